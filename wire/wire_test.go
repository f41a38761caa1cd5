package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/agent-sidecar/supervisor/wire"
)

func frame(payload []byte) []byte { return wire.AppendFrame(nil, payload) }

func header(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

func TestReadFrameRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16+7) // > eager allocation, odd size
	payloads := [][]byte{{0x80}, []byte("hello"), make([]byte, 65<<10), big}
	var stream []byte
	for _, p := range payloads {
		stream = wire.AppendFrame(stream, p)
	}
	readers := map[string]func(io.Reader) io.Reader{
		"plain":    func(r io.Reader) io.Reader { return r },
		"one-byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data-err": iotest.DataErrReader,
	}
	for name, wrap := range readers {
		t.Run(name, func(t *testing.T) {
			r := wire.NewReader(wrap(bytes.NewReader(stream)), 0)
			for i, want := range payloads {
				got, err := r.ReadFrame()
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(want))
				}
			}
			if _, err := r.ReadFrame(); err != io.EOF {
				t.Fatalf("after last frame: got %v, want io.EOF itself", err)
			}
		})
	}
}

func TestReadFrameReturnsOwnedSlice(t *testing.T) {
	r := wire.NewReader(bytes.NewReader(append(frame([]byte("aaaa")), frame([]byte("bbbb"))...)), 0)
	first, err := r.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if string(first) != "aaaa" {
		t.Fatalf("first frame changed by the next read: %q", first)
	}
}

func TestReadFrameErrors(t *testing.T) {
	tests := []struct {
		name     string
		input    []byte
		max      int
		want     error // errors.Is target
		framing  bool
		unexpEOF bool
	}{
		{name: "empty input is a clean EOF", input: nil, want: io.EOF},
		{name: "zero length", input: header(0), want: wire.ErrZeroLength, framing: true},
		{name: "zero length with bytes after", input: append(header(0), 1, 2, 3), want: wire.ErrZeroLength, framing: true},
		{name: "length 0xFFFFFFFF with 4 bytes", input: append(header(0xFFFFFFFF), 1, 2, 3, 4), want: wire.ErrFrameTooLarge, framing: true},
		{name: "length one above a small maximum", input: append(header(11), make([]byte, 11)...), max: 10, want: wire.ErrFrameTooLarge, framing: true},
		{name: "header cut after 1 byte", input: []byte{0}, want: wire.ErrTruncated, framing: true, unexpEOF: true},
		{name: "header cut after 3 bytes", input: []byte{0, 0, 0}, want: wire.ErrTruncated, framing: true, unexpEOF: true},
		{name: "payload missing", input: header(5), want: wire.ErrTruncated, framing: true, unexpEOF: true},
		{name: "payload cut short", input: append(header(5), 1, 2), want: wire.ErrTruncated, framing: true, unexpEOF: true},
		{name: "large payload cut short", input: append(header(3<<20), make([]byte, 2<<20)...), want: wire.ErrTruncated, framing: true, unexpEOF: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := wire.NewReader(bytes.NewReader(tt.input), tt.max)
			p, err := r.ReadFrame()
			if p != nil {
				t.Errorf("got a payload of %d bytes with error %v", len(p), err)
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if tt.want == io.EOF && err != io.EOF {
				t.Fatalf("clean EOF must be io.EOF itself, got %#v", err)
			}
			if got := wire.IsFramingError(err); got != tt.framing {
				t.Errorf("IsFramingError = %v, want %v", got, tt.framing)
			}
			if got := errors.Is(err, io.ErrUnexpectedEOF); got != tt.unexpEOF {
				t.Errorf("errors.Is(err, io.ErrUnexpectedEOF) = %v, want %v", got, tt.unexpEOF)
			}
		})
	}
}

func TestReadFrameAfterGoodFrameThenTruncation(t *testing.T) {
	in := append(frame([]byte{0x80}), 0, 0)
	r := wire.NewReader(bytes.NewReader(in), 0)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadFrame(); !errors.Is(err, wire.ErrTruncated) {
		t.Fatalf("got %v, want ErrTruncated", err)
	}
}

