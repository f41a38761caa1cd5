package agentproc

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Descendants that leave the agent's process group (setsid(), Python's
// start_new_session=True) are not reached by a group kill. The supervisor is
// a child subreaper, so when their parent dies they are re-parented to us;
// while the agent lives they are in its process tree. Both are found in
// /proc, and each is signalled through a pidfd opened after its start time
// was checked, so a recycled pid is never signalled.

var discardLog = slog.New(slog.DiscardHandler)

// procStartTime returns the start time (clock ticks after boot) of pid, the
// 22nd field of /proc/PID/stat; ok false when it is gone.
func procStartTime(pid int) (uint64, bool) { return new(childLister).startTime(pid) }

// descendants lists the whole process tree below pid (not pid itself).
func descendants(pid int) []int { return new(childLister).descendants(nil, pid) }

// trackDescendants records the agent's current descendants (the reaper
// calls it every reaperSweep and on SIGCHLD, with its lister; stop and reap
// call it too, with nil).
func (p *Process) trackDescendants(l *childLister) {
	select {
	case <-p.exited:
		return // a zombie has no children; what it had is re-parented to us
	default:
	}
	if l == nil {
		l = new(childLister)
	}
	l.tree = l.descendants(l.tree[:0], p.pid)
	p.knownMu.Lock()
	defer p.knownMu.Unlock()
	if p.known == nil {
		p.known = map[int]uint64{}
	}
	for _, d := range l.tree {
		if st, ok := l.startTime(d); ok {
			p.known[d] = st
		}
	}
}

func (p *Process) knows(pid int, start uint64) bool {
	p.knownMu.Lock()
	defer p.knownMu.Unlock()
	st, ok := p.known[pid]
	return ok && st == start
}

// killEscaped SIGKILLs every descendant of the stopped agent that is still
// alive outside its process group, and waits (bounded) until they are gone.
// Orphans re-parented to us count as the agent's unless another running
// agent is known to own them. The leader must have exited.
func (p *Process) killEscaped() {
	var killed []int // pidfds
	defer func() {
		for _, fd := range killed {
			_ = unix.Close(fd)
		}
	}()
	seen := map[int]bool{}
	// An orphan caught inside execve shows an empty environment for a few
	// microseconds (the new image's is not mapped yet); it is looked at
	// again until this deadline rather than taken for a stranger.
	undecidedUntil := time.Now().Add(200 * time.Millisecond)
	for round := 0; round < 1000; round++ {
		targets, undecided := p.escapedTargets()
		n := 0
		for _, t := range targets {
			if seen[t.pid] {
				continue
			}
			if fd, ok := signalExact(t.pid, t.start, unix.SIGKILL); ok {
				killed = append(killed, fd)
				seen[t.pid] = true
				n++
			}
		}
		if n == 0 {
			if !undecided || time.Now().After(undecidedUntil) {
				break // nothing new: no one forked while we were killing
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitGone(killed, 2*time.Second)
	p.table.reapOrphans(nil, discardLog)
}

type target struct {
	pid   int
	start uint64
}

// escapedTargets returns the processes to kill: descendants of our
// unmanaged children (orphans) that belong to this agent, with their trees,
// and what is left of the agent's known descendants. undecided is true when
// an orphan's environment could not be read yet (see envUnreadable).
func (p *Process) escapedTargets() (out []target, undecided bool) {
	others := p.table.running()
	add := func(pid int) {
		if st, ok := procStartTime(pid); ok {
			out = append(out, target{pid, st})
		}
	}
	for _, c := range childPids() {
		if p.table.isManaged(c) || c == p.pid {
			continue
		}
		st, ok := procStartTime(c)
		if !ok {
			continue
		}
		mine := p.knows(c, st)
		if !mine {
			// Escaped before the tracker saw it: ours if it carries an
			// agent's environment and no other running agent knows it. (An
			// orphan without one — say from `docker exec` while we are PID 1
			// — is left alone.)
			agent, sure := fromAnAgent(c)
			undecided = undecided || !sure
			mine = agent
			for _, o := range others {
				if mine && o != p && o.knows(c, st) {
					mine = false
				}
			}
		}
		if !mine {
			continue
		}
		out = append(out, target{c, st})
		for _, d := range descendants(c) {
			add(d)
		}
	}
	// Known descendants not (yet) re-parented: still under an exiting parent.
	p.knownMu.Lock()
	known := make([]target, 0, len(p.known))
	for pid, st := range p.known {
		known = append(known, target{pid, st})
	}
	p.knownMu.Unlock()
	for _, k := range known {
		if st, ok := procStartTime(k.pid); ok && st == k.start {
			out = append(out, k)
		}
	}
	return out, undecided
}

// signalExact sends sig to pid through a pidfd if pid still has start time
// start (it is the process we mean, not a recycled pid). It returns the
// pidfd, which the caller closes.
func signalExact(pid int, start uint64, sig unix.Signal) (int, bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, false
	}
	// The pidfd pins the process: if the start time matches now, the
	// signal cannot reach anyone else.
	if st, ok := procStartTime(pid); !ok || st != start {
		unix.Close(fd)
		return -1, false
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		unix.Close(fd)
		return -1, false
	}
	return fd, true
}

// waitGone waits until every pidfd reports its process exited, or timeout.
func waitGone(fds []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	pending := fds
	for len(pending) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		pfds := make([]unix.PollFd, len(pending))
		for i, fd := range pending {
			pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		}
		if _, err := unix.Poll(pfds, int(left.Milliseconds())+1); err != nil && err != unix.EINTR {
			return
		}
		next := pending[:0:0]
		for i, pf := range pfds {
			if pf.Revents == 0 {
				next = append(next, pending[i])
			}
		}
		pending = next
	}
}

// fromAnAgent reports whether pid's environment carries the variables the
// supervisor gives its agents (inherited by their descendants unless they
// cleared it). sure is false when the environment read empty: a process in
// the middle of execve has none for a moment, between the switch to the new
// image and the kernel copying its environment in; the caller looks again.
// (A process that really runs with an empty environment stays unsure until
// the caller's deadline and is then left alone, like any stranger.)
func fromAnAgent(pid int) (agent, sure bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false, true // gone, or not ours to read
	}
	defer f.Close()
	b := make([]byte, 256<<10)
	n, _ := io.ReadFull(f, b)
	if n == 0 {
		return false, false
	}
	b = b[:n]
	return bytes.HasPrefix(b, []byte("SUPERVISOR_ROLE=")) || bytes.Contains(b, []byte("\x00SUPERVISOR_ROLE=")), true
}
