package main

import (
	"io"
	"unicode/utf8"
)

// termSafe writes what the read-only commands print with the terminal's
// control characters escaped: C0 controls other than newline and tab, DEL
// and C1 controls as \u00XX, and bytes that are not UTF-8 as \xNN. What they
// print holds text the agent or an HTTP client chose (an error code, an
// evolution's target and reason, a request's answer), and an escape
// sequence in it would otherwise drive the operator's terminal: rewrite the
// screen, hide lines, set the window title. JSON output keeps its meaning:
// encoding/json already escapes C0 controls, and \u00XX is the JSON escape
// of a C1 control inside a string.
type termSafe struct {
	w    io.Writer
	pend []byte // the start of a UTF-8 sequence split across writes
	buf  []byte
}

func newTermSafe(w io.Writer) *termSafe { return &termSafe{w: w} }

func (t *termSafe) Write(p []byte) (int, error) {
	data := p
	if len(t.pend) > 0 {
		data = append(t.pend, p...)
		t.pend = nil
	}
	// Hold back an incomplete sequence at the end: the rest may follow.
	if n := incompleteTail(data); n > 0 {
		t.pend = append([]byte(nil), data[len(data)-n:]...)
		data = data[:len(data)-n]
	}
	if plain(data) {
		if _, err := t.w.Write(data); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	t.buf = escapeControls(t.buf[:0], data)
	if _, err := t.w.Write(t.buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes an incomplete sequence held back, escaped: nothing followed.
func (t *termSafe) Flush() error {
	if len(t.pend) == 0 {
		return nil
	}
	t.buf = escapeControls(t.buf[:0], t.pend)
	t.pend = nil
	_, err := t.w.Write(t.buf)
	return err
}

// plain reports whether b is printable ASCII, newlines and tabs only.
func plain(b []byte) bool {
	for _, c := range b {
		if c >= 0x7f || c < 0x20 && c != '\n' && c != '\t' {
			return false
		}
	}
	return true
}

// incompleteTail is the length of a UTF-8 sequence begun at b's end and not
// finished there (0: none).
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if c >= 0xc0 { // a leading byte
			if !utf8.FullRune(b[len(b)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

func escapeControls(dst, b []byte) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			dst = append(dst, '\\', 'x', hex[b[i]>>4], hex[b[i]&0xf])
		case r < 0x20 && r != '\n' && r != '\t', r >= 0x7f && r <= 0x9f:
			dst = append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			dst = append(dst, b[i:i+size]...)
		}
		i += size
	}
	return dst
}
