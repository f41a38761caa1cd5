package wal

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestWatchRunsOnDurability: a watcher sees each new durable sequence, and
// sees it before WaitDurable's waiters are woken (so an ack written from it
// leaves before anyone else hears of the fsync).
func TestWatchRunsOnDurability(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncAlways, SyncNone} {
		t.Run(policy.String(), func(t *testing.T) {
			o := testOptions(t, t.TempDir())
			o.Sync = policy
			l := mustOpen(t, o)
			defer l.Close()
			var mu sync.Mutex
			var seen []uint64
			stop := l.Watch(func(d uint64, fe *FailedError) {
				if fe != nil {
					t.Errorf("failure %v on a healthy log", fe)
				}
				mu.Lock()
				seen = append(seen, d)
				mu.Unlock()
			})
			for s := uint64(1); s <= 20; s++ {
				mustAppend(t, l, seqEntries(s, s)...)
				l.Hurry(s)
				if err := l.WaitDurable(t.Context(), s); err != nil {
					t.Fatal(err)
				}
				// The watcher ran before the waiter was woken.
				mu.Lock()
				last := uint64(0)
				if len(seen) > 0 {
					last = seen[len(seen)-1]
				}
				mu.Unlock()
				if last < s {
					t.Fatalf("WaitDurable(%d) returned; the watcher has seen only %d", s, last)
				}
			}
			stop()
			mustAppend(t, l, seqEntries(21, 21)...)
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i := 1; i < len(seen); i++ {
				if seen[i] < seen[i-1] {
					t.Fatalf("durable went backwards: %v", seen)
				}
			}
			if seen[len(seen)-1] != 20 {
				t.Fatalf("the watcher ran after stop: %v", seen)
			}
		})
	}
}

// TestWatchSeesFailure: a failed fsync stops the log, and the watcher hears
// of it with what stays durable.
func TestWatchSeesFailure(t *testing.T) {
	o, fo := faultyOptions(t, t.TempDir(), SyncBatch)
	l := mustOpen(t, o)
	defer l.Close()
	mustAppend(t, l, seqEntries(1, 5)...)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make(chan *FailedError, 4)
	defer l.Watch(func(d uint64, fe *FailedError) {
		if fe != nil {
			got <- fe
		}
	})()
	fo.failSyncs(syscall.EIO, -1)
	mustAppend(t, l, seqEntries(6, 8)...)
	l.Hurry(8)
	select {
	case fe := <-got:
		if fe.Durable != 5 || !errors.Is(fe, ErrWriteFailed) {
			t.Fatalf("failure %+v, want durable 5 and ErrWriteFailed", fe)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher never heard of the failed fsync")
	}
}

// TestHurryEndsTheBatchWindow: under SyncBatch, while more entries keep
// arriving, written entries wait up to SyncInterval for their fsync; an
// entry somebody hurries for is made durable at once, as for a WaitDurable
// caller. Here every write brings another append, so something is always
// pending, and SyncInterval is an hour.
func TestHurryEndsTheBatchWindow(t *testing.T) {
	o, fo := faultyOptions(t, t.TempDir(), SyncBatch)
	o.SyncInterval = time.Hour
	l := mustOpen(t, o)
	defer l.Close()
	const flood = 200
	next, writes := uint64(2), 0
	floodOver := false
	var mu sync.Mutex
	fo.afterWrite = func() { // on the syncer goroutine
		mu.Lock()
		defer mu.Unlock()
		writes++
		if next <= flood {
			if _, err := l.Append(seqEntries(next, next)...); err != nil && !errors.Is(err, ErrClosed) {
				t.Error(err)
			}
			next++
		} else {
			floodOver = true
		}
	}
	first := make(chan bool, 1)
	defer l.Watch(func(d uint64, _ *FailedError) {
		mu.Lock()
		over := floodOver
		mu.Unlock()
		select {
		case first <- over:
		default:
		}
	})()
	mustAppend(t, l, seqEntries(1, 1)...)
	l.Hurry(1)
	if over := <-first; over {
		t.Fatal("the hurried entry was made durable only after the flood ended: Hurry did not end the batch window")
	}
}

// TestSyncIfIdle: with the syncer idle, SyncIfIdle makes the entries
// durable on the caller's goroutine — the watchers run there, before it
// returns — and with HoldKick the append did not wake the syncer for them.
// While the syncer is at work SyncIfIdle does nothing (false). An append
// under HoldKick that nobody syncs is written once ReleaseKick wakes the
// syncer.
func TestSyncIfIdle(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncNone} {
		t.Run(policy.String(), func(t *testing.T) {
			o := testOptions(t, t.TempDir())
			o.Sync = policy
			l := mustOpen(t, o)
			defer l.Close()
			var mu sync.Mutex
			var seen uint64
			l.Watch(func(d uint64, _ *FailedError) {
				mu.Lock()
				seen = max(seen, d)
				mu.Unlock()
			})
			for s := uint64(1); s <= 20; s++ {
				l.HoldKick()
				mustAppend(t, l, seqEntries(s, s)...)
				if !l.SyncIfIdle(s) {
					// The syncer may be finishing the previous round
					// (the mark, a preparation): not idle, fine.
					l.Hurry(s)
				} else {
					mu.Lock()
					got := seen
					mu.Unlock()
					if got < s || l.DurableSequence() < s {
						t.Fatalf("SyncIfIdle(%d) returned true; durable %d, the watcher saw %d", s, l.DurableSequence(), got)
					}
				}
				l.ReleaseKick()
				if err := l.WaitDurable(t.Context(), s); err != nil {
					t.Fatal(err)
				}
			}

			// After a slow fsync the disk is left to the syncer.
			l.lastSyncNanos.Store(int64(inlineSyncMax))
			if l.SyncIfIdle(20) {
				t.Fatal("SyncIfIdle wrote on the caller after a slow fsync")
			}
			l.lastSyncNanos.Store(0)

			// The syncer at work: SyncIfIdle does not wait for it.
			l.drainMu.Lock()
			l.HoldKick()
			mustAppend(t, l, seqEntries(21, 21)...)
			if l.SyncIfIdle(21) {
				t.Fatal("SyncIfIdle wrote while the syncer held the log")
			}
			l.drainMu.Unlock()
			// Held kick, nobody syncing: ReleaseKick hands it to the syncer.
			l.ReleaseKick()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := l.WaitDurable(ctx, 21); err != nil {
				t.Fatalf("entry 21 appended under HoldKick never made durable after ReleaseKick: %v", err)
			}
		})
	}
}
