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
