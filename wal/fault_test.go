package wal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// faultOps fails writes and fsyncs on demand. A failing write first writes
// half of its bytes, as a real short write before ENOSPC does.
type faultOps struct {
	osOps
	mu        sync.Mutex
	writeErr  error
	writeIf   func(off int64) bool // nil: every write fails while writeErr is set
	syncErr   error
	syncFails int // fsyncs left to fail while syncErr is set; < 0: all
	// reportZero makes a failing write report 0 bytes written although it
	// wrote half, as os.File.WriteAt does when a pwrite wrote part of the
	// data and the next one failed.
	reportZero bool
	// afterWrite, when set, runs after each successful write (on the
	// syncer goroutine).
	afterWrite func()
}

var _ fileOps = (*faultOps)(nil)

// faultyOptions is testOptions for dir under policy, its writes and fsyncs
// going through a faultOps the test fails on demand.
func faultyOptions(t testing.TB, dir string, policy SyncPolicy) (Options, *faultOps) {
	fo := &faultOps{}
	o := testOptions(t, dir)
	o.Sync, o.ops = policy, fo
	return o, fo
}

func (f *faultOps) failWrites(err error, cond func(off int64) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writeErr, f.writeIf = err, cond
}

func (f *faultOps) failSyncs(err error, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncErr, f.syncFails = err, n
}

func (f *faultOps) heal() {
	f.failWrites(nil, nil)
	f.failSyncs(nil, 0)
}

func (f *faultOps) writeAt(file *os.File, p []byte, off int64) (int, error) {
	f.mu.Lock()
	err, cond := f.writeErr, f.writeIf
	f.mu.Unlock()
	if err != nil && (cond == nil || cond(off)) {
		n, _ := file.WriteAt(p[:len(p)/2], off)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.reportZero {
			n = 0
		}
		return n, err
	}
	n, werr := file.WriteAt(p, off)
	if werr == nil && f.afterWrite != nil {
		f.afterWrite()
	}
	return n, werr
}

func (f *faultOps) datasync(file *os.File) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.syncErr != nil && f.syncFails != 0 {
		f.syncFails--
		return f.syncErr
	}
	return datasync(file)
}

