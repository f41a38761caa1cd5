package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
	"github.com/agent-sidecar/supervisor/wal"
)

// Errors Run returns; the CLI maps them to exit codes.
var (
	// ErrCrashLoop: the agent restarted more than --max-restarts times within
	// --restart-window (exit code 1).
	ErrCrashLoop = errors.New("agent crash loop: supervisor gave up")
	// ErrAgentFailed: the agent failed once and --restart is never (exit 1).
	ErrAgentFailed = errors.New("agent failed")
	// ErrDataDirLocked: another supervisor owns the data directory.
	ErrDataDirLocked = errors.New("data directory is in use by another supervisor")
	// ErrUnrestorable: no restore satisfying the restore invariant can be
	// built from the data directory (durable.ErrUnrestorable; exit code 3).
	ErrUnrestorable = durable.ErrUnrestorable
)

// State is the lifecycle state of the primary agent.
type State string

const (
	StateStarting   State = "starting"    // spawned, waiting for its first heartbeat
	StateRunning    State = "running"     // heartbeating
	StateStopping   State = "stopping"    // being stopped (hung, framing error, shutdown)
	StateBackingOff State = "backing_off" // waiting to restart
	StateGivenUp    State = "given_up"    // crash loop: the supervisor is exiting
	StateStopped    State = "stopped"     // supervisor shutting down or done
)

// reasonOperatorRestore: the agent was stopped to deliver an operator's
// restore; not a failure, restarted at once.
const reasonOperatorRestore = "operator_restore"

// Supervisor runs one primary agent. Build it with New, then call Run.
//
// Its parts are built once, by New (the API, the store worker, the metrics)
// and by Run's open (the data directory's stores, ledger and replica), and
// never swapped. Lifecycle state is the owner loop's alone (lc); other
// goroutines read what it publishes (pub) and reach it only through inbox.
type Supervisor struct {
	cfg   Config
	log   *slog.Logger
	codec *schema.Codec
	rec   *observe.Recorder // logs, counts and audits occurrences (its audit log attached by open)
	met   *observe.Metrics
	bmet  *observe.BoundsMetrics
	rmet  *requests.Metrics
	api   *api.Server // the HTTP API, its request table and the control socket
	// work runs checkpoint saves and the owner's slow storage jobs on one
	// goroutine (storejobs.go); they report back on inbox.stored.
	work *durable.Worker[ckptJob]
	// spawn starts an agent: spawnProcess, or an in-memory agent in the
	// owner loop's tests.
	spawn func(agentproc.Spec) (agentproc.Proc, error)

	// The data directory's parts, opened by Run (open) before the loop.
	st     *durable.Stores // WAL, checkpoints, restore assembly: the restore invariant
	lock   *os.File
	ledger *evolution.Ledger
	rep    *replicaState // --replica (replica.go); nil when off
	// book is the request journal and every request's state
	// (supervisor/requests); the owner tells it when the primary starts and
	// dies, and never waits on it.
	book *requests.Book

	inbox inbox     // every way into the owner loop
	lc    lifecycle // the owner loop's state: nobody else reads or writes it
	// pub is the owner's last published view (view.go): the only way other
	// goroutines see owner state.
	pub      atomic.Pointer[view]
	loopBeat atomic.Int64 // unix nanos of the owner loop's last turn; 0 before Run
	// spawns counts the spawn goroutines still out (spawn.go).
	spawns sync.WaitGroup
}

// inbox is every channel into the owner loop.
type inbox struct {
	events  chan conn.Event  // from agent instances, and their drains
	control chan controlCall // operators, through the control socket
	force   chan struct{}    // ForceStop: skip the graceful wait
	stored  chan storeResult // store worker answers to owner jobs
	spawned chan spawnResult // spawned processes (spawn.go)
	// walFailed: the WAL stopped after a failed fsync or write (walfailed.go);
	// cap 1, sent without blocking from the WAL's syncer.
	walFailed chan *wal.FailedError
	// loopDone is closed when the owner loop has returned: goroutines
	// reporting to it stop waiting.
	loopDone chan struct{}
}

