package supervisor

import (
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// HTTP server bounds. Every connection has deadlines, so a slow or idle
// client cannot hold one for ever, and the number of connections is capped
// well below the process's file limit, so a flood of connections can never
// take the descriptors the WAL and checkpoint store need.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 30 * time.Second // whole request, body included
	httpWriteTimeout      = 60 * time.Second // long enough for a ?wait= answer
	httpIdleTimeout       = 60 * time.Second
	httpMaxHeaderBytes    = 64 << 10
	maxHTTPConnsCeiling   = 256
)

// httpConnCap returns the connection cap: a quarter of RLIMIT_NOFILE, at
// most 256 and at least 4. The other three quarters stay for the agent's
// pipes, the WAL, checkpoints, the audit log and the control socket.
func httpConnCap() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	return int(max(4, min(maxHTTPConnsCeiling, rl.Cur/4)))
}

func (s *Supervisor) newHTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.httpHandler(),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		// net/http's own per-connection errors (a client that sent garbage,
		// accept failures) go through our non-blocking log, throttled.
		ErrorLog: log.New(httpErrorLog{s: s, limit: observe.NewRateLimiter(10, 10*time.Second)}, "", 0),
	}
}

type httpErrorLog struct {
	s     *Supervisor
	limit *observe.RateLimiter
}

func (h httpErrorLog) Write(p []byte) (int, error) {
	if ok, sup := h.limit.Allow(time.Now()); ok {
		h.s.log.Warn("HTTP server", "err", strings.TrimSpace(string(p)), "suppressed_before", sup)
	}
	return len(p), nil
}

// limitListener accepts at most n connections at a time: at the cap, Accept
// waits for one to close, and further clients wait in the kernel's backlog,
// where they cost the supervisor no file descriptor.
type limitListener struct {
	net.Listener
	sem    chan struct{}
	done   chan struct{}
	once   sync.Once
	onOpen func(delta int)
	onWait func()
}

func newLimitListener(l net.Listener, n int, onOpen func(int), onWait func()) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}), onOpen: onOpen, onWait: onWait}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.onWait()
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.onOpen(1)
	return &limitConn{Conn: c, release: func() { l.onOpen(-1); <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
