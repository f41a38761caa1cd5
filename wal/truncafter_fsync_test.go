package wal

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// TruncateAfter that must rewrite a segment (a record holds entries on both
// sides of the cut) and whose directory fsync fails after the rename. The
// file on disk already holds the cut segment, but the log kept the old
// description (size and last sequence): the next appends were written at the
// old, larger offset past the end of the shorter file, leaving a hole of
// zeros before them, so the entries acknowledged after the failed rollback
// were unreadable and recovery cut the log at the hole (reported as
// corruption below the durable mark). And since the rename is not known to
// be durable, a power cut may bring the old segment back, taking every entry
// appended to the new inode with it: like any failed fsync, it must stop the
// log until Reopen (which fsyncs the directory again from what is on disk).
func TestTruncateAfterRewriteWithFailedDirFsync(t *testing.T) {
	dir := t.TempDir()
	o := testOptions(t, dir)
	o.Sync = SyncAlways
	l := mustOpen(t, o)
	mustAppend(t, l, Entry{1, []byte("one")}, Entry{2, []byte("two")}, Entry{3, []byte("three")})
	mustAppend(t, l, Entry{4, []byte("four")}, Entry{5, []byte("five")}, Entry{6, []byte("six")})

	d := &dirSyncs{}
	remove := atomicfile.SetSyncHook(d.hook)
	d.fail(dir, syscall.EIO, 1)
	_, err := l.TruncateAfter(5) // rewrites the segment: record 4..6 is split
	remove()
	if !errors.Is(err, atomicfile.ErrNotDurable) || !errors.Is(err, ErrFailed) {
		t.Fatalf("TruncateAfter: %v, want the failed directory fsync", err)
	}
	// The log stops, as after any failed fsync, until Reopen.
	if _, err := l.Append(Entry{100, []byte("x")}); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after the failed TruncateAfter: %v, want ErrFailed", err)
	}
	if _, err := l.Reopen(); err != nil {
		t.Fatalf("Reopen: %v", err)
	}
	last := l.LastSequence()
	t.Logf("LastSequence after the failed TruncateAfter: %d", last)
	for s := last + 1; s <= last+3; s++ {
		if _, err := l.Append(Entry{s, []byte(fmt.Sprintf("new-%d", s))}); err != nil {
			t.Fatalf("append %d: %v", s, err)
		}
	}
	var got []uint64
	rerr := l.ReadAfter(0, func(e Entry) error { got = append(got, e.Sequence); return nil })
	if rerr != nil {
		t.Errorf("ReadAfter on the running log: %v (read %v)", rerr, got)
	}
	l.Close()
	l2 := mustOpen(t, o)
	defer l2.Close()
	if c := l2.Recovery().Corruption; c != nil {
		t.Errorf("corruption at reopen: %v", c)
	}
	if l2.LastSequence() != last+3 {
		t.Fatalf("after reopen the log ends at %d; %d..%d were appended and acknowledged (SyncAlways)", l2.LastSequence(), last+1, last+3)
	}
}
