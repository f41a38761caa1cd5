package checkpoint

import (
	"fmt"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// The targets (SPEC §8): a realistic 100 MiB checkpoint stored — compressed
// and fsynced — in under 1 s, and loaded — decompressed and verified — in
// under 0.5 s, on 2 cores. Run with:
//
//	go test -run '^$' -bench 'Save|Load' -benchtime 3x ./checkpoint

func BenchmarkSave1MiB(b *testing.B)   { benchSave(b, genCheckpoint(1<<20, 2), 0) }
func BenchmarkSave100MiB(b *testing.B) { benchSave(b, checkpoint100MiB(b), 0) }
func BenchmarkLoad1MiB(b *testing.B)   { benchLoad(b, genCheckpoint(1<<20, 2)) }
func BenchmarkLoad100MiB(b *testing.B) { benchLoad(b, checkpoint100MiB(b)) }

// BenchmarkSaveLevel100MiB compares the levels Options.Level may take, to
// justify the default.
func BenchmarkSaveLevel100MiB(b *testing.B) {
	for _, l := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression} {
		b.Run(fmt.Sprint(l), func(b *testing.B) { benchSave(b, checkpoint100MiB(b), l) })
	}
}

func benchSave(b *testing.B, data []byte, level zstd.EncoderLevel) {
	s, err := Open(b.TempDir(), Options{Level: level, Retain: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	var stored int64
	for range b.N {
		m, err := s.Save(data, 1)
		if err != nil {
			b.Fatal(err)
		}
		stored = m.StoredSize
		b.StopTimer()
		if _, err := s.Prune(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(stored), "stored-bytes")
	b.ReportMetric(float64(stored)/float64(len(data)), "ratio")
}

func benchLoad(b *testing.B, data []byte) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := s.Save(data, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, _, err := s.Load(m.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(m.StoredSize), "stored-bytes")
}
