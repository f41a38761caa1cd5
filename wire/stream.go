package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// streamBuffer batches a streamed frame's small writes (WAL entries of a
// few hundred bytes) into pipe writes of this size.
const streamBuffer = 64 << 10

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
	bw := bufio.NewWriterSize(w.w, streamBuffer)
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
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		w.err = fmt.Errorf("wire: writing streamed frame of %d bytes (stream now unusable): %w", total, err)
		return w.err
	}
	return nil
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
