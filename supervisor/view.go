package supervisor

import (
	"os"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
)

// view is what the owner goroutine publishes after every transition: one
// immutable value that other goroutines (HTTP handlers, the control socket,
// metrics, frame readers) read through Supervisor.pub without a lock. The
// owner never changes a published view; it publishes a new one.
type view struct {
	status Status         // the owner's fields of the status
	cur    *conn.Instance // the primary instance, nil between incarnations
	trial  *trial         // the evolution trial under way, nil: none
	// failed: the supervisor has given up (crash loop, a failure with
	// --restart never, or a state it cannot restore); /healthz fails.
	failed bool
	// walFailed: the WAL stopped and is not reopened yet; /readyz fails.
	walFailed bool
	// restarts: the newest restarts, oldest first, at most maxRecentRestarts
	// (the status page); never changed once published.
	restarts []api.RestartRecord
	lastPID  int // the newest agent pid, kept after it exits
}

// maxRecentRestarts bounds the restarts a view carries.
const maxRecentRestarts = 20

// publish makes the owner's current state visible to other goroutines.
// Owner only.
func (s *Supervisor) publish() {
	v := &view{status: s.lc.stat, trial: s.lc.trial, failed: s.lc.failed, walFailed: s.lc.walFailed != nil}
	if s.lc.cur != nil {
		v.cur = s.lc.cur.Instance
	}
	if p := s.lc.pendingPoint; p != nil {
		v.status.PendingRestore = &PendingRestore{CheckpointID: p.CheckpointID, NoWAL: p.NoWAL}
	}
	v.lastPID = v.status.PID
	if prev := s.pub.Load(); prev != nil {
		v.restarts = prev.restarts
		if v.lastPID == 0 {
			v.lastPID = prev.lastPID
		}
		if v.status.Restarts > prev.status.Restarts {
			r := api.RestartRecord{Time: time.Now().UTC(), Reason: v.status.LastRestartReason, Restarts: v.status.Restarts, PID: prev.lastPID}
			keep := prev.restarts[max(0, len(prev.restarts)-maxRecentRestarts+1):]
			v.restarts = append(append(make([]api.RestartRecord, 0, len(keep)+1), keep...), r)
		}
	}
	s.pub.Store(v)
}

// current is the last published view.
func (s *Supervisor) current() *view { return s.pub.Load() }

// Status returns the supervisor's current status: the owner's last
// published view, plus what the instance and the WAL know now (the
// heartbeat's time, the log's sequences: each written by its own owner).
// Safe from any goroutine.
func (s *Supervisor) Status() Status {
	v := s.current()
	st := v.status
	st.Running = true
	st.SupervisorPID = os.Getpid()
	b := Build()
	st.Version, st.Revision = b.Version, b.Revision
	if in := v.cur; in != nil {
		st.UptimeSeconds = time.Since(in.Started()).Seconds()
		if last := in.LastHeartbeat(); !last.IsZero() {
			st.LastHeartbeat = last.UTC()
		}
	}
	if s.st != nil {
		st.NewestCheckpoint = s.st.NewestID()
		st.LastWALSequence = s.st.WAL().LastSequence()
		st.DurableWALSequence = s.st.WAL().DurableSequence()
	}
	st.Replica = s.replicaStatus()
	return st
}
