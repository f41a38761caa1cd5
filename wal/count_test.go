package wal

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// countByReading returns what CountAfter must return for every after: the
// log read once, entry by entry.
func countByReading(t *testing.T, l *Log) func(after uint64) (n int, bytes int64, last uint64) {
	t.Helper()
	var seqs []uint64
	var cum []int64 // cum[i]: data bytes of entries 0..i-1
	cum = append(cum, 0)
	if err := l.ReadAfter(0, func(e Entry) error {
		seqs = append(seqs, e.Sequence)
		cum = append(cum, cum[len(cum)-1]+int64(len(e.Data)))
		return nil
	}); err != nil {
		t.Fatalf("ReadAfter: %v", err)
	}
	return func(after uint64) (int, int64, uint64) {
		i, _ := slices.BinarySearch(seqs, after+1) // the first entry above after
		if i == len(seqs) {
			return 0, 0, after
		}
		return len(seqs) - i, cum[len(seqs)] - cum[i], seqs[len(seqs)-1]
	}
}

// checkCounts compares CountAfter with a read at every boundary that
// matters (each segment's edges, sequences inside and between records, the
// gaps) and at random points.
func checkCounts(t *testing.T, what string, l *Log, seqs []uint64, rng *rand.Rand) {
	t.Helper()
	afters := []uint64{0, 1, seqs[len(seqs)-1], seqs[len(seqs)-1] + 5}
	l.segMu.RLock()
	for _, s := range l.segs {
		afters = append(afters, s.prevLast, s.prevLast+1, s.first, s.last, s.last+1)
		for _, p := range s.points {
			afters = append(afters, p.last-1, p.last, p.last+1)
		}
	}
	l.segMu.RUnlock()
	for range 200 {
		afters = append(afters, seqs[rng.IntN(len(seqs))]+uint64(rng.IntN(3))-1)
	}
	want := countByReading(t, l)
	points := 0
	l.segMu.RLock()
	for _, s := range l.segs {
		points += len(s.points)
	}
	l.segMu.RUnlock()
	if points == 0 {
		t.Fatalf("%s: no count points: the test does not exercise them", what)
	}
	for _, after := range afters {
		wantN, wantB, wantLast := want(after)
		n, b, last, err := l.CountAfter(after)
		if err != nil {
			t.Fatalf("%s: CountAfter(%d): %v", what, after, err)
		}
		if n != wantN || b != wantB || last != wantLast {
			t.Fatalf("%s: CountAfter(%d) = %d entries, %d bytes, last %d; reading gives %d, %d, %d", what, after, n, b, last, wantN, wantB, wantLast)
		}
	}
}

// CountAfter agrees with reading the entries, over segments with count
// points, records of several entries, sequence gaps, and a log changed by
// every operation that changes what a segment holds: appends, recovery
// (Open), TruncateAfter (in place and by rewriting), TruncateBefore and a
// segment rolled over.
func TestCountAfterAgreesWithReading(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = 2 << 20 // several count points per segment
	rng := rand.New(rand.NewPCG(7, 11))
	l := mustOpen(t, o)
	var seqs []uint64
	seq := uint64(0)
	appendSome := func(n int) {
		for range n {
			k := 1 + rng.IntN(4)
			es := make([]Entry, k)
			for i := range es {
				seq += 1 + uint64(rng.IntN(3)/2) // some gaps
				es[i] = Entry{Sequence: seq, Data: make([]byte, 10+rng.IntN(3000))}
				seqs = append(seqs, seq)
			}
			mustAppend(t, l, es...)
		}
	}
	appendSome(1500) // about 5.6 MB: three segments
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.segMu.RLock()
	nsegs := len(l.segs)
	l.segMu.RUnlock()
	if nsegs < 3 {
		t.Fatalf("%d segments, want at least 3", nsegs)
	}
	checkCounts(t, "appended", l, seqs, rng)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	defer func() { l.Close() }()
	checkCounts(t, "recovered", l, seqs, rng)

	// Cut inside a record (rewrite), then at a record boundary (in place).
	cut := seqs[len(seqs)*2/3]
	if _, err := l.TruncateAfter(cut - 1); err != nil {
		t.Fatal(err)
	}
	for len(seqs) > 0 && seqs[len(seqs)-1] > cut-1 {
		seqs = seqs[:len(seqs)-1]
	}
	checkCounts(t, "cut", l, seqs, rng)
	appendSome(300)
	checkCounts(t, "cut and appended", l, seqs, rng)
	if _, err := l.TruncateBefore(seqs[len(seqs)/3]); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, "truncated before", l, seqs[len(seqs)/3:], rng)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	checkCounts(t, "all of it recovered", l, seqs[len(seqs)/3:], rng)
}

// CountAfter runs beside the syncer appending count points (for the race
// detector), and what it counts never goes backwards while the log only
// grows.
func TestCountAfterConcurrentWithAppends(t *testing.T) {
	o := testOptions(t, t.TempDir())
	o.SegmentSize = 1 << 20
	l := mustOpen(t, o)
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := uint64(1); s <= 4000; s++ {
			if _, err := l.Append(Entry{Sequence: s, Data: make([]byte, 700)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	prev := 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		n, b, last, err := l.CountAfter(0)
		if err != nil {
			t.Fatal(err)
		}
		if n < prev || b != int64(n)*700 || (n > 0 && last != uint64(n)) {
			t.Fatalf("CountAfter(0) = %d entries, %d bytes, last %d (before: %d entries)", n, b, last, prev)
		}
		prev = n
	}
	if n, _, _, _ := l.CountAfter(0); n != 4000 {
		t.Fatalf("CountAfter(0) = %d at the end, want 4000", n)
	}
}