// waitHealthy polls until the log accepts and persists an append again (the
// syncer retries with back-off up to a second).
func waitHealthy(t *testing.T, l *Log, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := l.WaitDurable(ctx, seq)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log did not recover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWriteFailure injects each kind of write-path failure. A failed write
// under SyncAlways fails the Appends waiting for it (their sequences are not
// consumed) and the log goes on once the fault clears. A failed fsync under
// every policy, and any failure under SyncBatch or SyncNone (where the
// Appends of the lost entries have returned already), stops the log: a
// *FailedError naming the whole failed range, nothing accepted until Reopen,
// and the failed range never in the log — not after healing, not after
// Reopen, not after a restart (SPEC §4; issue 22 item 3, issue 33 item 4).
func TestWriteFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   SyncPolicy
		fail     func(*faultOps)
		sentinel error
		errno    syscall.Errno
		stops    bool
	}{
		{"always/ENOSPC on write", SyncAlways, func(f *faultOps) { f.failWrites(syscall.ENOSPC, nil) }, ErrNoSpace, syscall.ENOSPC, false},
		{"always/EIO on write", SyncAlways, func(f *faultOps) { f.failWrites(syscall.EIO, nil) }, ErrWriteFailed, syscall.EIO, false},
		{"always/EIO on fsync", SyncAlways, func(f *faultOps) { f.failSyncs(syscall.EIO, 1) }, ErrWriteFailed, syscall.EIO, true},
		{"always/EDQUOT on write", SyncAlways, func(f *faultOps) { f.failWrites(syscall.EDQUOT, nil) }, ErrNoSpace, syscall.EDQUOT, false},
		{"batch/ENOSPC on write", SyncBatch, func(f *faultOps) { f.failWrites(syscall.ENOSPC, nil) }, ErrNoSpace, syscall.ENOSPC, true},
		{"batch/EIO on fsync", SyncBatch, func(f *faultOps) { f.failSyncs(syscall.EIO, 1) }, ErrWriteFailed, syscall.EIO, true},
		{"batch/EIO on every fsync", SyncBatch, func(f *faultOps) { f.failSyncs(syscall.EIO, -1) }, ErrWriteFailed, syscall.EIO, true},
		{"none/ENOSPC on write", SyncNone, func(f *faultOps) { f.failWrites(syscall.ENOSPC, nil) }, ErrNoSpace, syscall.ENOSPC, true},
		{"always/ENOSPC creating a segment", SyncAlways, func(f *faultOps) {
			f.failWrites(syscall.ENOSPC, func(off int64) bool { return off == 0 })
		}, ErrNoSpace, syscall.ENOSPC, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o, fo := faultyOptions(t, dir, tc.policy)
			o.SegmentSize = MinSegmentSize
			var reported []*FailedError
			var repMu sync.Mutex
			o.OnFailure = func(fe *FailedError) { repMu.Lock(); reported = append(reported, fe); repMu.Unlock() }
			l := mustOpen(t, o)
			defer l.Close()
			want := seqEntries(1, 30)
			mustAppend(t, l, want[:20]...)
			mustAppend(t, l, want[20:]...)
			if err := l.WaitDurable(t.Context(), 30); err != nil {
				t.Fatal(err)
			}
			tc.fail(fo)

			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, tc.sentinel) || !errors.Is(err, tc.errno) {
					t.Fatalf("%s: %v, want %v wrapping %v", what, err, tc.sentinel, tc.errno)
				}
				if other := map[error]error{ErrNoSpace: ErrWriteFailed, ErrWriteFailed: ErrNoSpace}[tc.sentinel]; errors.Is(err, other) {
					t.Fatalf("%s: %v is also %v", what, err, other)
				}
				if !tc.stops {
					return
				}
				var fe *FailedError
				if !errors.As(err, &fe) || !errors.Is(err, ErrFailed) {
					t.Fatalf("%s: %v, want a *FailedError", what, err)
				}
				if fe.First != 31 || fe.Last != 60 || fe.Durable != 30 {
					t.Fatalf("%s: failed range %d..%d durable %d, want 31..60 durable 30", what, fe.First, fe.Last, fe.Durable)
				}
			}
			// Enough data to need a new segment, for the segment-creation case.
			failing := seqEntries(31, 60)
			if tc.policy == SyncAlways {
				_, err := l.Append(failing...)
				check("Append while failing", err)
			} else {
				// Accepted; the failure surfaces in WaitDurable and later Appends.
				if _, err := l.Append(failing...); err != nil {
					t.Fatalf("first Append under %v: %v", tc.policy, err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				check("WaitDurable while failing", l.WaitDurable(ctx, 60))
				cancel()
			}
			if got := l.LastSequence(); got != 30 {
				t.Fatalf("LastSequence = %d after the failure, want 30 (the failed entries are not in the log)", got)
			}
			if tc.stops {
				_, err := l.Append(seqEntries(61, 61)...)
				check("Append after the failure", err)
				check("ReadAfter after the failure", l.ReadAfter(0, func(Entry) error { return nil }))
				check("Failure()", l.Failure())
				// OnFailure runs on the syncer right after the failure is
				// visible: wait for it.
				calls := func() int { repMu.Lock(); defer repMu.Unlock(); return len(reported) }
				for deadline := time.Now().Add(time.Minute); calls() == 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				if n := calls(); n != 1 {
					t.Fatalf("OnFailure called %d times, want once", n)
				}
			}
			// Readable up to the last good record meanwhile.
			var got []Entry
			_ = l.ReadAfter(0, func(e Entry) error {
				got = append(got, Entry{Sequence: e.Sequence, Data: append([]byte(nil), e.Data...)})
				return nil
			})
			sameEntries(t, "readable while failing", got, want)

			fo.heal()
			if tc.stops {
				// Healing does not bring the log back, nor the failed range.
				_, err := l.Append(failing...)
				check("Append after healing, before Reopen", err)
				last, err := l.Reopen()
				if err != nil || last != 30 {
					t.Fatalf("Reopen = %d, %v; want 30", last, err)
				}
				if l.Failure() != nil {
					t.Fatalf("Failure() after Reopen = %v", l.Failure())
				}
				sameEntries(t, "after Reopen", readAll(t, l, 0), want)
			}
			// The client's retry of the refused entries is a new append.
			if res := mustAppend(t, l, failing...); res.Appended != 30 || res.Duplicates != 0 {
				t.Fatalf("retried Append = %+v", res)
			}
			want = append(want, failing...)
			mustAppend(t, l, seqEntries(61, 61)...)
			want = append(want, seqEntries(61, 61)...)
			if err := l.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			l = mustOpen(t, testOptions(t, dir))
			if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 {
				t.Fatalf("reopen after recovery from the fault: %+v", r)
			}
			sameEntries(t, "after the fault", readAll(t, l, 0), want)
		})
	}
}

