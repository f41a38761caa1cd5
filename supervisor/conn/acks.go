package conn

import (
	"context"
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
// The frame reader only records what was asked (asked never blocks); one
// goroutine per instance, started by the first ask, waits on the WAL's
// durable sequence and sends one cumulative ack for everything that became
// durable. Under group commit many asks are answered by one fsync and one
// ack. The goroutine is owned by the instance: finish stops it and waits.
type acks struct {
	mu      sync.Mutex
	log     *wal.Log // the WAL this instance appends to (the shadow's is scratch)
	lo, hi  uint64   // lowest and highest sequence asked and not yet acknowledged; 0: none
	kick    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

// ackWhenDurable records that the agent asked for a wal_ack covering seq,
// an entry that l accepted (appended or skipped as a replay). It returns at
// once; the ack is sent by the instance's acker.
func (in *Instance) AckWhenDurable(l *wal.Log, seq uint64) {
	a := &in.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	if a.done == nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.log, a.cancel = l, cancel
		a.kick, a.done = make(chan struct{}, 1), make(chan struct{})
		go in.ackLoop(ctx)
	}
	if a.lo == 0 || seq < a.lo {
		a.lo = seq
	}
	a.hi = max(a.hi, seq)
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// stopAcks ends the acker and waits for it; asks after that are ignored. It
// may be called more than once.
func (in *Instance) stopAcks() {
	a := &in.acks
	a.mu.Lock()
	a.stopped = true
	cancel, done := a.cancel, a.done
	a.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (in *Instance) ackLoop(ctx context.Context) {
	a := &in.acks
	defer close(a.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		}
		for {
			a.mu.Lock()
			lo, hi := a.lo, a.hi
			a.mu.Unlock()
			if lo == 0 {
				break
			}
			// Wait for the lowest ask: whatever the next fsync makes durable
			// is acknowledged at once, asks above it in a later round.
			err := a.log.WaitDurable(ctx, lo)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				a.mu.Lock()
				a.lo, a.hi = 0, 0
				a.mu.Unlock()
				in.ackFailed(err, lo, hi)
				continue
			}
			d := a.log.DurableSequence()
			a.mu.Lock()
			switch {
			case d >= a.hi:
				a.lo, a.hi = 0, 0
			case d >= a.lo:
				a.lo = d + 1 // a lower bound for what is still asked
			default:
				// WaitDurable returned with nothing durable at lo: the log no
				// longer holds it (an operator's rollback truncated it).
				// Nothing up to lo is acknowledged; the asks are dropped.
				in.log.Warn("wal_ack not sent: the asked entries are no longer in the WAL", "sequence", lo, "durable_sequence", d)
				a.lo, a.hi = 0, 0
				a.mu.Unlock()
				continue
			}
			a.mu.Unlock()
			if in.SendMsg(&schema.WALAck{Sequence: d}) {
				in.met.WALAcks.Inc()
			}
		}
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
