package supervisor

// A failed WAL fsync or write (SPEC §4, "A failed fsync is never retried as
// if the data were safe"): the log stops, the agent is told exactly which
// sequences are not in it, and it is restarted from the log once the log is
// reopened from the disk — so the agent's state, the log and every later
// checkpoint's watermark agree.

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// reasonWALFailed is the restart reason after a WAL failure.
const reasonWALFailed = "wal_failed"

// onWALFailure is the stores' OnWALFailure: it runs on the WAL's syncer
// and only hands the failure to the owner loop. One pending failure is
// enough: the start after it reopens the log whatever came since.
func (s *Supervisor) onWALFailure(fe *wal.FailedError) {
	select {
	case s.inbox.walFailed <- fe:
	default:
	}
}

// walFailed reports a stopped WAL and stops the primary (owner only): it is
// told the failed range and asked to shut down; its restart reopens the log
// (assembleStart) and restores it from what the log holds. The restart is
// not the agent's failure: it happens whatever --restart says, and its
// back-off never counts towards --max-restarts (a full disk is waited out).
func (s *Supervisor) walFailed(fe *wal.FailedError) {
	s.lc.walFailed = fe
	s.publish()
	fields := map[string]any{"error": fe.Err.Error(), "durable_sequence": fe.Durable}
	if fe.First != 0 {
		fields["first_sequence"], fields["last_sequence"] = fe.First, fe.Last
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelError,
		Msg: "WAL write or fsync failed: the log stopped, and the entries not yet durable are not in it (never retried as if safe). " +
			"The agent is told their exact range and restarted from what the log holds once it is reopened from the disk. Check the disk under --data-dir (dmesg, df)",
		Kind: observe.AuditWALError, Fields: fields, Count: s.met.WALFsyncFailures})
	in := s.lc.cur
	if in == nil || in.stopping {
		return // the next start reopens the log
	}
	if fe.First != 0 {
		e := walFailedError(fe, fe.First, fe.Last)
		s.met.WALErrors.WithLabelValues(e.Error.Code).Inc()
		in.SendMsg(e)
	}
	in.SendMsg(&schema.Shutdown{Reason: "the supervisor's WAL failed; you are restarted and restored from what it holds"})
	// It reads the error and the shutdown first, and exits; signalled only
	// when it does not within --kill-timeout.
	s.stopInstanceAfter(in, reasonWALFailed, s.cfg.KillTimeout)
}

// walFailedError is the WAL_FAILED (WAL_FULL when the disk is full) an agent
// gets for entries first..last that the stopped log does not hold: the range
// is widened to the log's whole failed range, so it names every sequence
// that is not in the log.
func walFailedError(fe *wal.FailedError, first, last uint64) *schema.Error {
	if fe.First != 0 {
		first, last = min(first, fe.First), max(last, fe.Last)
	}
	code := schema.CodeWALFailed
	if errors.Is(fe, wal.ErrNoSpace) {
		code = schema.CodeWALFull // the disk is full: what stopped the log
	}
	return schema.NewError(code,
		fmt.Sprintf("WAL entries %d..%d are not in the log: the WAL failed (%v); do not act on them — you are restarted from what the log holds", first, last, fe.Err),
		map[string]any{"first_sequence": first, "last_sequence": last, "durable_sequence": fe.Durable})
}

// errWALStopped: a start found the WAL stopped and could not reopen it.
var errWALStopped = errors.New("the WAL is stopped after a failed fsync or write and could not be reopened")