// TestFailedAppendNotResurrected crashes (abandons the log without Close)
// right after a failed Append: the half-written record must not come back.
func TestFailedAppendNotResurrected(t *testing.T) {
	dir := t.TempDir()
	o, fo := faultyOptions(t, dir, SyncAlways)
	l := mustOpen(t, o)
	mustAppend(t, l, seqEntries(1, 10)...)
	fo.failSyncs(syscall.EIO, 1) // the record is written completely, its fsync fails
	if _, err := l.Append(seqEntries(11, 12)...); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("Append = %v", err)
	}
	// Simulate the crash: release the lock without the final flush.
	l.lock.Close()
	l2 := mustOpen(t, testOptions(t, dir))
	defer l2.Close()
	sameEntries(t, "after a crash following a failed append", readAll(t, l2, 0), seqEntries(1, 10))
	if r := l2.Recovery(); r.Corruption != nil {
		t.Fatalf("corruption: %v", r.Corruption)
	}
	l.Close()
}

// TestRealDiskFull fills a small tmpfs (needs root and mount; skipped
// otherwise): ENOSPC maps to ErrNoSpace, the failed entries are not
// consumed, and once space is freed appends resume without a restart.
func TestRealDiskFull(t *testing.T) {
	for _, prealloc := range []bool{false, true} {
		t.Run(map[bool]string{false: "growing", true: "preallocated"}[prealloc], func(t *testing.T) {
			mnt := t.TempDir()
			if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
				t.Skipf("cannot mount a tmpfs to fill (%v); the injected-fault tests cover ENOSPC", err)
			}
			t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
			dir := filepath.Join(mnt, "wal")
			o := testOptions(t, dir)
			o.Sync, o.SegmentSize, o.NoPreallocate = SyncAlways, 64<<10, !prealloc
			l := mustOpen(t, o)
			defer l.Close()
			big := func(s uint64) Entry {
				return Entry{Sequence: s, Data: append(payload(s), make([]byte, 2000)...)}
			}
			var want []Entry
			var err error
			s := uint64(1)
			for ; s < 10000; s++ {
				if _, err = l.Append(big(s)); err != nil {
					break
				}
				want = append(want, big(s))
			}
			if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append on a full disk = %v, want ErrNoSpace wrapping ENOSPC", err)
			}
			if l.LastSequence() != s-1 {
				t.Fatalf("LastSequence = %d, want %d", l.LastSequence(), s-1)
			}
			sameEntries(t, "readable on a full disk", readAll(t, l, 0), want)
			// Free space the way the supervisor does: drop old segments.
			if n, err := l.TruncateBefore(s / 2); err != nil || n == 0 {
				t.Fatalf("TruncateBefore = %d, %v", n, err)
			}
			first := l.FirstSequence()
			mustAppend(t, l, big(s))
			want = append(want, big(s))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = mustOpen(t, o)
			if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 {
				t.Fatalf("reopen: %+v", r)
			}
			sameEntries(t, "after freeing space", readAll(t, l, first-1), want[first-1:])
		})
	}
}

// A segment whose preparation fails (the disk full while it is zero-filled,
// or the log closing) leaves neither its temporary file nor its descriptor
// behind. (Both were left: the cleanup read the results the failing return
// had already set to nil and "".)
func TestFailedPreparationLeavesNothing(t *testing.T) {
	for _, stop := range []bool{false, true} {
		dir := t.TempDir()
		ops := &faultOps{}
		ops.failWrites(syscall.ENOSPC, nil)
		p := newPreparer(dir, 1<<20, ops, testLogger(t))
		if stop {
			ops.heal()
			close(p.stop)
		}
		fds := openFDs(t)
		f, path, err := p.prepare()
		if err == nil {
			f.Close()
			t.Fatalf("prepare (stop=%v) succeeded: %s", stop, path)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Errorf("prepare failed (%v) and left %v", err, left)
		}
		if now := openFDs(t); now != fds {
			t.Errorf("prepare failed (%v): %d descriptors open, %d before", err, now, fds)
		}
	}
}

