package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wire"
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

// drainTimeout bounds how long, after an agent exits, we keep reading what it
// wrote before dying (normally EOF comes at once).
const drainTimeout = 2 * time.Second

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
	// fallbackFrom: with --fallback-on-crash-loop, restores come from the
	// newest checkpoint older than this one ("" = the newest).
	fallbackFrom string
	lastRestored string // checkpoint id of the newest restore sent to a primary
	trial        *trial
	trialPrep    bool // an evolution's backup is being prepared (storeResult.trial)
}

type ckptJob struct {
	inst      *conn.Instance
	dest      *ckptDest
	data      []byte // uncompressed data, or nil when zstd is set
	zstd      []byte // the agent's compressed data, validated while it is stored
	size      int64  // bytes reserved in ckptGate
	watermark uint64
	tailAt    int64 // stores.checkpointArrived's accounting mark
	arrived   time.Time
}

// ckptQueueBytes bounds the checkpoints waiting to be stored (compressed ones
// count their compressed size). An agent that sends faster than they are
// stored is slowed down through its pipe.
const ckptQueueBytes = 8 << 20

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
			events:   make(chan conn.Event, 256),
			control:  make(chan controlCall),
			force:    make(chan struct{}, 1),
			stored:   make(chan storeResult, 4),
			spawned:  make(chan spawnResult), // unbuffered: an answer is taken by the loop, or settled by its sender
			loopDone: make(chan struct{}),
		},
		lc: lifecycle{bo: backoff{
			initial: cfg.BackoffInitial, max: cfg.BackoffMax,
			maxRestarts: cfg.MaxRestarts, window: cfg.RestartWindow,
		}},
	}
	s.setState(StateStarting) // the first start is scheduled at once
	s.met = observe.NewMetrics(s.heartbeatAgeSeconds, s.walLastSequence)
	s.bmet = observe.NewBoundsMetrics(s.met.Reg, cfg.LogDropped)
	srv, err := api.New(api.Options{Log: log, Metrics: s.met, Bounds: s.bmet, Codec: s.codec,
		TokenFile: cfg.HTTPTokenFile, Retention: cfg.RequestRetention}, apiOwner{s})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	s.api = srv
	return s, nil
}

// Run supervises the agent until ctx is cancelled (a graceful stop: returns
// nil) or the agent crash-loops (returns an error wrapping ErrCrashLoop), or
// fails with --restart never (ErrAgentFailed). A start that fails its
// preflight (ErrConfig) has created nothing.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	// Nothing is created before everything that can fail fast has been
	// checked (preflight.go): a failed start leaves no data directory behind.
	httpLn, err := s.preflight()
	if err != nil {
		return err
	}
	if err := s.open(); err != nil {
		if httpLn != nil {
			httpLn.Close()
		}
		return err
	}
	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	defer func() {
		stopBG()
		bgWG.Wait()
		s.settleStored() // the store worker has exited: no answer comes after these
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	if err := agentproc.BecomeSubreaper(); err != nil {
		s.log.Warn("cannot become a child subreaper; orphaned agent descendants will be reaped by init instead", "err", err)
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); agentproc.Shared().RunReaper(bg, s.log) }()

	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.work.Run(s.storeCheckpoint) }()
	defer s.work.Stop()   // runs before stopBG/bgWG.Wait above: the worker finishes its queue and exits
	defer s.spawns.Wait() // before the worker stops: an unwanted spawn's trial is released on it

	if ln := httpLn; ln != nil {
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			if err := s.api.Serve(ln); err != nil {
				s.log.Error("HTTP server stopped", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s.api.Shutdown(sctx)
		}()
	}

	cl, err := api.ListenControl(s.cfg.DataDir)
	if err != nil {
		return err
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.api.ServeControl(bg, cl) }()
	defer cl.Close()

	s.rec.Audit(observe.AuditStart, map[string]any{"pid": os.Getpid(), "command": s.cfg.Command, "data_dir": s.cfg.DataDir})
	runErr := s.loop(ctx)
	close(s.inbox.loopDone)
	fields := map[string]any{"restarts": s.lc.restarts}
	if runErr != nil {
		fields["error"] = runErr.Error()
	}
	s.rec.Audit(observe.AuditStop, fields)
	return runErr
}

