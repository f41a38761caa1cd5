package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
)

const (
	// DefaultMaxFrameSize is the largest payload accepted when no maximum is
	// configured: 128 MiB.
	DefaultMaxFrameSize = 128 << 20
	// HeaderSize is the length of the big-endian length prefix.
	HeaderSize = 4

	// readBufferSize is the Reader's internal buffer.
	readBufferSize = 64 << 10
	// eagerAlloc is the largest payload allocated in full before its bytes
	// arrive; larger payloads grow as they are read.
	eagerAlloc = 1 << 20
	// trustFraction: once 1/trustFraction of a payload has arrived,
	// readPayload allocates the rest of it at once instead of doubling.
	trustFraction = 4
	// singleWriteMax is the largest payload copied behind its header so the
	// frame goes out in one Write call.
	singleWriteMax = 64 << 10
	// maxUint32 is the largest length the header can express.
	maxUint32 = 1<<32 - 1
)

var (
	// ErrZeroLength is returned for a frame whose declared length is 0.
	ErrZeroLength = errors.New("wire: frame with length 0")
	// ErrFrameTooLarge is returned for a frame whose declared length is above
	// the maximum; nothing of that size was allocated.
	ErrFrameTooLarge = errors.New("wire: frame length above the maximum")
	// ErrTruncated is returned when the input ends inside a frame (in its
	// header or its payload). Its chain also holds io.ErrUnexpectedEOF.
	ErrTruncated = errors.New("wire: input ended inside a frame")
	// ErrFrameDiscarded is what every [*DiscardedError] unwraps to.
	ErrFrameDiscarded = errors.New("wire: frame discarded unread")
)

// DiscardedError is returned by ReadFrame for a frame above the Reader's
// discard limit ([Reader.DiscardAbove]) but within its maximum: its payload
// was read and thrown away, so the stream is still in step and the next
// ReadFrame reads the next frame. It is not a framing error.
type DiscardedError struct {
	Size  int // the frame's declared length
	Limit int // the discard limit it was above
}

func (e *DiscardedError) Error() string {
	return fmt.Sprintf("wire: frame of %d bytes discarded unread: above the %d-byte limit", e.Size, e.Limit)
}

// Unwrap returns [ErrFrameDiscarded].
func (e *DiscardedError) Unwrap() error { return ErrFrameDiscarded }

// IsFramingError reports whether err is a framing error: a zero length, a
// length above the maximum, or a frame cut short. After one the stream cannot
// be resynchronised.
func IsFramingError(err error) bool {
	return errors.Is(err, ErrZeroLength) || errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrTruncated)
}

// normalizeMax maps a non-positive maximum to the default and clamps it to
// what a 4-byte header can express.
func normalizeMax(max int) int {
	if max <= 0 {
		return DefaultMaxFrameSize
	}
	if uint64(max) > maxUint32 {
		return maxUint32
	}
	return max
}

// Reader reads frames from an underlying reader. It is not safe for
// concurrent use: one goroutine owns a Reader.
type Reader struct {
	br      *bufio.Reader
	max     int
	discard int // frames above it (and within max) are skipped; 0: none
	hdr     [HeaderSize]byte
}

// NewReader returns a Reader that buffers r (64 KiB) and accepts payloads of
// up to maxFrameSize bytes; maxFrameSize <= 0 means [DefaultMaxFrameSize].
func NewReader(r io.Reader, maxFrameSize int) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, readBufferSize), max: normalizeMax(maxFrameSize)}
}

// Buffered reports the bytes read from the input and not yet returned in a
// frame: 0 when the peer has sent nothing more for now.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// MaxFrameSize returns the largest payload the Reader accepts.
func (r *Reader) MaxFrameSize() int { return r.max }

// DiscardAbove makes ReadFrame skip any frame longer than n bytes but within
// the maximum: the payload is read through the Reader's 64 KiB buffer and
// thrown away, never held, and ReadFrame returns a [*DiscardedError]. For a
// peer that may send a frame the Reader's owner refuses by its size anyway,
// without either holding it or losing step. n <= 0, or n at or above the
// maximum, turns it off.
func (r *Reader) DiscardAbove(n int) {
	if n <= 0 || n >= r.max {
		n = 0
	}
	r.discard = n
}

