package api

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// connPool caps the connections of an HTTP listener and keeps room for the
// probes whatever the clients do. Every connection holds a slot: one of
// general slots (any request), or one of reserve slots (probe paths only).
//
//   - A new connection takes a free general slot.
//   - When none is free, it takes the slot of a connection that has had no
//     request in progress for at least grace: one that has not sent a
//     complete request header yet (a slow or silent client), or one idle
//     between requests (keep-alive), the longest-waiting first. That one is
//     closed. A legitimate client sends its header at once (a kubelet's probe
//     is in the socket buffer before it is accepted), so under a flood of
//     connections that send nothing the listener keeps turning over, and
//     the clients behind them in the kernel's backlog are reached within a
//     fraction of a second instead of after the header timeout.
//   - When every general connection is serving a request (a request that
//     waits for the agent, a slow upload), it takes a reserve slot: such a
//     connection is answered only on /healthz, /readyz and /metrics (503
//     elsewhere) and closed after one response.
//   - When nothing is free or can be taken, Accept waits and new clients wait
//     in the kernel's backlog, costing no descriptor.
//
// What can keep a general slot busy for long is bounded elsewhere: a client
// without the bearer token is answered 401 and disconnected, requests that
// wait (?wait=) are capped per client and in all (waiters.go), and a request
// must arrive whole within the server's read timeout.
type connPool struct {
	net.Listener
	general, reserve int
	grace            time.Duration
	onOpen           func(delta int) // a connection opened (+1) or closed (-1)
	onWait           func()          // Accept found every slot taken
	onEvict          func()          // a connection was closed to make room

	mu       sync.Mutex
	conns    map[*poolConn]struct{}
	nGeneral int
	nReserve int
	changed  chan struct{} // 1-buffered: a slot was freed or a connection went idle
	done     chan struct{}
	once     sync.Once
}

// connState is what a pooled connection is doing.
type connState int

const (
	connFresh connState = iota // accepted, no complete request header yet
	connBusy                   // a request is being served
	connIdle                   // keep-alive, between requests
)

type poolConn struct {
	net.Conn
	pool      *connPool
	probeOnly bool // in a reserve slot; fixed before Accept returns it

	// Guarded by pool.mu.
	state connState
	since time.Time // when it entered state
	gone  bool      // evicted or closed: it holds no slot any more
}

func newConnPool(l net.Listener, general, reserve int, grace time.Duration) *connPool {
	return &connPool{
		Listener: l, general: max(1, general), reserve: max(0, reserve), grace: grace,
		onOpen: func(int) {}, onWait: func() {}, onEvict: func() {},
		conns: map[*poolConn]struct{}{}, changed: make(chan struct{}, 1), done: make(chan struct{}),
	}
}

// Accept returns the next connection once it has a slot (see connPool).
func (p *connPool) Accept() (net.Conn, error) {
	waited := false
	for {
		p.mu.Lock()
		ok, next := p.admissibleLocked(time.Now())
		p.mu.Unlock()
		if ok {
			break
		}
		if !waited {
			waited = true
			p.onWait()
		}
		if err := p.sleep(next); err != nil {
			return nil, err
		}
	}
	c, err := p.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// Usually admitted at once; the slot seen free may have been taken by
	// a connection that went busy meanwhile, so wait again if need be.
	for {
		p.mu.Lock()
		pc, victim, next := p.admitLocked(c, time.Now())
		p.mu.Unlock()
		if victim != nil {
			victim.Conn.Close()
			p.onOpen(-1)
			p.onEvict()
		}
		if pc != nil {
			p.onOpen(1)
			return pc, nil
		}
		if err := p.sleep(next); err != nil {
			c.Close()
			return nil, err
		}
	}
}

// sleep waits for a change, until next (zero: a second at most), or for
// Close.
func (p *connPool) sleep(next time.Time) error {
	d := time.Second
	if !next.IsZero() {
		d = max(time.Millisecond, time.Until(next))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.changed:
	case <-t.C:
	case <-p.done:
		return net.ErrClosed
	}
	return nil
}

// admissibleLocked: whether a new connection would get a slot now, and if
// not, when the next connection becomes evictable (zero: none will by
// waiting alone).
func (p *connPool) admissibleLocked(now time.Time) (bool, time.Time) {
	if p.nGeneral < p.general || p.nReserve < p.reserve {
		return true, time.Time{}
	}
	victim, next := p.victimLocked(now)
	return victim != nil, next
}