// open creates the data directory, takes its lock and opens the stores.
func (s *Supervisor) open() error {
	dir := s.cfg.DataDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: create data directory %s: %v", ErrConfig, dir, err)
	}
	if err := checkDataDir(dir); err != nil {
		return err
	}
	lock, err := lockDataDir(dir)
	if err != nil {
		return plantedLink(err)
	}
	s.lock = lock
	if err := s.restoreFromReplica(); err != nil { // an empty data dir with --replica
		return err
	}
	audit, err := observe.OpenAudit(filepath.Join(dir, "audit.jsonl"), s.bmet.AuditDropped.Inc, func(err error) {
		s.log.Error("cannot write the audit log; the records of this batch are lost (check the disk under --data-dir)", "err", err)
	})
	if err != nil {
		return plantedLink(err)
	}
	s.rec.AttachAudit(audit)
	policy, err := s.cfg.walSyncPolicy()
	if err != nil {
		return err
	}
	st, err := durable.Open(durable.Options{Dir: dir, Codec: s.codec, Log: s.log,
		CheckpointRetain: s.cfg.CheckpointRetain, CheckpointLevel: s.cfg.CheckpointLevel, MaxFrameSize: s.cfg.MaxFrameSize,
		WALSegmentSize: s.cfg.WALSegmentSize, WALSync: policy, WALSyncInterval: s.cfg.WALSyncInterval, OnSync: s.met.WALSynced,
		OnRewind: s.replicaRewound})
	if err != nil {
		return err
	}
	s.st = st
	w := st.WAL()
	rec := w.Recovery()
	s.log.Info("WAL opened", "segments", rec.Segments, "entries", rec.Entries,
		"last_sequence", w.LastSequence(), "floor", w.Floor(), "torn_bytes_truncated", rec.TruncatedBytes)
	for _, ce := range rec.Covered {
		s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "damaged WAL segments below the newest checkpoint's watermark set aside; that checkpoint covers them",
			Kind: observe.AuditWALError, Fields: map[string]any{"error": ce.Error(), "covered_by_checkpoint": true, "moved_aside": ce.Moved}})
	}
	if rec.Corruption != nil {
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "WAL CORRUPTION: replay stopped at a corrupt record; the good prefix is kept and entries after it are NOT served. Inspect with `supervisor wal dump` and restore the data directory from a backup if those entries matter.",
			Kind: observe.AuditWALError, Fields: map[string]any{"error": rec.Corruption.Error(), "last_good_sequence": w.LastSequence()}})
	}
	ledger, err := evolution.OpenLedger(filepath.Join(dir, "evolution.json"))
	if err != nil {
		return fmt.Errorf("open the evolution ledger: %w", err)
	}
	s.ledger = ledger
	if id, noWAL, ok, err := st.Checkpoints().TakeRestorePoint(); err != nil {
		s.log.Error("cannot read the recorded restore point; ignoring it", "err", err)
	} else if ok {
		s.lc.pendingPoint = &durable.Point{CheckpointID: id, NoWAL: noWAL}
		s.log.Info("restore point recorded by an operator will be used", "checkpoint_id", id, "no_wal", noWAL)
	}
	s.startReplica()
	return nil
}

func (s *Supervisor) close() error {
	var errs []error
	s.stopReplica() // a last bounded upload of what is durable
	if s.st != nil {
		if err := s.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close WAL: %w", err))
		}
	}
	if a := s.rec.AuditLog(); a != nil {
		_ = a.Close()
	}
	if s.lock != nil {
		_ = os.Remove(filepath.Join(s.cfg.DataDir, api.SocketName))
		_ = s.lock.Close()
	}
	return errors.Join(errs...)
}

