// Package clip makes text that came from outside (an agent, an HTTP client,
// a bucket, the command line) safe to put in a log line, an error reply or
// the audit log. One rule everywhere: the result is valid UTF-8 — a byte
// that is not part of a valid UTF-8 sequence is written as the four
// characters \xNN — and, when it is too long, it is cut on a rune boundary,
// never inside a rune, saying how long the original was.
//
// Valid UTF-8 matters beyond looks: the text may travel back to the agent in
// a MessagePack str, and strict decoders (Python's msgpack with raw=False)
// refuse a str that is not UTF-8.
package clip

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// String returns s with invalid UTF-8 escaped ([Valid]), cut to at most n
// bytes of the original on a rune boundary and marked with the original
// length when cut.
func String(s string, n int) string {
	if len(s) <= n {
		return Valid(s)
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return Valid(s[:cut]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// Bytes is String for a byte slice.
func Bytes(b []byte, n int) string {
	if len(b) <= n {
		return Valid(string(b))
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return Valid(string(b[:cut])) + "…(" + strconv.Itoa(len(b)) + " bytes)"
}

// Valid returns s unchanged when it is valid UTF-8, and otherwise with each
// byte that does not belong to a valid UTF-8 sequence replaced by \xNN (two
// lower-case hex digits), the escape Go's %q uses, so the bytes can still be
// told apart. The result is always valid UTF-8.
func Valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			b.WriteString(`\x`)
			b.WriteByte(hex[s[i]>>4])
			b.WriteByte(hex[s[i]&0x0f])
			i++
			continue
		}
		b.WriteString(s[i : i+size])
		i += size
	}
	return b.String()
}
