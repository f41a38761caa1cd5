package agentproc

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The supervisor is a child subreaper: when an agent dies, its orphaned
// descendants are re-parented to us instead of init, and we reap them. Agents we
// spawned ourselves are "managed": their owner reaps them (after killing their
// group), so the reaper must never wait on them — it would steal their exit
// status and free their pid while we may still signal the group.

// Table is the set of agents this OS process spawned ("managed"), and the
// lock that keeps the reaper off a child being spawned. There is one per OS
// process (Shared): a child's exit status can be taken only once, so every
// spawner and the reaper must agree on which children are whose.
type Table struct {
	mu    sync.Mutex
	procs map[int]*Process

	// spawnMu is held from just before an agent is forked until its pid is
	// registered as managed, and by the reaper while it looks for orphans:
	// a child the reaper sees unregistered is never one being spawned (it
	// once waited on a fresh /bin/true before its registration and stole
	// its exit status).
	spawnMu sync.Mutex
}

var shared = &Table{procs: map[int]*Process{}}

// Shared returns this OS process's table.
func Shared() *Table { return shared }

func (t *Table) register(p *Process) {
	t.mu.Lock()
	t.procs[p.pid] = p
	t.mu.Unlock()
}

func (t *Table) unregister(pid int) {
	t.mu.Lock()
	delete(t.procs, pid)
	t.mu.Unlock()
}

func (t *Table) isManaged(pid int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.procs[pid]
	return ok
}

// running returns the agents running now.
func (t *Table) running() []*Process { return t.appendRunning(nil) }

// appendRunning appends the agents running now to out.
func (t *Table) appendRunning(out []*Process) []*Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		out = append(out, p)
	}
	return out
}

// BecomeSubreaper marks this process as a child subreaper.
func BecomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// reaperSweep is how often RunReaper sweeps without a SIGCHLD while no
// agent runs; trackEvery while one does. The sweep records each agent's
// process tree (trackDescendants): a helper the agent starts in a session
// of its own with its environment cleared (a sandboxed tool runner) is
// recognised after the agent dies only if a sweep saw it under the agent,
// so the window in which such a helper escapes the agent's stop is this
// interval. With the lister a sweep costs some 40 µs and 370 bytes.
const (
	reaperSweep = 10 * time.Second
	trackEvery  = time.Second
)

// RunReaper reaps orphaned descendants until ctx is done. It reacts to SIGCHLD
// (each sweep reaps every exited child, so signals that coalesce lose
// nothing) and also sweeps every trackEvery while an agent runs, every
// reaperSweep otherwise. The sweep lists /proc/self/task/*/children (with
// a childLister, whose buffers it keeps: issue 31, an idle supervisor
// weighs what it allocates).
func (t *Table) RunReaper(ctx context.Context, log *slog.Logger) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTimer(trackEvery)
	defer tick.Stop()
	var (
		l     childLister
		procs []*Process
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
		t.reapOrphans(&l, log)
		procs = t.appendRunning(procs[:0])
		for _, p := range procs {
			p.trackDescendants(&l)
		}
		next := reaperSweep
		if len(procs) > 0 {
			next = trackEvery
		}
		clear(procs) // hold no finished agent until the next sweep
		tick.Reset(next)
	}
}

// reapOrphans waits (without blocking) on every child that is not managed,
// each by its pid — never wait(-1), which could take an agent's status.
// l lists them (nil: a lister of its own).
func (t *Table) reapOrphans(l *childLister, log *slog.Logger) {
	if l == nil {
		l = new(childLister)
	}
	t.spawnMu.Lock()
	defer t.spawnMu.Unlock()
	l.own = l.children(l.own[:0], 0)
	for _, pid := range l.own {
		if t.isManaged(pid) {
			continue
		}
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if err == nil && got == pid {
			log.Debug("reaped orphaned descendant", "pid", pid, "status", int(ws))
		}
	}
}

// childPids lists this process's children from /proc (every thread's list).
func childPids() []int { return new(childLister).children(nil, 0) }