// lockDataDir takes an exclusive flock on DATA_DIR/LOCK and writes our pid.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w (a symlink there is refused; remove it)", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("%w: %s is locked by pid %s; stop that supervisor or use another --data-dir",
			ErrDataDirLocked, dir, strings.TrimSpace(string(b)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// DataDirInUse reports whether a supervisor holds the lock of dir.
func DataDirInUse(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "LOCK"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// ForceStop skips the graceful wait of a stop already under way (a second
// SIGTERM/SIGINT): the agent's group is killed at once. The WAL is still
// synced before Run returns.
func (s *Supervisor) ForceStop() {
	select {
	case s.inbox.force <- struct{}{}:
	default:
	}
}

// loop is the owner: the only goroutine that changes lifecycle state.
func (s *Supervisor) loop(ctx context.Context) error {
	startTimer := time.NewTimer(0) // first start now
	hbTimer := time.NewTimer(time.Hour)
	hbTimer.Stop()
	var shutdownTimer <-chan time.Time
	done := ctx.Done()
	trialTick := time.NewTicker(250 * time.Millisecond)
	defer trialTick.Stop()
	// The loop's own heartbeat: /healthz fails when it stops beating.
	beat := time.NewTicker(time.Second)
	defer beat.Stop()
	defer s.abortTrial("the supervisor stopped during the trial")
	defer s.answerPending("the supervisor stopped before the restore was sent")

	for {
		s.loopBeat.Store(time.Now().UnixNano())
		select {
		case <-beat.C:

		case <-done:
			done = nil
			s.lc.shutting = true
			startTimer.Stop()
			s.stopTrial("the supervisor is stopping")
			if s.lc.cur == nil {
				s.setState(StateStopped)
				return nil
			}
			s.log.Info("stopping: asking the agent to shut down", "timeout", s.cfg.ShutdownTimeout)
			s.setState(StateStopping)
			s.lc.cur.stopping = true
			s.lc.cur.stopReason = "shutdown"
			s.lc.cur.SendMsg(&schema.Shutdown{Reason: "supervisor is stopping", CreateCheckpoint: true})
			shutdownTimer = time.After(s.cfg.ShutdownTimeout)

		case <-s.inbox.force:
			if s.lc.cur != nil && s.lc.shutting {
				s.log.Warn("second stop signal: killing the agent's process group without waiting")
				_ = s.lc.cur.Proc().SignalGroup(syscall.SIGKILL)
			}

		case <-shutdownTimer:
			shutdownTimer = nil
			if s.lc.cur != nil {
				s.log.Warn("agent did not exit within --shutdown-timeout; killing its process group", "timeout", s.cfg.ShutdownTimeout)
				_ = s.lc.cur.Proc().SignalGroup(syscall.SIGKILL)
			}

		case <-startTimer.C:
			if !s.lc.shutting {
				s.prepareStart()
			}

		case r := <-s.inbox.stored:
			if stop, err := s.storeDone(r, startTimer, hbTimer); stop {
				return err
			}

		case r := <-s.inbox.spawned:
			if stop, err := s.spawnDone(r, startTimer, hbTimer); stop {
				return err
			}

		case <-hbTimer.C:
			s.checkHeartbeat(hbTimer)

		case <-s.trialTimer():
			s.concludeTrial()

		case <-trialTick.C:
			s.checkShadowHeartbeat()

		case ev := <-s.inbox.events:
			if ev.Inst.Role() == RoleShadow {
				s.shadowEvent(ev)
				continue
			}
			if s.lc.cur == nil || ev.Inst != s.lc.cur.Instance {
				continue // an event from an instance already finished
			}
			cur := s.lc.cur
			switch ev.Kind {
			case conn.FirstHeartbeat:
				if s.lc.state == StateStarting {
					s.setState(StateRunning)
					s.met.AgentUp.WithLabelValues(RolePrimary).Set(1)
					s.log.Info("agent is up", "pid", ev.Inst.Proc().ID(), "start_seconds", time.Since(ev.Inst.Started()).Seconds())
				}
				s.armHeartbeat(hbTimer)
			case conn.StreamEnded:
				s.streamEnded(cur, ev)
			case conn.Unresponsive:
				if !cur.stopping {
					s.log.Error("agent stopped reading its input (outbound queue full); restarting it",
						"queued_bytes", ev.Inst.OutQueued(), "max_frames", conn.OutboundQueue, "max_bytes", conn.OutboundBytes)
					s.stopInstance(cur, "unresponsive")
				}
			case conn.EvolutionIntent:
				s.evolutionIntent(cur, ev.Msg.(*schema.EvolutionIntent))
			case conn.Exited:
				hbTimer.Stop()
				s.drainInstance(cur)
			case conn.Finished:
				stop, err := s.instanceExited(cur, ev.Status, startTimer)
				if stop {
					return err
				}
			}

		case call := <-s.inbox.control:
			if resp := s.handleControl(call); resp.OK || resp.Error != "" {
				call.reply <- resp
			}
		}
	}
}

func (s *Supervisor) setState(st State) {
	s.lc.state = st
	s.lc.stat.State = string(st)
	s.publish()
}

// storeDone takes a store worker's answer to an owner job. stop=true ends
// Run with err.
func (s *Supervisor) storeDone(r storeResult, startTimer, hbTimer *time.Timer) (stop bool, err error) {
	switch {
	case r.fallback != nil:
		return s.fallbackAnswered(r.fallback, startTimer)
	case r.trial != nil:
		s.trialPrepared(r.trial)
	case r.promotion != nil:
		s.promotionRecorded(r.promotion)
	case r.start != nil:
		if err := s.startPrepared(r.start); err != nil {
			return s.startFailed(err, startTimer)
		}
	}
	return false, nil
}

// spawnDone takes a spawned process (spawn.go) and makes it the primary or a
// trial's shadow (owner only).
func (s *Supervisor) spawnDone(r spawnResult, startTimer, hbTimer *time.Timer) (stop bool, err error) {
	if r.trial != nil {
		s.shadowSpawned(r)
		return false, nil
	}
	p := r.start
	if p != s.lc.preparing || s.lc.shutting {
		if r.proc != nil {
			go agentproc.Discard(r.proc)
		}
		return false, nil
	}
	s.lc.preparing = nil
	if s.lc.pendingPoint != p.point {
		// An operator recorded another restore point while the agent was
		// being started. It has not been sent a frame: it is stopped, and
		// the start begins again from that point.
		if r.proc != nil {
			go agentproc.Discard(r.proc)
		}
		s.prepareStart()
		return false, nil
	}
	s.lc.pendingPoint = nil
	if err := s.startSpawned(p, r.proc, r.err); err != nil {
		return s.startFailed(err, startTimer)
	}
	s.armHeartbeat(hbTimer)
	return false, nil
}

// startFailed handles a start that could not be made: a configuration error
// or an unrestorable data directory ends Run; anything else is retried
// after a back-off (owner only).
func (s *Supervisor) startFailed(err error, startTimer *time.Timer) (stop bool, _ error) {
	s.answerPending("the agent could not be restarted to deliver the restore: " + err.Error())
	if errors.Is(err, ErrConfig) {
		return true, err
	}
	if errors.Is(err, ErrUnrestorable) {
		s.refuseStart(err)
		return true, err
	}
	s.log.Error("cannot start the agent", "err", err)
	return s.scheduleRestart("spawn_failed", true, startTimer)
}

// storeResult is a store worker's answer to an owner job (one field set).
type storeResult struct {
	start     *startPrep   // prepareStart
	trial     *trialPrep   // evolutionIntent
	fallback  *fallbackAsk // scheduleRestart, with --fallback-on-crash-loop
	promotion *promotion   // concludeTrial
}

// startPrep is one start's restore, assembled on the store worker
// (assembleStart) and answered to the owner (startPrepared).
type startPrep struct {
	point        *durable.Point // the operator's restore point; nil: the newest checkpoint
	fallbackFrom string         // the owner's fallbackFrom; cleared when a newer checkpoint was stored

	plan      *durable.Plan // nil: no state yet (a fresh start)
	usedPoint bool          // point was used (false: it could not be, the newest was)
	err       error         // no restore can be built: the agent is not started
}

// prepareStart asks the store worker to assemble the next start's restore.
// It runs after every checkpoint queued before it, so it sees all that the
// previous incarnation sent; the owner goes on meanwhile, and spawns the
// agent when the answer comes (startPrepared).
func (s *Supervisor) prepareStart() {
	if s.lc.preparing != nil {
		return
	}
	p := &startPrep{point: s.lc.pendingPoint, fallbackFrom: s.lc.fallbackFrom}
	s.lc.preparing = p
	s.work.Post(func() {
		s.assembleStart(p)
		s.report(storeResult{start: p})
	})
}

// report answers an owner job. After the loop has returned, nobody will
// take the answer: it is settled here (unanswered).
func (s *Supervisor) report(r storeResult) {
	select {
	case <-s.inbox.loopDone:
		s.unanswered(r)
		return
	default:
	}
	select {
	case s.inbox.stored <- r:
	case <-s.inbox.loopDone:
		s.unanswered(r)
	}
}

// unanswered settles a store worker's answer the owner loop will never take
// (it has returned): a prepared trial releases what it holds; a promotion
// the ledger recorded is audited (the next run's primary gets its code from
// the ledger). Store worker, or Run once the worker has exited.
func (s *Supervisor) unanswered(r storeResult) {
	if t := r.trial; t != nil && t.t != nil {
		s.unpinNow(t.t.backup.ID)
		t.t.close()
	}
	if r.promotion != nil {
		s.promotionAfterLoop(r.promotion)
	}
}

// settleStored settles the answers left in s.inbox.stored when the loop returned.
// Call once the store worker has exited.
func (s *Supervisor) settleStored() {
	for {
		select {
		case r := <-s.inbox.stored:
			s.unanswered(r)
		default:
			return
		}
	}
}

// assembleStart builds a start's restore. Store worker only.
func (s *Supervisor) assembleStart(p *startPrep) {
	if p.fallbackFrom != "" {
		if m, ok := s.st.NewestGood(); !ok || m.ID != p.fallbackFrom {
			p.fallbackFrom = "" // a newer checkpoint was stored since the fallback
		}
	}
	if pt := p.point; pt != nil {
		plan, err := s.st.BuildRestore(*pt)
		if err != nil {
			s.log.Error("the recorded restore point cannot be used; restoring from the newest checkpoint instead",
				"checkpoint_id", pt.CheckpointID, "err", err)
		} else {
			p.plan, p.usedPoint = plan, true
		}
	}
	if !p.usedPoint {
		plan, err := s.st.BuildRestore(durable.Point{OlderThan: p.fallbackFrom})
		if err != nil {
			p.err = fmt.Errorf("assemble restore: %w", err)
			return
		}
		p.plan = plan
	}
	if p.plan != nil {
		s.reportSkipped(p.plan.Skipped)
	}
	if p.usedPoint && p.point.NoWAL && p.plan != nil {
		meta, err := s.st.Checkpoints().Stat(p.point.CheckpointID)
		if err == nil {
			err = s.rewindWAL(meta)
		}
		if err != nil {
			p.err = fmt.Errorf("roll back to checkpoint %s for a --no-wal restore: %w", p.point.CheckpointID, err)
		}
	}
}

// startPrepared spawns the agent with the restore the store worker
// assembled, and queues the restore as its first frame.
func (s *Supervisor) startPrepared(p *startPrep) error {
	if p != s.lc.preparing || s.lc.shutting {
		return nil
	}
	if s.lc.pendingPoint != p.point {
		// An operator recorded another restore point while this one was
		// assembled: that one is what the agent must start from.
		s.lc.preparing = nil
		s.prepareStart()
		return nil
	}
	s.lc.fallbackFrom = p.fallbackFrom
	if p.err != nil {
		s.lc.preparing, s.lc.pendingPoint = nil, nil
		s.publish()
		return p.err
	}
	// Still preparing (s.lc.preparing) until spawnDone takes the process.
	s.spawnAsync(agentproc.Spec{Path: s.cfg.Command[0], Args: s.cfg.Command[1:], Env: s.agentEnv(RolePrimary, p.plan != nil), Stdio: s.cfg.Stdio},
		spawnResult{start: p})
	return nil
}

// startSpawned makes a spawned process the primary and sends it its restore
// (owner only).
func (s *Supervisor) startSpawned(p *startPrep, proc agentproc.Proc, err error) error {
	plan := p.plan
	var point *durable.Point
	if p.usedPoint {
		point = p.point
	}
	if err != nil {
		if !s.lc.startedOnce && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		return err
	}
	s.lc.startedOnce = true
	s.lc.incarnation++
	inst := &agent{Instance: conn.Start(conn.Config{N: s.lc.incarnation, Role: RolePrimary, Proc: proc, Codec: s.codec,
		MaxFrame: s.cfg.MaxFrameSize, Sink: s.primarySinks(), Events: s.inbox.events, Metrics: s.met, Log: s.log})}
	s.lc.cur = inst
	s.lc.stat.PID = proc.ID()
	s.lc.stat.Incarnation = s.lc.incarnation
	s.lc.stat.AgentStartedAt = inst.Started()
	s.setState(StateStarting)
	s.log.Info("agent started", "pid", proc.ID(), "incarnation", s.lc.incarnation, "command", s.cfg.Command, "restore", plan != nil)
	created := time.Time{}
	trigger := "start"
	if s.lc.pendingReply != nil {
		trigger = "operator"
	}
	if plan != nil {
		s.sendRestore(inst.Instance, plan, trigger)
		created = plan.Created
		s.lc.lastRestored = plan.CheckpointID
	}
	if s.lc.pendingReply != nil {
		resp := ControlResponse{Error: "the restore point could not be used; the agent was restored from the newest checkpoint instead"}
		if plan != nil && point != nil {
			resp = ControlResponse{OK: true, Message: "restore sent to the restarted agent", Restore: &RestoreInfo{
				CheckpointID: plan.CheckpointID, Watermark: plan.Watermark, WALEntries: plan.Entries,
				LastSequence: plan.LastSequence, Sent: true, NoWAL: point.NoWAL}}
		}
		s.lc.pendingReply <- resp
		s.lc.pendingReply = nil
	}
	// Promoted code newer than the restored state is applied again.
	s.resendPromotions(inst, created)
	return nil
}

// reportSkipped logs, counts and audits the checkpoints a restore passed
// over (corrupt ones; bad-marked ones were reported when marked).
func (s *Supervisor) reportSkipped(skipped []checkpoint.Skipped) {
	for _, sk := range skipped {
		if errors.Is(sk.Err, checkpoint.ErrMarkedBad) {
			s.log.Info("checkpoint marked bad earlier is passed over", "checkpoint_id", sk.ID, "err", sk.Err)
			continue
		}
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "checkpoint skipped at restore; using an older one with a longer WAL replay",
			Kind: observe.AuditCheckpointSkip, Fields: map[string]any{"checkpoint_id": sk.ID, "error": sk.Err.Error()}, Count: s.met.CheckpointSkip})
	}
}

