package wire

import (
	"bytes"
	"fmt"
)

// textContext is how many bytes after a text header a [TextError] keeps:
// enough to recognise a log line, little enough to quote in one.
const textContext = 60

// TextError is wrapped, next to [ErrFrameTooLarge], by the error ReadFrame
// returns when the four bytes of an oversized length prefix are all
// printable ASCII: "star" declares 1937006962 bytes. The peer has almost
// certainly written text (a print or a log line) to the stream that should
// carry only frames. Find it with errors.As.
type TextError struct {
	// Text is the header and the bytes already buffered after it, up to the
	// end of that line, at most HeaderSize+60 bytes. It is the peer's text:
	// quote it (%q) before showing it.
	Text []byte
}

func (e *TextError) Error() string {
	return fmt.Sprintf("wire: the length prefix is text (%q): the peer wrote text, not frames", e.Text)
}

// textHeader returns a *TextError when the header just read is printable
// text, else nil. It only looks at bytes already buffered: it never blocks.
func (r *Reader) textHeader() *TextError {
	for _, c := range r.hdr {
		if !printable(c) {
			return nil
		}
	}
	text := append([]byte(nil), r.hdr[:]...)
	if text[len(text)-1] != '\n' {
		next, _ := r.br.Peek(min(r.br.Buffered(), textContext))
		if i := bytes.IndexByte(next, '\n'); i >= 0 {
			next = next[:i]
		}
		for _, c := range next {
			if !printable(c) {
				break
			}
			text = append(text, c)
		}
	}
	return &TextError{Text: bytes.TrimRight(text, "\r\n")}
}

// printable: printable ASCII, tab, CR or LF.
func printable(c byte) bool {
	return (c >= 0x20 && c < 0x7f) || c == '\t' || c == '\n' || c == '\r'
}
