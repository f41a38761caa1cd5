package wal

// Watching durability from the syncer goroutine (issue 31: wal_ack at the
// fsync floor). A WaitDurable caller is woken through a channel after the
// fsync: one goroutine hand-off, and on an idle machine one thread wake-up,
// before it can act. A watcher runs on the syncer goroutine itself, right
// after the fsync returns and before any waiter is woken, so whoever needs
// to tell somebody (the agent's wal_ack) does it without a hop.

// Watch registers fn to be called on the syncer goroutine each time entries
// become durable, with the last durable sequence, and once when the log
// stops after a failure, with the [FailedError] (durable is then
// failure.Durable). fn runs before WaitDurable's waiters are woken and
// holds up the syncer while it runs: it must return quickly and never block
// (no waiting on a pipe, a channel or the log). It may call the log's read
// accessors (DurableSequence, Failure).
//
// The returned stop removes fn; when stop returns, fn is not running and is
// not called again. stop must not be called from fn, nor while holding a
// lock fn takes.
func (l *Log) Watch(fn func(durable uint64, failure *FailedError)) (stop func()) {
	w := &watcher{fn: fn}
	l.watchMu.Lock()
	l.watchers = append(l.watchers[:len(l.watchers):len(l.watchers)], w)
	l.watched.Store(true)
	l.watchMu.Unlock()
	return func() {
		l.watchMu.Lock()
		defer l.watchMu.Unlock()
		for i, x := range l.watchers {
			if x == w {
				ws := make([]*watcher, 0, len(l.watchers)-1)
				ws = append(ws, l.watchers[:i]...)
				l.watchers = append(ws, l.watchers[i+1:]...)
				break
			}
		}
		l.watched.Store(len(l.watchers) > 0)
	}
}

type watcher struct {
	fn func(durable uint64, failure *FailedError)
}

// callWatchers runs the watchers (on the syncer goroutine).
func (l *Log) callWatchers(durable uint64, failure *FailedError) {
	l.watchMu.Lock()
	defer l.watchMu.Unlock()
	for _, w := range l.watchers {
		w.fn(durable, failure)
	}
}

// Hurry asks for the entries up to seq to be made durable without waiting
// for more to arrive: what a WaitDurable caller's presence does under
// [SyncBatch], for a caller that watches instead of waiting (Watch).
func (l *Log) Hurry(seq uint64) {
	l.mu.Lock()
	if seq > l.wanted {
		l.wanted = seq
	}
	urgent := l.wanted > l.durable
	l.mu.Unlock()
	if urgent {
		l.kickSyncer()
	}
}
