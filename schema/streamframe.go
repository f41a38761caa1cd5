package schema

import (
	"bytes"
	"errors"
	"io"
)

// StreamAbove is the frame size above which a frame from the agent can only
// be a checkpoint: every other type's limit is at or below it. A reader may
// hand such a frame to [Codec.DecodeCheckpointStream] instead of holding it.
func (c *Codec) StreamAbove() int {
	n := 0
	for _, t := range Types(FromAgent) {
		if t != TypeCheckpoint {
			n = max(n, c.limits.frame(t))
		}
	}
	return n
}

// StoreError is a failure of the writer a streamed checkpoint's data went
// to (storage, not the agent's payload): the checkpoint was valid but is
// not stored.
type StoreError struct{ Err error }

func (e *StoreError) Error() string { return "storing the checkpoint's data: " + e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// DecodeCheckpointStream is Decode for a frame from the agent of size
// bytes read from body, which is never held whole: the value of its data
// key, when it is a map, is checked as Decode checks a checkpoint's data
// while every byte of it is written, as it comes, to the writer open
// returns (opened at the first byte of it; "speculatively": the frame's
// other keys may come after it). The other values are kept (a frame's
// envelope: a few hundred bytes) and decoded as Decode would, with the
// data's bytes counted in the size checks.
//
// streamed reports that data was written to the writer. Then, with a nil
// err, msg is a *Checkpoint whose Data is nil (its bytes went to the
// writer) and whose Status is set; with an err, the writer's bytes are
// void. When nothing was streamed (data is not a map: a compressed body,
// or a frame that is not a checkpoint) the frame was kept and msg, err are
// Decode's on it.
//
// err is a *ValidationError (the frame is invalid, exactly as Decode
// would find it but for the byte offsets in its text), a *StoreError (the
// frame is valid; the writer failed), or the error body returned (the
// stream is broken: a framing error).
func (c *Codec) DecodeCheckpointStream(body io.Reader, size int, open func() (io.Writer, error)) (msg Message, streamed bool, err error) {
	t := &tap{r: body, buf: make([]byte, 64<<10)}
	sw := &streamWalker{br: t}
	var (
		kept     bytes.Buffer // the frame as Decode will see it
		dataSize int64
		status   string
		semErr   error // the data's first semantic fault (not structure)
		storeErr error
		werr     error // the first structural fault
	)
	first, err := t.peek()
	if err != nil {
		return nil, false, t.fail(err)
	}
	if !isMapCode(first) {
		return c.decodeKept(t, size)
	}
	t.setOut(&kept)
	_, n, _, herr := sw.head()
	werr = herr
	for i := uint64(0); werr == nil && i < n; i++ {
		t.flush()
		kstart := kept.Len()
		if werr = sw.value(2); werr != nil {
			break
		}
		t.flush()
		k := kept.Bytes()[kstart:]
		isData := !streamed && isStrCode(k[0]) && string(content(k)) == "data"
		if !isData {
			werr = sw.value(2)
			continue
		}
		c0, err := t.peek()
		if err != nil {
			werr = sw.readErr(err)
			break
		}
		if !isMapCode(c0) {
			// Not a map: kept, and Decode says what it is (a compressed
			// body, or the wrong type).
			werr = sw.value(2)
			continue
		}
		streamed = true
		var w io.Writer = io.Discard
		if ow, err := open(); err != nil {
			storeErr = err
		} else {
			w = ow
		}
		cw := &countWriter{w: w}
		t.setOut(cw)
		dw := &streamWalker{br: t, off: sw.off, base: 1}
		status, werr = dw.checkpointDataAll(&semErr)
		sw.off = dw.off
		t.setOut(&kept)
		dataSize = cw.n
		if cw.err != nil && storeErr == nil {
			storeErr = cw.err
		}
		kept.WriteByte(0x80) // Decode sees {} in its place
	}
	if werr == nil {
		// The value must be all the frame holds.
		if _, err := t.ReadByte(); err == nil {
			werr = &walkError{int(sw.off), "trailing bytes after the value"}
		} else if !errors.Is(err, io.EOF) {
			werr = sw.readErr(err)
		}
	}
	t.setOut(nil)
	if t.err != nil {
		return nil, streamed, t.err // the stream broke: not the payload's fault
	}
	if werr != nil {
		// Whatever the fault, the rest of the frame is read and dropped so
		// that the next frame can be read.
		if _, err := io.Copy(io.Discard, t); err != nil && t.err != nil {
			return nil, streamed, t.err
		}
		var ve *ValidationError
		if errors.As(werr, &ve) {
			return nil, streamed, ve
		}
		var we *walkError
		if errors.As(werr, &we) {
			return nil, streamed, malformed(we)
		}
		return nil, streamed, malformed(&walkError{int(sw.off), werr.Error()})
	}
	if !streamed {
		m, err := c.Decode(FromAgent, kept.Bytes())
		return m, false, err
	}
	msg, err = c.Decode(FromAgent, kept.Bytes())
	if err != nil {
		return nil, true, err
	}
	cp, ok := msg.(*Checkpoint)
	s := &decodeState{c: c, typ: msg.MessageType()}
	if !ok {
		limit := c.limits.frame(s.typ)
		return nil, true, s.fail("", RuleTooLarge, "%s of %d bytes is over its %d-byte limit", s.typ, size, limit)
	}
	if limit := c.limits.Checkpoint; dataSize > int64(limit) {
		return nil, true, s.fail("data", RuleTooLarge, "checkpoint data of %d bytes is over its %d-byte limit", dataSize, limit)
	}
	if semErr != nil {
		return nil, true, semErr
	}
	if storeErr != nil {
		return nil, true, &StoreError{Err: storeErr}
	}
	cp.Data, cp.Status = nil, status
	return cp, true, nil
}

// decodeKept reads the whole frame (it is not a map: Decode says why).
func (c *Codec) decodeKept(t *tap, size int) (Message, bool, error) {
	var b bytes.Buffer
	t.setOut(&b)
	if _, err := io.Copy(io.Discard, t); err != nil || t.err != nil {
		return nil, false, t.fail(err)
	}
	t.setOut(nil)
	m, err := c.Decode(FromAgent, b.Bytes())
	return m, false, err
}

// countWriter counts what it passes on, and keeps going (dropping) after
// the first error of w.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if c.err == nil {
		_, c.err = c.w.Write(p)
	}
	return len(p), nil
}

