package agentproc

import (
	"io"
	"syscall"
	"time"
)

// Proc is the agent's side of an instance: the pipes it reads and
// writes, its exit, and its process group. *Process (process.go) is the OS
// one; the owner loop's tests (loop_test.go) use an in-memory one, so the
// loop runs under testing/synctest.
type Proc interface {
	ID() int // the pid, for logs and the status
	// pipes are the agent's frame input, its frame output, and its log
	// streams (stderr, then stdout when frames use fd 3/4).
	Pipes() (toAgent io.Writer, fromAgent io.Reader, logs []io.Reader)
	Exited() <-chan struct{} // closed when the agent has exited (not yet reaped)
	SignalGroup(sig syscall.Signal) error
	// stopGroup: SIGTERM, SIGKILL after killTimeout; returns once exited.
	StopGroup(killTimeout time.Duration) (killed bool)
	Reap() ExitStatus // after exitedCh: collect the status; idempotent
	CloseReaders()    // unblock readers held by an escaped descendant
}
