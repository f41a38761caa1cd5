package requests

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// The journal's write path: what a ticket promises, on success and on
// failure, and what is on disk afterwards.

// waitDone waits for a ticket's completion without taking the writer's
// place (Done, not Wait): what completes it is the journal's own goroutine.
func waitDone(t *testing.T, tk *Ticket, what string) error {
	t.Helper()
	select {
	case <-tk.Done():
		return tk.err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: its ticket was never completed", what)
		return nil
	}
}

// TestJournalRecordOverLimitRefused: a record the journal could not read
// back (over maxRecord) is refused at Append — its ticket fails, nothing of
// it is written — instead of being acknowledged and then skipped as damage
// by the next start.
func TestJournalRecordOverLimitRefused(t *testing.T) {
	dir := t.TempDir()
	j, _ := openStarted(t, dir, nil)
	big := &Record{Kind: KindAccepted, ID: "big", Body: bytes.Repeat([]byte("x"), maxRecord)}
	err := j.Append(accepted("a"), big).Wait()
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("a record over %d bytes: %v, want refused", maxRecord, err)
	}
	if err := j.Append(accepted("b")).Wait(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	wantReplay(t, dir, "replay", "b")
}

// TestJournalCloseWritesWhatIsQueued: Close writes every queued record —
// lazy ones too — before it returns, a second Close is harmless, and an
// Append after Close fails at once instead of waiting for a writer that is
// gone. A lazy record alone is written within lazyDelay, nobody waiting.
func TestJournalCloseWritesWhatIsQueued(t *testing.T) {
	dir := t.TempDir()
	j, _ := openStarted(t, dir, nil)
	if err := waitDone(t, j.AppendLazy(accepted("lazy-alone")), "a lazy record nobody waits for"); err != nil {
		t.Fatal(err)
	}
	lazy := j.AppendLazy(accepted("lazy"))
	urgent := j.Append(accepted("urgent"))
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for name, tk := range map[string]*Ticket{"lazy": lazy, "urgent": urgent} {
		select {
		case <-tk.Done():
			if tk.err != nil {
				t.Fatalf("%s record at Close: %v", name, tk.err)
			}
		default:
			t.Fatalf("Close returned with the %s record not written", name)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := waitDone(t, j.Append(accepted("late")), "an Append after Close"); err == nil {
		t.Fatal("an Append after Close succeeded")
	}
	rp := replayOf(t, dir)
	if got := recordIDs(rp); !slices.Equal(got, []string{"lazy-alone", "lazy", "urgent"}) {
		t.Fatalf("replay: %v", got)
	}
}

// TestJournalConcurrentAppends: many goroutines appending at once, waiting
// or not, urgent or lazy: every record whose ticket succeeded is on disk
// exactly once, nothing is damaged, no ticket is left waiting, and onSync
// has counted every byte written.
func TestJournalConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var synced atomic.Int64
	j.Start(func() []*Record { return nil }, func(n int64, err error) {
		if err == nil {
			synced.Add(n)
		}
	})
	const workers, each = 8, 150
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lazy []*Ticket
			for i := range each {
				r := accepted(fmt.Sprintf("w%d-%03d", w, i))
				switch i % 3 {
				case 0:
					if err := j.Append(r).Wait(); err != nil {
						t.Error(err)
					}
				case 1:
					lazy = append(lazy, j.AppendLazy(r))
				default:
					lazy = append(lazy, j.Append(r))
				}
			}
			for _, tk := range lazy {
				if err := tk.Wait(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("appends still waiting after 60 s: a ticket was left behind")
	}
	size := j.Size()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	rp := replayOf(t, dir)
	if rp.Corruption != nil || rp.TruncatedBytes != 0 || rp.Size != size {
		t.Fatalf("replay: corruption %v, truncated %d, size %d (journal said %d)", rp.Corruption, rp.TruncatedBytes, rp.Size, size)
	}
	got := recordIDs(rp)
	sort.Strings(got)
	var want []string
	for w := range workers {
		for i := range each {
			want = append(want, fmt.Sprintf("w%d-%03d", w, i))
		}
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("replay holds %d records, want the %d appended, each once", len(got), len(want))
	}
	if synced.Load() != size {
		t.Fatalf("onSync counted %d bytes, the journal holds %d", synced.Load(), size)
	}
}

// TestJournalFailedSyncKeepsNothing: when the fsync after a write fails, the
// ticket fails (ErrDiskFull for ENOSPC, so the API answers 507), and the
// records are cut from the file at once, so that a crash cannot bring back
// what was refused; the journal goes on when the disk does.
func TestJournalFailedSyncKeepsNothing(t *testing.T) {
	for _, tc := range []struct {
		errno    error
		diskFull bool
	}{{unix.ENOSPC, true}, {unix.EDQUOT, true}, {unix.EIO, false}} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			dir := t.TempDir()
			j, _, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			var failing atomic.Bool
			j.sync = func(f *os.File) error {
				if failing.Load() {
					return tc.errno
				}
				return datasync(f)
			}
			j.Start(func() []*Record { return nil }, nil)
			defer j.Close()
			if err := j.Append(accepted("a")).Wait(); err != nil {
				t.Fatal(err)
			}
			kept := j.Size()
			failing.Store(true)
			refused := &Record{Kind: KindAccepted, ID: "refused", Body: bytes.Repeat([]byte("r"), 4000)}
			err = j.Append(refused).Wait()
			if err == nil || !errors.Is(err, tc.errno) || errors.Is(err, ErrDiskFull) != tc.diskFull {
				t.Fatalf("a write whose fsync fails with %v: %v (want it, ErrDiskFull %v)", tc.errno, err, tc.diskFull)
			}
			if rp := replayOf(t, dir); !slices.Equal(recordIDs(rp), []string{"a"}) || rp.Size != kept {
				t.Fatalf("the file after the failed write holds %v (%d bytes), want only a (%d): the refused record must not be left for a crash to keep",
					recordIDs(rp), rp.Size, kept)
			}
			failing.Store(false)
			if err := j.Append(accepted("b")).Wait(); err != nil {
				t.Fatalf("after the disk recovered: %v", err)
			}
			j.Close()
			wantReplay(t, dir, "replay", "a", "b")
		})
	}
}

