package wal

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// dirSyncs records the directories fsynced through internal/atomicfile and
// fails the next n fsyncs of dir (n < 0: all).
type dirSyncs struct {
	mu     sync.Mutex
	dir    string
	err    error
	n      int
	synced []string
}

func (d *dirSyncs) hook(dir string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.synced = append(d.synced, dir)
	if d.err != nil && dir == d.dir && d.n != 0 {
		d.n--
		return d.err
	}
	return nil
}

func (d *dirSyncs) fail(dir string, err error, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dir, d.err, d.n = dir, err, n
}

// Open creates the WAL directory durably: the parent of each directory it
// creates is fsynced (issue 22 item 1: data/wal/ was durable only by the
// accident of the first fsync of data/).
func TestOpenFsyncsTheParentOfANewDirectory(t *testing.T) {
	d := &dirSyncs{}
	defer atomicfile.SetSyncHook(d.hook)()
	data := filepath.Join(t.TempDir(), "data")
	l := mustOpen(t, testOptions(t, filepath.Join(data, "wal")))
	defer l.Close()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, want := range []string{filepath.Dir(data), data} {
		if !slices.Contains(d.synced, want) {
			t.Errorf("%s not fsynced after creating a directory in it; fsynced: %v", want, d.synced)
		}
	}
}

// A failed fsync of the directory after a new segment was renamed into
// place stops the log: the segment's entry may not survive a power cut, so
// nothing written into it may be acknowledged. Reopen fsyncs the directory
// again and the log goes on; the failed range is not in it.
func TestSegmentDirectoryFsyncFailureStopsTheLog(t *testing.T) {
	d := &dirSyncs{}
	defer atomicfile.SetSyncHook(d.hook)()
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = MinSegmentSize
	l := mustOpen(t, o)
	defer l.Close()
	want := seqEntries(1, 10)
	mustAppend(t, l, want...)
	if err := l.WaitDurable(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("input/output error")
	d.fail(dir, eio, 1)
	// Enough to roll over to a new segment.
	for s := uint64(11); s <= 60; s++ {
		if _, err := l.Append(seqEntries(s, s)...); err != nil {
			var fe *FailedError
			if !errors.As(err, &fe) {
				t.Fatalf("Append(%d) = %v, want a *FailedError", s, err)
			}
			break
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := l.WaitDurable(ctx, 60)
	var fe *FailedError
	if !errors.As(err, &fe) || !errors.Is(err, eio) || !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("WaitDurable = %v, want a *FailedError wrapping ErrWriteFailed and %v", err, eio)
	}
	if fe.First <= fe.Durable || fe.Last < fe.First {
		t.Fatalf("failed range %d..%d, durable %d", fe.First, fe.Last, fe.Durable)
	}
	want = seqEntries(1, fe.Durable)
	last, err := l.Reopen()
	if err != nil || last != fe.Durable {
		t.Fatalf("Reopen = %d, %v; want %d", last, err, fe.Durable)
	}
	sameEntries(t, "after Reopen", readAll(t, l, 0), want)
	more := seqEntries(fe.First, fe.Last+5)
	mustAppend(t, l, more...)
	want = append(want, more...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, o)
	sameEntries(t, "after a restart", readAll(t, l, 0), want)
}

// Issue 22 item 3, through the sequence the agent sees: under SyncBatch an
// fsync fails once; the agent is told the range failed; it retries the very
// same entries (byte-identical). Before, the log kept the failed batch
// queued, fsynced it later and answered the retry as a replay — entries the
// agent was told to drop became durable. Now the retry is refused until
// Reopen, and after it the entries are appended afresh, never found as
// replays of data whose fsync failed.
func TestFailedFsyncIsNeverRetriedAsSafe(t *testing.T) {
	dir := t.TempDir()
	fo := &faultOps{}
	o := testOptions(t, dir)
	o.ops = fo
	l := mustOpen(t, o)
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 5)...)
	if err := l.WaitDurable(t.Context(), 5); err != nil {
		t.Fatal(err)
	}
	fo.failSyncs(syscall.EIO, 1) // one failure; later fsyncs succeed (Linux: the pages are dropped)
	mustAppend(t, l, seqEntries(6, 9)...)
	err := l.WaitDurable(t.Context(), 9)
	var fe *FailedError
	if !errors.As(err, &fe) || fe.First != 6 || fe.Last != 9 || fe.Durable != 5 {
		t.Fatalf("WaitDurable = %v, want entries 6..9 failed, durable 5", err)
	}
	// Appends that were queued behind it, and the agent's retry, are refused.
	if _, err := l.Append(seqEntries(6, 9)...); !errors.Is(err, ErrFailed) {
		t.Fatalf("retry before Reopen = %v, want ErrFailed", err)
	}
	// Give a buggy syncer every chance to write the batch again.
	if err := l.Sync(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Sync on a stopped log = %v, want ErrFailed", err)
	}
	if got := l.DurableSequence(); got != 5 {
		t.Fatalf("DurableSequence = %d, want 5", got)
	}
	if last, err := l.Reopen(); err != nil || last != 5 {
		t.Fatalf("Reopen = %d, %v; want 5", last, err)
	}
	res, err := l.Append(seqEntries(6, 9)...)
	if err != nil || res.Appended != 4 || res.Duplicates != 0 {
		t.Fatalf("retry after Reopen = %+v, %v; want 4 appended, no replays", res, err)
	}
	if err := l.WaitDurable(t.Context(), 9); err != nil {
		t.Fatal(err)
	}
}

