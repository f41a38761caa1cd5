package schema

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/klauspost/compress/zstd"
)

// StreamWindow is the largest zstd window a streamed checkpoint body may
// declare: the decoder keeps one window of history, so this is its memory.
// Encoders pick at most 8 MiB at every level up to zstd 19 without --long
// (klauspost/compress at most 8 MiB, SpeedFastest 4 MiB).
const StreamWindow = 8 << 20

// CheckpointData validates the compressed data of a checkpoint decoded with
// [Options].StreamCheckpoints and writes the decompressed MessagePack to w,
// without ever holding the whole decompressed body: the zstd stream is read
// through a small buffer by a walker that checks what Decode checks for a
// checkpoint's data (one well-formed MessagePack map, nested at most
// MaxDepth, at most the checkpoint limit, and data.agent_state.status when
// present), while every byte it reads is copied to w. It returns the status
// and the number of bytes written.
//
// A payload error is a *ValidationError (reply INVALID_MESSAGE); an error
// from w is returned wrapped as it is (a storage failure). Whatever the
// outcome, w may have received a prefix: the caller discards it on error.
func (c *Codec) CheckpointData(zdata []byte, w io.Writer) (status string, n int64, err error) {
	limit := c.limits.Checkpoint
	fail := func(rule Rule, format string, args ...any) *ValidationError {
		return &ValidationError{Type: TypeCheckpoint, Field: "data", Rule: rule, Reason: clip.String(fmt.Sprintf(format, args...), maxErrReason)}
	}
	var h zstd.Header
	if err := h.Decode(zdata); err != nil {
		return "", 0, fail(RuleCompression, "compressed body does not decompress: not a zstd frame: %v", err)
	}
	window := h.WindowSize
	if h.SingleSegment {
		window = h.FrameContentSize
	}
	if window > StreamWindow {
		return "", 0, fail(RuleCompression, "the zstd frame declares a %d-byte window; at most %d is accepted for a checkpoint "+
			"(compress with zstd level 19 or below, without --long, or send it uncompressed)", window, StreamWindow)
	}
	dec, err := zstd.NewReader(bytes.NewReader(zdata),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(StreamWindow),
		zstd.WithDecoderMaxMemory(StreamWindow)) // the window; the output is capped by the LimitReader below
	if err != nil {
		return "", 0, fmt.Errorf("schema: creating a zstd decoder: %w", err)
	}
	defer dec.Close()
	tee := &teeCounter{r: io.LimitReader(dec, int64(limit)+1), w: w}
	sw := &streamWalker{br: bufio.NewReaderSize(tee, 64<<10)}
	status, werr := sw.checkpointData()
	if tee.werr != nil {
		return "", tee.n, tee.werr
	}
	if werr == nil {
		// The value must be all there is: read to the end (this also makes
		// sure every decompressed byte went through to w).
		if _, err := sw.br.ReadByte(); err == nil {
			werr = &walkError{int(sw.off), "trailing bytes after the value"}
		} else if !errors.Is(err, io.EOF) {
			werr = sw.readErr(err)
		}
	}
	if tee.werr != nil {
		return "", tee.n, tee.werr
	}
	if tee.n > int64(limit) {
		return "", tee.n, fail(RuleTooLarge, "checkpoint data is over its %d-byte limit", limit)
	}
	if werr == nil && h.HasFCS && uint64(tee.n) != h.FrameContentSize {
		return "", tee.n, fail(RuleCompression, "the zstd frame declares %d bytes but holds %d", h.FrameContentSize, tee.n)
	}
	if werr != nil {
		var ve *ValidationError
		if errors.As(werr, &ve) {
			return "", tee.n, ve
		}
		var ze *zstdError
		if errors.As(werr, &ze) {
			return "", tee.n, fail(RuleCompression, "compressed body does not decompress: %v", ze.err)
		}
		return "", tee.n, fail(RuleMalformed, "decompressed body is not one valid MessagePack value: %v", werr)
	}
	return status, tee.n, nil
}

// teeCounter copies what is read from r to w and counts it; a write error
// is kept apart from read errors.
type teeCounter struct {
	r    io.Reader
	w    io.Writer
	n    int64
	werr error
}

func (t *teeCounter) Read(p []byte) (int, error) {
	if t.werr != nil {
		return 0, t.werr
	}
	n, err := t.r.Read(p)
	if n > 0 {
		t.n += int64(n)
		if _, werr := t.w.Write(p[:n]); werr != nil {
			t.werr = werr
			return n, werr
		}
	}
	return n, err
}

