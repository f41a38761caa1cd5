package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// payload is the deterministic data of entry seq, 1..300 bytes.
func payload(seq uint64) []byte {
	b := make([]byte, 1+int(seq*7919%300))
	for i := range b {
		b[i] = byte(seq*31 + uint64(i))
	}
	return b
}

// seqEntries returns entries from..to (inclusive) with payload data.
func seqEntries(from, to uint64) []Entry {
	var es []Entry
	for s := from; s <= to; s++ {
		es = append(es, Entry{Sequence: s, Data: payload(s)})
	}
	return es
}

func testLogger(t testing.TB) *slog.Logger {
	if tt, ok := t.(*testing.T); ok && testing.Verbose() {
		return slog.New(slog.NewTextHandler(tt.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func testOptions(t testing.TB, dir string) Options {
	return Options{Dir: dir, SegmentSize: 64 << 10, NoPreallocate: true, Logger: testLogger(t)}
}

func mustOpen(t testing.TB, o Options) *Log {
	t.Helper()
	l, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func mustAppend(t testing.TB, l *Log, es ...Entry) AppendResult {
	t.Helper()
	res, err := l.Append(es...)
	if err != nil {
		t.Fatalf("Append(%d..): %v", es[0].Sequence, err)
	}
	return res
}

// readAll returns copies of the entries ReadAfter serves.
func readAll(t testing.TB, l *Log, after uint64) []Entry {
	t.Helper()
	var out []Entry
	if err := l.ReadAfter(after, func(e Entry) error {
		out = append(out, Entry{Sequence: e.Sequence, Data: slices.Clone(e.Data)})
		return nil
	}); err != nil {
		t.Fatalf("ReadAfter(%d): %v", after, err)
	}
	return out
}

func readDirAll(dir string, after uint64) ([]Entry, error) {
	var out []Entry
	err := ReadDir(dir, after, func(e Entry) error {
		out = append(out, Entry{Sequence: e.Sequence, Data: slices.Clone(e.Data)})
		return nil
	})
	return out, err
}

func sameEntries(t testing.TB, what string, got, want []Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d (got %v..., want %v...)", what, len(got), len(want), seqs(got, 5), seqs(want, 5))
	}
	for i := range got {
		if got[i].Sequence != want[i].Sequence || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("%s: entry %d is %d (%d bytes), want %d (%d bytes)", what, i, got[i].Sequence, len(got[i].Data), want[i].Sequence, len(want[i].Data))
		}
	}
}

func seqs(es []Entry, n int) []uint64 {
	var s []uint64
	for i, e := range es {
		if i == n {
			break
		}
		s = append(s, e.Sequence)
	}
	return s
}

func TestParseSyncPolicy(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    SyncPolicy
		wantErr bool
	}{
		{"batch", SyncBatch, false},
		{"always", SyncAlways, false},
		{"none", SyncNone, false},
		{"", 0, true},
		{"Always", 0, true},
		{"fsync", 0, true},
	} {
		got, err := ParseSyncPolicy(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseSyncPolicy(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err == nil && got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
		if want := fmt.Sprintf("must be always, batch or none, got %q", tc.in); err != nil && err.Error() != want {
			t.Errorf("ParseSyncPolicy(%q) error %q, want %q", tc.in, err, want)
		}
	}
}

func TestOpenOptions(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"empty dir", Options{}},
		{"segment below minimum", Options{Dir: dir, SegmentSize: 100}},
		{"negative sync interval", Options{Dir: dir, SyncInterval: -1}},
		{"unknown policy", Options{Dir: dir, Sync: 7}},
	} {
		if l, err := Open(tc.o); err == nil {
			l.Close()
			t.Errorf("%s: Open succeeded", tc.name)
		}
	}
}

// TestRoundTrip appends singles and batches under every policy, with and
// without preallocation, reads them back, reopens and reads again.
func TestRoundTrip(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncNone} {
		for _, prealloc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/prealloc=%v", policy, prealloc), func(t *testing.T) {
				dir := t.TempDir()
				o := testOptions(t, dir)
				o.Sync, o.NoPreallocate, o.SegmentSize = policy, !prealloc, 16<<10
				l := mustOpen(t, o)
				var want []Entry
				for s := uint64(1); s <= 300; {
					n := uint64(1 + s%7)
					es := seqEntries(s, s+n-1)
					res := mustAppend(t, l, es...)
					if res.Appended != len(es) || res.Duplicates != 0 || len(res.Gaps) != 0 || res.Last != s+n-1 {
						t.Fatalf("Append(%d..%d) = %+v", s, s+n-1, res)
					}
					want = append(want, es...)
					s += n
				}
				if err := l.WaitDurable(t.Context(), 1<<62); err != nil {
					t.Fatalf("WaitDurable: %v", err)
				}
				if got := l.DurableSequence(); got != 300 {
					t.Fatalf("DurableSequence = %d, want 300", got)
				}
				sameEntries(t, "ReadAfter(0)", readAll(t, l, 0), want)
				sameEntries(t, "ReadAfter(123)", readAll(t, l, 123), want[123:])
				sameEntries(t, "ReadAfter(300)", readAll(t, l, 300), nil)
				if err := l.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if err := l.Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}

				l = mustOpen(t, o)
				defer l.Close()
				rec := l.Recovery()
				if rec.Corruption != nil || rec.TruncatedBytes != 0 || rec.Entries != 300 || rec.Segments < 2 {
					t.Fatalf("Recovery = %+v", rec)
				}
				if l.LastSequence() != 300 || l.DurableSequence() != 300 || l.FirstSequence() != 1 {
					t.Fatalf("after reopen: last %d durable %d first %d", l.LastSequence(), l.DurableSequence(), l.FirstSequence())
				}
				sameEntries(t, "after reopen", readAll(t, l, 0), want)
				got, err := readDirAll(dir, 0)
				if err != nil {
					t.Fatalf("ReadDir: %v", err)
				}
				sameEntries(t, "ReadDir", got, want)
				got, err = readDirAll(dir, 250)
				if err != nil {
					t.Fatalf("ReadDir(250): %v", err)
				}
				sameEntries(t, "ReadDir(250)", got, want[250:])
				mustAppend(t, l, seqEntries(301, 301)...)
				if l.LastSequence() != 301 {
					t.Fatalf("LastSequence = %d after appending 301", l.LastSequence())
				}
			})
		}
	}
}