// tap is a buffered reader whose consumed bytes go, in chunks, to out (when
// set): the walker reads values through it, and each value's bytes are
// kept or streamed without a copy per byte.
type tap struct {
	r              io.Reader
	buf            []byte
	emit, pos, end int // buf[emit:pos] consumed, not yet given to out
	out            io.Writer
	err            error // from r, other than io.EOF: the stream broke
}

func (t *tap) flush() {
	if t.out != nil && t.pos > t.emit {
		t.out.Write(t.buf[t.emit:t.pos]) // out keeps its own error (countWriter, bytes.Buffer)
	}
	t.emit = t.pos
}

func (t *tap) setOut(w io.Writer) {
	t.flush()
	t.out = w
}

func (t *tap) fill() error {
	t.flush()
	n := copy(t.buf, t.buf[t.pos:t.end])
	t.pos, t.emit, t.end = 0, 0, n
	m, err := io.ReadAtLeast(t.r, t.buf[t.end:], 1)
	t.end += m
	if m > 0 {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return io.EOF
	}
	t.err = err
	return err
}

func (t *tap) fail(err error) error {
	if t.err != nil {
		return t.err
	}
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (t *tap) peek() (byte, error) {
	for t.pos == t.end {
		if err := t.fill(); err != nil {
			return 0, err
		}
	}
	return t.buf[t.pos], nil
}

func (t *tap) ReadByte() (byte, error) {
	c, err := t.peek()
	if err == nil {
		t.pos++
	}
	return c, err
}

func (t *tap) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := t.peek(); err != nil {
		return 0, err
	}
	n := copy(p, t.buf[t.pos:t.end])
	t.pos += n
	return n, nil
}

func (t *tap) Discard(n int) (int, error) {
	d := 0
	for d < n {
		if _, err := t.peek(); err != nil {
			return d, err
		}
		k := min(n-d, t.end-t.pos)
		t.pos += k
		d += k
	}
	return d, nil
}

// checkpointDataAll is checkpointData that walks the whole value even
// after a semantic fault (a bad status, a duplicate interpreted key), so
// that a structural fault later in the frame still wins, as in Decode; the
// first semantic fault is put in *sem.
func (w *streamWalker) checkpointDataAll(sem *error) (string, error) {
	status, err := w.checkpointData()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return status, err
	}
	*sem = ve
	// checkpointData stopped inside the data map: walk what is left of it
	// structurally (w.open: the containers it was inside).
	return "", w.finish()
}

// finish walks the rest of the containers in w.open, innermost first.
func (w *streamWalker) finish() error {
	for len(w.open) > 0 {
		top := &w.open[len(w.open)-1]
		if top.left == 0 {
			w.open = w.open[:len(w.open)-1]
			continue
		}
		top.left--
		if err := w.value(top.depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// openContainer is a map or array the walker is inside: left elements
// (keys and values counted apart) still to walk, at depth.
type openContainer struct {
	left  uint64
	depth int
}