// answerPending fails an operator restore still waiting for its answer.
func (s *Supervisor) answerPending(msg string) {
	if s.lc.pendingReply != nil {
		s.lc.pendingReply <- ControlResponse{Error: msg}
		s.lc.pendingReply = nil
	}
}

// agentEnv is the environment of an agent process.
func (s *Supervisor) agentEnv(role string, restorePending bool) []string {
	transport := "stdio"
	if !s.cfg.Stdio {
		transport = "fd"
	}
	pending := "0"
	if restorePending {
		pending = "1"
	}
	return append(os.Environ(),
		"SUPERVISOR_ROLE="+role,
		"SUPERVISOR_PROTOCOL_VERSION=2",
		"SUPERVISOR_TRANSPORT="+transport,
		"SUPERVISOR_RESTORE_PENDING="+pending,
	)
}

// armHeartbeat sets the timer to the current instance's heartbeat deadline.
func (s *Supervisor) armHeartbeat(t *time.Timer) {
	if s.lc.cur == nil || s.lc.cur.stopping {
		t.Stop()
		return
	}
	age, seen := s.lc.cur.HeartbeatAge(time.Now())
	limit := s.cfg.StartTimeout
	if seen {
		limit = s.cfg.HeartbeatTimeout
	}
	wait := limit - age
	if wait < time.Millisecond {
		wait = time.Millisecond
	}
	t.Reset(wait)
}