// A prepared segment is filled from zeroFill, which no one writes, not from
// a buffer on the heap: the preparer kept a 1 MiB buffer for the log's
// lifetime, half an idle supervisor's live heap (issue 31's idle memory).
func TestPreparerKeepsNoBuffer(t *testing.T) {
	p := newPreparer(t.TempDir(), 4<<20, &faultOps{}, testLogger(t))
	before := liveHeap()
	f, path, err := p.prepare()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	grown := liveHeap() - before
	runtime.KeepAlive(p)
	if grown >= 512<<10 {
		t.Errorf("the live heap grew by %d bytes preparing %s, and the preparer keeps them", grown, path)
	}
	if zeroFill != [len(zeroFill)]byte{} {
		t.Error("zeroFill was written")
	}
}

// liveHeap is the heap's live bytes after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestUnclearedFailedWriteStopsTheLog: under SyncAlways a failed write
// normally fails only its own Append, once its half-written bytes are
// cleared. When they cannot be cleared (the clearing fails too), the log
// stops, whatever the policy: those bytes must not come back as an entry
// after a crash, so nothing is appended after them until Reopen clears
// them.
func TestUnclearedFailedWriteStopsTheLog(t *testing.T) {
	dir := t.TempDir()
	o, fo := faultyOptions(t, dir, SyncAlways)
	l := mustOpen(t, o)
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 3)...)
	// The write fails, and so does the fsync that would make its clearing
	// (zeros, or a truncation where the file was not preallocated) durable.
	fo.failWrites(syscall.EIO, nil)
	fo.failSyncs(syscall.EIO, -1)
	if _, err := l.Append(seqEntries(4, 4)...); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Append while writes fail: %v, want EIO", err)
	}
	// Nor does Reopen bring the log back while the clearing cannot be made
	// durable (writes work again, the one fsync that would cover the
	// clearing fails): after a machine crash the bytes could be back.
	fo.failWrites(nil, nil)
	fo.failSyncs(syscall.EIO, 1)
	if last, err := l.Reopen(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Reopen while fsyncs fail = %d, %v; want it refused with EIO", last, err)
	}
	fo.heal()
	_, err := l.Append(seqEntries(4, 4)...)
	var fe *FailedError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "clearing its bytes failed too") {
		t.Fatalf("Append after the failed write could not be cleared: %v; want the log stopped (a *FailedError saying the clearing failed)", err)
	}
	if last, err := l.Reopen(); err != nil || last != 3 {
		t.Fatalf("Reopen = %d, %v; want 3", last, err)
	}
	mustAppend(t, l, seqEntries(4, 5)...)
	if got := readAll(t, l, 0); len(got) != 5 || got[4].Sequence != 5 {
		t.Fatalf("after Reopen: %d entries", len(got))
	}
}

// TestFailedFsyncAtARollStopsTheLog: a segment is fsynced before the next
// one starts; when that fsync fails, the log stops with the range it
// covered, as for any failed fsync — it does not go on in the next segment
// (whose fsyncs would then succeed and make the entries after the lost
// ones durable, leaving a gap after a crash).
func TestFailedFsyncAtARollStopsTheLog(t *testing.T) {
	dir := t.TempDir()
	o, fo := faultyOptions(t, dir, SyncNone)
	o.SegmentSize = MinSegmentSize // no fsync but at a roll
	l := mustOpen(t, o)
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 1)...)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	fo.failSyncs(syscall.EIO, 1) // the roll's; later fsyncs succeed
	segs := func() int { m, _ := filepath.Glob(filepath.Join(dir, "*.wal")); return len(m) }
	for s := uint64(2); segs() < 2 && s < 1000; s++ {
		if _, err := l.Append(seqEntries(s, s)...); err != nil {
			break // the log stopped
		}
		l.Hurry(s)
	}
	err := l.Sync()
	var fe *FailedError
	if !errors.As(err, &fe) || !errors.Is(err, syscall.EIO) || fe.First != 2 || fe.Durable != 1 {
		t.Fatalf("Sync after the roll's fsync failed: %v; want the log stopped, entries from 2 failed, 1 durable", err)
	}
	if last, err := l.Reopen(); err != nil || last != 1 {
		t.Fatalf("Reopen = %d, %v; want 1", last, err)
	}
}
