package durable

import "sync"

// byteGate bounds the bytes held by a queue. acquire blocks while the queue
// holds other items and adding n would exceed max; a single item larger
// than max is admitted alone (it is already in memory: refusing it would
// not free anything), so the bound is max or one item, whichever is larger.
type byteGate struct {
	mu    sync.Mutex
	max   int64
	used  int64
	freed chan struct{} // closed and replaced on every release
}

func newByteGate(max int64) *byteGate {
	return &byteGate{max: max, freed: make(chan struct{})}
}

// acquire reserves n bytes, waiting for room. It reports whether it had to
// wait, and false ok when cancel closed first (nothing reserved).
func (g *byteGate) acquire(n int64, cancel <-chan struct{}) (waited, ok bool) {
	for {
		g.mu.Lock()
		if g.used == 0 || g.used+n <= g.max {
			g.used += n
			g.mu.Unlock()
			return waited, true
		}
		ch := g.freed
		g.mu.Unlock()
		waited = true
		select {
		case <-ch:
		case <-cancel:
			return waited, false
		}
	}
}

// release returns n bytes reserved by acquire.
func (g *byteGate) release(n int64) {
	g.mu.Lock()
	g.used -= n
	close(g.freed)
	g.freed = make(chan struct{})
	g.mu.Unlock()
}
