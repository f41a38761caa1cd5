package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/wal"
)

// A chunk holds the WAL entries with sequences in (After, Last], the last
// one at Last. Its object is a 48-byte header then one zstd frame of the
// entries (all integers big-endian):
//
//	0   8  magic "SVREPCK1"
//	8   8  After
//	16  8  Last
//	24  4  number of entries (≥ 1)
//	28  4  zero
//	32  8  length of the decompressed entries
//	40  8  cut time, unix milliseconds
//	48  …  zstd frame of: per entry, sequence (8), length (4), bytes
//
// The object's SHA-256 is in its name; the header repeats what the name
// says, so a renamed object is caught too.

const (
	chunkMagic     = "SVREPCK1"
	chunkHeaderLen = 48
	// chunkTarget is the raw bytes a chunk gathers before it is cut (a
	// single larger entry makes a chunk of its own).
	chunkTarget = 16 << 20
	// maxChunkRaw bounds what a chunk may claim to decompress to: the
	// output buffer is allocated from the header, so never beyond this.
	maxChunkRaw = 512 << 20
)

var (
	chunkEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
)

// chunkBuilder gathers entries for one chunk.
type chunkBuilder struct {
	after uint64
	last  uint64
	count int
	raw   bytes.Buffer
}

func (b *chunkBuilder) add(e wal.Entry) {
	var h [12]byte
	binary.BigEndian.PutUint64(h[:8], e.Sequence)
	binary.BigEndian.PutUint32(h[8:], uint32(len(e.Data)))
	b.raw.Write(h[:])
	b.raw.Write(e.Data)
	b.last = e.Sequence
	b.count++
}

// encode returns the chunk's object bytes.
func (b *chunkBuilder) encode(cut time.Time) []byte {
	out := make([]byte, chunkHeaderLen, chunkHeaderLen+b.raw.Len()/2+64)
	copy(out, chunkMagic)
	binary.BigEndian.PutUint64(out[8:], b.after)
	binary.BigEndian.PutUint64(out[16:], b.last)
	binary.BigEndian.PutUint32(out[24:], uint32(b.count))
	binary.BigEndian.PutUint64(out[32:], uint64(b.raw.Len()))
	binary.BigEndian.PutUint64(out[40:], uint64(cut.UnixMilli()))
	return chunkEncoder.EncodeAll(b.raw.Bytes(), out)
}

// decodeChunk checks a downloaded chunk against its name (o) and calls fn
// for each entry in order. Any mismatch is ErrCorrupt naming the object.
func decodeChunk(o object, b []byte, fn func(wal.Entry) error) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, o.Key, fmt.Sprintf(format, args...))
	}
	if got := sum(b); got != o.SHA {
		return bad("SHA-256 is %s, its name says %s", got[:16]+"…", o.SHA[:16]+"…")
	}
	if len(b) < chunkHeaderLen || string(b[:8]) != chunkMagic {
		return bad("not a WAL chunk (bad magic)")
	}
	after, last := binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
	count, rawLen := binary.BigEndian.Uint32(b[24:]), binary.BigEndian.Uint64(b[32:])
	if after != o.After || last != o.Last {
		return bad("header says (%d, %d], the name (%d, %d]", after, last, o.After, o.Last)
	}
	if count == 0 || rawLen > maxChunkRaw || rawLen < uint64(count)*12 {
		return bad("header claims %d entries in %d bytes", count, rawLen)
	}
	// The window the frame may declare is capped (the encoder's is 8 MiB at
	// most, or the data's size): a hostile header cannot make it reserve more.
	window := min(max(rawLen, 8<<20), maxChunkRaw)
	dec, err := zstd.NewReader(bytes.NewReader(b[chunkHeaderLen:]), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(window+1), zstd.WithDecoderMaxWindow(window))
	if err != nil {
		return bad("%v", err)
	}
	defer dec.Close()
	raw := make([]byte, rawLen)
	if _, err := io.ReadFull(dec, raw); err != nil {
		return bad("decompress: %v", err)
	}
	if n, _ := dec.Read(make([]byte, 1)); n != 0 {
		return bad("decompresses to more than the %d bytes its header claims", rawLen)
	}
	prev := after
	for i := uint32(0); i < count; i++ {
		if len(raw) < 12 {
			return bad("entry %d cut short", i)
		}
		seq, n := binary.BigEndian.Uint64(raw), binary.BigEndian.Uint32(raw[8:])
		raw = raw[12:]
		if uint64(n) > uint64(len(raw)) || seq <= prev || seq > last {
			return bad("entry %d (sequence %d, %d bytes) out of place", i, seq, n)
		}
		if err := fn(wal.Entry{Sequence: seq, Data: raw[:n:n]}); err != nil {
			return err
		}
		raw, prev = raw[n:], seq
	}
	if len(raw) != 0 || prev != last {
		return bad("entries end at %d with %d bytes left; the header says %d", prev, len(raw), last)
	}
	return nil
}