func (s *Supervisor) checkHeartbeat(t *time.Timer) {
	in := s.lc.cur
	if in == nil || in.stopping {
		return
	}
	age, seen := in.HeartbeatAge(time.Now())
	switch {
	case !seen && age >= s.cfg.StartTimeout:
		s.log.Error("agent sent no heartbeat within --start-timeout; stopping it", "start_timeout", s.cfg.StartTimeout, "pid", in.Proc().ID())
		s.stopInstance(in, "start_timeout")
	case seen && age >= s.cfg.HeartbeatTimeout:
		s.log.Error("agent is hung: no heartbeat within --heartbeat-timeout; stopping it", "heartbeat_timeout", s.cfg.HeartbeatTimeout, "last_heartbeat_age", age.Round(time.Millisecond), "pid", in.Proc().ID())
		s.stopInstance(in, "hung")
	default:
		s.armHeartbeat(t)
	}
}

// stopInstance stops an instance in the background: SIGTERM to its group,
// SIGKILL after --kill-timeout. Its exit arrives as an conn.Exited event.
func (s *Supervisor) stopInstance(in *agent, reason string) {
	if in.stopping {
		return
	}
	in.stopping = true
	in.stopReason = reason
	if in == s.lc.cur {
		s.setState(StateStopping)
		s.met.AgentUp.WithLabelValues(in.Role()).Set(0)
	}
	go func() {
		if in.Proc().StopGroup(s.cfg.KillTimeout) {
			in.Log().Warn("agent ignored SIGTERM; killed it with SIGKILL", "kill_timeout", s.cfg.KillTimeout)
		}
	}()
}

