package supervisor

import "syscall"

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
	trial *trialPrep // an evolution's shadow
	proc  agentProc
	err   error
}

// spawnAsync starts spec on its own goroutine and answers r on s.spawned.
// Once the loop has returned nobody takes the answer: the process is killed
// and what a trial held is released (Run waits for these goroutines, in
// s.spawns, before it stops the store worker).
func (s *Supervisor) spawnAsync(spec procSpec, r spawnResult) {
	s.spawns.Add(1)
	go func() {
		defer s.spawns.Done()
		r.proc, r.err = s.spawn(spec)
		select {
		case s.spawned <- r:
		case <-s.loopDone:
			if r.proc != nil {
				discardProc(r.proc)
			}
			if p := r.trial; p != nil && p.t != nil {
				s.dropTrial(p.t)
			}
		}
	}()
}

// discardProc kills a process no instance was made for, reaps it and
// closes our ends of its pipes. It waits for the exit: not on the owner.
func discardProc(p agentProc) {
	_ = p.signalGroup(syscall.SIGKILL)
	p.reap()
	p.closeReaders()
}