// A crash (no Close, no Reopen) right after a failed fsync under SyncBatch:
// the records it covered were cleared before anyone was told, so the next
// Open does not bring them back.
func TestFailedBatchNotResurrectedByACrash(t *testing.T) {
	dir := t.TempDir()
	fo := &faultOps{}
	o := testOptions(t, dir)
	o.ops = fo
	l := mustOpen(t, o)
	mustAppend(t, l, seqEntries(1, 10)...)
	if err := l.WaitDurable(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	fo.failSyncs(syscall.EIO, 1)
	mustAppend(t, l, seqEntries(11, 20)...)
	if err := l.WaitDurable(t.Context(), 20); !errors.Is(err, ErrFailed) {
		t.Fatalf("WaitDurable = %v", err)
	}
	l.lock.Close() // the crash: the lock goes, nothing is flushed
	l2 := mustOpen(t, testOptions(t, dir))
	defer l2.Close()
	sameEntries(t, "after a crash following a failed fsync", readAll(t, l2, 0), seqEntries(1, 10))
	l.Close()
}

// Reopen is safe while other goroutines append, read and wait (run with
// -race): each call either succeeds or fails with the failure, and the log
// ends up holding a contiguous prefix of what was appended.
func TestReopenUnderConcurrentUse(t *testing.T) {
	dir := t.TempDir()
	fo := &faultOps{}
	o := testOptions(t, dir)
	o.ops, o.SegmentSize = fo, MinSegmentSize
	l := mustOpen(t, o)
	defer l.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the appender: numbers above whatever the log holds
		defer wg.Done()
		for ctx.Err() == nil {
			s := l.LastSequence() + 1
			_, _ = l.Append(seqEntries(s, s+2)...)
			_ = l.WaitDurable(ctx, s+2)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = l.ReadAfter(l.Floor(), func(Entry) error { return nil })
			_ = l.Failure()
			_ = l.Recovery()
		}
	}()
	for range 20 {
		fo.failSyncs(syscall.EIO, 1)
		deadline := time.Now().Add(time.Minute)
		for l.Failure() == nil && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if l.Failure() == nil {
			t.Fatal("the injected fsync failure never stopped the log")
		}
		if _, err := l.Reopen(); err != nil {
			t.Fatalf("Reopen: %v", err)
		}
	}
	cancel()
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, testOptions(t, dir))
	prev := uint64(0)
	for _, e := range readAll(t, l, 0) {
		if e.Sequence != prev+1 {
			t.Fatalf("entry %d follows %d: not contiguous", e.Sequence, prev)
		}
		prev = e.Sequence
	}
}

