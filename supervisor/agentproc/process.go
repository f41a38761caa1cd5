package agentproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Spec describes how to start one agent process.
type Spec struct {
	Path  string
	Args  []string // without argv[0]
	Env   []string // full environment
	Dir   string
	Stdio bool // true: frames on stdin/stdout; false: frames on fd 3 (agent reads) and fd 4 (agent writes)
}

// Process is one running agent process and the pipes to it. The leader is kept
// unreaped (a zombie) after it exits until reap is called, so its pid — which is
// also the process group id — cannot be reused while we may still signal it.
type Process struct {
	table *Table

	cmd   *exec.Cmd
	pid   int
	pidfd int

	// Parent ends of the pipes.
	toAgent   *os.File   // the agent's frame input
	fromAgent *framePipe // the agent's frame output (read on the reader's thread, framepipe.go)
	logs      []*os.File

	exited   chan struct{} // closed when the leader has exited (not yet reaped)
	exitedAt atomic.Int64  // unix nanos when the exit was seen

	// known are the descendants seen in the agent's process tree (pid →
	// start time), so that those which escape its group and are re-parented
	// to us can be told apart from another agent's.
	knownMu sync.Mutex
	known   map[int]uint64

	mu     sync.Mutex
	reaped bool
	state  *os.ProcessState
	// release is closed by reap so the spawning goroutine (which holds the OS
	// thread the child's Pdeathsig is tied to) may unlock and exit.
	release chan struct{}
}

// Start spawns the agent in its own process group. The fork happens on a
// goroutine locked to its OS thread, and that goroutine keeps the thread until
// the child has exited: Linux delivers Pdeathsig when the *thread* that forked
// the child dies, and Go may otherwise retire an idle thread.
func (t *Table) Start(spec Spec) (*Process, error) {
	p := &Process{
		table:   t,
		pidfd:   -1,
		exited:  make(chan struct{}),
		release: make(chan struct{}),
	}
	// Pipes: child ends are handed to the child and closed here after Start.
	inR, inW, err := os.Pipe() // supervisor → agent
	if err != nil {
		return nil, fmt.Errorf("create agent input pipe: %w", err)
	}
	growPipe(inW)
	outR, outW, err := newFramePipe() // agent → supervisor
	if err != nil {
		closeAll(inR, inW)
		return nil, fmt.Errorf("create agent output pipe: %w", err)
	}
	errR, errW, err := os.Pipe() // agent stderr
	if err != nil {
		closeAll(inR, inW, outW)
		outR.Close()
		return nil, fmt.Errorf("create agent stderr pipe: %w", err)
	}
	childEnds := []*os.File{inR, outW, errW}
	p.toAgent, p.fromAgent = inW, outR
	p.logs = []*os.File{errR}

	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = spec.Env
	cmd.Dir = spec.Dir
	cmd.Stderr = errW
	if spec.Stdio {
		cmd.Stdin = inR
		cmd.Stdout = outW
	} else {
		// fd 3 = agent reads frames, fd 4 = agent writes frames; stdout is a log.
		logR, logW, err := os.Pipe()
		if err != nil {
			closeAll(inR, inW, outW, errR, errW)
			outR.Close()
			return nil, fmt.Errorf("create agent stdout pipe: %w", err)
		}
		childEnds = append(childEnds, logW)
		p.logs = append(p.logs, logR)
		cmd.Stdin = nil // /dev/null
		cmd.Stdout = logW
		cmd.ExtraFiles = []*os.File{inR, outW}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
		PidFD:     &p.pidfd,
	}
	p.cmd = cmd

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Registered before the reaper may look at our children again.
		t.spawnMu.Lock()
		if err := cmd.Start(); err != nil {
			t.spawnMu.Unlock()
			started <- err
			runtime.UnlockOSThread()
			return
		}
		p.pid = cmd.Process.Pid
		t.register(p)
		t.spawnMu.Unlock()
		started <- nil
		p.waitExit()
		p.exitedAt.Store(time.Now().UnixNano())
		close(p.exited)
		// Keep the thread until the owner has finished with the child: if this
		// goroutine returned while locked, Go would kill the thread and the
		// kernel would deliver Pdeathsig to a child that is still running.
		<-p.release
		runtime.UnlockOSThread()
	}()
	err = <-started
	closeAll(childEnds...)
	if err != nil {
		closeAll(p.toAgent)
		p.fromAgent.Close()
		closeAll(p.logs...)
		return nil, fmt.Errorf("start agent %q: %w", spec.Path, err)
	}
	return p, nil
}