// lifecycle is the owner loop's state. Only the loop's goroutine (Run)
// reads or writes it; what others need is published (view.go).
type lifecycle struct {
	state        State
	stat         Status // the owner's fields of the status, published by publish
	failed       bool   // gave up: /healthz fails
	cur          *agent
	incarnation  int
	bo           backoff
	restarts     int
	pendingPoint *durable.Point
	pendingReply chan ControlResponse // operator restore waiting for the agent's restart
	shutting     bool
	startedOnce  bool
	// preparing: a start whose restore the store worker is assembling
	// (storeResult.start answers it); nil: none.
	preparing *startPrep
	// early: the first agent, started during recovery with
	// --spawn-during-recovery (early.go), until a start takes it.
	early *earlyStart
	// fallbackFrom: with --fallback-on-crash-loop, restores come from the
	// newest checkpoint older than this one ("" = the newest).
	fallbackFrom string
	lastRestored string // checkpoint id of the newest restore sent to a primary
	trial        *trial
	trialPrep    bool // an evolution's backup is being prepared (storeResult.trial)
	// walFailed: the WAL stopped and has not been reopened yet (walfailed.go);
	// readiness fails meanwhile.
	walFailed *wal.FailedError

	// The loop's timers: the next start (back-off), and the current
	// instance's heartbeat deadline.
	startTimer *time.Timer
	hbTimer    *time.Timer
}

// newCodec is the one codec of a run: streamed checkpoints whatever the
// frame limit, and restores bounded by --max-frame-size when it is below the
// default restore limit. One acceptance rule for every --max-frame-size.
func newCodec(cfg Config) *schema.Codec {
	restore := schema.DefaultLimits().Restore
	if cfg.MaxFrameSize > 0 && cfg.MaxFrameSize < restore {
		restore = cfg.MaxFrameSize
	}
	return schema.NewCodec(schema.Options{ExtraWALOperations: cfg.WALOperations, StreamCheckpoints: true,
		Limits: schema.Limits{Restore: restore}})
}

// New validates the configuration. Nothing is opened until Run.
func New(cfg Config) (*Supervisor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Supervisor{
		cfg:   cfg,
		log:   log,
		rec:   observe.NewRecorder(log),
		codec: newCodec(cfg),
		work:  durable.NewWorker[ckptJob](ckptQueueBytes),
		spawn: spawnProcess,
		inbox: inbox{
			events:    make(chan conn.Event, 256),
			control:   make(chan controlCall),
			force:     make(chan struct{}, 1),
			stored:    make(chan storeResult, 4),
			spawned:   make(chan spawnResult), // unbuffered: an answer is taken by the loop, or settled by its sender
			loopDone:  make(chan struct{}),
			walFailed: make(chan *wal.FailedError, 1),
		},
		lc: lifecycle{bo: backoff{
			initial: cfg.BackoffInitial, max: cfg.BackoffMax,
			maxRestarts: cfg.MaxRestarts, window: cfg.RestartWindow,
		}},
	}
	s.setState(StateStarting) // the first start is scheduled at once
	s.met = observe.NewMetrics(s.heartbeatAgeSeconds, s.walLastSequence, newBuildInfoGauge(Build()))
	s.bmet = observe.NewBoundsMetrics(s.met.Reg, cfg.LogDropped)
	s.rmet = requests.NewMetrics(s.met.Reg)
	srv, err := api.New(api.Options{Log: log, Metrics: s.met, Bounds: s.bmet, Codec: s.codec,
		TokenFile: cfg.HTTPTokenFile, Retention: cfg.RequestRetention, AuditPath: filepath.Join(cfg.DataDir, "audit.jsonl")}, apiOwner{s})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	s.api = srv
	return s, nil
}
