package supervisor

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
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

var managed = struct {
	sync.Mutex
	procs map[int]*process
}{procs: map[int]*process{}}

// spawnMu is held from just before an agent is forked until its pid is
// registered as managed, and by the reaper while it looks for orphans: a
// child the reaper sees unregistered is never one being spawned (it once
// waited on a fresh /bin/true before its registration and stole its exit
// status).
var spawnMu sync.Mutex

func registerManaged(p *process) {
	managed.Lock()
	managed.procs[p.pid] = p
	managed.Unlock()
}

func unregisterManaged(pid int) {
	managed.Lock()
	delete(managed.procs, pid)
	managed.Unlock()
}

func isManaged(pid int) bool {
	managed.Lock()
	defer managed.Unlock()
	_, ok := managed.procs[pid]
	return ok
}

// managedProcs returns the agents running now.
func managedProcs() []*process {
	managed.Lock()
	defer managed.Unlock()
	out := make([]*process, 0, len(managed.procs))
	for _, p := range managed.procs {
		out = append(out, p)
	}
	return out
}

// becomeSubreaper marks this process as a child subreaper.
func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// runReaper reaps orphaned descendants until ctx is done. It reacts to SIGCHLD
// and also sweeps once a second (signals coalesce).
func runReaper(ctx context.Context, log *slog.Logger) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
		reapOrphans(log)
		for _, p := range managedProcs() {
			p.trackDescendants()
		}
	}
}

// reapOrphans waits (without blocking) on every child that is not managed,
// each by its pid — never wait(-1), which could take an agent's status.
func reapOrphans(log *slog.Logger) {
	spawnMu.Lock()
	defer spawnMu.Unlock()
	for _, pid := range childPids() {
		if isManaged(pid) {
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
func childPids() []int { return childrenOf("self") }

// childrenOf lists the children of a process ("self" or a pid) from /proc.
func childrenOf(pid string) []int {
	paths, _ := filepath.Glob("/proc/" + pid + "/task/*/children")
	var pids []int
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