func TestDuplicatesAndGaps(t *testing.T) {
	e := func(s ...uint64) []Entry {
		var es []Entry
		for _, q := range s {
			es = append(es, Entry{Sequence: q, Data: payload(q)})
		}
		return es
	}
	for _, tc := range []struct {
		name      string
		last      uint64 // appended first: 1..last
		in        []Entry
		appended  int
		dups      int
		gaps      []Gap
		wantLast  uint64
		wantInLog []uint64 // sequences after last
	}{
		{"continues", 3, e(4, 5), 2, 0, nil, 5, []uint64{4, 5}},
		{"replay entirely duplicate", 3, e(1, 2, 3), 0, 3, nil, 3, nil},
		{"replay overlapping", 3, e(2, 3, 4, 5), 2, 2, nil, 5, []uint64{4, 5}},
		{"repeat inside batch", 3, e(4, 4, 5, 5), 2, 2, nil, 5, []uint64{4, 5}},
		{"sequence zero is a duplicate", 0, e(0, 1), 1, 1, nil, 1, []uint64{1}},
		{"gap", 3, e(7), 1, 0, []Gap{{3, 7}}, 7, []uint64{7}},
		{"gaps inside batch", 3, e(5, 6, 9), 3, 0, []Gap{{3, 5}, {6, 9}}, 9, []uint64{5, 6, 9}},
		{"first entry of an empty log above 1", 0, e(10), 1, 0, []Gap{{0, 10}}, 10, []uint64{10}},
		{"empty append", 3, nil, 0, 0, nil, 3, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustOpen(t, testOptions(t, t.TempDir()))
			defer l.Close()
			if tc.last > 0 {
				mustAppend(t, l, seqEntries(1, tc.last)...)
			}
			res, err := l.Append(tc.in...)
			if err != nil {
				t.Fatal(err)
			}
			if res.Appended != tc.appended || res.Duplicates != tc.dups || !slices.Equal(res.Gaps, tc.gaps) || res.Last != tc.wantLast {
				t.Fatalf("Append = %+v, want appended %d dups %d gaps %v last %d", res, tc.appended, tc.dups, tc.gaps, tc.wantLast)
			}
			var got []uint64
			for _, e := range readAll(t, l, tc.last) {
				got = append(got, e.Sequence)
			}
			if !slices.Equal(got, tc.wantInLog) {
				t.Fatalf("log after %d holds %v, want %v", tc.last, got, tc.wantInLog)
			}
		})
	}
}

