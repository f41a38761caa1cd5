package wal

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// recordSpan is one record's place in a segment file.
type recordSpan struct {
	off, end    int64
	first, last uint64
	count       int
}

// recordSpans lists the valid records of a segment file.
func recordSpans(t testing.TB, path string) []recordSpan {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	rr := newRecordReader(f, segmentHeaderSize, fi.Size())
	defer rr.close()
	var spans []recordSpan
	last := uint64(0)
	for {
		off := rr.off
		h, _, err := rr.next(last, 0, false)
		if err != nil {
			return spans
		}
		last = h.last
		spans = append(spans, recordSpan{off: off, end: rr.off, first: h.first, last: h.last, count: int(h.count)})
	}
}

// copyDir copies the regular files of src into a new temporary directory.
func copyDir(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	copyFiles(t, src, dst)
	return dst
}

// copyFiles copies the regular files of src into the directory dst.
func copyFiles(t testing.TB, src, dst string) {
	t.Helper()
	des, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		copyFile(t, filepath.Join(src, de.Name()), filepath.Join(dst, de.Name()))
	}
}

// copyFile writes the bytes of the file src to dst, replacing it.
func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// corruptFunc damages a log directory; tests apply it to a copy.
type corruptFunc func(t testing.TB, dir string)

// buildLog writes entries 1..n (singles, then a final batch of batch
// entries) into dir and returns them.
func buildLog(t testing.TB, o Options, n, batch uint64) []Entry {
	t.Helper()
	l := mustOpen(t, o)
	var want []Entry
	for s := uint64(1); s <= n-batch; s++ {
		want = append(want, mustAppendOne(t, l, s))
	}
	es := seqEntries(n-batch+1, n)
	mustAppend(t, l, es...)
	want = append(want, es...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestTornBatchAtEveryOffset cuts the file at every byte offset of the last
// record (a batch) and reopens: the batch is there entirely or not at all,
// and a cut is a torn tail, never corruption.
func TestTornBatchAtEveryOffset(t *testing.T) {
	for _, zeroTail := range []bool{false, true} {
		name := map[bool]string{false: "truncated file", true: "zeroed tail of a preallocated file"}[zeroTail]
		t.Run(name, func(t *testing.T) {
			src := t.TempDir()
			o := testOptions(t, src)
			o.NoPreallocate = !zeroTail
			l := mustOpen(t, o)
			want := seqEntries(1, 12)
			for _, e := range want {
				mustAppend(t, l, e)
			}
			var batch []Entry // small entries keep the number of cut points (and the test) short
			for s := uint64(13); s <= 20; s++ {
				batch = append(batch, Entry{Sequence: s, Data: payload(s)[:1+s%23]})
			}
			mustAppend(t, l, batch...)
			want = append(want, batch...)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			idx, _ := listSegments(src)
			seg := segmentPath(src, idx[len(idx)-1])
			spans := recordSpans(t, seg)
			lastRec := spans[len(spans)-1]
			if lastRec.count != 8 {
				t.Fatalf("last record holds %d entries, want the batch of 8", lastRec.count)
			}
			orig, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			for cut := lastRec.off; cut <= lastRec.end; cut++ {
				os.RemoveAll(dir)
				os.Mkdir(dir, 0o700)
				b := slices.Clone(orig)
				intact := cut == lastRec.end
				if zeroTail {
					intact = isZero(b[cut:lastRec.end])
					clear(b[cut:lastRec.end])
				} else {
					b = b[:cut]
				}
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(seg)), b, 0o600); err != nil {
					t.Fatal(err)
				}
				oo := o
				oo.Dir, oo.NoPreallocate = dir, true
				l, err := Open(oo)
				if err != nil {
					t.Fatalf("cut at %d: Open: %v", cut, err)
				}
				rec := l.Recovery()
				got := readAll(t, l, 0)
				switch {
				case rec.Corruption != nil:
					t.Fatalf("cut at %d: reported corruption: %v", cut, rec.Corruption)
				case intact:
					sameEntries(t, "uncut", got, want)
				default:
					sameEntries(t, "cut inside the batch", got, want[:12])
					if cut > lastRec.off && rec.TruncatedBytes == 0 {
						t.Fatalf("cut at %d: TruncatedBytes = 0", cut)
					}
				}
				if (cut-lastRec.off)%7 != 0 && cut != lastRec.end {
					l.Close()
					continue
				}
				// The log appends again right after what it kept.
				next := got[len(got)-1].Sequence + 1
				mustAppend(t, l, seqEntries(next, next)...)
				l.Close()
				l = mustOpen(t, oo)
				if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 || l.LastSequence() != next {
					t.Fatalf("cut at %d: second reopen %+v, last %d", cut, r, l.LastSequence())
				}
				l.Close()
			}
		})
	}
}