// admitLocked gives c a slot, evicting a connection for it if need be
// (returned for the caller to close outside the lock), or returns nil and
// when to try again.
func (p *connPool) admitLocked(c net.Conn, now time.Time) (pc, victim *poolConn, next time.Time) {
	pc = &poolConn{Conn: c, pool: p, state: connFresh, since: now}
	switch {
	case p.nGeneral < p.general:
		p.nGeneral++
	default:
		victim, next = p.victimLocked(now)
		switch {
		case victim != nil:
			// The newcomer takes the victim's slot, of the same kind.
			victim.gone = true
			delete(p.conns, victim)
			pc.probeOnly = victim.probeOnly
		case p.nReserve < p.reserve:
			p.nReserve++
			pc.probeOnly = true
		default:
			return nil, nil, next
		}
	}
	p.conns[pc] = struct{}{}
	return pc, victim, time.Time{}
}

// victimLocked returns the connection to close for a newcomer: one without
// a request in progress for at least grace — one in a general slot before
// one in the reserve (the newcomer takes the victim's kind of slot), one
// that never sent a whole header before one idle between requests, the
// longest-waiting first. With none, it returns when the first becomes old
// enough (zero: none will by waiting alone).
func (p *connPool) victimLocked(now time.Time) (*poolConn, time.Time) {
	var best *poolConn
	var next time.Time
	for c := range p.conns {
		if c.state == connBusy {
			continue
		}
		if at := c.since.Add(p.grace); at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		if best == nil || evictFirst(c, best) {
			best = c
		}
	}
	if best != nil {
		return best, time.Time{}
	}
	return nil, next
}

// evictFirst: whether a is a better victim than b.
func evictFirst(a, b *poolConn) bool {
	if a.probeOnly != b.probeOnly {
		return !a.probeOnly
	}
	if a.state != b.state {
		return a.state == connFresh
	}
	return a.since.Before(b.since)
}

// connState records what a connection does now (http.Server.ConnState).
func (p *connPool) connState(c net.Conn, st http.ConnState) {
	pc, ok := c.(*poolConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive:
		p.set(pc, connBusy)
	case http.StateIdle:
		p.set(pc, connIdle)
	case http.StateClosed, http.StateHijacked:
		pc.release()
	}
}

func (p *connPool) set(pc *poolConn, st connState) {
	p.mu.Lock()
	pc.state, pc.since = st, time.Now()
	p.mu.Unlock()
	if st == connIdle {
		p.signal()
	}
}

func (p *connPool) signal() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// release frees pc's slot, once; an evicted connection's slot was already
// handed on.
func (pc *poolConn) release() {
	p := pc.pool
	p.mu.Lock()
	if pc.gone {
		p.mu.Unlock()
		return
	}
	pc.gone = true
	delete(p.conns, pc)
	if pc.probeOnly {
		p.nReserve--
	} else {
		p.nGeneral--
	}
	p.mu.Unlock()
	p.onOpen(-1)
	p.signal()
}

func (pc *poolConn) Close() error {
	err := pc.Conn.Close()
	pc.release()
	return err
}

func (p *connPool) Close() error {
	err := p.Listener.Close()
	p.once.Do(func() { close(p.done) })
	return err
}

// connKey is the request context's key for the *poolConn serving it.
type connKey struct{}

// connContext puts the pooled connection in its requests' context
// (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*poolConn); ok {
		return context.WithValue(ctx, connKey{}, pc)
	}
	return ctx
}

// probePaths are what a connection in a reserve slot, and the probe
// listener, answer.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// reserveGuard answers a request that came on a reserve slot only if it is
// for a probe path, and closes the connection after it: the reserve is for
// the probes, and frees itself at once.
func reserveGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pc, _ := r.Context().Value(connKey{}).(*poolConn)
		if pc == nil || !pc.probeOnly {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if r.Method != http.MethodGet || !probePaths[r.URL.Path] {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{
				"error": "the HTTP listener is at its connection cap (every connection is serving a request); retry shortly"})
			return
		}
		h.ServeHTTP(w, r)
	})
}
