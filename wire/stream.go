package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// A streamed frame's bytes go to the pipe through a ring of streamChunks
// chunks of streamChunk bytes: its producer (a checkpoint's decompressor,
// the WAL's reader) fills one while another goroutine writes the full ones,
// so producing overlaps the pipe writes and the wake-ups of the pipe's
// reader, instead of following each of them. The small writes (WAL entries
// of a few hundred bytes) are batched into writes of a chunk.
const (
	streamChunk  = 1 << 20
	streamChunks = 4
)

// errStreamOverrun: fill wrote more than the frame declared.
var errStreamOverrun = errors.New("wire: streamed frame body longer than declared")

// WriteFrameStream writes one frame of len(head)+rest payload bytes whose
// first bytes are head and whose last rest bytes fill writes, as they come:
// a large payload is never held whole. fill must write exactly rest bytes.
// When it does not, or fails, the frame is cut short on the wire: the
// stream is unusable from then on (the error is sticky, as for a failed
// write), and the caller should close it, so that the reader sees the
// truncation instead of waiting for the missing bytes.
func (w *Writer) WriteFrameStream(head []byte, rest int64, fill func(io.Writer) error) error {
	total := int64(len(head)) + rest
	if total == 0 {
		return ErrZeroLength
	}
	if total > int64(w.max) {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, total, w.max)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if total <= streamChunk {
		return w.writeFrameStreamed(head, rest, fill, bufio.NewWriterSize(w.w, int(total)+HeaderSize))
	}
	rw := newRingWriter(w.w)
	return w.writeFrameStreamed(head, rest, fill, rw)
}

// chunkWriter is where writeFrameStreamed puts a frame's bytes: Flush
// sends what is left to the pipe and reports the first error on the way.
type chunkWriter interface {
	io.Writer
	Flush() error
}

func (w *Writer) writeFrameStreamed(head []byte, rest int64, fill func(io.Writer) error, bw chunkWriter) error {
	total := int64(len(head)) + rest
	var hdr [HeaderSize]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(total))
	_, err := bw.Write(hdr[:])
	if err == nil {
		_, err = bw.Write(head)
	}
	if err == nil {
		lw := &limitedWriter{w: bw, left: rest}
		err = fill(lw)
		if err == nil && lw.left != 0 {
			err = fmt.Errorf("wire: streamed frame body %d bytes shorter than declared", lw.left)
		}
	}
	if rw, ok := bw.(*ringWriter); ok && err != nil {
		rw.abort() // the frame is cut short: what is queued is not sent
	} else if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		w.err = fmt.Errorf("wire: writing streamed frame of %d bytes (stream now unusable): %w", total, err)
		return w.err
	}
	return nil
}

// ringWriter copies its writes into chunks that its goroutine writes to w
// in order (see streamChunk). It is made for one frame: Flush or abort ends
// the goroutine and waits for it, so none outlives the call.
type ringWriter struct {
	w    io.Writer
	cur  []byte
	free chan []byte // empty chunks: the ring's bound
	full chan []byte // chunks for the goroutine, in order
	done chan struct{}
	// failed is closed when the goroutine's write fails; err is then set.
	failed chan struct{}
	err    error
	n      int         // chunks made so far (at most streamChunks)
	stop   atomic.Bool // abort: the goroutine writes nothing more
}

func newRingWriter(w io.Writer) *ringWriter {
	r := &ringWriter{w: w, free: make(chan []byte, streamChunks), full: make(chan []byte, streamChunks),
		done: make(chan struct{}), failed: make(chan struct{})}
	go r.run()
	return r
}

// run writes the full chunks to w until the ring is closed; after a failed
// write it drops the rest (the producer sees the error at its next chunk).
func (r *ringWriter) run() {
	defer close(r.done)
	for c := range r.full {
		if r.err == nil && !r.stop.Load() {
			if _, err := r.w.Write(c); err != nil {
				r.err = err
				close(r.failed)
			}
		}
		r.free <- c[:0]
	}
}

