package durable

import (
	"testing"
	"testing/synctest"
)

// TestByteGateBoundsBytes: an item that does not fit waits until a release
// makes room. In a synctest bubble, synctest.Wait returns once the waiter
// has entered or is blocked at the gate: "it did not enter" is known, not
// hoped for after a sleep.
func TestByteGateBoundsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newByteGate(100)
		if waited, ok := g.acquire(60, nil); !ok || waited {
			t.Fatal("first item must enter at once")
		}
		if _, ok := g.acquire(40, nil); !ok {
			t.Fatal("an item that fits must enter")
		}
		entered := make(chan struct{})
		go func() {
			g.acquire(10, nil)
			close(entered)
		}()
		synctest.Wait()
		select {
		case <-entered:
			t.Fatal("entered a full gate")
		default:
		}
		g.release(60)
		<-entered
		if g.inUse() != 50 {
			t.Fatalf("in use %d, want 50", g.inUse())
		}
		g.release(40)
		g.release(10)
		// One item larger than the bound is admitted alone.
		if _, ok := g.acquire(1000, nil); !ok {
			t.Fatal("an oversized item into an empty gate")
		}
		cancel := make(chan struct{})
		close(cancel)
		if _, ok := g.acquire(1, cancel); ok {
			t.Fatal("acquired past an oversized item")
		}
	})
}

// inUse returns the bytes reserved now.
func (g *byteGate) inUse() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used
}