// Issue 33 item 4 on a real full disk under SyncBatch (a small tmpfs; needs
// root): an entry whose append got an error (directly, or through the
// FailedError's range) is never in the log — not after Reopen, not after a
// restart — and once space is freed the refused entries go in as new ones.
func TestRealDiskFullBatch(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=512k"); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (%v); the injected-fault tests cover ENOSPC", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, "wal")
	o := testOptions(t, dir)
	o.SegmentSize = 64 << 10
	l := mustOpen(t, o)
	defer l.Close()
	big := func(s uint64) Entry { return Entry{Sequence: s, Data: append(payload(s), make([]byte, 2000)...)} }
	var fe *FailedError
	refused := map[uint64]bool{}
	s := uint64(1)
	for ; s < 100000 && fe == nil; s++ {
		if _, err := l.Append(big(s)); err != nil {
			if !errors.As(err, &fe) {
				t.Fatalf("Append(%d) = %v, want a *FailedError", s, err)
			}
			refused[s] = true
		}
	}
	if fe == nil {
		t.Fatal("the disk never filled")
	}
	if !errors.Is(fe, ErrNoSpace) || !errors.Is(fe, syscall.ENOSPC) {
		t.Fatalf("failure = %v, want ErrNoSpace wrapping ENOSPC", fe)
	}
	for q := fe.First; q <= fe.Last; q++ {
		refused[q] = true
	}
	check := func(what string, l *Log) []Entry {
		got := readAll(t, l, 0)
		for _, e := range got {
			if refused[e.Sequence] {
				t.Fatalf("%s: entry %d was refused (failed range %d..%d) but is in the log", what, e.Sequence, fe.First, fe.Last)
			}
		}
		if n := len(got); n == 0 || got[n-1].Sequence != fe.Durable {
			t.Fatalf("%s: log ends at %v, want the durable sequence %d", what, seqs(got[max(0, n-1):], 1), fe.Durable)
		}
		return got
	}
	if last, err := l.Reopen(); err != nil || last != fe.Durable {
		t.Fatalf("Reopen on a full disk = %d, %v; want %d", last, err, fe.Durable)
	}
	check("after Reopen", l)
	// Free space as the supervisor does (after a checkpoint): drop old segments.
	if n, err := l.TruncateBefore(fe.Durable / 2); err != nil || n == 0 {
		t.Fatalf("TruncateBefore = %d, %v", n, err)
	}
	if _, err := l.Append(big(fe.Durable + 1)); err != nil {
		t.Fatalf("append after freeing space: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	delete(refused, fe.Durable+1)
	fe.Durable++
	l = mustOpen(t, o)
	check("after a restart", l)
}

// Issue 33 item 4: a write that fails part-way (ENOSPC) may have put whole
// records on the disk although os.File.WriteAt reports 0 bytes written. The
// entries were refused, so those bytes must be cleared before anyone is
// told: after a crash they must not come back.
func TestPartlyWrittenRefusedRecordsNotResurrected(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncAlways} {
		t.Run(policy.String(), func(t *testing.T) {
			dir := t.TempDir()
			fo := &faultOps{reportZero: true}
			o := testOptions(t, dir)
			o.ops, o.Sync = fo, policy
			l := mustOpen(t, o)
			mustAppend(t, l, seqEntries(1, 10)...)
			if err := l.WaitDurable(t.Context(), 10); err != nil {
				t.Fatal(err)
			}
			fo.failWrites(syscall.ENOSPC, nil)
			// One Append of many entries: one record, written half.
			// Under SyncBatch also several records queued for one write.
			if policy == SyncBatch {
				for s := uint64(11); s <= 30; s++ {
					if _, err := l.Append(seqEntries(s, s)...); err != nil {
						break
					}
				}
			} else {
				if _, err := l.Append(seqEntries(11, 30)...); !errors.Is(err, ErrNoSpace) {
					t.Fatalf("Append = %v, want ErrNoSpace", err)
				}
			}
			if err := l.WaitDurable(t.Context(), 30); policy == SyncBatch && !errors.Is(err, ErrNoSpace) {
				t.Fatalf("WaitDurable = %v, want ErrNoSpace", err)
			}
			l.lock.Close() // the crash
			l2 := mustOpen(t, testOptions(t, dir))
			defer l2.Close()
			sameEntries(t, "after a crash following a partly written, refused append", readAll(t, l2, 0), seqEntries(1, 10))
			l.Close()
		})
	}
}