// zstdError marks a failure of the decompressor (not of the MessagePack).
type zstdError struct{ err error }

func (e *zstdError) Error() string { return e.err.Error() }

// streamWalker is the bounds walk of walk.go over a stream: it checks one
// value without holding it, skipping payloads through the buffer.
type streamWalker struct {
	br   byteSource
	off  int64
	base int      // depth of the walked value's container (0: the value is the payload)
	key  [16]byte // a key short enough to be one we interpret
	// open: the containers checkpointData is inside, with what is left of
	// each, so that a walk stopped by a semantic fault can be finished.
	open []openContainer
}

// byteSource is what a streamWalker reads: a *bufio.Reader, or a tap
// (streamframe.go).
type byteSource interface {
	io.ByteReader
	io.Reader
	Discard(n int) (int, error)
}

func (w *streamWalker) readErr(err error) error {
	if errors.Is(err, io.EOF) {
		return &walkError{int(w.off), "value expected, input ended"}
	}
	return &zstdError{err}
}

func (w *streamWalker) byte() (byte, error) {
	c, err := w.br.ReadByte()
	if err != nil {
		return 0, w.readErr(err)
	}
	w.off++
	return c, nil
}

func (w *streamWalker) full(p []byte) error {
	n, err := io.ReadFull(w.br, p)
	w.off += int64(n)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return w.readErr(err)
	}
	return nil
}

func (w *streamWalker) discard(n uint64) error {
	for n > 0 {
		step := int(min(n, 1<<20))
		got, err := w.br.Discard(step)
		w.off += int64(got)
		n -= uint64(got)
		if err != nil {
			return w.readErr(err)
		}
	}
	return nil
}

// head reads a value's code and length header. For str, bin and ext, n is
// the payload length (ext: including its type byte); for arrays and maps,
// the element count (maps: pairs); kind is 0 for scalars and payloads, 1
// for arrays, 2 for maps.
func (w *streamWalker) head() (c byte, n uint64, kind int, err error) {
	if c, err = w.byte(); err != nil {
		return 0, 0, 0, err
	}
	hdr := 0
	switch {
	case c <= 0x7f || c >= 0xe0:
		return c, 0, 0, nil
	case c <= 0x8f:
		return c, uint64(c & 0x0f), 2, nil
	case c <= 0x9f:
		return c, uint64(c & 0x0f), 1, nil
	case c <= 0xbf:
		return c, uint64(c & 0x1f), 0, nil
	}
	switch c {
	case 0xc0, 0xc2, 0xc3:
		return c, 0, 0, nil
	case 0xc1:
		return 0, 0, 0, &walkError{int(w.off - 1), "reserved code 0xc1"}
	case 0xcc, 0xd0:
		return c, 1, 0, nil
	case 0xcd, 0xd1:
		return c, 2, 0, nil
	case 0xca, 0xce, 0xd2:
		return c, 4, 0, nil
	case 0xcb, 0xcf, 0xd3:
		return c, 8, 0, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return c, 1 + 1<<(c-0xd4), 0, nil
	case 0xc4, 0xd9, 0xc7:
		hdr = 1
	case 0xc5, 0xda, 0xc8:
		hdr = 2
	case 0xc6, 0xdb, 0xc9:
		hdr = 4
	case 0xdc:
		hdr, kind = 2, 1
	case 0xdd:
		hdr, kind = 4, 1
	case 0xde:
		hdr, kind = 2, 2
	case 0xdf:
		hdr, kind = 4, 2
	}
	var b [4]byte
	if err := w.full(b[:hdr]); err != nil {
		return 0, 0, 0, err
	}
	switch hdr {
	case 1:
		n = uint64(b[0])
	case 2:
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 4:
		n = uint64(binary.BigEndian.Uint32(b[:]))
	}
	if c >= 0xc7 && c <= 0xc9 {
		n++
	}
	return c, n, kind, nil
}

// value checks one value at depth.
func (w *streamWalker) value(depth int) error {
	_, n, kind, err := w.head()
	if err != nil {
		return err
	}
	return w.rest(n, kind, depth)
}

