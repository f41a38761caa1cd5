package replica

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/wal"
)

// Chunks of every size decode to what was put in (a chunk of a few entries
// once failed with "window size exceeded": the encoder declares an 8 MiB
// window whatever the data's size), and any flipped byte is ErrCorrupt.
func TestChunkRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{1, 100, 1 << 10, 100 << 10, 2 << 20, 20 << 20} {
		b := &chunkBuilder{after: 41}
		var want []wal.Entry
		seq := uint64(41)
		for n := 0; n < size; {
			seq += 1 + uint64(rng.IntN(3)) // gaps are allowed
			d := make([]byte, 1+rng.IntN(min(size, 64<<10)))
			for i := range d {
				d[i] = byte(rng.IntN(16)) // compressible, not trivially
			}
			b.add(wal.Entry{Sequence: seq, Data: d})
			want = append(want, wal.Entry{Sequence: seq, Data: d})
			n += len(d)
		}
		data := b.encode(time.Now())
		o := object{Key: "k", After: 41, Last: seq, SHA: sum(data)}
		var got []wal.Entry
		if err := decodeChunk(o, data, func(e wal.Entry) error { got = append(got, e); return nil }); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d bytes: %d entries, want %d", size, len(got), len(want))
		}
		for i := range got {
			if got[i].Sequence != want[i].Sequence || !bytes.Equal(got[i].Data, want[i].Data) {
				t.Fatalf("%d bytes: entry %d differs", size, i)
			}
		}
		if size > 100<<10 {
			continue
		}
		for i := 0; i < len(data); i += max(1, len(data)/50) {
			bad := bytes.Clone(data)
			bad[i] ^= 0x40
			o := object{Key: "k", After: 41, Last: seq, SHA: sum(bad)} // even with a matching checksum
			err := decodeChunk(o, bad, func(wal.Entry) error { return nil })
			if err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
			}
			o.SHA = sum(data)
			if err := decodeChunk(o, bad, func(wal.Entry) error { return nil }); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("byte %d flipped: %v, want ErrCorrupt from the checksum", i, err)
			}
		}
	}
}