func TestOutOfOrder(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 3)...)
	_, err := l.Append(Entry{Sequence: 5}, Entry{Sequence: 4})
	if !errors.Is(err, ErrOutOfOrder) {
		t.Fatalf("Append(5, 4) = %v, want ErrOutOfOrder", err)
	}
	if l.LastSequence() != 3 {
		t.Fatalf("LastSequence = %d after a rejected append, want 3", l.LastSequence())
	}
	mustAppend(t, l, seqEntries(4, 5)...)
}

func TestSegmentRollover(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = MinSegmentSize
	l := mustOpen(t, o)
	var want []Entry
	for s := uint64(1); s <= 200; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	// A record larger than a whole segment gets a segment of its own.
	big := Entry{Sequence: 201, Data: bytes.Repeat([]byte{0xab}, 3*MinSegmentSize)}
	mustAppend(t, l, big)
	want = append(want, big)
	want = append(want, mustAppendOne(t, l, 202))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	idx, err := listSegments(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx) < 10 {
		t.Fatalf("%d segments, want many at a %d-byte limit", len(idx), MinSegmentSize)
	}
	for i, x := range idx {
		if x != uint64(i+1) {
			t.Fatalf("segment indexes %v are not 1..n", idx)
		}
		fi, err := os.Stat(segmentPath(dir, x))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > MinSegmentSize && fi.Size() < 3*MinSegmentSize {
			t.Fatalf("segment %d is %d bytes, over the limit without an oversized record", x, fi.Size())
		}
	}
	l = mustOpen(t, o)
	defer l.Close()
	if rec := l.Recovery(); rec.Corruption != nil || rec.Segments != len(idx) || rec.Entries != len(want) {
		t.Fatalf("Recovery = %+v", rec)
	}
	sameEntries(t, "after rollover", readAll(t, l, 0), want)
}

func mustAppendOne(t testing.TB, l *Log, s uint64) Entry {
	t.Helper()
	e := Entry{Sequence: s, Data: payload(s)}
	mustAppend(t, l, e)
	return e
}

// halfFull opens a preallocating log of 32 KiB segments in dir and fills
// its first segment past half with entries 1..150: that starts preparing
// the second.
func halfFull(t *testing.T, dir string) (Options, *Log, []Entry) {
	t.Helper()
	o := testOptions(t, dir)
	o.NoPreallocate = false
	o.SegmentSize = 32 << 10
	l := mustOpen(t, o)
	var want []Entry
	for s := uint64(1); s <= 150; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	return o, l, want
}