// bigEntries are entries of about 1.5 KiB: each record spans several
// 512-byte sectors.
func bigEntries(from, to uint64) []Entry {
	var es []Entry
	for s := from; s <= to; s++ {
		d := make([]byte, 1500)
		for i := range d {
			d[i] = byte(s + uint64(i)%251 + 1)
		}
		es = append(es, Entry{Sequence: s, Data: d})
	}
	return es
}

// zeroSector zeroes the 512-byte sector at off (aligned down) in path: a
// page that never reached the disk.
func zeroSector(t *testing.T, path string, off int64) {
	t.Helper()
	writeAt(t, path, off/512*512, make([]byte, 512))
}

// Issue 22 item 4: a power cut that let the last unsynced pages reach the
// disk out of order (a hole, then intact records) happened after the last
// position known durable: it is a torn tail, repaired without a word of
// corruption. Before the durable mark it was "WAL corruption".
func TestOutOfOrderTornTailIsNotCorruption(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.SegmentSize = 1 << 20
	l := mustOpen(t, o)
	want := bigEntries(1, 20)
	mustAppend(t, l, want...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	m, ok := readMark(dir)
	if !ok {
		t.Fatal("no durable mark after a clean close")
	}
	// Written, never fsynced (SyncNone), then the power goes: one sector in
	// the middle of the unsynced records never reached the disk.
	o.Sync = SyncNone
	l = mustOpen(t, o)
	for s := uint64(21); s <= 40; s++ {
		mustAppend(t, l, bigEntries(s, s)...)
	}
	readAll(t, l, 0) // everything written to the file
	l.lock.Close()   // the power cut
	path := segmentPath(dir, m.index)
	zeroSector(t, path, m.offset+5*1550)

	l2 := mustOpen(t, testOptions(t, dir))
	r := l2.Recovery()
	if r.Corruption != nil {
		t.Fatalf("an out-of-order torn tail after the durable mark was reported as corruption: %v", r.Corruption)
	}
	if r.TruncatedBytes == 0 {
		t.Fatal("no torn tail truncated")
	}
	got := readAll(t, l2, 0)
	if len(got) < 20 || len(got) >= 40 {
		t.Fatalf("%d entries after recovery, want the 20 durable ones and some of the rest, not all", len(got))
	}
	sameEntries(t, "durable entries", got[:20], want)
	for i, e := range got {
		if e.Sequence != uint64(i+1) {
			t.Fatalf("entry %d is %d: not contiguous", i, e.Sequence)
		}
	}
	l2.Close()
	l.Close()
}

// closedWithMark writes entries 1..20 (1,500 bytes each) to a new log in
// dir and closes it cleanly; it returns the log's options and its durable
// mark.
func closedWithMark(t *testing.T, dir string) (Options, markPos) {
	t.Helper()
	o := testOptions(t, dir)
	o.SegmentSize = 1 << 20
	l := mustOpen(t, o)
	mustAppend(t, l, bigEntries(1, 20)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	m, ok := readMark(dir)
	if !ok {
		t.Fatal("no durable mark after a clean close")
	}
	return o, m
}

// Damage below the durable mark is corruption even when it looks like a
// torn write: those bytes were fsynced and acknowledged. Before the mark, a
// zeroed last sector of the newest segment was silently truncated as a
// torn tail, losing acknowledged entries without a word.
func TestDamageBelowTheMarkIsCorruption(t *testing.T) {
	dir := t.TempDir()
	_, m := closedWithMark(t, dir)
	// The last record's final sector comes back as zeros.
	zeroSector(t, segmentPath(dir, m.index), m.offset-100)
	l2 := mustOpen(t, testOptions(t, dir))
	defer l2.Close()
	var ce *CorruptionError
	if r := l2.Recovery(); !errors.As(r.Corruption, &ce) || !strings.Contains(ce.Reason, "durable mark") {
		t.Fatalf("Recovery = %+v, want corruption below the durable mark", r)
	}
}

// The durable mark follows the log while it runs, not only at a clean
// close: after a crash (no Close), damage to records fsynced while it ran
// is still told apart from a torn tail. A mark written only at Close would
// leave the last close's position, and the damaged acknowledged records
// above it would be truncated as a torn tail without a word.
func TestMarkFollowsTheRunningLog(t *testing.T) {
	dir := t.TempDir()
	o, closed := closedWithMark(t, dir)
	l := mustOpen(t, o)
	mustAppend(t, l, bigEntries(21, 40)...)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// The mark trails the fsyncs by up to markInterval.
	deadline := time.Now().Add(10 * time.Second)
	m, _ := readMark(dir)
	for m.seq != 40 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		m, _ = readMark(dir)
	}
	if m.seq != 40 || m.offset <= closed.offset {
		t.Fatalf("durable mark at sequence %d offset %d while the log ran (at the last close: %d, %d); want sequence 40", m.seq, m.offset, closed.seq, closed.offset)
	}
	l.lock.Close() // the crash: no Close
	// A sector of an acknowledged record written in this run comes back
	// as zeros, after the last close's mark, before this run's.
	zeroSector(t, segmentPath(dir, m.index), m.offset-100)
	l2 := mustOpen(t, testOptions(t, dir))
	defer l2.Close()
	var ce *CorruptionError
	if r := l2.Recovery(); !errors.As(r.Corruption, &ce) || !strings.Contains(ce.Reason, "durable mark") {
		t.Fatalf("Recovery = %+v, want corruption below the durable mark", r)
	}
	l.Close()
}

// Reopen on a healthy log keeps everything accepted: it makes it durable
// first.
func TestReopenHealthyKeepsAccepted(t *testing.T) {
	l := mustOpen(t, testOptions(t, t.TempDir()))
	defer l.Close()
	want := seqEntries(1, 50)
	for _, e := range want {
		mustAppend(t, l, e)
	}
	last, err := l.Reopen()
	if err != nil || last != 50 {
		t.Fatalf("Reopen = %d, %v; want 50", last, err)
	}
	sameEntries(t, "after Reopen", readAll(t, l, 0), want)
	if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 || r.Entries != 50 {
		t.Fatalf("Recovery after Reopen = %+v", r)
	}
	l.Close()
	if _, err := l.Reopen(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reopen after Close = %v, want ErrClosed", err)
	}
}

// Close makes what the log accepted durable; when that last fsync fails,
// Close says so (the entries after the durable sequence may be gone), and
// the next Open holds no more than was durable before it.
func TestCloseReportsAFailedFinalFsync(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncNone, SyncBatch} {
		t.Run(policy.String(), func(t *testing.T) {
			dir := t.TempDir()
			o, fo := faultyOptions(t, dir, policy)
			o.SyncInterval = time.Hour
			l := mustOpen(t, o)
			mustAppend(t, l, seqEntries(1, 5)...)
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			fo.failSyncs(syscall.EIO, -1)
			mustAppend(t, l, seqEntries(6, 9)...)
			err := l.Close()
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "after sequence 5") {
				t.Fatalf("Close with its final fsync failing = %v; want EIO, naming the durable sequence 5", err)
			}
		})
	}
}
