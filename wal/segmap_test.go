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

// A file that cannot be mapped (a filesystem without mmap, or a mapping
// refused midway) is read with pread from where the mapping stopped:
// recovery, ReadAfter from the start and from the middle, CountAfter and
// ReadDir return exactly what they return through the mapping.
func TestReadsWithoutMapping(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = 12 << 20 // several windows in each segment
	l := mustOpen(t, o)
	const n = 30000 // about 20 MB: two segments, the second one half full
	want := make([]Entry, 0, n)
	for s := uint64(1); s <= n; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	unixMmap := mmap
	defer func() { mmap = unixMmap }()
	for _, mode := range []struct {
		name string
		maps int // mappings that succeed before the first refusal; -1: all
	}{{"mapped", -1}, {"never mapped", 0}, {"refused after the first window", 1}, {"refused after three windows", 3}} {
		t.Run(mode.name, func(t *testing.T) {
			var calls, refused int
			mmap = func(fd int, off int64, length, prot, flags int) ([]byte, error) {
				if calls++; mode.maps >= 0 && calls > mode.maps {
					refused++
					return nil, errors.New("mapping refused by the test")
				}
				return unixMmap(fd, off, length, prot, flags)
			}
			l := mustOpen(t, testOptions(t, dir))
			defer l.Close()
			if r := l.Recovery(); r.Entries != n || r.Corruption != nil || r.TruncatedBytes != 0 {
				t.Fatalf("recovery: %+v, want %d entries and no damage", r, n)
			}
			sameEntries(t, "ReadAfter(0)", readAll(t, l, 0), want)
			sameEntries(t, "ReadAfter(17000)", readAll(t, l, 17000), want[17000:])
			count, bytes, last, err := l.CountAfter(12345)
			var wantBytes int64
			for _, e := range want[12345:] {
				wantBytes += int64(len(e.Data))
			}
			if err != nil || count != n-12345 || bytes != wantBytes || last != n {
				t.Fatalf("CountAfter(12345) = %d entries, %d bytes, last %d, %v; want %d, %d, %d", count, bytes, last, err, n-12345, wantBytes, n)
			}
			var dumped []Entry
			if err := ReadDir(dir, 0, func(e Entry) error {
				dumped = append(dumped, Entry{Sequence: e.Sequence, Data: append([]byte(nil), e.Data...)})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			sameEntries(t, "ReadDir", dumped, want)
			if mode.maps >= 0 && refused == 0 {
				t.Fatalf("no mapping was refused (%d made): the pread path was not taken", calls)
			}
			t.Logf("%d mappings asked, %d refused", calls, refused)
		})
	}
}
