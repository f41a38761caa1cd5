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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// HTTP server bounds. Every connection has deadlines, so a slow or idle
// client cannot hold one for ever, and the number of connections is capped
// well below the process's file limit, so a flood of connections can never
// take the descriptors the WAL and checkpoint store need. The cap keeps room
// for the probes (connPool).
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 30 * time.Second // whole request, body included
	httpWriteTimeout      = 60 * time.Second // long enough for a ?wait= answer
	httpIdleTimeout       = 60 * time.Second
	httpMaxHeaderBytes    = 64 << 10
	maxHTTPConnsCeiling   = 256

	// A connection with no request in progress for this long (no complete
	// header yet, or idle between requests) gives its slot to a new one
	// when every slot is taken.
	evictGrace = 100 * time.Millisecond
	// Of the cap, this share (at most maxReserveSlots) is kept for
	// requests to the probe paths when every other connection is busy.
	maxReserveSlots = 8

	// The probe listener (--probe-addr): a few connections, short timeouts.
	probeConns             = 16
	probeReadHeaderTimeout = 2 * time.Second
	probeReadTimeout       = 5 * time.Second // the probes take no body
	probeWriteTimeout      = 10 * time.Second
	probeIdleTimeout       = 10 * time.Second
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

// splitCap divides the connection cap into general and reserve slots: an
// eighth is reserved for the probes, 1 to maxReserveSlots.
func splitCap(n int) (general, reserve int) {
	reserve = max(1, min(maxReserveSlots, n/8))
	return n - reserve, reserve
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
	// during an evolution trial, the trial's mirror, which sends the same
	// traffic to its shadows, and the trial's id.
	Target() (primary Agent, mirror Mirror, trial string)
	// CheckpointMeta reads a checkpoint's header (an operator's restore).
	CheckpointMeta(id string) (checkpoint.Meta, error)
	// CheckpointList lists the checkpoints stored, newest first (the
	// status page, now and then).
	CheckpointList() ([]checkpoint.Meta, error)
	// Details is what the status page shows beyond Status, published.
	Details() Details
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

// Mirror is a running evolution trial as the API sees it: every request
// sent to the primary is mirrored to the trial's shadows (SPEC §6).
type Mirror interface {
	// Expect registers request id, about to be sent to the primary at
	// sent. Called before the primary's send, so no answer precedes it.
	Expect(id string, sent time.Time)
	// Send mirrors the request's frame to the shadows (in random order),
	// after the primary got it.
	Send(id string, frame []byte)
	// Cancel forgets an expected request the primary could not be sent.
	Cancel(id string)
}

// Options configure a Server; they are fixed at New.
type Options struct {
	Log       *slog.Logger
	Metrics   *observe.Metrics
	Bounds    *observe.BoundsMetrics
	Codec     *schema.Codec
	TokenFile string        // --http-token-file; "": no token
	Retention time.Duration // --request-retention
	AuditPath string        // the audit log, read by GET /v1/evolutions ("": none)
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
	probeSrv  *http.Server // --probe-addr's, likewise

	general, reserve int          // the main listener's slots (splitCap)
	waits            *waitLimiter // POST /v1/requests?wait= in progress
	waitsRefused     prometheus.Counter
	evictions        *prometheus.CounterVec

	status statusState // the status page's caches and sampler (status.go)
}

// New builds the API. A bad token file is an error (ErrConfig-wrapped by
// the caller's configErr).
func New(opts Options, owner Owner) (*Server, error) {
	tok, err := loadToken(opts.TokenFile)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, owner: owner, requests: newRequestTable(opts.Retention, opts.Metrics), tokenHash: tok}
	s.general, s.reserve = splitCap(ConnCap())
	s.waits = newWaitLimiter(maxWaitsPerClient, s.general/2)
	a := promauto.With(opts.Metrics.Reg)
	s.waitsRefused = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_http_waits_refused_total",
		Help: "POST /v1/requests?wait= answered 202 at once because that client, or the listener, had as many requests waiting as allowed.",
	})
	s.evictions = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_http_connections_evicted_total",
		Help: "Connections closed to make room for a new one, every slot being taken: they had no request in progress (no complete header yet, or idle).",
	}, []string{"listener"})
	s.srv = s.newHTTPServer(s.Handler(), httpReadHeaderTimeout, httpReadTimeout, httpWriteTimeout, httpIdleTimeout)
	s.probeSrv = s.newHTTPServer(s.ProbeHandler(), probeReadHeaderTimeout, probeReadTimeout, probeWriteTimeout, probeIdleTimeout)
	return s, nil
}

// Serve serves HTTP on ln until Shutdown, capped at ConnCap connections
// with room kept for the probes (connPool). It returns nil once shut down.
func (s *Server) Serve(ln net.Listener) error {
	pool := newConnPool(ln, s.general, s.reserve, evictGrace)
	pool.onOpen = func(d int) { s.opts.Bounds.HTTPConns.Add(float64(d)) }
	pool.onWait = s.opts.Bounds.HTTPWaits.Inc
	pool.onEvict = s.evictions.WithLabelValues("http").Inc
	s.srv.ConnState = pool.connState
	s.opts.Log.Info("HTTP listener up", "addr", ln.Addr().String(), "max_connections", s.general+s.reserve,
		"reserved_for_probes", s.reserve, "max_waits", s.waits.total, "max_waits_per_client", s.waits.perClient)
	s.startSampler()
	return serve(s.srv, pool)
}

// ServeProbes serves /healthz, /readyz and /metrics alone on ln (the
// --probe-addr listener) until Shutdown: a few connections of its own and
// short timeouts, so the probes answer whatever clients do to the main
// listener. It returns nil once shut down.
func (s *Server) ServeProbes(ln net.Listener) error {
	pool := newConnPool(ln, probeConns, 0, evictGrace)
	pool.onEvict = s.evictions.WithLabelValues("probe").Inc
	s.probeSrv.ConnState = pool.connState
	s.opts.Log.Info("probe listener up", "addr", ln.Addr().String(), "max_connections", probeConns, "paths", "/healthz /readyz /metrics")
	return serve(s.probeSrv, pool)
}

func serve(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the HTTP servers, giving requests under way until ctx. A
// Serve that has not begun yet returns at once when it does.
func (s *Server) Shutdown(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.probeSrv.Shutdown(ctx) })
	_ = s.srv.Shutdown(ctx)
	wg.Wait()
	s.stopSampler()
}

// Requests is the request table's view for the owner's result sink.
func (s *Server) Requests() *RequestTable { return s.requests }

func (s *Server) newHTTPServer(h http.Handler, readHeader, read, write, idle time.Duration) *http.Server {
	return &http.Server{
		Handler:           unreadBodies(h),
		ConnContext:       connContext,
		ReadHeaderTimeout: readHeader,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idle,
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