func TestPreallocatedSegments(t *testing.T) {
	dir := t.TempDir()
	o, l, want := halfFull(t, dir)
	s := uint64(151)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	waitPrepared(t, l)
	for ; s <= 600; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	idx, _ := listSegments(dir)
	if len(idx) < 3 {
		t.Fatalf("only %d segments", len(idx))
	}
	// The first segment is prepared at Open, the second was waited for.
	for _, x := range idx[:2] {
		if fi, _ := os.Stat(segmentPath(dir, x)); fi.Size() != o.SegmentSize {
			t.Errorf("segment %d is %d bytes, want preallocated %d", x, fi.Size(), o.SegmentSize)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*"+tmpSuffix)); len(m) != 0 {
		t.Fatalf("Close left temporary files: %v", m)
	}
	l = mustOpen(t, o)
	defer l.Close()
	if rec := l.Recovery(); rec.Corruption != nil || rec.TruncatedBytes != 0 || rec.Entries != 600 {
		t.Fatalf("Recovery = %+v", rec)
	}
	sameEntries(t, "preallocated", readAll(t, l, 0), want)
	info, err := Inspect(dir)
	if err != nil || info.Corruption != nil || info.Entries != 600 || info.Last != 600 || info.First != 1 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
}

// waitPrepared waits until l's preparer holds a ready file.
func waitPrepared(t *testing.T, l *Log) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		l.prep.mu.Lock()
		ready := l.prep.ready != nil
		l.prep.mu.Unlock()
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the next segment was not prepared")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A prepared segment outlives the log that prepared it (a Close, or a
// process killed): the next Open adopts the same file rather than writing
// and fsyncing a segment of zeros again during a restart. One of another
// size is removed, and so is one left when preallocation is off.
func TestPreparedSegmentKeptAcrossRuns(t *testing.T) {
	dir := t.TempDir()
	o, l, want := halfFull(t, dir)
	s := uint64(151)
	waitPrepared(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(dir, preparedName)
	before, err := os.Stat(kept)
	if err != nil {
		t.Fatalf("the prepared segment was not kept: %v", err)
	}
	l = mustOpen(t, o)
	for ; s <= 300; s++ { // rolls into the second segment
		want = append(want, mustAppendOne(t, l, s))
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	idx, _ := listSegments(dir)
	if len(idx) < 2 {
		t.Fatalf("only %d segments", len(idx))
	}
	second, err := os.Stat(segmentPath(dir, idx[1]))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, second) {
		t.Fatal("the second segment is not the file the first run prepared")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	sameEntries(t, "after adopting the prepared segment", readAll(t, l, 0), want)
	l.Close()

	// Another segment size: the kept file is not used.
	if err := os.WriteFile(kept, make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	l.Close()
	if fi, err := os.Stat(kept); err == nil && fi.Size() != o.SegmentSize {
		t.Fatalf("a prepared file of the wrong size (%d bytes) was kept", fi.Size())
	}
	// Preallocation off: a kept file is removed.
	if err := os.WriteFile(kept, make([]byte, o.SegmentSize), 0o600); err != nil {
		t.Fatal(err)
	}
	o.NoPreallocate = true
	l = mustOpen(t, o)
	l.Close()
	if _, err := os.Stat(kept); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a kept prepared file with preallocation off: %v", err)
	}
}

func TestTruncateBefore(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = MinSegmentSize
	l := mustOpen(t, o)
	defer l.Close()
	var want []Entry
	for s := uint64(1); s <= 100; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	before, _ := listSegments(dir)
	if len(before) < 6 {
		t.Fatalf("only %d segments", len(before))
	}
	l.segMu.RLock()
	wm := l.segs[3].last // segments 1..4 are wholly ≤ wm
	l.segMu.RUnlock()
	n, err := l.TruncateBefore(wm)
	if err != nil || n != 4 {
		t.Fatalf("TruncateBefore(%d) = %d, %v; want 4 segments", wm, n, err)
	}
	after, _ := listSegments(dir)
	if len(after) != len(before)-4 || after[0] != before[4] {
		t.Fatalf("segments %v after truncating %v", after, before)
	}
	if l.FirstSequence() != wm+1 {
		t.Fatalf("FirstSequence = %d, want %d", l.FirstSequence(), wm+1)
	}
	sameEntries(t, "after TruncateBefore", readAll(t, l, wm), want[wm:])
	// The active segment is never deleted, whatever the watermark.
	n, err = l.TruncateBefore(1 << 62)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := listSegments(dir); len(got) != 1 || n != len(after)-1 {
		t.Fatalf("TruncateBefore(max) removed %d, left %v", n, got)
	}
	if l.LastSequence() != 100 {
		t.Fatalf("LastSequence = %d", l.LastSequence())
	}
	mustAppendOne(t, l, 101)
	l.Close()
	l2 := mustOpen(t, o)
	defer l2.Close()
	if rec := l2.Recovery(); rec.Corruption != nil || l2.LastSequence() != 101 {
		t.Fatalf("reopen after truncation: %+v, last %d", rec, l2.LastSequence())
	}
	// Replays of entries still held are recognized after the old segments
	// are gone; an entry below the floor cannot be checked, so it is a
	// conflict, never silently dropped.
	floor := l2.Floor()
	if floor == 0 || floor >= 100 {
		t.Fatalf("Floor = %d after truncation, want between 0 and 100", floor)
	}
	if res, err := l2.Append(seqEntries(floor+1, 101)...); err != nil || res.Duplicates != int(101-floor) || res.Appended != 0 {
		t.Fatalf("replay after truncation: %+v, %v", res, err)
	}
	var ce *SequenceConflictError
	if _, err := l2.Append(seqEntries(floor, 101)...); !errors.As(err, &ce) || ce.Sequence != floor || !strings.Contains(ce.Reason, "oldest sequence the log still holds") {
		t.Fatalf("replay from below the floor: %v, want a SequenceConflictError at %d", err, floor)
	}
}

// A reader whose next segments are deleted under it (TruncateBefore, as a
// checkpoint moves the floor while a restore or the replicator reads) gets
// ErrTruncated, never the entries after them as if nothing were missing.
func TestReadAfterSegmentsDeletedUnderIt(t *testing.T) {
	o := testOptions(t, t.TempDir())
	o.SegmentSize = MinSegmentSize
	l := mustOpen(t, o)
	defer l.Close()
	for s := uint64(1); s <= 100; s++ {
		mustAppendOne(t, l, s)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	l.segMu.RLock()
	if len(l.segs) < 6 {
		l.segMu.RUnlock()
		t.Fatalf("only %d segments", len(l.segs))
	}
	firstOf2, wm := l.segs[1].prevLast+1, l.segs[3].last // reading segment 2; segments 1..4 are wholly ≤ wm
	l.segMu.RUnlock()
	var got []uint64
	err := l.ReadAfter(0, func(e Entry) error {
		got = append(got, e.Sequence)
		if e.Sequence == firstOf2 {
			if n, err := l.TruncateBefore(wm); err != nil || n != 4 {
				t.Fatalf("TruncateBefore(%d) = %d, %v; want 4 segments", wm, n, err)
			}
		}
		return nil
	})
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("ReadAfter with segments 3 and 4 deleted under it: %v after %d entries (last %d); want ErrTruncated", err, len(got), got[len(got)-1])
	}
	for i, s := range got {
		if s != uint64(i+1) {
			t.Fatalf("entry %d served has sequence %d: a gap", i, s)
		}
	}
	if last := got[len(got)-1]; last > wm {
		t.Fatalf("served up to %d, past the deleted segments (%d)", last, wm)
	}
}

// A batch whose record would be over the largest payload a record may have
// (which recovery refuses to read back) is refused before anything is
// written: never acknowledged, then unreadable after a restart.
func TestAppendOverRecordLimitRefused(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	defer l.Close()
	mustAppendOne(t, l, 1)
	data := make([]byte, 1<<20) // shared by every entry: the batch costs 1 MiB, its record over 1 GiB
	var es []Entry
	for s := uint64(2); int64(len(es))*int64(len(data)) <= maxRecordPayload; s++ {
		es = append(es, Entry{Sequence: s, Data: data})
	}
	if _, err := l.Append(es...); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append of a %d-entry batch of 1 MiB each: %v, want ErrTooLarge", len(es), err)
	}
	if l.LastSequence() != 1 {
		t.Fatalf("LastSequence = %d after the refused batch, want 1", l.LastSequence())
	}
	mustAppendOne(t, l, 2)
}

// A replay that names a sequence the log skipped (sequences may have gaps)
// is a conflict that says so, not a duplicate.
func TestReplayIntoAGapIsAConflict(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	defer l.Close()
	held := []Entry{{Sequence: 1, Data: payload(1)}, {Sequence: 2, Data: payload(2)}, {Sequence: 5, Data: payload(5)}, {Sequence: 6, Data: payload(6)}}
	mustAppend(t, l, held...)
	var ce *SequenceConflictError
	if _, err := l.Append(Entry{Sequence: 2, Data: payload(2)}, Entry{Sequence: 3, Data: payload(3)}); !errors.As(err, &ce) || ce.Sequence != 3 || !strings.Contains(ce.Reason, "falls in a gap") {
		t.Fatalf("replay of 2 and 3 over a log holding 1, 2, 5, 6: %v, want a conflict at 3 naming the gap", err)
	}
	sameEntries(t, "the log after the refused replay", readAll(t, l, 0), held)
}

func TestTruncateAfter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seq     uint64
		removed int
	}{
		{"at a record boundary", 60, 40},
		{"inside a batch", 97, 3},
		{"in an older segment", 10, 90},
		{"everything", 0, 100},
		{"nothing", 100, 0},
		{"beyond the end", 500, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(t, dir)
			o.SegmentSize = MinSegmentSize
			o.NoPreallocate = tc.seq%2 == 0
			l := mustOpen(t, o)
			defer l.Close()
			var want []Entry
			for s := uint64(1); s <= 90; s++ {
				want = append(want, mustAppendOne(t, l, s))
			}
			mustAppend(t, l, seqEntries(91, 100)...) // one record of 10
			want = append(want, seqEntries(91, 100)...)
			n, err := l.TruncateAfter(tc.seq)
			if err != nil || n != tc.removed {
				t.Fatalf("TruncateAfter(%d) = %d, %v; want %d", tc.seq, n, err, tc.removed)
			}
			keep := want[:min(int(tc.seq), len(want))]
			if got := l.LastSequence(); got != uint64(len(keep)) {
				t.Fatalf("LastSequence = %d, want %d", got, len(keep))
			}
			sameEntries(t, "after TruncateAfter", readAll(t, l, 0), keep)
			next := uint64(len(keep)) + 1
			if res := mustAppend(t, l, seqEntries(next, next+1)...); res.Appended != 2 || res.Duplicates != 0 {
				t.Fatalf("append after TruncateAfter: %+v", res)
			}
			keep = append(keep, seqEntries(next, next+1)...)
			l.Close()
			l2 := mustOpen(t, o)
			defer l2.Close()
			if rec := l2.Recovery(); rec.Corruption != nil || rec.TruncatedBytes != 0 {
				t.Fatalf("reopen: %+v", rec)
			}
			sameEntries(t, "reopened", readAll(t, l2, 0), keep)
		})
	}
}

