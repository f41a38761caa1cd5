package wal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	tidwall "github.com/tidwall/wal"
)

// The workload of SPEC §8: 1 KiB entries, appended one at a time or in
// batches of 100.
//
// BenchmarkAppend measures the log alone, per sync policy.
//
// BenchmarkCompare measures, in the same run, the machine's floor and
// tidwall/wal on the same workload, and reports ratios. The disk is shared
// and noisy, so the contenders run interleaved: each round gives every
// contender the same number of entries in turn, and each contender's
// entries/s is its entries over its own time summed across rounds.
//
//	go test -run '^$' -bench . -benchtime 1s ./wal/
const benchEntrySize = 1024

func benchEntries(n int) []Entry {
	es := make([]Entry, n)
	for i := range es {
		d := make([]byte, benchEntrySize)
		for j := range d {
			d[j] = byte(i*7 + j)
		}
		es[i] = Entry{Data: d}
	}
	return es
}

func BenchmarkAppend(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, p := range []SyncPolicy{SyncAlways, SyncBatch, SyncNone} {
			b.Run(fmt.Sprintf("batch=%d/%v", batch, p), func(b *testing.B) {
				var syncs int
				l, err := Open(Options{Dir: b.TempDir(), Sync: p, OnSync: func(time.Duration, int, int) { syncs++ }})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				es := benchEntries(batch)
				b.SetBytes(int64(batch * benchEntrySize))
				b.ResetTimer()
				start := time.Now()
				seq := uint64(0)
				for range b.N {
					for i := range es {
						seq++
						es[i].Sequence = seq
					}
					if _, err := l.Append(es...); err != nil {
						b.Fatal(err)
					}
				}
				// Durable (SyncNone: handed to the OS) before the clock stops.
				if err := l.WaitDurable(context.Background(), seq); err != nil {
					b.Fatal(err)
				}
				d := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N*batch)/d.Seconds(), "entries/s")
				if p != SyncNone {
					b.ReportMetric(float64(b.N*batch)/float64(max(syncs, 1)), "entries/fsync")
				}
			})
		}
	}
}

// contender is one way of making batches of entries durable.
type contender struct {
	name   string
	append func(es []Entry) error // one batch
	finish func() error           // end of a round: everything durable
	close  func()
	d      time.Duration
	n      int
}

func noFinish() error { return nil }

// fileContender writes the bytes our log would write for each batch (one
// record) and fdatasyncs: the floor. prezeroed overwrites a file filled with
// zeros beforehand (no allocation work per fsync).
func fileContender(b *testing.B, name string, prezeroed bool) *contender {
	const size = 256 << 20
	f, err := os.OpenFile(filepath.Join(b.TempDir(), name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if prezeroed {
		z := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(z)) {
			if _, err := f.WriteAt(z, off); err != nil {
				b.Fatal(err)
			}
		}
		if err := datasync(f); err != nil {
			b.Fatal(err)
		}
	}
	off := int64(0)
	var rec []byte
	return &contender{name: name, finish: noFinish, close: func() { f.Close() },
		append: func(es []Entry) error {
			rec = appendRecord(rec[:0], es)
			if off+int64(len(rec)) > size {
				if !prezeroed {
					if err := f.Truncate(0); err != nil {
						return err
					}
				}
				off = 0
			}
			if _, err := f.WriteAt(rec, off); err != nil {
				return err
			}
			off += int64(len(rec))
			return datasync(f)
		}}
}

func tidwallContender(b *testing.B) *contender {
	l, err := tidwall.Open(b.TempDir(), nil) // defaults: fsync after every write
	if err != nil {
		b.Fatal(err)
	}
	var wb tidwall.Batch
	idx := uint64(1)
	return &contender{name: "tidwall", finish: noFinish, close: func() { l.Close() },
		append: func(es []Entry) error {
			wb.Clear()
			for _, e := range es {
				wb.Write(idx, e.Data)
				idx++
			}
			return l.WriteBatch(&wb)
		}}
}

func logContender(b *testing.B, p SyncPolicy) *contender {
	l, err := Open(Options{Dir: b.TempDir(), Sync: p})
	if err != nil {
		b.Fatal(err)
	}
	seq := uint64(0)
	return &contender{name: p.String(), close: func() { l.Close() },
		append: func(es []Entry) error {
			for i := range es {
				seq++
				es[i].Sequence = seq
			}
			_, err := l.Append(es...)
			return err
		},
		finish: func() error { return l.WaitDurable(context.Background(), seq) }}
}

func BenchmarkCompare(b *testing.B) {
	for _, tc := range []struct{ batch, perRound int }{{1, 100}, {100, 2000}} {
		b.Run(fmt.Sprintf("batch=%d", tc.batch), func(b *testing.B) {
			cs := []*contender{
				fileContender(b, "floor", false),
				fileContender(b, "prezeroed", true),
				tidwallContender(b),
				logContender(b, SyncAlways),
				logContender(b, SyncBatch),
			}
			defer func() {
				for _, c := range cs {
					c.close()
				}
			}()
			es := benchEntries(tc.batch)
			b.ResetTimer()
			for round := range b.N {
				for k := range cs {
					c := cs[(round+k)%len(cs)] // rotate who goes first
					start := time.Now()
					for range tc.perRound / tc.batch {
						if err := c.append(es); err != nil {
							b.Fatalf("%s: %v", c.name, err)
						}
					}
					if err := c.finish(); err != nil {
						b.Fatalf("%s: %v", c.name, err)
					}
					c.d += time.Since(start)
					c.n += tc.perRound
				}
			}
			b.StopTimer()
			rate := map[string]float64{}
			for _, c := range cs {
				rate[c.name] = float64(c.n) / c.d.Seconds()
				b.ReportMetric(rate[c.name], c.name+"_entries/s")
			}
			for _, ours := range []string{"always", "batch"} {
				for _, base := range []string{"floor", "prezeroed", "tidwall"} {
					b.ReportMetric(rate[ours]/rate[base], ours+"/"+base)
				}
			}
			b.ReportMetric(0, "ns/op") // a round's time says little; the rates do
		})
	}
}

// BenchmarkReadAfter reads back a log of 20,000 1 KiB entries.
func BenchmarkReadAfter(b *testing.B) {
	l, n := benchFilledLog(b, 20000)
	defer l.Close()
	b.SetBytes(int64(n * benchEntrySize))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		got := 0
		if err := l.ReadAfter(0, func(Entry) error { got++; return nil }); err != nil || got != n {
			b.Fatalf("read %d of %d: %v", got, n, err)
		}
	}
	b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "entries/s")
}

// BenchmarkRecover opens (verifies every record of) the same log.
func BenchmarkRecover(b *testing.B) {
	l, n := benchFilledLog(b, 20000)
	dir := l.dir
	l.Close()
	b.SetBytes(int64(n * benchEntrySize))
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		l, err := Open(Options{Dir: dir, NoPreallocate: true})
		if err != nil {
			b.Fatal(err)
		}
		if got := l.Recovery().Entries; got != n {
			b.Fatalf("recovered %d entries, want %d", got, n)
		}
		l.Close()
	}
	b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "entries/s")
}

func benchFilledLog(b *testing.B, n int) (*Log, int) {
	l, err := Open(Options{Dir: b.TempDir(), Sync: SyncNone, NoPreallocate: true, SegmentSize: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	es := benchEntries(100)
	for s := 0; s < n; s += 100 {
		for i := range es {
			es[i].Sequence = uint64(s + i + 1)
		}
		if _, err := l.Append(es...); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Sync(); err != nil {
		b.Fatal(err)
	}
	return l, n
}