func TestReadFrameUnderlyingError(t *testing.T) {
	boom := errors.New("boom")
	r := wire.NewReader(iotest.ErrReader(boom), 0)
	_, err := r.ReadFrame()
	if !errors.Is(err, boom) || wire.IsFramingError(err) {
		t.Fatalf("got %v, want the reader's own error, not a framing error", err)
	}
	r = wire.NewReader(io.MultiReader(bytes.NewReader(header(10)), iotest.ErrReader(boom)), 0)
	_, err = r.ReadFrame()
	if !errors.Is(err, boom) || wire.IsFramingError(err) {
		t.Fatalf("payload: got %v, want the reader's own error", err)
	}
}

// repeatReader yields its bytes over and over, so one Reader can be fed the
// same hostile header any number of times without re-allocating its buffer.
type repeatReader struct {
	b   []byte
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

// TestOversizedLengthDoesNotAllocate proves the length check happens before
// any allocation of the declared size: a 0xFFFFFFFF length followed by 4 more
// bytes (here: another such length) is rejected with no allocation beyond
// the error value, and little memory overall.
func TestOversizedLengthDoesNotAllocate(t *testing.T) {
	r := wire.NewReader(&repeatReader{b: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}, 0)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := r.ReadFrame(); !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Fatalf("got %v", err)
		}
	})
	// The only allocations allowed are the error value and its message (the
	// count varies with fmt's boxing and the race detector; the bytes, checked
	// below, are what prove the declared 4 GiB was never allocated).
	if allocs > 8 {
		t.Fatalf("rejecting an oversized length allocated %v times per call", allocs)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		if _, err := r.ReadFrame(); !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Fatalf("got %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 100*512 {
		t.Fatalf("100 rejected 4 GiB frames allocated %d bytes in total, want under 512 bytes each", grew)
	}
}

// TestLargeDeclaredLengthGrowsWithData: a frame declaring 100 MiB whose
// sender dies after a few bytes must not cost 100 MiB.
func TestLargeDeclaredLengthGrowsWithData(t *testing.T) {
	input := append(header(100<<20), 1, 2, 3, 4)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := wire.NewReader(bytes.NewReader(input), 0).ReadFrame()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, wire.ErrTruncated) {
		t.Fatalf("got %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Fatalf("a truncated 100 MiB frame allocated %d bytes", grew)
	}
}

type countingWriter struct {
	bytes.Buffer
	calls int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.calls++
	return w.Buffer.Write(p)
}

func TestWriteFrame(t *testing.T) {
	for _, size := range []int{1, 100, 64 << 10, 64<<10 + 1, 2 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			payload := bytes.Repeat([]byte{0xAB}, size)
			var cw countingWriter
			if err := wire.NewWriter(&cw, 0).WriteFrame(payload); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(cw.Bytes(), frame(payload)) {
				t.Fatal("written bytes differ from AppendFrame")
			}
			wantCalls := 1
			if size > 64<<10 {
				wantCalls = 2
			}
			if cw.calls != wantCalls {
				t.Fatalf("%d Write calls, want %d", cw.calls, wantCalls)
			}
		})
	}
}

func TestWriteFrameRefuses(t *testing.T) {
	var buf bytes.Buffer
	w := wire.NewWriter(&buf, 10)
	if err := w.WriteFrame(nil); !errors.Is(err, wire.ErrZeroLength) {
		t.Errorf("empty payload: got %v", err)
	}
	if err := w.WriteFrame(make([]byte, 11)); !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Errorf("oversized payload: got %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("refused frames wrote %d bytes", buf.Len())
	}
	if err := w.WriteFrame(make([]byte, 10)); err != nil {
		t.Errorf("payload at the limit: %v", err)
	}
}

type shortWriter struct{ n int }

func (w *shortWriter) Write(p []byte) (int, error) {
	w.n++
	return len(p) / 2, nil
}

func TestWriteFrameErrorIsSticky(t *testing.T) {
	sw := &shortWriter{}
	w := wire.NewWriter(sw, 0)
	err := w.WriteFrame([]byte("hello"))
	if !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: got %v", err)
	}
	if err2 := w.WriteFrame([]byte("again")); !errors.Is(err2, io.ErrShortWrite) {
		t.Fatalf("second write after a broken stream: got %v", err2)
	}
	if sw.n != 1 {
		t.Fatalf("writer was called %d times after the stream broke", sw.n)
	}
}