// TestBitFlips flips one bit at random offsets of random segments: the flip
// is detected, the good prefix kept, and no damaged entry served.
func TestBitFlips(t *testing.T) {
	src := t.TempDir()
	o := testOptions(t, src)
	o.SegmentSize = 8 << 10
	want := buildLog(t, o, 120, 10)
	idx, _ := listSegments(src)
	if len(idx) < 3 {
		t.Fatalf("only %d segments", len(idx))
	}
	// entriesBefore[seg] = entries in the segments before it.
	entriesBefore := map[uint64]int{}
	spans := map[uint64][]recordSpan{}
	total := 0
	for _, x := range idx {
		entriesBefore[x] = total
		spans[x] = recordSpans(t, segmentPath(src, x))
		for _, s := range spans[x] {
			total += s.count
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	iterations := 100
	if testing.Short() {
		iterations = 30
	}
	for i := range iterations {
		x := idx[rng.IntN(len(idx))]
		path := segmentPath(src, x)
		fi, _ := os.Stat(path)
		off := rng.Int64N(fi.Size())
		bit := byte(1) << rng.IntN(8)
		dir := copyDir(t, src)
		b, _ := os.ReadFile(filepath.Join(dir, filepath.Base(path)))
		b[off] ^= bit
		os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o600)

		// Entries before the damaged record (or segment header).
		keep := entriesBefore[x]
		lastRecordOfLog := false
		for j, s := range spans[x] {
			if off < segmentHeaderSize {
				break
			}
			if off >= s.off && off < s.end {
				lastRecordOfLog = x == idx[len(idx)-1] && j == len(spans[x])-1
				break
			}
			keep += s.count
		}
		// The dump sees the same thing Open does, and changes nothing.
		dumped, derr := readDirAll(dir, 0)

		oo := o
		oo.Dir = dir
		l, err := Open(oo)
		if err != nil {
			t.Fatalf("flip %d at %s+%d: Open: %v", i, filepath.Base(path), off, err)
		}
		rec := l.Recovery()
		got := readAll(t, l, 0)
		sameEntries(t, "after a bit flip", got, want[:len(got)])
		if len(got) != keep {
			t.Fatalf("flip at %s+%d: kept %d entries, want the %d before the damage (recovery %+v)", filepath.Base(path), off, len(got), keep, rec)
		}
		if !lastRecordOfLog {
			var ce *CorruptionError
			if !errors.As(rec.Corruption, &ce) || !errors.Is(rec.Corruption, ErrCorrupt) {
				t.Fatalf("flip at %s+%d: Recovery.Corruption = %v, want a *CorruptionError", filepath.Base(path), off, rec.Corruption)
			}
			if len(ce.Moved) == 0 {
				t.Fatalf("flip at %s+%d: nothing set aside: %v", filepath.Base(path), off, ce)
			}
			if !errors.As(derr, &ce) {
				t.Fatalf("flip at %s+%d: ReadDir returned %v, want a *CorruptionError", filepath.Base(path), off, derr)
			}
		} else if derr != nil && !errors.Is(derr, ErrCorrupt) {
			t.Fatalf("ReadDir: %v", derr)
		}
		sameEntries(t, "ReadDir before repair", dumped, want[:len(dumped)])
		if len(dumped) != keep {
			t.Fatalf("flip at %s+%d: ReadDir served %d entries, want %d", filepath.Base(path), off, len(dumped), keep)
		}
		// After the repair the log is clean and appends continue.
		next := l.LastSequence() + 1
		mustAppend(t, l, seqEntries(next, next)...)
		l.Close()
		l = mustOpen(t, oo)
		if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 || l.LastSequence() != next {
			t.Fatalf("flip at %s+%d: reopen after repair: %+v, last %d", filepath.Base(path), off, r, l.LastSequence())
		}
		l.Close()
	}
}

func TestMissingSegment(t *testing.T) {
	src := t.TempDir()
	o := testOptions(t, src)
	o.SegmentSize = MinSegmentSize
	want := buildLog(t, o, 100, 1)
	idx, _ := listSegments(src)
	if len(idx) < 5 {
		t.Fatalf("only %d segments", len(idx))
	}
	gone := idx[2]
	keep := 0
	for _, x := range idx[:2] {
		for _, s := range recordSpans(t, segmentPath(src, x)) {
			keep += s.count
		}
	}
	os.Remove(segmentPath(src, gone))

	_, err := readDirAll(src, 0)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Segment != segmentName(gone) {
		t.Fatalf("ReadDir with a missing segment: %v", err)
	}
	l := mustOpen(t, o)
	rec := l.Recovery()
	if !errors.As(rec.Corruption, &ce) || ce.Segment != segmentName(gone) || !strings.Contains(ce.Reason, "missing") {
		t.Fatalf("Recovery.Corruption = %v", rec.Corruption)
	}
	if len(ce.Moved) != len(idx)-3 {
		t.Fatalf("moved %v, want the %d segments after the gap", ce.Moved, len(idx)-3)
	}
	for _, m := range ce.Moved {
		if _, err := os.Stat(filepath.Join(src, m)); err != nil {
			t.Fatalf("set-aside file: %v", err)
		}
	}
	sameEntries(t, "prefix before the gap", readAll(t, l, 0), want[:keep])
	mustAppendOne(t, l, uint64(keep)+1)
	l.Close()
	l = mustOpen(t, o)
	defer l.Close()
	if r := l.Recovery(); r.Corruption != nil {
		t.Fatalf("reopen: %v", r.Corruption)
	}
}

func TestUnsupportedVersion(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	buildLog(t, o, 10, 1)
	path := segmentPath(dir, 1)
	b, _ := os.ReadFile(path)
	b[9] = 2 // version 2
	os.WriteFile(path, b, 0o600)
	if l, err := Open(o); err == nil || !strings.Contains(err.Error(), "version 2") {
		if err == nil {
			l.Close()
		}
		t.Fatalf("Open of a version 2 segment = %v, want a version error", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after, b) {
		t.Fatal("Open changed a segment of another version")
	}
}

// TestGarbageTail covers what recovery sees after the last record: zeros
// (preallocated space), a torn write, and damage.
func TestGarbageTail(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tail      func(rec []byte) []byte // bytes appended after the good records
		corrupt   bool
		truncated bool
	}{
		{"zeros", func([]byte) []byte { return make([]byte, 5000) }, false, false},
		{"half a record", func(rec []byte) []byte { return rec[:len(rec)/2] }, false, true},
		{"half a record then zeros", func(rec []byte) []byte { return append(rec[:len(rec)/2:len(rec)/2], make([]byte, 3000)...) }, false, true},
		{"a few garbage bytes", func([]byte) []byte { return []byte{1, 2, 3} }, false, true},
		{"complete record with a flipped payload bit", func(rec []byte) []byte {
			rec[len(rec)-5] ^= 0x10
			return rec
		}, true, false},
		{"complete record with a flipped header bit", func(rec []byte) []byte {
			rec[30] ^= 0x01
			return rec
		}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(t, dir)
			want := buildLog(t, o, 10, 1)
			rec := appendRecord(nil, seqEntries(11, 13))
			f, _ := os.OpenFile(segmentPath(dir, 1), os.O_WRONLY|os.O_APPEND, 0)
			f.Write(tc.tail(rec))
			f.Close()
			l := mustOpen(t, o)
			defer l.Close()
			r := l.Recovery()
			if (r.Corruption != nil) != tc.corrupt || (r.TruncatedBytes > 0) != tc.truncated {
				t.Fatalf("Recovery = %+v; want corruption %v, truncation %v", r, tc.corrupt, tc.truncated)
			}
			sameEntries(t, "good records", readAll(t, l, 0), want)
		})
	}
}

