package schema

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// errOverLimit marks a body that decompresses to more than its cap.
var errOverLimit = errors.New("decompressed body over the limit")

// sharedEncoder is one zstd encoder for the process; EncodeAll is safe for
// concurrent use and runs each call on its caller's goroutine.
var sharedEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(min(runtime.GOMAXPROCS(0), 4)),
	)
})

// smallEncoder writes single-segment frames. The shared encoder leaves the
// content size out of frames under 256 bytes that are not single-segment,
// and one-shot decoders in other languages (python-zstandard's decompress)
// refuse frames without it; every frame we send declares its size.
var smallEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(1),
		zstd.WithSingleSegment(true),
	)
})

// compress returns the zstd frame of src appended to dst. The frame
// declares its content size.
func compress(dst, src []byte) ([]byte, error) {
	get := sharedEncoder
	if len(src) <= zstd.MinWindowSize {
		get = smallEncoder
	}
	enc, err := get()
	if err != nil {
		return nil, fmt.Errorf("schema: creating the zstd encoder: %w", err)
	}
	return enc.EncodeAll(src, dst), nil
}

// compressedBytes turns a compressed body field into zstd bytes: the content
// of a bin, or a base64 str decoded. v has been walked.
func (s *decodeState) compressedBytes(v []byte) ([]byte, bool) {
	switch c := v[0]; {
	case isBinCode(c):
		return content(v), true
	case isStrCode(c):
		text := content(v)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			out := make([]byte, enc.DecodedLen(len(text)))
			if n, err := enc.Decode(out, text); err == nil {
				return out[:n], true
			}
		}
	}
	return nil, false
}

// maxInMemoryWindow caps the window of a zstd frame decoded into memory.
// The decoder reserves the declared window before it has produced a byte,
// so a frame may not declare more than its body could legitimately need.
const maxInMemoryWindow = 8 << 20

// decompress inflates the zstd data src, refusing to produce more than limit
// bytes. Memory follows what is really decoded, never what the frame
// declares: the frame's window must fit the body's limit (a 30-byte frame
// cannot reserve 100 MiB), the output starts small and doubles as bytes
// arrive, never past limit+1. Errors wrapping errOverLimit mean a cap was
// hit.
func (c *Codec) decompress(src []byte, limit int) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return nil, fmt.Errorf("not a zstd frame: %w", err)
	}
	if h.HasFCS && h.FrameContentSize > uint64(limit) {
		return nil, fmt.Errorf("%w: the zstd frame declares %d bytes, limit %d", errOverLimit, h.FrameContentSize, limit)
	}
	if err := checkWindow(h, limit); err != nil {
		return nil, err
	}
	// The declared content size is a claim, not a fact: never size the
	// buffer by it. Start from what the input could plausibly hold.
	hint := min(limit, max(4<<10, 8*len(src)))
	d, err := c.zstdDecoder()
	if err != nil {
		return nil, fmt.Errorf("creating a zstd decoder: %w", err)
	}
	defer c.putZstdDecoder(d)
	if err := d.Reset(bytes.NewReader(src)); err != nil {
		return nil, fmt.Errorf("starting zstd decoding: %w", err)
	}
	out, err := readCapped(d, limit, hint)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkWindow refuses a frame whose window is larger than a body of limit
// bytes needs (a single-segment frame's window is its content size, checked
// by the caller) or than maxInMemoryWindow.
func checkWindow(h zstd.Header, limit int) error {
	if h.SingleSegment {
		return nil
	}
	allowed := min(uint64(maxInMemoryWindow), max(uint64(2*limit), 1<<20))
	if h.WindowSize > allowed {
		return fmt.Errorf("%w: the zstd frame declares a %d-byte window, at most %d accepted for this body (compress with a smaller window, e.g. zstd level 19 or below without --long)",
			errOverLimit, h.WindowSize, allowed)
	}
	return nil
}

// readCapped reads r to its end into a buffer that starts at hint bytes and
// doubles, never beyond limit+1; one byte past limit is errOverLimit.
func readCapped(r io.Reader, limit, hint int) ([]byte, error) {
	buf := make([]byte, 0, max(1, min(hint, limit)+1))
	for {
		if len(buf) == cap(buf) {
			if len(buf) > limit {
				return nil, fmt.Errorf("%w: more than %d bytes", errOverLimit, limit)
			}
			next := make([]byte, len(buf), min(2*cap(buf), limit+1))
			copy(next, buf)
			buf = next
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return nil, fmt.Errorf("%w: more than %d bytes", errOverLimit, limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, fmt.Errorf("corrupt zstd data: %w", err)
		}
	}
}
