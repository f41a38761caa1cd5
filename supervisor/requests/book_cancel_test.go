package requests

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/internal/crashfs"
)

// TestCancelRetriedUntilDurable: a cancellation whose record cannot be
// written is reported failed, and a retry is not reported done until the
// record is on disk: the retry writes it again, and after a power cut the
// request is still cancelled. (A retried Cancel returned the request as
// cancelled at once, without writing anything, and a power cut brought the
// request back pending, to be delivered again.) Needs root and /dev/fuse.
func TestCancelRetriedUntilDurable(t *testing.T) {
	var failing atomic.Bool
	d := newCrashDisk(t, crashfs.Options{FailFsync: func(c crashfs.Fsync) bool {
		return failing.Load() && !c.Dir && c.Path == "data/"+DirName+"/"+FileName
	}})
	b := testBook(t, d.data, Config{})
	if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	if v, err := b.Cancel("r1"); err == nil || v.Status != StatusCancelled {
		t.Fatalf("a cancellation the journal could not write: %q, %v (want the request cancelled here, and the error)", v.Status, err)
	}
	if v, err := b.Cancel("r1"); err == nil {
		t.Fatalf("a retried cancellation, the journal still failing: %q, no error", v.Status)
	}
	failing.Store(false)
	if v, err := b.Cancel("r1"); err != nil || v.Status != StatusCancelled {
		t.Fatalf("a retried cancellation, the disk back: %q, %v", v.Status, err)
	}
	d.powerCut(b.j)
	after := testBook(t, d.data, Config{})
	if v, ok := after.Get("r1"); !ok || v.Status != StatusCancelled {
		t.Fatalf("after the power cut: %q (known %v), want cancelled", v.Status, ok)
	}
}

// TestOpenLetsGoOfFinishedWithoutAgent: while no agent is up, the requests
// finished meanwhile leave the open list (they stayed there, and the book
// ticked every 50 ms, until an agent came up).
func TestOpenLetsGoOfFinishedWithoutAgent(t *testing.T) {
	b := testBook(t, fastDir(t), Config{MaxBytes: 1 << 30})
	for _, id := range []string{"r1", "r2"} {
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Cancel(id); err != nil {
			t.Fatal(err)
		}
	}
	for start := time.Now(); b.busy(); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			b.mu.Lock()
			n := len(b.open)
			b.mu.Unlock()
			t.Fatalf("with no agent up, %d cancelled requests still open after 5s", n)
		}
	}
}
