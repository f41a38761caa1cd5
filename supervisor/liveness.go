package supervisor

// Liveness: heartbeat deadlines, stopping an instance, reading what it wrote
// before it died, and reaping it.

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wire"
)

// beat is an instance's heartbeat as its deadline sees it.
type beat struct {
	age   time.Duration // since the last heartbeat, or the start (HeartbeatAge)
	seen  bool          // a heartbeat has arrived
	limit time.Duration // --start-timeout before the first, --heartbeat-timeout after
	// stalled is how long a frame for the agent has waited for it to read
	// its pipe (conn.WriteStalled). A full queue is our back-pressure; an
	// agent that reads nothing for the whole limit is unresponsive.
	stalled time.Duration
}

// late reports whether the instance has missed its deadline.
func (b beat) late() bool { return b.age >= b.limit }

// unread reports whether the instance has read nothing of its input for the
// whole deadline while a frame waited for it.
func (b beat) unread() bool { return b.stalled >= b.limit }

// heartbeat is the one place the heartbeat deadline is computed: for the
// primary's timer, its liveness check, a shadow's, and readiness.
func (s *Supervisor) heartbeat(in *conn.Instance, now time.Time) beat {
	age, seen := in.HeartbeatAge(now)
	b := beat{age: age, seen: seen, limit: s.cfg.StartTimeout, stalled: in.WriteStalled(now)}
	if seen {
		b.limit = s.cfg.HeartbeatTimeout
	}
	return b
}

// armHeartbeat sets the timer to the current instance's heartbeat deadline.
func (s *Supervisor) armHeartbeat() {
	t := s.lc.hbTimer
	if s.lc.cur == nil || s.lc.cur.stopping {
		t.Stop()
		return
	}
	b := s.heartbeat(s.lc.cur.Instance, time.Now())
	t.Reset(max(b.limit-b.age, time.Millisecond))
}

func (s *Supervisor) checkHeartbeat() {
	in := s.lc.cur
	if in == nil || in.stopping {
		return
	}
	switch b := s.heartbeat(in.Instance, time.Now()); {
	case b.late() && !b.seen:
		s.log.Error("agent sent no heartbeat within --start-timeout; stopping it", "start_timeout", s.cfg.StartTimeout, "pid", in.Proc().ID())
		s.stopInstance(in, "start_timeout")
	case b.late():
		s.log.Error("agent is hung: no heartbeat within --heartbeat-timeout; stopping it", "heartbeat_timeout", s.cfg.HeartbeatTimeout, "last_heartbeat_age", b.age.Round(time.Millisecond), "pid", in.Proc().ID())
		s.stopInstance(in, "hung")
	case b.unread():
		s.log.Error("agent stopped reading its input: a frame has waited for it longer than its heartbeat deadline; restarting it",
			"waited", b.stalled.Round(time.Millisecond), "limit", b.limit, "queued_bytes", in.OutQueued(), "pid", in.Proc().ID())
		s.stopInstance(in, "unresponsive")
	default:
		s.armHeartbeat()
	}
}

// stopInstance stops an instance in the background: SIGTERM to its group,
// SIGKILL after --kill-timeout. Its exit arrives as an conn.Exited event.
func (s *Supervisor) stopInstance(in *agent, reason string) { s.stopInstanceAfter(in, reason, 0) }

// stopInstanceAfter is stopInstance after a grace period: an instance that
// was sent a shutdown (and the error that explains it) gets grace to read
// them and exit on its own before it is signalled.
func (s *Supervisor) stopInstanceAfter(in *agent, reason string, grace time.Duration) {
	if in.stopping {
		return
	}
	in.stopping = true
	in.stopReason = reason
	if in == s.lc.cur {
		s.book.Detach()
		s.setState(StateStopping)
		s.met.AgentUp.WithLabelValues(in.Role()).Set(0)
	}
	go func() {
		if grace > 0 {
			t := time.NewTimer(grace)
			defer t.Stop()
			select {
			case <-in.Proc().Exited():
				return
			case <-t.C:
			}
		}
		if in.Proc().StopGroup(s.cfg.KillTimeout) {
			in.Log().Warn("agent ignored SIGTERM; killed it with SIGKILL", "kill_timeout", s.cfg.KillTimeout)
		}
	}()
}

func (s *Supervisor) streamEnded(in *agent, ev conn.Event) {
	if ev.Err == nil || errors.Is(ev.Err, os.ErrClosed) {
		return
	}
	if errors.Is(ev.Err, io.EOF) {
		in.Log().Debug("agent closed its output")
		return
	}
	if wire.IsFramingError(ev.Err) {
		rule := framingRule(ev.Err)
		s.met.Invalid.WithLabelValues("FRAMING_ERROR", rule).Inc()
		if in.stopping {
			return
		}
		fields := map[string]any{"pid": in.Proc().ID(), "error": ev.Err.Error(), "rule": rule}
		msg := "framing error from the agent: its output can no longer be trusted; restarting it"
		if d := s.diagnoseFraming(ev.Err); d != "" { // diagnose.go
			msg = "framing error from the agent: " + d + "; restarting it"
			fields["diagnosis"] = d
		}
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Log: in.Log(), Kind: observe.AuditFraming, Fields: fields})
		s.stopInstance(in, "framing_error")
		return
	}
	in.Log().Error("reading from the agent failed", "err", ev.Err)
	s.stopInstance(in, "read_error")
}

// drainInstance finishes an exited primary in the background: its output
// is read to the end and stored, however long our own storage takes (only a
// pipe an escaped descendant holds open is cut), then it is reaped, and
// conn.Finished reports to the owner. The owner goes on meanwhile.
func (s *Supervisor) drainInstance(in *agent) {
	if in.Role() == RolePrimary && in == s.lc.cur {
		s.book.Detach()
	}
	if in.Role() == RolePrimary && !in.draining {
		s.setState(StateStopping)
		s.met.AgentUp.WithLabelValues(RolePrimary).Set(0)
	}
	s.drain(in)
}

// drain finishes an exited instance on its own goroutine; conn.Finished
// reports it (owner only).
func (s *Supervisor) drain(in *agent) {
	if in.draining {
		return
	}
	in.draining = true
	go func() {
		st := in.Finish(drainTimeout)
		select {
		case s.inbox.events <- conn.Event{Inst: in.Instance, Kind: conn.Finished, Status: st}:
		case <-s.inbox.loopDone:
		}
	}()
}

// walLastSequence is the WAL's last sequence for the metric (0 before the
// stores are open; they are before the HTTP server serves).
func (s *Supervisor) walLastSequence() float64 {
	if s.st == nil {
		return 0
	}
	return float64(s.st.WAL().LastSequence())
}

func (s *Supervisor) heartbeatAgeSeconds() float64 {
	in := s.current().cur
	if in == nil {
		return 0
	}
	age, seen := in.HeartbeatAge(time.Now())
	if !seen {
		return 0
	}
	return age.Seconds()
}

func framingRule(err error) string {
	switch {
	case errors.Is(err, wire.ErrZeroLength):
		return "zero_length"
	case errors.Is(err, wire.ErrFrameTooLarge):
		return "too_large"
	case errors.Is(err, wire.ErrTruncated):
		return "truncated"
	}
	return "other"
}

// drainTimeout bounds how long, after an agent exits, we keep reading what it
// wrote before dying (normally EOF comes at once).
const drainTimeout = 2 * time.Second
