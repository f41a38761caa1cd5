package evolution

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func enc(t *testing.T, f func(e *msgpack.Encoder) error) []byte {
	t.Helper()
	var b bytesBuf
	e := msgpack.NewEncoder(&b)
	if err := f(e); err != nil {
		t.Fatal(err)
	}
	return b.b
}

type bytesBuf struct{ b []byte }

func (w *bytesBuf) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// Two encodings an agent would call the same answer have one digest; a
// different value has another.
func TestAnswerCanonical(t *testing.T) {
	abInt8 := enc(t, func(e *msgpack.Encoder) error {
		_ = e.EncodeMapLen(2)
		_ = e.EncodeString("a")
		_ = e.EncodeInt8(1)
		_ = e.EncodeString("b")
		return e.EncodeFloat32(0.5)
	})
	baInt64 := enc(t, func(e *msgpack.Encoder) error {
		_ = e.EncodeMapLen(2)
		_ = e.EncodeString("b")
		_ = e.EncodeFloat64(0.5)
		_ = e.EncodeString("a")
		return e.EncodeInt64(1)
	})
	aUint := enc(t, func(e *msgpack.Encoder) error {
		_ = e.EncodeMapLen(2)
		_ = e.EncodeString("a")
		_ = e.EncodeUint32(1)
		_ = e.EncodeString("b")
		return e.EncodeFloat64(0.5)
	})
	aFloat := enc(t, func(e *msgpack.Encoder) error {
		_ = e.EncodeMapLen(2)
		_ = e.EncodeString("a")
		_ = e.EncodeFloat64(1)
		_ = e.EncodeString("b")
		return e.EncodeFloat64(0.5)
	})
	other := enc(t, func(e *msgpack.Encoder) error {
		_ = e.EncodeMapLen(2)
		_ = e.EncodeString("a")
		_ = e.EncodeInt(2)
		_ = e.EncodeString("b")
		return e.EncodeFloat64(0.5)
	})
	x, y, z := AnswerOf(abInt8, false, ""), AnswerOf(baInt64, false, ""), AnswerOf(aUint, false, "")
	if x.Digest != y.Digest || x.Digest != z.Digest {
		t.Fatalf("equal answers differ: %q %q %q", x.Text, y.Text, z.Text)
	}
	if x.Text != `{"a":1,"b":0.5}` {
		t.Fatalf("canonical text %q", x.Text)
	}
	if f := AnswerOf(aFloat, false, ""); f.Digest == x.Digest {
		t.Fatalf("1 and 1.0 compared equal: %q", f.Text)
	}
	if o := AnswerOf(other, false, ""); o.Digest == x.Digest {
		t.Fatal("different answers compared equal")
	}
	if e := AnswerOf(nil, true, "X"); e.Digest == AnswerOf(nil, true, "Y").Digest || !e.Failed {
		t.Fatal("error codes not told apart")
	}
	// Garbage is compared as bytes, never a panic.
	g := AnswerOf([]byte{0xc1, 0xff, 0x00}, false, "")
	if g.Digest == x.Digest || g.Text == "" {
		t.Fatalf("garbage answer %q", g.Text)
	}
	long := enc(t, func(e *msgpack.Encoder) error { return e.EncodeString(string(make([]byte, 10000))) })
	if l := AnswerOf(long, false, ""); len(l.Text) > maxAnswerText+4 {
		t.Fatalf("kept %d bytes of text", len(l.Text))
	}
}
