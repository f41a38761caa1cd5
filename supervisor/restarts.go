package supervisor

// After an exit: restart with back-off, fall back, or give up.

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// instanceExited decides what happens after a primary has exited and been
// drained and reaped. stop=true ends Run with err.
func (s *Supervisor) instanceExited(in *agent, st agentproc.ExitStatus) (stop bool, err error) {
	now := time.Now()
	s.lc.cur = nil
	s.lc.stat.PID = 0
	s.lc.stat.AgentStartedAt = time.Time{}
	s.publish()
	s.met.AgentUp.WithLabelValues(RolePrimary).Set(0)
	desc, failed := st.Describe()
	reason := in.stopReason
	if reason == "" {
		switch {
		case st.Known && st.Signal != 0:
			reason = "killed"
		case failed:
			reason = "crashed"
		default:
			reason = "exited"
		}
	}
	if reason != "exited" && reason != "shutdown" && reason != reasonOperatorRestore {
		failed = true
	}
	// The requests in flight are charged a death (poison isolation); they
	// wait for the next start.
	s.book.AgentGone(reason)
	if s.lc.trial != nil && !s.lc.trial.decided {
		s.concludeTrial() // the primary is gone: rejected, with the reason
	}
	uptime := now.Sub(in.Started())
	s.log.Info("agent stopped", "pid", in.Proc().ID(), "status", desc, "reason", reason, "uptime", uptime.Round(time.Millisecond))

	// Healthy is first heartbeat to last, not to now: the time an agent
	// spent hung and being killed is not time it ran well (with the
	// defaults, 5 s of --heartbeat-timeout and 5 s of --kill-timeout would
	// reset the back-off of an agent that heartbeated once and hung). A
	// healthy run resets the back-off however it ended: also by an
	// operator's restore or a WAL failure, whose restarts return below
	// before the policy is applied.
	if first := in.FirstHeartbeatAt(); !first.IsZero() && in.LastHeartbeat().Sub(first) >= s.cfg.HealthyReset {
		s.lc.bo.reset()
	}

	if s.lc.shutting {
		// Checkpoints still queued are stored before Run returns (the store
		// worker finishes its queue).
		s.setState(StateStopped)
		return true, nil
	}

	if reason == reasonOperatorRestore {
		s.setState(StateBackingOff)
		s.lc.startTimer.Reset(0)
		return false, nil
	}
	if reason == reasonWALFailed {
		// Our storage failed, not the agent: it is restarted whatever
		// --restart says, after a back-off that never counts towards
		// --max-restarts (walfailed.go).
		s.restartAfter(reason, true, s.lc.bo.wait())
		return false, nil
	}
	switch s.cfg.Restart {
	case RestartNever:
		if failed {
			s.lc.failed = true
		}
		s.setState(StateStopped)
		if failed {
			msg := fmt.Sprintf("agent %s (%s) and --restart is never, so it is not restarted.%s", desc, reason, s.failureHint(reason))
			s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Kind: observe.AuditGaveUp,
				Fields: map[string]any{"reason": reason, "status": desc, "policy": "never"}})
			return true, fmt.Errorf("%w: %s", ErrAgentFailed, msg)
		}
		return true, nil
	case RestartOnFailure:
		if !failed {
			s.setState(StateStopped)
			s.log.Info("agent exited cleanly and --restart is on-failure; supervisor stops")
			return true, nil
		}
	}
	return s.scheduleRestart(reason, failed)
}

// scheduleRestart applies back-off and the crash-loop limit.
func (s *Supervisor) scheduleRestart(reason string, failed bool) (stop bool, err error) {
	now := time.Now()
	delay, giveUp := s.lc.bo.next(now)
	if !giveUp {
		s.restartAfter(reason, failed, delay)
		return false, nil
	}
	if s.cfg.FallbackOnCrashLoop && s.lc.lastRestored != "" {
		// Whether an older checkpoint has its whole WAL tail is the store
		// worker's to find out (it lists and reads the store); the answer
		// decides (fallbackAnswered).
		f := &fallbackAsk{from: s.lc.lastRestored, reason: reason, failed: failed}
		s.setState(StateBackingOff)
		s.work.Post(func() {
			f.to, f.ok = s.st.FallbackCandidate(f.from)
			s.report(storeResult{fallback: f})
		})
		return false, nil
	}
	return s.giveUp(reason, now)
}

// fallbackAsk is a crash loop's question to the store worker, with
// --fallback-on-crash-loop: is there a checkpoint older than from whose whole
// WAL tail is held?
type fallbackAsk struct {
	from, reason string
	failed       bool
	to           checkpoint.Meta
	ok           bool
}

// fallbackAnswered restores from an older checkpoint when there is one with
// its whole WAL tail (the restore is then that checkpoint plus every entry
// after it: the same history, replayed from further back), and gives up
// otherwise. Nothing is marked bad.
func (s *Supervisor) fallbackAnswered(f *fallbackAsk) (stop bool, err error) {
	now := time.Now()
	if s.lc.shutting {
		return false, nil
	}
	if !f.ok {
		s.log.Error("crash loop: no older checkpoint with a complete WAL tail to fall back to", "checkpoint_id", f.from)
		return s.giveUp(f.reason, now)
	}
	s.lc.fallbackFrom = f.from
	s.lc.bo.forget()
	s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "crash loop: falling back to an older checkpoint (--fallback-on-crash-loop); it is restored with every WAL entry after it",
		Kind: observe.AuditFallback, Fields: map[string]any{"from_checkpoint_id": f.from, "to_checkpoint_id": f.to.ID,
			"to_watermark": f.to.Watermark, "reason": f.reason}, Count: s.met.Fallbacks})
	delay, _ := s.lc.bo.next(now)
	s.restartAfter(f.reason, f.failed, delay)
	return false, nil
}

// giveUp ends supervision after a crash loop (Run returns ErrCrashLoop).
func (s *Supervisor) giveUp(reason string, now time.Time) (stop bool, err error) {
	s.lc.failed = true
	s.setState(StateGivenUp)
	msg := fmt.Sprintf("agent restarted more than --max-restarts=%d times within --restart-window=%s (last run ended: %s); giving up.%s "+
		"The agent's state is intact: nothing was marked bad or discarded, and the next start restores the same checkpoint and every WAL entry after it. "+
		"Check the agent's own output in this log (lines with stream=stderr) and `supervisor audit --data-dir %s` for each exit; "+
		"raise --max-restarts or use --max-restarts 0 to keep retrying",
		s.cfg.MaxRestarts, s.cfg.RestartWindow, reason, s.failureHint(reason), s.cfg.DataDir)
	s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Kind: observe.AuditGaveUp,
		Fields: map[string]any{"reason": reason, "restarts_in_window": s.lc.bo.recent(now), "max_restarts": s.cfg.MaxRestarts, "window": s.cfg.RestartWindow.String()}})
	return true, fmt.Errorf("%w: %s", ErrCrashLoop, msg)
}

// restartAfter schedules the next start after delay.
func (s *Supervisor) restartAfter(reason string, failed bool, delay time.Duration) {
	s.lc.restarts++
	s.lc.stat.Restarts = s.lc.restarts
	s.lc.stat.LastRestartReason = reason
	s.setState(StateBackingOff)
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "restarting the agent", Kind: observe.AuditRestart,
		Fields:  map[string]any{"reason": reason, "failed": failed, "delay_seconds": delay.Seconds(), "restarts": s.lc.restarts},
		LogOnly: []any{"delay", delay.Round(time.Millisecond)}, Count: s.met.Restarts.WithLabelValues(reason)})
	s.lc.startTimer.Reset(delay)
}