func TestWaitDurable(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncNone, SyncAlways} {
		t.Run(policy.String(), func(t *testing.T) {
			o := testOptions(t, t.TempDir())
			o.Sync = policy
			l := mustOpen(t, o)
			defer l.Close()
			if err := l.WaitDurable(t.Context(), 10); err != nil {
				t.Fatalf("WaitDurable on an empty log: %v", err)
			}
			mustAppend(t, l, seqEntries(1, 50)...)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if err := l.WaitDurable(ctx, 20); err != nil {
				t.Fatal(err)
			}
			if err := l.WaitDurable(ctx, 1000); err != nil { // waits for min(1000, last)
				t.Fatal(err)
			}
			if d := l.DurableSequence(); d != 50 {
				t.Fatalf("DurableSequence = %d, want 50", d)
			}
		})
	}
}

func TestClosed(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	mustAppend(t, l, seqEntries(1, 2)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(seqEntries(3, 3)...); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close: %v", err)
	}
	if err := l.ReadAfter(0, func(Entry) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAfter after Close: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Close: %v", err)
	}
	if _, err := l.TruncateBefore(1); !errors.Is(err, ErrClosed) {
		t.Errorf("TruncateBefore after Close: %v", err)
	}
	if _, err := l.TruncateAfter(1); !errors.Is(err, ErrClosed) {
		t.Errorf("TruncateAfter after Close: %v", err)
	}
	if err := l.WaitDurable(t.Context(), 2); err != nil {
		t.Errorf("WaitDurable for durable entries after Close: %v", err)
	}
	if l.LastSequence() != 2 {
		t.Errorf("LastSequence after Close = %d", l.LastSequence())
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, testOptions(t, dir))
	if l2, err := Open(testOptions(t, dir)); !errors.Is(err, ErrLocked) {
		if err == nil {
			l2.Close()
		}
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	l.Close()
	mustOpen(t, testOptions(t, dir)).Close()
}

func TestReadAfterCallbackError(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 10)...)
	stop := errors.New("stop")
	n := 0
	err := l.ReadAfter(0, func(Entry) error {
		n++
		if n == 3 {
			return stop
		}
		return nil
	})
	if err != stop || n != 3 {
		t.Fatalf("ReadAfter = %v after %d entries, want fn's error after 3", err, n)
	}
}