// TestGolden pins the on-disk format: a log written by this build must be
// byte-identical to testdata/golden-v1.wal. Regenerate with -update only
// for a deliberate format change (and bump formatVersion).
func TestGolden(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	l := mustOpen(t, o)
	mustAppend(t, l, Entry{Sequence: 1, Data: []byte("\x83\xa9operation\xaamemory_add\xa6params\x80\xa8sequence\x01")})
	mustAppend(t, l, Entry{Sequence: 2, Data: []byte("two")}, Entry{Sequence: 5, Data: nil}, Entry{Sequence: 6, Data: []byte{0}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(segmentPath(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden-v1.wal")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("segment bytes differ from %s:\ngot  %x\nwant %x", golden, got, want)
	}
	// And the golden file reads back.
	gdir := t.TempDir()
	os.WriteFile(filepath.Join(gdir, segmentName(1)), want, 0o600)
	es, err := readDirAll(gdir, 0)
	if err != nil || len(es) != 4 || es[2].Sequence != 5 || len(es[2].Data) != 0 {
		t.Fatalf("golden read back: %v, %v", es, err)
	}
}

func TestInspectAndDump(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = MinSegmentSize
	buildLog(t, o, 40, 5)
	info, err := Inspect(dir)
	if err != nil || info.Corruption != nil || info.Entries != 40 || info.First != 1 || info.Last != 40 || len(info.Segments) < 2 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	var buf bytes.Buffer
	n, err := Dump(&buf, dir, DumpOptions{After: 37})
	if err != nil || n != 3 {
		t.Fatalf("Dump = %d, %v", n, err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "38\t") || !strings.Contains(lines[0], "\thex:") {
		t.Fatalf("Dump text:\n%s", buf.String())
	}
	buf.Reset()
	n, err = Dump(&buf, dir, DumpOptions{After: 39, JSON: true, Decode: func(b []byte) (any, error) {
		if len(b) == 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return map[string]int{"len": len(b)}, nil
	}})
	want := `{"sequence":40,"size":` + itoa(len(payload(40))) + `,"entry":{"len":` + itoa(len(payload(40))) + "}}\n"
	if err != nil || n != 1 || buf.String() != want {
		t.Fatalf("Dump JSON = %q, %v; want %q", buf.String(), err, want)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestDamageBelowCheckpointIsFree: a flipped byte, or a missing segment,
// wholly at or below the newest checkpoint's watermark (CoveredThrough)
// costs nothing: the damaged segment and those before it are set aside and
// reported, every intact segment after it is kept and served, and Floor says
// where the log now starts. Damage above the watermark still cuts the log.
func TestDamageBelowCheckpointIsFree(t *testing.T) {
	src := t.TempDir()
	o := testOptions(t, src)
	o.SegmentSize = MinSegmentSize
	want := buildLog(t, o, 200, 1)
	idx, _ := listSegments(src)
	if len(idx) < 6 {
		t.Fatalf("only %d segments", len(idx))
	}
	lastOf := func(dir string, x uint64) uint64 {
		sp := recordSpans(t, segmentPath(dir, x))
		return sp[len(sp)-1].last
	}
	flip := func(dir string, x uint64) {
		sp := recordSpans(t, segmentPath(dir, x))
		f, err := os.OpenFile(segmentPath(dir, x), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := []byte{0}
		off := sp[len(sp)/2].off + recordHeaderSize + 1
		f.ReadAt(b, off)
		b[0] ^= 0x40
		f.WriteAt(b, off)
	}
	for _, tc := range []struct {
		name    string
		damage  func(dir string)
		covered func(dir string) uint64 // the checkpoint watermark
		floor   uint64                  // want Floor() after Open; 0 = cut instead
	}{
		{"flip below the watermark", func(d string) { flip(d, idx[1]) },
			func(d string) uint64 { return lastOf(d, idx[3]) }, 1},
		{"flip in the segment just below the watermark", func(d string) { flip(d, idx[2]) },
			func(d string) uint64 { return lastOf(d, idx[2]) }, 1},
		{"missing segment below the watermark", func(d string) { os.Remove(segmentPath(d, idx[1])) },
			func(d string) uint64 { return lastOf(d, idx[2]) }, 1},
		{"flip above the watermark cuts", func(d string) { flip(d, idx[2]) },
			func(d string) uint64 { return lastOf(d, idx[0]) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, src)
			covered := tc.covered(dir)
			tc.damage(dir)
			o := testOptions(t, dir)
			o.SegmentSize = MinSegmentSize
			o.CoveredThrough = covered
			l := mustOpen(t, o)
			defer l.Close()
			rec := l.Recovery()
			if tc.floor == 0 {
				if rec.Corruption == nil || l.LastSequence() >= 200 {
					t.Fatalf("damage above the watermark: Corruption %v, last %d; want a cut log", rec.Corruption, l.LastSequence())
				}
				return
			}
			if rec.Corruption != nil || len(rec.Covered) != 1 || len(rec.Covered[0].Moved) == 0 {
				t.Fatalf("Recovery = %+v; want the damage reported as covered and set aside", rec)
			}
			if l.LastSequence() != 200 {
				t.Fatalf("LastSequence = %d, want 200: intact segments after the damage were dropped", l.LastSequence())
			}
			if f := l.Floor(); f > covered || f == 0 {
				t.Fatalf("Floor = %d, want in (0, %d]", f, covered)
			}
			sameEntries(t, "entries after the watermark", readAll(t, l, covered), want[covered:])
			for _, m := range rec.Covered[0].Moved {
				if _, err := os.Stat(filepath.Join(dir, m)); err != nil {
					t.Fatalf("set-aside file: %v", err)
				}
			}
		})
	}
}

// TestDamageOutsideRecords covers what recovery must call damage that no
// bit flip in a record shows: a segment whose header is gone, names another
// segment, or continues another history; bytes after the last record of a
// complete segment; a record whose checksum holds over a payload laid out
// wrong. Each cuts the log at the damage, loudly (Recovery.Corruption),
// with the reason named, and keeps every entry before it.
func TestDamageOutsideRecords(t *testing.T) {
	entriesIn := func(t *testing.T, dir string, idx []uint64) int {
		n := 0
		for _, x := range idx {
			for _, s := range recordSpans(t, segmentPath(dir, x)) {
				n += s.count
			}
		}
		return n
	}
	for _, tc := range []struct {
		name string
		// damage returns the segments whose entries stay and the one the
		// damage is reported in.
		damage func(t *testing.T, dir string, idx []uint64) (keep []uint64, at uint64)
		reason string
	}{
		{"a middle segment zeroed (its blocks lost)", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			fi, err := os.Stat(segmentPath(dir, idx[2]))
			if err != nil {
				t.Fatal(err)
			}
			writeAt(t, segmentPath(dir, idx[2]), 0, make([]byte, fi.Size()))
			return idx[:2], idx[2]
		}, "segment header is missing"},
		{"a middle segment's header checksum damaged", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			b, _ := os.ReadFile(segmentPath(dir, idx[2]))
			writeAt(t, segmentPath(dir, idx[2]), 29, []byte{b[29] ^ 0x04})
			return idx[:2], idx[2]
		}, "segment header checksum mismatch"},
		{"a middle segment holding another segment's bytes", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			copyFile(t, segmentPath(dir, idx[3]), segmentPath(dir, idx[2]))
			return idx[:2], idx[2]
		}, "header says this is segment"},
		{"a middle segment from another history", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			// The same index, from a log whose segments end elsewhere.
			other := t.TempDir()
			o := testOptions(t, other)
			o.SegmentSize = MinSegmentSize
			l := mustOpen(t, o)
			for s := uint64(1); s <= 200; s++ {
				mustAppend(t, l, Entry{Sequence: s, Data: bytes.Repeat([]byte{byte(s)}, 40)})
			}
			l.Close()
			copyFile(t, segmentPath(other, idx[2]), segmentPath(dir, idx[2]))
			return idx[:2], idx[2]
		}, "entries are missing"},
		{"bytes after the last record of a complete segment", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			f, err := os.OpenFile(segmentPath(dir, idx[2]), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(append(make([]byte, 100), "not a record"...)) // zeros, as preallocated space reads, then not
			f.Close()
			return idx[:3], idx[2] // its records stay; the damage is after them
		}, "after the last record of a complete segment"},
		{"the newest segment's header zeroed over its records", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			writeAt(t, segmentPath(dir, idx[len(idx)-1]), 0, make([]byte, segmentHeaderSize))
			return idx[:len(idx)-1], idx[len(idx)-1]
		}, "header is missing but data follows"},
		{"entries out of order under a valid checksum", func(t *testing.T, dir string, idx []uint64) ([]uint64, uint64) {
			// Sequences first, first+2, first+1: the header's first, last
			// and count agree; only the payload's order is wrong.
			path := segmentPath(dir, idx[2])
			spans := recordSpans(t, path)
			s := spans[0]
			rec := appendRecord(nil, []Entry{{Sequence: s.first, Data: []byte("a")}, {Sequence: s.first + 2, Data: []byte("b")}, {Sequence: s.first + 1, Data: []byte("c")}})
			if int64(len(rec)) > s.end-s.off+int64(recordHeaderSize) {
				t.Fatalf("crafted record of %d bytes does not fit", len(rec))
			}
			// Over the segment's records: the rest of the file is zeros.
			b, _ := os.ReadFile(path)
			clear(b[s.off:])
			copy(b[s.off:], rec)
			os.WriteFile(path, b, 0o600)
			return idx[:2], idx[2]
		}, "out of order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(t, dir)
			o.SegmentSize = MinSegmentSize
			want := buildLog(t, o, 100, 1)
			idx, _ := listSegments(dir)
			if len(idx) < 5 {
				t.Fatalf("only %d segments", len(idx))
			}
			kept, damaged := tc.damage(t, dir, idx)
			keep := entriesIn(t, dir, kept)
			l := mustOpen(t, o)
			defer l.Close()
			rec := l.Recovery()
			var ce *CorruptionError
			at := segmentName(damaged)
			if !errors.As(rec.Corruption, &ce) || !strings.Contains(ce.Reason, tc.reason) || ce.Segment != at {
				t.Fatalf("Recovery = %+v; want damage %q in %s", rec, tc.reason, at)
			}
			sameEntries(t, "entries before the damage", readAll(t, l, 0), want[:keep])
		})
	}
}