// rest checks what follows a head: a payload to skip or elements to walk.
func (w *streamWalker) rest(n uint64, kind, depth int) error {
	if kind == 0 {
		return w.discard(n)
	}
	if depth+w.base > MaxDepth {
		return &walkError{int(w.off), fmt.Sprintf("maps and arrays nested deeper than %d levels", MaxDepth)}
	}
	count := n * uint64(kind)
	for range count {
		if err := w.value(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// strKey reads a map key. ok reports a string key of at most len(w.key)
// bytes, returned in k (valid until the next call); other keys are skipped.
func (w *streamWalker) strKey(depth int) (k []byte, ok bool, err error) {
	c, n, kind, err := w.head()
	if err != nil {
		return nil, false, err
	}
	if !isStrCode(c) || n > uint64(len(w.key)) {
		return nil, false, w.rest(n, kind, depth)
	}
	if err := w.full(w.key[:n]); err != nil {
		return nil, false, err
	}
	return w.key[:n], true, nil
}

// checkpointData walks the data map, interpreting data.agent_state.status
// as Decode does (checkpointStatus): duplicate interpreted keys are
// malformed, agent_state must be a map (or nil), status one of the four.
func (w *streamWalker) checkpointData() (string, error) {
	fail := func(field string, rule Rule, format string, args ...any) error {
		return &ValidationError{Type: TypeCheckpoint, Field: field, Rule: rule, Reason: clip.String(fmt.Sprintf(format, args...), maxErrReason)}
	}
	c, n, kind, err := w.head()
	if err != nil {
		return "", err
	}
	if kind != 2 {
		if err := w.rest(n, kind, 1); err != nil {
			return "", err
		}
		return "", fail("data", RuleFieldType, "must be a map, got %s", describe([]byte{c}))
	}
	var status string
	seenState := false
	w.open = append(w.open[:0], openContainer{left: 2 * n, depth: 1})
	dm := len(w.open) - 1
	for range n {
		w.open[dm].left-- // the key
		k, ok, err := w.strKey(2)
		if err != nil {
			return "", err
		}
		if !ok || string(k) != "agent_state" {
			w.open[dm].left--
			if err := w.value(2); err != nil {
				return "", err
			}
			continue
		}
		if seenState {
			return "", fail("data.agent_state", RuleMalformed, "key %q occurs more than once", "agent_state")
		}
		seenState = true
		w.open[dm].left-- // the value, walked here
		c, sn, skind, err := w.head()
		if err != nil {
			return "", err
		}
		if c == 0xc0 {
			continue
		}
		if skind != 2 {
			if err := w.rest(sn, skind, 2); err != nil {
				return "", err
			}
			return "", fail("data.agent_state", RuleFieldType, "must be a map, got %s", describe([]byte{c}))
		}
		if 2+w.base > MaxDepth {
			return "", w.rest(sn, skind, 2)
		}
		w.open = append(w.open, openContainer{left: 2 * sn, depth: 2})
		am := len(w.open) - 1
		seenStatus := false
		for range sn {
			w.open[am].left-- // the key
			k, ok, err := w.strKey(3)
			if err != nil {
				return "", err
			}
			if !ok || string(k) != "status" {
				w.open[am].left--
				if err := w.value(3); err != nil {
					return "", err
				}
				continue
			}
			if seenStatus {
				return "", fail("data.agent_state.status", RuleMalformed, "key %q occurs more than once", "status")
			}
			seenStatus = true
			w.open[am].left-- // the value, walked here
			vc, vn, vkind, err := w.head()
			if err != nil {
				return "", err
			}
			if vc == 0xc0 {
				continue
			}
			if !isStrCode(vc) {
				if err := w.rest(vn, vkind, 3); err != nil {
					return "", err
				}
				return "", fail("data.agent_state.status", RuleFieldType, "must be a string, got %s", describe([]byte{vc}))
			}
			var buf [32]byte
			take := min(vn, uint64(len(buf)))
			if err := w.full(buf[:take]); err != nil {
				return "", err
			}
			if err := w.discard(vn - take); err != nil {
				return "", err
			}
			switch v := string(buf[:take]); {
			case vn == take && v == StatusIdle, vn == take && v == StatusThinking, vn == take && v == StatusActing, vn == take && v == StatusEvolving:
				status = v
			default:
				return "", fail("data.agent_state.status", RuleFieldValue, "must be one of idle, thinking, acting, evolving; got %q", clip.Bytes(buf[:take], 32))
			}
		}
		w.open = w.open[:am]
	}
	w.open = w.open[:0]
	return status, nil
}
