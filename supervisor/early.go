package supervisor

// With --spawn-during-recovery, the first agent is started while the data
// directory is recovered (open: the replica restore, the WAL's verified
// scan), not after its restore is built, so the agent's own start-up (an
// interpreter and its imports: 50–100 ms for Python) overlaps the recovery.
//
// The agent is told SUPERVISOR_RESTORE_PENDING before anything is known,
// so the supervisor guesses (guessPending): a restore is coming when the
// data directory already holds a WAL segment or a checkpoint, or --replica
// may bring state into an empty one. A guess of "pending" is always kept:
// when no state turns out to exist, the agent gets an empty restore
// (durable.Point.Always). A guess of "none" that turns out wrong — state
// appeared that the files did not show — discards the process unsent and
// starts another the ordinary way.
//
// The agent is sent nothing until its restore is built: a restore that
// cannot be built (ErrUnrestorable, a failed open) kills it unsent, as it
// would never have started without the flag. What the flag gives up is
// that an agent which ignores SUPERVISOR_RESTORE_PENDING and acts at once
// may act for the whole recovery without its state; hence off by default.
//
// The spawn and the restore come back to the owner in either order
// (spawnDone with spawnResult.early, storeDone with the start): whichever
// comes second starts the primary (takeEarly).

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
)

// earlyStart is the process started during recovery, owned by the loop
// once it runs (lifecycle.early).
type earlyStart struct {
	pending bool         // the SUPERVISOR_RESTORE_PENDING it was started with
	res     *spawnResult // the spawn's answer, once it came
	prep    *startPrep   // the first start, once its restore was built, waiting for res
}

// spawnEarly starts the first agent before the stores are open (open,
// after the data directory's lock is taken). Its answer reaches the loop on
// s.inbox.spawned like any spawn's.
func (s *Supervisor) spawnEarly() {
	e := &earlyStart{pending: s.guessPending()}
	s.lc.early = e
	s.log.Info("starting the agent while the data directory is recovered (--spawn-during-recovery)", "restore_pending", e.pending)
	s.spawnAsync(s.primarySpec(e.pending), spawnResult{early: true})
}

// guessPending says whether the data directory may hold state to restore:
// any WAL segment or checkpoint file, or a replica to restore an empty
// directory from. A wrong "true" costs an empty restore; a wrong "false"
// a second spawn.
func (s *Supervisor) guessPending() bool {
	if s.cfg.Replica != "" {
		return true
	}
	for _, sub := range []string{"wal", "checkpoints"} {
		ents, err := os.ReadDir(filepath.Join(s.cfg.DataDir, sub))
		if (err != nil && !errors.Is(err, fs.ErrNotExist)) || len(ents) > 0 {
			return true // unreadable: assume state, an empty restore is harmless
		}
	}
	return false
}

// earlySpawned takes the early spawn's answer (owner only).
func (s *Supervisor) earlySpawned(r spawnResult) (stop bool, err error) {
	e := s.lc.early
	if e == nil || s.lc.shutting {
		s.discardEarly(r.proc)
		return false, nil
	}
	e.res = &r
	return s.takeEarly()
}

// useEarly reports whether the start p takes the early process instead of
// spawning one: when the agent was told what p's restore is (a restore is
// pending and one is built — empty if need be — or none is and none is).
// Otherwise the early process is discarded (owner only).
func (s *Supervisor) useEarly(p *startPrep) bool {
	e := s.lc.early
	if e == nil {
		return false
	}
	if e.pending != (p.plan != nil) {
		s.log.Warn("the agent started during recovery was told the wrong SUPERVISOR_RESTORE_PENDING; stopping it unsent and starting another",
			"told_restore_pending", e.pending, "restore_built", p.plan != nil)
		s.dropEarly()
		return false
	}
	e.prep = p
	return true
}

// takeEarly starts the primary from the early process once both its spawn
// and its restore have come (owner only).
func (s *Supervisor) takeEarly() (stop bool, err error) {
	e := s.lc.early
	if e == nil || e.res == nil || e.prep == nil {
		return false, nil
	}
	s.lc.early = nil
	r := *e.res
	r.early, r.start = false, e.prep
	return s.spawnDone(r)
}

// dropEarly discards the early process, now or when its spawn answers
// (owner only: a failed start, the loop's end).
func (s *Supervisor) dropEarly() {
	e := s.lc.early
	if e == nil {
		return
	}
	s.lc.early = nil
	if e.res != nil {
		s.discardEarly(e.res.proc)
	}
}

// discardEarly kills an early process that was never sent a frame. Run
// waits for it (s.spawns) before it returns: the process is gone, and
// reaped, when the supervisor exits.
func (s *Supervisor) discardEarly(proc agentproc.Proc) {
	if proc == nil {
		return
	}
	s.log.Info("stopping the agent started during recovery; it was sent nothing", "pid", proc.ID())
	s.spawns.Add(1)
	go func() {
		defer s.spawns.Done()
		agentproc.Discard(proc)
	}()
}

// earlyRestorePending is what a start's restore must honour: the agent
// started during recovery was told a restore is coming.
func (s *Supervisor) earlyRestorePending() bool {
	return s.lc.early != nil && s.lc.early.pending
}
