// Package clip truncates text that came from outside (an agent, an HTTP
// client, a bucket, the command line) before it reaches a log line, an error
// reply or the audit log. One rule everywhere: cut on a UTF-8 rune boundary,
// never inside a rune, and say how long the original was.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// String returns s cut to at most n bytes on a rune boundary, marked with
// the original length when cut.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Bytes is String for a byte slice.
func Bytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "…(" + strconv.Itoa(len(b)) + " bytes)"
}