// TestConcurrent appends from several goroutines while others read and
// truncate; every reader must see increasing sequences and intact data.
func TestConcurrent(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch} {
		t.Run(policy.String(), func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(t, dir)
			o.Sync, o.SegmentSize, o.NoPreallocate = policy, 16<<10, false
			l := mustOpen(t, o)
			defer l.Close()
			var (
				seqMu sync.Mutex
				next  uint64 = 1
				wg    sync.WaitGroup
			)
			const perWriter = 150
			for range 4 {
				wg.Go(func() {
					for range perWriter {
						seqMu.Lock()
						s := next
						next += 2
						es := seqEntries(s, s+1)
						_, err := l.Append(es...)
						seqMu.Unlock()
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			done := make(chan struct{})
			var rg sync.WaitGroup
			for range 2 {
				rg.Go(func() {
					for {
						select {
						case <-done:
							return
						default:
						}
						var prev uint64
						err := l.ReadAfter(0, func(e Entry) error {
							if e.Sequence <= prev || !bytes.Equal(e.Data, payload(e.Sequence)) {
								return fmt.Errorf("entry %d after %d, or its data is wrong", e.Sequence, prev)
							}
							prev = e.Sequence
							return nil
						})
						if err != nil && !errors.Is(err, ErrTruncated) {
							t.Error(err)
							return
						}
					}
				})
			}
			rg.Go(func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(time.Millisecond):
					}
					if _, err := l.TruncateBefore(l.DurableSequence() / 2); err != nil {
						t.Error(err)
						return
					}
				}
			})
			wg.Wait()
			close(done)
			rg.Wait()
			if err := l.WaitDurable(t.Context(), 1<<62); err != nil {
				t.Fatal(err)
			}
			if got, want := l.LastSequence(), uint64(4*perWriter*2); got != want {
				t.Fatalf("LastSequence = %d, want %d", got, want)
			}
		})
	}
}