func TestWriterConcurrentOverPipe(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	const writers, perWriter = 8, 200
	w := wire.NewWriter(pw, 0)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range perWriter {
				// Sizes straddle the single-write threshold and PIPE_BUF.
				size := 1 + (g*7919+i*104729)%(80<<10)
				p := bytes.Repeat([]byte{byte(g)}, size)
				if size >= 4 {
					binary.BigEndian.PutUint32(p, uint32(i))
				}
				if err := w.WriteFrame(p); err != nil {
					t.Errorf("writer %d: %v", g, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		pw.Close()
		close(done)
	}()
	r := wire.NewReader(pr, 0)
	count := 0
	for {
		p, err := r.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("frame %d: %v", count, err)
		}
		// Every byte after the index is the writer's id: frames never interleave.
		g := p[len(p)-1]
		start := 4
		if len(p) < 4 {
			start = 0
		}
		for j := start; j < len(p); j++ {
			if p[j] != g {
				t.Fatalf("frame %d mixes bytes of writers %d and %d", count, g, p[j])
			}
		}
		count++
	}
	<-done
	if count != writers*perWriter {
		t.Fatalf("read %d frames, want %d", count, writers*perWriter)
	}
}

func TestNormalizedMax(t *testing.T) {
	if got := wire.NewReader(nil, 0).MaxFrameSize(); got != wire.DefaultMaxFrameSize {
		t.Errorf("reader default max = %d", got)
	}
	if got := wire.NewWriter(nil, -1).MaxFrameSize(); got != wire.DefaultMaxFrameSize {
		t.Errorf("writer default max = %d", got)
	}
	if got := wire.NewReader(nil, 1<<40).MaxFrameSize(); got != 1<<32-1 {
		t.Errorf("max above 4 GiB not clamped: %d", got)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0x80})       // one empty map
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}) // absurd length, no body
	f.Add([]byte{0, 0, 0, 0})             // zero length
	f.Add([]byte{0, 0, 0, 2, 0x80})       // truncated
	f.Add(append(frame([]byte{0x81, 0xa1, 'a', 1}), frame([]byte{0xc0})...))
	f.Fuzz(func(t *testing.T, b []byte) {
		const max = 64 << 10
		r := wire.NewReader(bytes.NewReader(b), max)
		consumed := 0
		for {
			p, err := r.ReadFrame()
			if err != nil {
				if err == io.EOF && consumed != len(b) {
					t.Fatalf("clean EOF after %d of %d bytes", consumed, len(b))
				}
				if err != io.EOF && !wire.IsFramingError(err) {
					t.Fatalf("unexpected error class: %v", err)
				}
				return
			}
			if len(p) == 0 || len(p) > max {
				t.Fatalf("payload of %d bytes escaped the checks", len(p))
			}
			if !bytes.Equal(p, b[consumed+4:consumed+4+len(p)]) {
				t.Fatal("payload differs from input")
			}
			consumed += 4 + len(p)
		}
	})
}

// A frame above the discard limit is skipped without being held and the
// next frame reads as usual; one cut short is still a truncated frame.
func TestDiscardAbove(t *testing.T) {
	big := make([]byte, 3<<20)
	stream := wire.AppendFrame(wire.AppendFrame(wire.AppendFrame(nil, []byte("a")), big), []byte("b"))
	r := wire.NewReader(iotest.HalfReader(bytes.NewReader(stream)), 4<<20)
	r.DiscardAbove(1 << 20)
	if p, err := r.ReadFrame(); err != nil || string(p) != "a" {
		t.Fatalf("first frame: %q, %v", p, err)
	}
	_, err := r.ReadFrame()
	var de *wire.DiscardedError
	if !errors.As(err, &de) || de.Size != len(big) || de.Limit != 1<<20 || !errors.Is(err, wire.ErrFrameDiscarded) || wire.IsFramingError(err) {
		t.Fatalf("oversize frame: %v", err)
	}
	if p, err := r.ReadFrame(); err != nil || string(p) != "b" {
		t.Fatalf("frame after the discarded one: %q, %v", p, err)
	}
	r = wire.NewReader(bytes.NewReader(append(header(2<<20), 1, 2, 3)), 4<<20)
	r.DiscardAbove(1 << 20)
	if _, err := r.ReadFrame(); !errors.Is(err, wire.ErrTruncated) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut-short oversize frame: %v", err)
	}
	r = wire.NewReader(bytes.NewReader(header(5<<20)), 4<<20)
	r.DiscardAbove(1 << 20)
	if _, err := r.ReadFrame(); !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Fatalf("above the maximum: %v", err)
	}
}
