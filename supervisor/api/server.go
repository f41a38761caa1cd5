package api

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
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

// ConnCap returns the connection cap: a quarter of RLIMIT_NOFILE, at
// most 256 and at least 4. The other three quarters stay for the agent's
// pipes, the WAL, checkpoints, the audit log and the control socket.
func ConnCap() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 64
	}
	return int(max(4, min(maxHTTPConnsCeiling, rl.Cur/4)))
}

// Owner is what the API reads of the supervisor and asks of it. The API
// never changes lifecycle state: it reads published snapshots and sends the
// owner requests (Control), which the owner loop answers.
type Owner interface {
	// Status is the supervisor's status now.
	Status() Status
	// Health: givenUp once the supervisor has given up (crash loop, a
	// failure with --restart never, an unrestorable state); stalled while
	// the owner loop has not turned for longer than limit.
	Health(now time.Time) (givenUp, stalled bool, age, limit time.Duration)
	// Readiness: whether the primary agent is up and heartbeating, and why
	// not.
	Readiness() (ready bool, reason string, st Status)
	// Target is where a request goes now: the primary (nil: none) and,
	// during an evolution trial, the shadow that gets the same traffic and
	// the trial's id.
	Target() (primary, shadow Agent, trial string)
	// CheckpointMeta reads a checkpoint's header (an operator's restore).
	CheckpointMeta(id string) (checkpoint.Meta, error)
	// Control hands a control request to the owner loop and waits for its
	// answer, or for ctx.
	Control(ctx context.Context, req ControlRequest, meta checkpoint.Meta) ControlResponse
}

// Agent is an agent instance as the API uses it: frames are queued to it
// (never blocking) and its heartbeat is read.
type Agent interface {
	// SendRequest queues a process_request within the requests' share of
	// the agent's input queue; false: full (answer 503, Retry-After).
	SendRequest(frame []byte) bool
	HeartbeatAge(now time.Time) (time.Duration, bool)
}

// Options configure a Server; they are fixed at New.
type Options struct {
	Log       *slog.Logger
	Metrics   *observe.Metrics
	Bounds    *observe.BoundsMetrics
	Codec     *schema.Codec
	TokenFile string        // --http-token-file; "": no token
	Retention time.Duration // --request-retention
}

// Server is the supervisor's API: the HTTP handlers, the request table and
// the control socket. It owns the table; what it knows of the agent it reads
// through Owner.
type Server struct {
	opts      Options
	owner     Owner
	requests  *RequestTable
	tokenHash []byte       // SHA-256 of the bearer token; nil: no token
	srv       *http.Server // built by New: Shutdown works before Serve has begun
}

// New builds the API. A bad token file is an error (ErrConfig-wrapped by
// the caller's configErr).
func New(opts Options, owner Owner) (*Server, error) {
	tok, err := loadToken(opts.TokenFile)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, owner: owner, requests: newRequestTable(opts.Retention, opts.Metrics), tokenHash: tok}
	s.srv = s.newHTTPServer()
	return s, nil
}

// Serve serves HTTP on ln (capped at ConnCap connections) until Shutdown.
// It returns nil once shut down.
func (s *Server) Serve(ln net.Listener) error {
	connCap := ConnCap()
	ln = newLimitListener(ln, connCap, func(d int) { s.opts.Bounds.HTTPConns.Add(float64(d)) }, s.opts.Bounds.HTTPWaits.Inc)
	s.opts.Log.Info("HTTP listener up", "addr", ln.Addr().String(), "max_connections", connCap)
	if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the HTTP server, giving requests under way until ctx. A
// Serve that has not begun yet returns at once when it does.
func (s *Server) Shutdown(ctx context.Context) { _ = s.srv.Shutdown(ctx) }

// Requests is the request table's view for the owner's result sink.
func (s *Server) Requests() *RequestTable { return s.requests }

func (s *Server) newHTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		// net/http's own per-connection errors (a client that sent garbage,
		// accept failures) go through our non-blocking log, throttled.
		ErrorLog: log.New(httpErrorLog{log: s.opts.Log, limit: observe.NewRateLimiter(10, 10*time.Second)}, "", 0),
	}
}

type httpErrorLog struct {
	log   *slog.Logger
	limit *observe.RateLimiter
}

func (h httpErrorLog) Write(p []byte) (int, error) {
	if ok, sup := h.limit.Allow(time.Now()); ok {
		h.log.Warn("HTTP server", "err", strings.TrimSpace(string(p)), "suppressed_before", sup)
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