func (r *ringWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if r.cur == nil {
			if err := r.take(); err != nil {
				return written, err
			}
		}
		n := copy(r.cur[len(r.cur):cap(r.cur)], p)
		r.cur = r.cur[:len(r.cur)+n]
		p, written = p[n:], written+n
		if len(r.cur) == cap(r.cur) {
			if err := r.send(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

// take makes r.cur an empty chunk: a new one while the ring has fewer than
// streamChunks, else one the goroutine has written.
func (r *ringWriter) take() error {
	if r.n < streamChunks {
		select {
		case c := <-r.free:
			r.cur = c
		default:
			r.n++
			r.cur = make([]byte, 0, streamChunk)
		}
		return nil
	}
	select {
	case c := <-r.free:
		r.cur = c
		return nil
	case <-r.failed:
		return r.err
	}
}

// send queues r.cur for the goroutine (there is always room: at most
// streamChunks chunks exist).
func (r *ringWriter) send() error {
	select {
	case <-r.failed:
		return r.err
	default:
	}
	r.full <- r.cur
	r.cur = nil
	return nil
}

// Flush sends what is left, ends the goroutine and returns the first
// write error.
func (r *ringWriter) Flush() error {
	var err error
	if len(r.cur) > 0 {
		err = r.send()
	}
	close(r.full)
	<-r.done
	if r.err != nil {
		return r.err
	}
	return err
}

// abort ends the goroutine, sending nothing more (a chunk being written
// is finished).
func (r *ringWriter) abort() {
	r.stop.Store(true)
	r.cur = nil
	close(r.full)
	<-r.done
}

// limitedWriter passes at most left bytes on to w.
type limitedWriter struct {
	w    io.Writer
	left int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, errStreamOverrun
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}

// FrameBody is the payload of a frame being read as a stream
// ([Reader.ReadFrameOrBody]): exactly its declared bytes, then io.EOF. The
// input ending before them is an error wrapping [ErrTruncated]. It must be
// read to its end (or Drain called) before the Reader's next ReadFrame.
type FrameBody struct {
	r    *Reader
	size int
	left int
}

// Size is the frame's declared payload length.
func (b *FrameBody) Size() int { return b.size }

func (b *FrameBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.br.Read(p)
	b.left -= n
	if err != nil && b.left > 0 {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, fmt.Errorf("%w: payload cut short after %d of %d bytes: %w", ErrTruncated, b.size-b.left, b.size, io.ErrUnexpectedEOF)
		}
		return n, fmt.Errorf("wire: reading frame payload (%d of %d bytes read): %w", b.size-b.left, b.size, err)
	}
	return n, nil
}

// Drain reads and drops what is left of the payload.
func (b *FrameBody) Drain() error {
	_, err := io.Copy(io.Discard, b)
	return err
}

// ReadFrameOrBody is ReadFrame for a reader that streams large frames: a
// frame longer than streamAbove bytes (and not above the discard limit or
// the maximum, which ReadFrame's errors report) is not read but returned
// as a [FrameBody] to read as it arrives; a shorter one is returned as
// ReadFrame returns it.
func (r *Reader) ReadFrameOrBody(streamAbove int) ([]byte, *FrameBody, error) {
	if n, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		switch {
		case err == io.EOF:
			return nil, nil, io.EOF
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, nil, fmt.Errorf("%w: header cut short after %d of %d bytes: %w", ErrTruncated, n, HeaderSize, io.ErrUnexpectedEOF)
		default:
			return nil, nil, fmt.Errorf("wire: reading frame header: %w", err)
		}
	}
	size := binary.BigEndian.Uint32(r.hdr[:])
	if size == 0 {
		return nil, nil, ErrZeroLength
	}
	if uint64(size) > uint64(r.max) {
		if te := r.textHeader(); te != nil {
			return nil, nil, fmt.Errorf("%w: declared %d bytes, limit %d: %w", ErrFrameTooLarge, size, r.max, te)
		}
		return nil, nil, fmt.Errorf("%w: declared %d bytes, limit %d", ErrFrameTooLarge, size, r.max)
	}
	if r.discard > 0 && int(size) > r.discard {
		return nil, nil, r.skipPayload(int(size))
	}
	if streamAbove > 0 && int(size) > streamAbove {
		return nil, &FrameBody{r: r, size: int(size), left: int(size)}, nil
	}
	p, err := r.readPayload(int(size))
	return p, nil, err
}
