package conn

import (
	"errors"
	"fmt"
	"sync"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
)

// acks answers the wal_entry and wal_batch messages of one instance that
// carry ack: true with wal_ack once every entry up to the asked sequence is
// durable (docs/protocol.md, "Extensions").
//
// The frame reader records what was asked; when the frame was the last the
// agent sent (it waits) and the syncer is idle, the reader writes and
// fsyncs the entry itself (wal.Log.SyncIfIdle), and the ack goes out from
// the watcher on the reader, with no hand-off at all. Otherwise the ack is
// sent by the WAL's syncer goroutine itself, from a
// watcher (wal.Log.Watch) that runs right after each fsync: one cumulative
// ack for everything that became durable, written straight into the
// agent's pipe when nothing else is queued for it (Instance.sendSmall), else
// queued behind what is. No goroutine is woken between the fsync and the
// pipe: that hand-off (and the thread wake-up it costs on an idle machine)
// is what kept the round trip above the fsync floor (issue 31).
type acks struct {
	mu      sync.Mutex
	log     *wal.Log // the WAL this instance appends to (the shadow's is scratch)
	unwatch func()   // removes the watcher; nil until the first ask
	lo, hi  uint64   // lowest and highest sequence asked and not yet acknowledged; 0: none
	sent    uint64   // the highest sequence acknowledged
	stopped bool
}

// AckWhenDurable records that the agent asked for a wal_ack covering seq,
// an entry that l accepted (appended or skipped as a replay). The ack is sent
// when the entry is durable, by whoever made it so: the WAL's syncer, or —
// for the last frame the agent sent, with the syncer idle — the reader
// itself, which then returns after the fsync (wal.Log.SyncIfIdle).
func (in *Instance) AckWhenDurable(l *wal.Log, seq uint64) {
	a := &in.acks
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	if a.unwatch == nil {
		a.log = l
		a.unwatch = l.Watch(in.durableAdvanced)
	}
	if a.lo == 0 || seq < a.lo {
		a.lo = seq
	}
	a.hi = max(a.hi, seq)
	a.mu.Unlock()
	// With nothing more from the agent to read (it waits for this ack), the
	// reader makes the entry durable itself when the syncer is idle: the
	// ack is written from here, right after the fsync, with no goroutine
	// hand-off on the way (the time counts as our storage's, not the
	// agent's: the reader is inside a sink). Otherwise ask for the fsync now
	// (no batch window), then look once more: the fsync that covers seq may
	// have run before the ask was recorded.
	if !in.LastOfBurst() || !l.SyncIfIdle(seq) {
		l.Hurry(seq)
	}
	if fe := l.Failure(); fe != nil {
		in.durableAdvanced(fe.Durable, fe)
	} else {
		in.durableAdvanced(l.DurableSequence(), nil)
	}
}

// LastOfBurst reports whether the frame being handled is the last the agent
// has sent for now (nothing more is buffered): an agent that waits for an
// ack. Reader goroutine only (inside a sink).
func (in *Instance) LastOfBurst() bool { return in.lastOfBurst }

// durableAdvanced is the WAL watcher: entries up to durable are on disk
// (or, with failure, the log stopped and nothing above failure.Durable
// will be). It runs on the WAL's syncer goroutine and never blocks.
func (in *Instance) durableAdvanced(durable uint64, failure *wal.FailedError) {
	a := &in.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped || a.lo == 0 {
		return
	}
	lo, hi := a.lo, a.hi
	if durable >= lo {
		if durable >= hi {
			a.lo, a.hi = 0, 0
		} else {
			a.lo = durable + 1
		}
		if durable >= a.sent {
			// Under the lock, so that acks never go backwards. Equal: a
			// replayed entry asked again, answered again.
			a.sent = durable
			in.sendAck(durable)
		}
	}
	if failure != nil && a.lo != 0 {
		// What is still asked will never be durable: say so, never ack it.
		first := a.lo
		a.lo, a.hi = 0, 0
		in.ackFailed(failure, first, hi)
	}
}

// sendAck sends wal_ack for everything up to seq.
func (in *Instance) sendAck(seq uint64) {
	b, err := in.codec.Encode(&schema.WALAck{Sequence: seq})
	if err != nil {
		in.log.Error("cannot encode wal_ack", "err", err)
		return
	}
	if in.sendSmall(schema.TypeWALAck, b) {
		in.met.WALAcks.Inc()
	}
}

// stopAcks removes the watcher; asks after that are ignored. When it
// returns, no ack of this instance is being sent.
func (in *Instance) stopAcks() {
	a := &in.acks
	a.mu.Lock()
	a.stopped = true
	unwatch := a.unwatch
	a.unwatch = nil
	a.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
}

// ackFailed answers asks that can no longer be acknowledged (the WAL could
// not write them) with the storage error, never an ack.
func (in *Instance) ackFailed(err error, first, last uint64) {
	code := schema.CodeWALFailed
	if errors.Is(err, wal.ErrNoSpace) {
		code = schema.CodeWALFull
	}
	details := map[string]any{"first_sequence": first, "last_sequence": last}
	var fe *wal.FailedError
	if errors.As(err, &fe) {
		// The log stopped: name every sequence it does not hold.
		if fe.First != 0 {
			first, last = min(first, fe.First), max(last, fe.Last)
		}
		details = map[string]any{"first_sequence": first, "last_sequence": last, "durable_sequence": fe.Durable}
	}
	in.met.WALErrors.WithLabelValues(code).Inc()
	in.log.Error("WAL entries asked for wal_ack are not durable; told the agent", "code", code, "err", err,
		"first_sequence", first, "last_sequence", last)
	in.SendMsg(schema.NewError(code, fmt.Sprintf("WAL entries %d..%d may not be durable: %v; do not act on them", first, last, err), details))
}
