package supervisor

import "github.com/agent-sidecar/supervisor/supervisor/agentproc"

// Agents are started off the owner loop: fork/exec waits for the kernel to
// load the agent's binary, which may sit on a slow or hung filesystem. The
// owner asks (spawnAsync) and goes on; the answer comes back on
// Supervisor.spawned as an event (spawnDone, shadowSpawned). While it is
// out, the start stays "being prepared" (Supervisor.preparing, trialPrep),
// so nothing starts a second one.

// spawnResult is a started process (or why it could not start) and what it
// was started for: one of start and trial is set.
type spawnResult struct {
	start *startPrep // a primary's start
	early bool       // the first primary, started during recovery (early.go)
	trial *trialPrep // an evolution's shadows: proc the candidate, ctrl the control (if any)
	proc  agentproc.Proc
	ctrl  agentproc.Proc
	err   error
}

// spawnAsync starts spec on its own goroutine and answers r on s.inbox.spawned.
// Once the loop has returned nobody takes the answer: the process is killed
// and what a trial held is released (Run waits for these goroutines, in
// s.spawns, before it stops the store worker).
func (s *Supervisor) spawnAsync(spec agentproc.Spec, r spawnResult) {
	s.spawns.Add(1)
	go func() {
		defer s.spawns.Done()
		r.proc, r.err = s.spawn(spec)
		if r.early && r.err == nil {
			s.log.Info("agent process started during recovery; it is sent nothing until its restore is built", "pid", r.proc.ID())
		}
		if r.err == nil && r.trial != nil && r.trial.t != nil && r.trial.t.control {
			if r.ctrl, r.err = s.spawn(spec); r.err != nil {
				agentproc.Discard(r.proc)
				r.proc = nil
			}
		}
		select {
		case s.inbox.spawned <- r:
		case <-s.inbox.loopDone:
			if r.proc != nil {
				agentproc.Discard(r.proc)
			}
			if r.ctrl != nil {
				agentproc.Discard(r.ctrl)
			}
			if p := r.trial; p != nil && p.t != nil {
				s.dropTrial(p.t)
			}
		}
	}()
}

// spawnProcess starts an agent process in this OS process's table.
func spawnProcess(spec agentproc.Spec) (agentproc.Proc, error) {
	p, err := agentproc.Shared().Start(spec)
	if err != nil {
		return nil, err
	}
	return p, nil
}