// A record damaged in the newest segment with intact records after it is
// damage in the middle of the log, not a torn write, when no durable mark
// says where a power cut may have torn the tail: the log is cut there
// loudly (the records after it set aside), never truncated quietly as a
// torn tail would be.
func TestDamageBeforeValidRecordsWithoutMark(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	l := mustOpen(t, o)
	var want []Entry
	for s := uint64(1); s <= 6; s++ {
		e := Entry{Sequence: s, Data: bytes.Repeat([]byte{byte('a' + s)}, 3000)}
		mustAppend(t, l, e)
		want = append(want, e)
	}
	l.Close()
	os.Remove(filepath.Join(dir, markName))
	path := segmentPath(dir, 1)
	spans := recordSpans(t, path)
	s := spans[2]
	// A lost sector inside record 3's payload: what a torn write leaves,
	// but records 4..6 follow it intact.
	at := (s.off + recordHeaderSize + 1024 + 511) / 512 * 512
	writeAt(t, path, at, make([]byte, 512))
	l = mustOpen(t, o)
	defer l.Close()
	rec := l.Recovery()
	if rec.Corruption == nil || rec.TruncatedBytes != 0 {
		t.Fatalf("Recovery = %+v; want damage reported, not a torn tail truncated", rec)
	}
	sameEntries(t, "entries before the damage", readAll(t, l, 0), want[:2])
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// The last record of the newest segment, with no durable mark to say where
// a power cut could have torn the tail: what a torn write leaves (a lost
// sector inside the payload) is truncated quietly; a damaged header over an
// intact payload is damage, even when the payload ends in a zero byte (as
// a torn payload's end would be).
func TestLastRecordTornOrDamagedWithoutMark(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     byte // the entries' last byte
		damage  func(t *testing.T, path string, s recordSpan)
		corrupt bool
	}{
		{"a lost sector in its payload", 'z', func(t *testing.T, path string, s recordSpan) {
			at := (s.off + recordHeaderSize + 1024 + 511) / 512 * 512
			writeAt(t, path, at, make([]byte, 512))
		}, false},
		{"a damaged header over its intact payload", 0, func(t *testing.T, path string, s recordSpan) {
			b, _ := os.ReadFile(path)
			writeAt(t, path, s.off+24, []byte{b[s.off+24] ^ 0x01}) // a bit of the first sequence
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := testOptions(t, dir)
			l := mustOpen(t, o)
			var want []Entry
			for s := uint64(1); s <= 4; s++ {
				e := Entry{Sequence: s, Data: append(bytes.Repeat([]byte{byte('a' + s)}, 3000), tc.end)}
				mustAppend(t, l, e)
				want = append(want, e)
			}
			l.Close()
			os.Remove(filepath.Join(dir, markName))
			path := segmentPath(dir, 1)
			spans := recordSpans(t, path)
			tc.damage(t, path, spans[len(spans)-1])
			l = mustOpen(t, o)
			defer l.Close()
			rec := l.Recovery()
			if (rec.Corruption != nil) != tc.corrupt || (rec.TruncatedBytes > 0) == tc.corrupt {
				t.Fatalf("Recovery = %+v; want corruption %v, else a torn tail truncated", rec, tc.corrupt)
			}
			sameEntries(t, "entries before the last record", readAll(t, l, 0), want[:3])
		})
	}
}
