package supervisor

import (
	"fmt"
	"time"
)

func (s *Supervisor) readiness() (bool, string, Status) {
	st := s.Status()
	v := s.current()
	if v.walFailed {
		return false, "the WAL failed (a write or fsync error): the agent is being restarted from what the log holds once it is reopened", st
	}
	in := v.cur
	if in == nil {
		switch State(st.State) {
		case StateStarting: // before the first spawn: the listener is bound first (preflight.go)
			return false, "waiting for the agent's first heartbeat (it is being started)", st
		case StateBackingOff:
			return false, "the agent is restarting (back-off after: " + st.LastRestartReason + ")", st
		case StateGivenUp:
			return false, "the supervisor gave up on a crash-looping agent", st
		default:
			return false, "the agent is not running (state " + st.State + ")", st
		}
	}
	switch b := s.heartbeat(in, time.Now()); {
	case !b.seen:
		return false, "waiting for the agent's first heartbeat", st
	case st.State == string(StateStopping):
		return false, "the agent is being stopped", st
	case b.late():
		return false, fmt.Sprintf("no heartbeat for %s", b.age.Round(time.Millisecond)), st
	}
	return true, "", st
}

// loopStalled reports whether the owner loop has not turned for longer than
// the stall limit, and for how long it has not.
func (s *Supervisor) loopStalled(now time.Time) (bool, time.Duration) {
	last := s.loopBeat.Load()
	if last == 0 {
		return false, 0
	}
	age := now.Sub(time.Unix(0, last))
	return age > s.stallLimit(), age
}

func (s *Supervisor) stallLimit() time.Duration {
	if s.cfg.LoopStallTimeout > 0 {
		return s.cfg.LoopStallTimeout
	}
	return 60 * time.Second
}

// beatEvery is how often an idle owner loop turns to beat: a dozen times
// within the stall limit, at most every 5 s (the default 60 s limit), so
// that an idle supervisor is not woken for nothing (issue 31, item 4).
func (s *Supervisor) beatEvery() time.Duration {
	return min(5*time.Second, max(s.stallLimit()/12, 10*time.Millisecond))
}