func (s *Supervisor) streamEnded(in *agent, ev conn.Event) {
	if ev.Err == nil || errors.Is(ev.Err, os.ErrClosed) {
		return
	}
	if errors.Is(ev.Err, io.EOF) {
		in.Log().Debug("agent closed its output")
		return
	}
	if wire.IsFramingError(ev.Err) {
		rule := framingRule(ev.Err)
		s.met.Invalid.WithLabelValues("FRAMING_ERROR", rule).Inc()
		if in.stopping {
			return
		}
		fields := map[string]any{"pid": in.Proc().ID(), "error": ev.Err.Error(), "rule": rule}
		msg := "framing error from the agent: its output can no longer be trusted; restarting it"
		if d := s.diagnoseFraming(ev.Err); d != "" { // diagnose.go
			msg = "framing error from the agent: " + d + "; restarting it"
			fields["diagnosis"] = d
		}
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Log: in.Log(), Kind: observe.AuditFraming, Fields: fields})
		s.stopInstance(in, "framing_error")
		return
	}
	in.Log().Error("reading from the agent failed", "err", ev.Err)
	s.stopInstance(in, "read_error")
}

// drainInstance finishes an exited primary in the background: its output
// is read to the end and stored, however long our own storage takes (only a
// pipe an escaped descendant holds open is cut), then it is reaped, and
// conn.Finished reports to the owner. The owner goes on meanwhile.
func (s *Supervisor) drainInstance(in *agent) {
	if in.Role() == RolePrimary && !in.draining {
		s.setState(StateStopping)
		s.met.AgentUp.WithLabelValues(RolePrimary).Set(0)
	}
	s.drain(in)
}

