package wire

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"testing/synctest"
)

// fillPattern writes n bytes of a known pattern in writes of varied sizes
// (the shapes a restore's producers make: a decompressor's blocks, WAL
// entries of a few hundred bytes), stopping at the first error.
func fillPattern(n int64, seed uint64, wrote *int64) func(io.Writer) error {
	return func(w io.Writer) error {
		r := rand.New(rand.NewPCG(seed, 1))
		buf := make([]byte, 300<<10+1000)
		for i := range buf {
			buf[i] = byte(i*7 + int(seed))
		}
		var off int64
		for off < n {
			size := int64(r.IntN(3)) // 0: small, 1: medium, 2: block
			switch size {
			case 0:
				size = 1 + int64(r.IntN(900))
			case 1:
				size = 1 + int64(r.IntN(64<<10))
			default:
				size = 300 << 10
			}
			size = min(size, n-off)
			start := off % 1000
			k, err := w.Write(buf[start : start+size])
			off += int64(k)
			if wrote != nil {
				*wrote = off
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// A frame far larger than the ring (streamChunks × streamChunk) arrives
// byte for byte, in order, whatever the sizes of the producer's writes.
func TestWriteFrameStreamRoundTrip(t *testing.T) {
	for _, rest := range []int64{1, 1000, streamChunk - 100, streamChunk, 3*streamChunk + 17, 9*streamChunk + 12345} {
		var out bytes.Buffer
		head := []byte("head-bytes")
		if err := NewWriter(&out, 0).WriteFrameStream(head, rest, fillPattern(rest, uint64(rest), nil)); err != nil {
			t.Fatalf("rest %d: %v", rest, err)
		}
		var want bytes.Buffer
		fillPattern(rest, uint64(rest), nil)(&want)
		payload, err := NewReader(&out, 0).ReadFrame()
		if err != nil {
			t.Fatalf("rest %d: read back: %v", rest, err)
		}
		if !bytes.Equal(payload[:len(head)], head) || !bytes.Equal(payload[len(head):], want.Bytes()) {
			t.Fatalf("rest %d: the frame read back differs from what was written", rest)
		}
		if out.Len() != 0 {
			t.Fatalf("rest %d: %d bytes after the frame", rest, out.Len())
		}
	}
}

// failAfter accepts limit bytes, then fails every write.
type failAfter struct {
	limit, n int64
	writes   int
}

var errPipeGone = errors.New("pipe reader gone")

func (f *failAfter) Write(p []byte) (int, error) {
	f.writes++
	if f.n+int64(len(p)) > f.limit {
		return 0, errPipeGone
	}
	f.n += int64(len(p))
	return len(p), nil
}

// The pipe's reader going away stops the producer at its next chunk (it
// does not decompress the rest of a 64 MiB checkpoint into nowhere), the
// error is the pipe's, sticky, and the ring's goroutine has ended when the
// call returns (synctest fails on one left blocked).
func TestWriteFrameStreamPipeFailureStopsTheProducer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rest = 64 << 20
		dst := &failAfter{limit: 2 * streamChunk}
		w := NewWriter(dst, rest+1024)
		var wrote int64
		err := w.WriteFrameStream([]byte("h"), rest, fillPattern(rest, 3, &wrote))
		if !errors.Is(err, errPipeGone) {
			t.Fatalf("err = %v, want the pipe's error", err)
		}
		if bound := int64((streamChunks + 4) * streamChunk); wrote > bound {
			t.Fatalf("the producer wrote %d bytes after the pipe failed at %d: want it stopped within the ring (%d)", wrote, dst.limit, bound)
		}
		if err := w.WriteFrame([]byte("x")); !errors.Is(err, errPipeGone) {
			t.Fatalf("the next write: %v, want the sticky error", err)
		}
	})
}

// A producer that fails (a checkpoint that does not verify) cuts the frame
// short: fewer bytes than declared reach the pipe, nothing queued after
// the failure is sent, and the error is the producer's.
func TestWriteFrameStreamProducerFailureCutsTheFrame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errCorrupt := errors.New("checkpoint corrupt")
		const rest = 8 * streamChunk
		var out bytes.Buffer
		err := NewWriter(&out, 0).WriteFrameStream([]byte("h"), rest, func(w io.Writer) error {
			if err := fillPattern(3*streamChunk+5, 9, nil)(w); err != nil {
				return err
			}
			return errCorrupt
		})
		if !errors.Is(err, errCorrupt) {
			t.Fatalf("err = %v, want the producer's", err)
		}
		if got := int64(out.Len()); got >= HeaderSize+1+rest || got > HeaderSize+1+3*streamChunk+5 {
			t.Fatalf("%d bytes reached the pipe: want the frame cut short, no more than what was produced", got)
		}
		if _, err := NewReader(&out, 0).ReadFrame(); !errors.Is(err, ErrTruncated) {
			t.Fatalf("the reader sees %v, want a truncated frame", err)
		}
	})
}

// A producer writing fewer bytes than declared is an error, the frame cut.
func TestWriteFrameStreamShortProducer(t *testing.T) {
	var out bytes.Buffer
	err := NewWriter(&out, 0).WriteFrameStream(nil, 3*streamChunk, fillPattern(2*streamChunk, 1, nil))
	if err == nil {
		t.Fatal("a short producer was not an error")
	}
	var over bytes.Buffer
	err = NewWriter(&over, 0).WriteFrameStream(nil, 2*streamChunk, fillPattern(3*streamChunk, 1, nil))
	if !errors.Is(err, errStreamOverrun) {
		t.Fatalf("a long producer: %v, want errStreamOverrun", err)
	}
}

// Over a real pipe whose reader is slower than the producer, the frame
// arrives whole and the writer holds at most the ring (no growth with the
// frame's size).
func TestWriteFrameStreamOverPipe(t *testing.T) {
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const rest = 20*streamChunk + 3
	done := make(chan error, 1)
	go func() {
		done <- NewWriter(pw, 0).WriteFrameStream([]byte("head"), rest, fillPattern(rest, 5, nil))
		pw.Close()
	}()
	payload, err := NewReader(r, 0).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	fillPattern(rest, 5, nil)(&want)
	if !bytes.Equal(payload[4:], want.Bytes()) {
		t.Fatal("the frame read from the pipe differs from what was written")
	}
}