// waitExit blocks until the leader exits, without reaping it.
func (p *Process) waitExit() {
	for {
		var info unix.Siginfo
		var err error
		if p.pidfd >= 0 {
			err = unix.Waitid(unix.P_PIDFD, p.pidfd, &info, unix.WEXITED|unix.WNOWAIT, nil)
		} else {
			err = unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		}
		if err == unix.EINTR {
			continue
		}
		return // exited, or ECHILD (cannot happen while we hold it unreaped)
	}
}

// signalGroup sends sig to the agent's whole process group. It is a no-op once
// the leader has been reaped: after that the pgid may belong to someone else.
func (p *Process) SignalGroup(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return nil
	}
	err := syscall.Kill(-p.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// The Proc view of a process.
func (p *Process) ID() int                 { return p.pid }
func (p *Process) Exited() <-chan struct{} { return p.exited }
func (p *Process) Pipes() (io.Writer, io.Reader, []io.Reader) {
	logs := make([]io.Reader, len(p.logs))
	for i, f := range p.logs {
		logs[i] = f
	}
	return p.toAgent, p.fromAgent, logs
}

// reap kills whatever is left of the group, collects the leader's exit status
// and releases the spawning thread. It must only be called after exited is
// closed. It is idempotent.
func (p *Process) Reap() ExitStatus {
	return statusOf(p.reapState())
}

func (p *Process) reapState() *os.ProcessState {
	<-p.exited
	p.mu.Lock()
	if p.reaped {
		st := p.state
		p.mu.Unlock()
		return st
	}
	// Leftover group members (grandchildren) die with the agent. The leader is
	// a zombie, so the group id is still ours. So do descendants that left
	// the group (setsid): no descendant outlives the agent.
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.killEscaped()
	err := p.cmd.Wait()
	p.reaped = true
	p.state = p.cmd.ProcessState
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
		p.pidfd = -1
	}
	p.mu.Unlock()
	p.table.unregister(p.pid)
	close(p.release)
	closeAll(p.toAgent)
	if p.state == nil && err != nil {
		return nil
	}
	return p.state
}

// closeReaders closes the parent's read ends, unblocking any reader still
// waiting on them (for example when an escaped grandchild holds a pipe).
func (p *Process) CloseReaders() {
	p.fromAgent.Close()
	closeAll(p.logs...)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// ExitStatus is how an agent process ended.
type ExitStatus struct {
	Known  bool           // false: the status could not be collected
	Code   int            // exit code, when not signalled
	Signal syscall.Signal // non-zero: killed by this signal
}

func statusOf(st *os.ProcessState) ExitStatus {
	if st == nil {
		return ExitStatus{}
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ExitStatus{Known: true, Signal: ws.Signal()}
	}
	return ExitStatus{Known: true, Code: st.ExitCode()}
}

// describe renders an exit status for logs and audit records.
func (e ExitStatus) Describe() (desc string, failed bool) {
	switch {
	case !e.Known:
		return "unknown exit status", true
	case e.Signal != 0:
		return fmt.Sprintf("killed by signal %s", e.Signal), true
	}
	return fmt.Sprintf("exited with code %d", e.Code), e.Code != 0
}

// stopGroup asks the group to stop with SIGTERM and SIGKILLs it after
// killTimeout unless the leader exits first. It returns when the leader has
// exited.
func (p *Process) StopGroup(killTimeout time.Duration) (killed bool) {
	select {
	case <-p.exited:
		return false
	default:
	}
	p.trackDescendants(nil) // the newest ones too, before they can escape
	_ = p.SignalGroup(syscall.SIGTERM)
	t := time.NewTimer(killTimeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return false
	case <-t.C:
		_ = p.SignalGroup(syscall.SIGKILL)
		<-p.exited
		return true
	}
}

// Discard kills a process no instance was made for, reaps it and
// closes our ends of its pipes. It waits for the exit: not on the owner.
func Discard(p Proc) {
	_ = p.SignalGroup(syscall.SIGKILL)
	p.Reap()
	p.CloseReaders()
}

// ExitedAt is when the leader's exit was seen (zero before).
func (p *Process) ExitedAt() time.Time {
	if n := p.exitedAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// inputPipeSize is the capacity asked for the supervisor → agent pipe. A
// restore of many megabytes then moves in 1 MiB writes and reads instead of
// the default 64 KiB's: an eighth of the wake-ups on both sides. 1 MiB is
// Linux's default /proc/sys/fs/pipe-max-size, so any user may ask for it.
const inputPipeSize = 1 << 20

// growPipe asks for inputPipeSize on w's pipe. It is best effort: a kernel
// that refuses (an unprivileged user over fs/pipe-user-pages-soft) leaves
// the default size, which only makes big restores slower.
func growPipe(w *os.File) {
	if rc, err := w.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, inputPipeSize) })
	}
}