// drain finishes an exited instance on its own goroutine; conn.Finished
// reports it (owner only).
func (s *Supervisor) drain(in *agent) {
	if in.draining {
		return
	}
	in.draining = true
	go func() {
		st := in.Finish(drainTimeout)
		select {
		case s.inbox.events <- conn.Event{Inst: in.Instance, Kind: conn.Finished, Status: st}:
		case <-s.inbox.loopDone:
		}
	}()
}

// instanceExited decides what happens after a primary has exited and been
// drained and reaped. stop=true ends Run with err.
func (s *Supervisor) instanceExited(in *agent, st agentproc.ExitStatus, startTimer *time.Timer) (stop bool, err error) {
	now := time.Now()
	s.lc.cur = nil
	s.lc.stat.PID = 0
	s.lc.stat.AgentStartedAt = time.Time{}
	s.publish()
	s.met.AgentUp.WithLabelValues(RolePrimary).Set(0)
	desc, failed := st.Describe()
	reason := in.stopReason
	if reason == "" {
		switch {
		case st.Known && st.Signal != 0:
			reason = "killed"
		case failed:
			reason = "crashed"
		default:
			reason = "exited"
		}
	}
	if reason != "exited" && reason != "shutdown" && reason != reasonOperatorRestore {
		failed = true
	}
	if s.lc.trial != nil && !s.lc.trial.decided {
		s.concludeTrial() // the primary is gone: rejected, with the reason
	}
	uptime := now.Sub(in.Started())
	s.log.Info("agent stopped", "pid", in.Proc().ID(), "status", desc, "reason", reason, "uptime", uptime.Round(time.Millisecond))

	if s.lc.shutting {
		// Checkpoints still queued are stored before Run returns (the store
		// worker finishes its queue).
		s.setState(StateStopped)
		return true, nil
	}

	if reason == reasonOperatorRestore {
		s.setState(StateBackingOff)
		startTimer.Reset(0)
		return false, nil
	}
	if first := in.FirstHeartbeatAt(); !first.IsZero() && now.Sub(first) >= s.cfg.HealthyReset {
		s.lc.bo.reset()
	}

	switch s.cfg.Restart {
	case RestartNever:
		if failed {
			s.lc.failed = true
		}
		s.setState(StateStopped)
		if failed {
			msg := fmt.Sprintf("agent %s (%s) and --restart is never, so it is not restarted.%s", desc, reason, s.failureHint(reason))
			s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Kind: observe.AuditGaveUp,
				Fields: map[string]any{"reason": reason, "status": desc, "policy": "never"}})
			return true, fmt.Errorf("%w: %s", ErrAgentFailed, msg)
		}
		return true, nil
	case RestartOnFailure:
		if !failed {
			s.setState(StateStopped)
			s.log.Info("agent exited cleanly and --restart is on-failure; supervisor stops")
			return true, nil
		}
	}
	return s.scheduleRestart(reason, failed, startTimer)
}

// scheduleRestart applies back-off and the crash-loop limit.
func (s *Supervisor) scheduleRestart(reason string, failed bool, startTimer *time.Timer) (stop bool, err error) {
	now := time.Now()
	delay, giveUp := s.lc.bo.next(now)
	if !giveUp {
		s.restartAfter(reason, failed, delay, startTimer)
		return false, nil
	}
	if s.cfg.FallbackOnCrashLoop && s.lc.lastRestored != "" {
		// Whether an older checkpoint has its whole WAL tail is the store
		// worker's to find out (it lists and reads the store); the answer
		// decides (fallbackAnswered).
		f := &fallbackAsk{from: s.lc.lastRestored, reason: reason, failed: failed}
		s.setState(StateBackingOff)
		s.work.Post(func() {
			f.to, f.ok = s.st.FallbackCandidate(f.from)
			s.report(storeResult{fallback: f})
		})
		return false, nil
	}
	return s.giveUp(reason, now)
}

// fallbackAsk is a crash loop's question to the store worker, with
// --fallback-on-crash-loop: is there a checkpoint older than from whose whole
// WAL tail is held?
type fallbackAsk struct {
	from, reason string
	failed       bool
	to           checkpoint.Meta
	ok           bool
}