// ReadFrame reads the next frame and returns its payload in a new slice owned
// by the caller. It returns io.EOF itself when the input ends cleanly between
// frames; [ErrZeroLength], [ErrFrameTooLarge] or [ErrTruncated] for framing
// errors; and any other read error wrapped.
func (r *Reader) ReadFrame() ([]byte, error) {
	p, _, err := r.ReadFrameOrBody(0)
	return p, err
}

// skipPayload reads n payload bytes and throws them away.
func (r *Reader) skipPayload(n int) error {
	got, err := r.br.Discard(n)
	if err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: payload cut short after %d of %d bytes: %w", ErrTruncated, got, n, io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("wire: reading frame payload (%d of %d bytes read): %w", got, n, err)
	}
	return &DiscardedError{Size: n, Limit: r.discard}
}

// readPayload reads exactly n payload bytes. Up to eagerAlloc bytes are
// allocated at once; beyond that the buffer doubles as bytes arrive.
func (r *Reader) readPayload(n int) ([]byte, error) {
	buf := make([]byte, min(n, eagerAlloc))
	got := 0
	for {
		m, err := io.ReadFull(r.br, buf[got:])
		got += m
		if err != nil {
			if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%w: payload cut short after %d of %d bytes: %w", ErrTruncated, got, n, io.ErrUnexpectedEOF)
			}
			return nil, fmt.Errorf("wire: reading frame payload (%d of %d bytes read): %w", got, n, err)
		}
		if got == n {
			return buf, nil
		}
		// Doubling keeps a lying header (a large size, few bytes) from
		// costing more than twice what was sent. Once a quarter of the
		// payload has come, the rest is allocated at once: a large frame
		// (a 30 MiB checkpoint) then costs its size plus a quarter to a
		// half of it at its peak, not plus half to all of it, and a lying
		// header at most four times what was sent.
		size := min(n, 2*len(buf))
		if got >= n/trustFraction {
			size = n
		}
		next := make([]byte, size)
		copy(next, buf)
		buf = next
	}
}

// Writer writes frames to an underlying writer. It is safe for concurrent
// use: each frame is written whole before the next begins.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	max int
	err error // sticky: set when a write failed part-way

	directOnce sync.Once
	pipe       syscall.RawConn // w's descriptor when it is a non-blocking pipe (TryWriteFrame)
}

// NewWriter returns a Writer that refuses payloads above maxFrameSize bytes;
// maxFrameSize <= 0 means [DefaultMaxFrameSize].
func NewWriter(w io.Writer, maxFrameSize int) *Writer {
	return &Writer{w: w, max: normalizeMax(maxFrameSize)}
}

// MaxFrameSize returns the largest payload the Writer accepts.
func (w *Writer) MaxFrameSize() int { return w.max }

var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 4<<10)
	return &b
}}

// WriteFrame writes payload as one frame. An empty payload is [ErrZeroLength]
// and one above the maximum [ErrFrameTooLarge]; neither writes anything. Once
// a write fails, the stream may hold part of a frame, so that error is
// returned by this and every later call.
func (w *Writer) WriteFrame(payload []byte) error {
	if len(payload) == 0 {
		return ErrZeroLength
	}
	if len(payload) > w.max {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(payload), w.max)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	var err error
	if len(payload) <= singleWriteMax {
		bp := bufPool.Get().(*[]byte)
		frame := AppendFrame((*bp)[:0], payload)
		err = writeAll(w.w, frame)
		*bp = frame[:0]
		bufPool.Put(bp)
	} else {
		var hdr [HeaderSize]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
		if err = writeAll(w.w, hdr[:]); err == nil {
			err = writeAll(w.w, payload)
		}
	}
	if err != nil {
		w.err = fmt.Errorf("wire: writing frame of %d bytes (stream now unusable): %w", len(payload), err)
		return w.err
	}
	return nil
}

// writeAll performs one Write and treats a short write as an error, as the
// io.Writer contract requires of writers that return one.
func writeAll(w io.Writer, b []byte) error {
	n, err := w.Write(b)
	if err != nil {
		return err
	}
	if n != len(b) {
		return io.ErrShortWrite
	}
	return nil
}

// AppendFrame appends the frame for payload (header, then payload) to dst and
// returns the extended slice. It does not check the payload's size.
func AppendFrame(dst, payload []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...)
}
