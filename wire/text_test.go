package wire_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/agent-sidecar/supervisor/wire"
)

// A program that prints to the stream meant for frames produces a length
// prefix made of text; the error says so and quotes the line.
func TestTextOnTheStreamIsDiagnosed(t *testing.T) {
	for _, c := range []struct {
		name  string
		input string
		want  string // TextError.Text; "" = no TextError
	}{
		{name: "a print() before the first frame", input: "starting up, model=small\n\x00\x00\x00\x01\x80", want: "starting up, model=small"},
		{name: "a JSON log line", input: `{"level":"info","msg":"hi"}` + "\n", want: `{"level":"info","msg":"hi"}`},
		{name: "a short line", input: "ok!\n", want: "ok!"},
		{name: "text cut at the first control byte", input: "star\x00\x01", want: "star"},
		{name: "binary length above the maximum", input: "\xff\xff\xff\xff\x00", want: ""},
		{name: "a long line keeps only its start", input: strings.Repeat("x", 500) + "\n", want: strings.Repeat("x", 64)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := wire.NewReader(strings.NewReader(c.input), 1<<20).ReadFrame()
			if !errors.Is(err, wire.ErrFrameTooLarge) || !wire.IsFramingError(err) {
				t.Fatalf("err %v, want a framing error wrapping ErrFrameTooLarge", err)
			}
			var te *wire.TextError
			if got := errors.As(err, &te); got != (c.want != "") {
				t.Fatalf("TextError found: %v, want %v (%v)", got, c.want != "", err)
			}
			if te != nil && string(te.Text) != c.want {
				t.Fatalf("text %q, want %q", te.Text, c.want)
			}
		})
	}
}

// The diagnosis only looks at what is buffered: a one-byte reader still
// gets it for the header, and ReadFrame does not block for more.
func TestTextDiagnosisNeverWaitsForMoreInput(t *testing.T) {
	_, err := wire.NewReader(iotest.OneByteReader(bytes.NewReader([]byte("hello world\n"))), 1<<20).ReadFrame()
	var te *wire.TextError
	if !errors.As(err, &te) || !bytes.HasPrefix(te.Text, []byte("hell")) {
		t.Fatalf("err %v, want a TextError starting with %q", err, "hell")
	}
}