// TestJournalFailedCompactionKeepsTheJournal: a compaction that fails
// leaves the journal as it was, with no temporary file beside it, and the
// records after it go after the last one written, not over it.
func TestJournalFailedCompactionKeepsTheJournal(t *testing.T) {
	dir := t.TempDir()
	asked := make(chan struct{})
	j, _ := openStarted(t, dir, func() []*Record {
		close(asked)
		// A record the journal cannot write: the compaction fails.
		return []*Record{{Kind: KindAccepted, ID: "big", Body: bytes.Repeat([]byte("x"), maxRecord)}, accepted("a")}
	})
	if err := j.Append(accepted("a"), accepted("b")).Wait(); err != nil {
		t.Fatal(err)
	}
	v := j.Version()
	j.Compact()
	<-asked
	// The writer is compacting (or done): c is written after it.
	if err := j.Append(accepted("c")).Wait(); err != nil {
		t.Fatal(err)
	}
	if j.Version() != v+1 {
		t.Fatalf("version %d → %d after one write: a failed compaction counted as a change", v, j.Version())
	}
	j.Close()
	wantReplay(t, dir, "replay", "a", "b", "c")
	if tmp, _ := filepath.Glob(filepath.Join(dir, DirName, "*"+atomicfile.TempSuffix)); len(tmp) != 0 {
		t.Fatalf("the failed compaction left %v", tmp)
	}
}

// TestJournalRealDiskFull fills a small tmpfs (needs root and mount;
// skipped otherwise). A record that fits is written even when the zeros the
// journal grows its file by ahead of its records do not (they are dropped);
// one that does not fit fails with ErrDiskFull and is cut from the file; once
// space is freed the journal goes on, without a restart.
func TestJournalRealDiskFull(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=512k"); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (%v); TestJournalFailedSyncKeepsNothing covers ENOSPC injected", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	j, _ := openStarted(t, mnt, nil)
	// Fill the disk, then free 64 KiB: room for records, not for the
	// journal's 1 MiB of zeros ahead.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	fi, _ := f.Stat()
	if err := f.Truncate(fi.Size() - 64<<10); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if err := j.Append(accepted("a")).Wait(); err != nil {
		t.Fatalf("a record that fits on the disk: %v", err)
	}
	huge := &Record{Kind: KindAccepted, ID: "huge", Body: bytes.Repeat([]byte("h"), 256<<10)}
	if err := j.Append(huge).Wait(); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("a record larger than the free space: %v, want ErrDiskFull", err)
	}
	if rp := replayOf(t, mnt); !slices.Equal(recordIDs(rp), []string{"a"}) || rp.TruncatedBytes != 0 {
		t.Fatalf("after the refused record the file holds %v (torn: %d bytes), want [a]", recordIDs(rp), rp.TruncatedBytes)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(huge, accepted("b")).Wait(); err != nil {
		t.Fatalf("after space was freed: %v", err)
	}
	j.Close()
	wantReplay(t, mnt, "replay", "a", "huge", "b")
}

// TestJournalCompactionOpenFails: a compaction that cannot open the
// compacted file for writing (EMFILE under a flood of connections) loses
// nothing: the records written after it are in the journal, not in a file
// no name leads to.
func TestJournalCompactionOpenFails(t *testing.T) {
	dir := t.TempDir()
	asked := make(chan struct{})
	j, _ := openStarted(t, dir, func() []*Record {
		close(asked)
		return []*Record{accepted("a"), accepted("b")}
	})
	if err := j.Append(accepted("a"), accepted("b")).Wait(); err != nil {
		t.Fatal(err)
	}
	saved := openCompacted
	openCompacted = func(*os.File, string) (*os.File, error) { return nil, unix.EMFILE }
	defer func() { openCompacted = saved }()
	j.Compact()
	<-asked
	// The writer is compacting (or done): c is written after it.
	if err := j.Append(accepted("c")).Wait(); err != nil {
		t.Fatal(err)
	}
	openCompacted = saved
	if err := j.Append(accepted("d")).Wait(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	wantReplay(t, dir, "replay", "a", "b", "c", "d")
}