// TestConcurrentUnserialized has several goroutines append overlapping,
// replayed and racing sequences with no coordination, through a tiny
// back-pressure bound: the log must stay strictly increasing and intact.
func TestConcurrentUnserialized(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize, o.maxPending = 8<<10, 2<<10
	l := mustOpen(t, o)
	var (
		next     atomic.Uint64
		appended atomic.Int64
		wg       sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := range 300 {
				s := next.Add(3) - 2
				if (i+w)%5 == 0 && s > 20 {
					s -= 15 // replay: mostly duplicates
				}
				res, err := l.Append(seqEntries(s, s+2)...)
				if errors.Is(err, ErrSequenceConflict) {
					continue // a racing "replay" landing in another writer's gap
				}
				if err != nil {
					t.Error(err)
					return
				}
				appended.Add(int64(res.Appended))
			}
		})
	}
	wg.Wait()
	check := func(l *Log) {
		t.Helper()
		var prev uint64
		n := 0
		if err := l.ReadAfter(0, func(e Entry) error {
			if e.Sequence <= prev || !bytes.Equal(e.Data, payload(e.Sequence)) {
				return fmt.Errorf("entry %d after %d, or its data is wrong", e.Sequence, prev)
			}
			prev = e.Sequence
			n++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if int64(n) != appended.Load() {
			t.Fatalf("log holds %d entries, Append reported %d appended", n, appended.Load())
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	defer l.Close()
	if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 {
		t.Fatalf("reopen: %+v", r)
	}
	check(l)
}

// TestSequenceConflicts: an entry at or below the last sequence is skipped
// only when it is a byte-identical replay of what the log holds; anything
// else is refused with a SequenceConflictError and nothing of the append is
// kept. A sequence above MaxSequence (2^62 − 1) is refused the same way, so
// one mistaken sequence near 2^64 cannot wrap; any gap below it is allowed.
func TestSequenceConflicts(t *testing.T) {
	o := testOptions(t, t.TempDir())
	o.SegmentSize = 8 << 10 // replays are read back across segments
	l := mustOpen(t, o)
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 200)...)
	changed := func(seq uint64) Entry { return Entry{Sequence: seq, Data: append(payload(seq), 'x')} }
	for _, tc := range []struct {
		name string
		in   []Entry
		seq  uint64 // the conflicting sequence
	}{
		{"renumbered from 1", []Entry{changed(1)}, 1},
		{"different bytes mid-log", []Entry{changed(150)}, 150},
		{"replay then a changed entry", append(seqEntries(190, 195), changed(196)), 196},
		{"changed entry then new ones", []Entry{changed(200), {Sequence: 201, Data: payload(201)}}, 200},
		{"repeat inside a batch with other bytes", []Entry{{Sequence: 201, Data: payload(201)}, changed(201)}, 201},
		{"jump near 2^64", []Entry{{Sequence: 1<<63 - 1, Data: payload(1)}}, 1<<63 - 1},
		{"the ceiling 2^62", []Entry{{Sequence: 1 << 62, Data: payload(1)}}, 1 << 62},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := l.Append(tc.in...)
			var ce *SequenceConflictError
			if !errors.As(err, &ce) || !errors.Is(err, ErrSequenceConflict) {
				t.Fatalf("Append = %+v, %v; want a SequenceConflictError", res, err)
			}
			if ce.Sequence != tc.seq || ce.LastSequence != 200 {
				t.Fatalf("conflict at %d (last %d), want %d (last 200)", ce.Sequence, ce.LastSequence, tc.seq)
			}
			if l.LastSequence() != 200 {
				t.Fatalf("LastSequence = %d after a refused append, want 200", l.LastSequence())
			}
		})
	}
	// The log is not wedged: the next sequences, and a gap of 2^40, are
	// accepted; identical replays are still skipped; then the last sequence
	// below the ceiling.
	res := mustAppend(t, l, append(seqEntries(195, 201), Entry{Sequence: 1 << 40, Data: payload(9)})...)
	if res.Appended != 2 || res.Duplicates != 6 || res.Last != 1<<40 {
		t.Fatalf("Append after conflicts = %+v", res)
	}
	res = mustAppend(t, l, Entry{Sequence: MaxSequence, Data: payload(10)})
	if res.Appended != 1 || res.Last != MaxSequence {
		t.Fatalf("Append after conflicts = %+v", res)
	}
	if got := readAll(t, l, 0); len(got) != 203 {
		t.Fatalf("log holds %d entries, want 203", len(got))
	}
}