// fallbackAnswered restores from an older checkpoint when there is one with
// its whole WAL tail (the restore is then that checkpoint plus every entry
// after it: the same history, replayed from further back), and gives up
// otherwise. Nothing is marked bad.
func (s *Supervisor) fallbackAnswered(f *fallbackAsk, startTimer *time.Timer) (stop bool, err error) {
	now := time.Now()
	if s.lc.shutting {
		return false, nil
	}
	if !f.ok {
		s.log.Error("crash loop: no older checkpoint with a complete WAL tail to fall back to", "checkpoint_id", f.from)
		return s.giveUp(f.reason, now)
	}
	s.lc.fallbackFrom = f.from
	s.lc.bo.forget()
	s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "crash loop: falling back to an older checkpoint (--fallback-on-crash-loop); it is restored with every WAL entry after it",
		Kind: observe.AuditFallback, Fields: map[string]any{"from_checkpoint_id": f.from, "to_checkpoint_id": f.to.ID,
			"to_watermark": f.to.Watermark, "reason": f.reason}, Count: s.met.Fallbacks})
	delay, _ := s.lc.bo.next(now)
	s.restartAfter(f.reason, f.failed, delay, startTimer)
	return false, nil
}

// giveUp ends supervision after a crash loop (Run returns ErrCrashLoop).
func (s *Supervisor) giveUp(reason string, now time.Time) (stop bool, err error) {
	s.lc.failed = true
	s.setState(StateGivenUp)
	msg := fmt.Sprintf("agent restarted more than --max-restarts=%d times within --restart-window=%s (last run ended: %s); giving up.%s "+
		"The agent's state is intact: nothing was marked bad or discarded, and the next start restores the same checkpoint and every WAL entry after it. "+
		"Check the agent's own output in this log (lines with stream=stderr) and `supervisor audit --data-dir %s` for each exit; "+
		"raise --max-restarts or use --max-restarts 0 to keep retrying",
		s.cfg.MaxRestarts, s.cfg.RestartWindow, reason, s.failureHint(reason), s.cfg.DataDir)
	s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: msg, Kind: observe.AuditGaveUp,
		Fields: map[string]any{"reason": reason, "restarts_in_window": s.lc.bo.recent(now), "max_restarts": s.cfg.MaxRestarts, "window": s.cfg.RestartWindow.String()}})
	return true, fmt.Errorf("%w: %s", ErrCrashLoop, msg)
}

// restartAfter schedules the next start after delay.
func (s *Supervisor) restartAfter(reason string, failed bool, delay time.Duration, startTimer *time.Timer) {
	s.lc.restarts++
	s.lc.stat.Restarts = s.lc.restarts
	s.lc.stat.LastRestartReason = reason
	s.setState(StateBackingOff)
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "restarting the agent", Kind: observe.AuditRestart,
		Fields:  map[string]any{"reason": reason, "failed": failed, "delay_seconds": delay.Seconds(), "restarts": s.lc.restarts},
		LogOnly: []any{"delay", delay.Round(time.Millisecond)}, Count: s.met.Restarts.WithLabelValues(reason)})
	startTimer.Reset(delay)
}

// refuseStart reports that no complete restore can be built: the agent is
// not started and Run ends with err (exit code 3).
func (s *Supervisor) refuseStart(err error) {
	s.lc.failed = true
	s.setState(StateGivenUp)
	s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "refusing to start the agent: its state cannot be restored completely",
		Kind: observe.AuditRestoreRefused, Fields: map[string]any{"error": err.Error(), "wal_floor": s.st.WAL().Floor(),
			"wal_last_sequence": s.st.WAL().LastSequence()}, Count: s.met.RestoreRefused})
}

// walLastSequence is the WAL's last sequence for the metric (0 before the
// stores are open; they are before the HTTP server serves).
func (s *Supervisor) walLastSequence() float64 {
	if s.st == nil {
		return 0
	}
	return float64(s.st.WAL().LastSequence())
}

func (s *Supervisor) heartbeatAgeSeconds() float64 {
	in := s.current().cur
	if in == nil {
		return 0
	}
	age, seen := in.HeartbeatAge(time.Now())
	if !seen {
		return 0
	}
	return age.Seconds()
}

func framingRule(err error) string {
	switch {
	case errors.Is(err, wire.ErrZeroLength):
		return "zero_length"
	case errors.Is(err, wire.ErrFrameTooLarge):
		return "too_large"
	case errors.Is(err, wire.ErrTruncated):
		return "truncated"
	}
	return "other"
}
