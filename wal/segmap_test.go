package wal

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// A segment read through its mapping is cut shorter under the reader:
// by TruncateAfter (which may run while a restore streams), the reader
// stops at the cut as a short read would; by someone else (the log does not
// know), the read fails with an error. Neither kills the process with
// SIGBUS, the signal a read of a mapping past its file's end raises.
func TestMappedReadSurvivesSegmentCut(t *testing.T) {
	t.Run("TruncateAfter", func(t *testing.T) {
		dir := t.TempDir()
		o := testOptions(t, dir)
		o.SegmentSize = 8 << 20 // one segment: the cut is in the window being read
		l := mustOpen(t, o)
		defer l.Close()
		for s := uint64(1); s <= 2000; s++ {
			mustAppendOne(t, l, s)
		}
		var got []uint64
		err := l.ReadAfter(0, func(e Entry) error {
			if !bytes.Equal(e.Data, payload(e.Sequence)) {
				t.Errorf("entry %d: wrong data", e.Sequence)
			}
			got = append(got, e.Sequence)
			if e.Sequence == 100 {
				if _, err := l.TruncateAfter(150); err != nil {
					t.Fatalf("TruncateAfter: %v", err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("ReadAfter across a TruncateAfter: %v", err)
		}
		// Entries up to the cut at least; none of the removed ones after
		// the read noticed the cut (the ones at most a record beyond 100
		// may have been read before it).
		if len(got) < 100 || got[len(got)-1] > 150 {
			t.Fatalf("read %d entries, last %d; want the entries up to 100..150", len(got), got[len(got)-1])
		}
	})
	t.Run("outside", func(t *testing.T) {
		dir := t.TempDir()
		o := testOptions(t, dir)
		o.SegmentSize = 8 << 20
		l := mustOpen(t, o)
		defer l.Close()
		for s := uint64(1); s <= 2000; s++ {
			mustAppendOne(t, l, s)
		}
		idx, err := listSegments(dir)
		if err != nil || len(idx) != 1 {
			t.Fatalf("segments %v, %v", idx, err)
		}
		path := segmentPath(dir, idx[0])
		n := 0
		err = l.ReadAfter(0, func(e Entry) error {
			if n++; n == 10 {
				if err := os.Truncate(path, 4096); err != nil {
					t.Fatal(err)
				}
			}
			return nil
		})
		if !errors.Is(err, errMapFault) {
			t.Fatalf("ReadAfter over a segment cut from outside: %v after %d entries; want errMapFault", err, n)
		}
		t.Logf("read %d entries, then: %v", n, err)
		// The read-only scan (wal dump, status) of the cut file sees a
		// torn tail or damage, depending on where the cut fell: either
		// way it returns (a read past the cut would have killed it).
		n = 0
		err = ReadDir(dir, 0, func(Entry) error { n++; return nil })
		t.Logf("ReadDir after the cut: %d entries, %v", n, err)
	})
}

// The mapping's windows: records that straddle a window's end, and one
// larger than a window, read back whole.
func TestMappedReadAcrossWindows(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = 32 << 20
	l := mustOpen(t, o)
	big := bytes.Repeat([]byte("w"), mapWindow+12345)
	want := map[uint64][]byte{}
	s := uint64(1)
	for ; s <= 30000; s++ {
		d := payload(s)
		if s == 9000 {
			d = big
		}
		mustAppend(t, l, Entry{Sequence: s, Data: d})
		want[s] = d
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o) // recovery's scan reads through the windows too
	defer l.Close()
	if rec := l.Recovery(); rec.Entries != 30000 || rec.Corruption != nil {
		t.Fatalf("recovery: %+v", rec)
	}
	n := 0
	if err := l.ReadAfter(0, func(e Entry) error {
		n++
		if !bytes.Equal(e.Data, want[e.Sequence]) {
			t.Fatalf("entry %d: %d bytes, want %d", e.Sequence, len(e.Data), len(want[e.Sequence]))
		}
		return nil
	}); err != nil || n != 30000 {
		t.Fatalf("ReadAfter: %d entries, %v", n, err)
	}
}
