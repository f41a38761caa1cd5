package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/agent-sidecar/supervisor/wire"
)

// Errors Run returns; the CLI maps them to exit codes.
var (
	// ErrCrashLoop: the agent restarted more than --max-restarts times within
	// --restart-window, or failed with --restart never (exit code 1).
	ErrCrashLoop = errors.New("agent crash loop: supervisor gave up")
	// ErrDataDirLocked: another supervisor owns the data directory.
	ErrDataDirLocked = errors.New("data directory is in use by another supervisor")
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
type Supervisor struct {
	cfg    Config
	log    *slog.Logger
	codec  *schema.Codec
	wal    *wal.Log
	store  *checkpoint.Store
	audit  *auditLog
	met    *metrics
	bmet   *boundsMetrics
	lock   *os.File
	ledger *evolution.Ledger

	events  chan event
	control chan controlCall
	force   chan struct{} // ForceStop: skip the graceful wait

	// Owner-only state (the Run goroutine).
	state        State
	cur          *instance
	incarnation  int
	bo           backoff
	lastReason   string
	restarts     int
	poison       map[string][]time.Time
	pendingPoint *restorePoint
	pendingReply chan ControlResponse // operator restore waiting for the agent's restart
	shutting     bool
	startedOnce  bool
	agentVersion int32 // highest protocol version any incarnation used
	trial        *trial

	// Published for other goroutines (HTTP, control socket).
	curPtr    atomic.Pointer[instance]
	trialPtr  atomic.Pointer[trial]
	statusMu  sync.Mutex
	status    Status
	gaveUp    atomic.Bool
	auditPtr  atomic.Pointer[auditLog] // for ReopenAudit from a signal handler
	loopBeat  atomic.Int64             // unix nanos of the owner loop's last turn; 0 before Run
	newestCkp atomic.Value             // string

	// Checkpoint storing runs on its own goroutine, in arrival order.
	ckptJobs chan ckptJob
	ckptGate *byteGate
	ckptWG   sync.WaitGroup
	// storeMu serialises checkpoint saves, pruning, WAL truncation and restore
	// assembly, so a restore never sees a half-applied retention step.
	storeMu sync.Mutex

	limiter *rateLimiter
}

type restorePoint struct {
	checkpointID string
	noWAL        bool
}

type ckptJob struct {
	inst      *instance
	data      []byte // uncompressed data, or nil when zstd is set
	zstd      []byte // the agent's compressed data, validated while it is stored
	size      int64  // bytes reserved in ckptGate
	watermark uint64
	arrived   time.Time
}

// ckptQueueBytes bounds the checkpoints waiting to be stored (compressed ones
// count their compressed size). An agent that sends faster than they are
// stored is slowed down through its pipe.
const ckptQueueBytes = 8 << 20

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
		cfg:     cfg,
		log:     log,
		codec:   schema.NewCodec(schema.Options{ExtraWALOperations: cfg.WALOperations, StreamCheckpoints: true}),
		events:  make(chan event, 256),
		control: make(chan controlCall),
		force:   make(chan struct{}, 1),
		poison:  map[string][]time.Time{},
		bo: backoff{
			initial: cfg.BackoffInitial, max: cfg.BackoffMax,
			maxRestarts: cfg.MaxRestarts, window: cfg.RestartWindow,
		},
		ckptJobs: make(chan ckptJob, 16),
		ckptGate: newByteGate(ckptQueueBytes),
		limiter:  newRateLimiter(20, 10*time.Second),
	}
	s.newestCkp.Store("")
	s.met = newMetrics(s.heartbeatAgeSeconds)
	s.bmet = newBoundsMetrics(s.met.reg, cfg.LogDropped)
	return s, nil
}

// Run supervises the agent until ctx is cancelled (a graceful stop: returns
// nil) or the agent crash-loops (returns an error wrapping ErrCrashLoop).
func (s *Supervisor) Run(ctx context.Context) (err error) {
	if err := s.open(); err != nil {
		return err
	}
	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	defer func() {
		stopBG()
		bgWG.Wait()
		if cerr := s.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	if err := becomeSubreaper(); err != nil {
		s.log.Warn("cannot become a child subreaper; orphaned agent descendants will be reaped by init instead", "err", err)
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); runReaper(bg, s.log) }()

	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.checkpointWorker() }()
	defer close(s.ckptJobs) // runs before stopBG/bgWG.Wait above: the worker drains and exits

	if s.cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("%w: listen on --http-addr %s: %v", ErrConfig, s.cfg.HTTPAddr, err)
		}
		srv := s.newHTTPServer()
		connCap := httpConnCap()
		ln = newLimitListener(ln, connCap, func(d int) { s.bmet.httpConns.Add(float64(d)) }, s.bmet.httpWaits.Inc)
		s.log.Info("HTTP listener up", "addr", ln.Addr().String(), "max_connections", connCap)
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("HTTP server stopped", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}

	cl, err := s.listenControl()
	if err != nil {
		return err
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.serveControl(bg, cl) }()
	defer cl.Close()

	_ = s.audit.Record(AuditStart, map[string]any{"pid": os.Getpid(), "command": s.cfg.Command, "data_dir": s.cfg.DataDir})
	runErr := s.loop(ctx)
	fields := map[string]any{"restarts": s.restarts}
	if runErr != nil {
		fields["error"] = runErr.Error()
	}
	_ = s.audit.Record(AuditStop, fields)
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
	audit, err := openAudit(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		return plantedLink(err)
	}
	s.audit = audit
	s.auditPtr.Store(audit)
	policy, err := wal.ParseSyncPolicy(s.cfg.WALSync)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	w, err := wal.Open(wal.Options{
		Dir: filepath.Join(dir, "wal"), SegmentSize: s.cfg.WALSegmentSize, Sync: policy,
		SyncInterval: s.cfg.WALSyncInterval, Logger: s.log.With("component", "wal"),
		OnSync: s.met.walSynced,
	})
	if err != nil {
		return fmt.Errorf("open WAL in %s: %w", filepath.Join(dir, "wal"), err)
	}
	s.wal = w
	rec := w.Recovery()
	s.log.Info("WAL opened", "segments", rec.Segments, "entries", rec.Entries,
		"last_sequence", w.LastSequence(), "torn_bytes_truncated", rec.TruncatedBytes)
	if rec.Corruption != nil {
		s.log.Error("WAL CORRUPTION: replay stopped at a corrupt record; the good prefix is kept and entries after it are NOT served. Inspect with `supervisor wal dump` and restore the data directory from a backup if those entries matter.",
			"err", rec.Corruption, "last_good_sequence", w.LastSequence())
		_ = s.audit.Record(AuditWALError, map[string]any{"error": rec.Corruption.Error(), "last_good_sequence": w.LastSequence()})
	}
	s.met.walLastSeq.Set(float64(w.LastSequence()))
	opts := checkpoint.Options{Retain: s.cfg.CheckpointRetain, Logger: s.log.With("component", "checkpoint")}
	if s.cfg.CheckpointLevel > 0 {
		opts.Level = zstdLevel(s.cfg.CheckpointLevel)
	}
	st, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), opts)
	if err != nil {
		return fmt.Errorf("open checkpoint store: %w", err)
	}
	s.store = st
	ledger, err := evolution.OpenLedger(filepath.Join(dir, "evolution.json"))
	if err != nil {
		return fmt.Errorf("open the evolution ledger: %w", err)
	}
	s.ledger = ledger
	if id, noWAL, ok, err := st.TakeRestorePoint(); err != nil {
		s.log.Error("cannot read the recorded restore point; ignoring it", "err", err)
	} else if ok {
		s.pendingPoint = &restorePoint{checkpointID: id, noWAL: noWAL}
		s.log.Info("restore point recorded by an operator will be used", "checkpoint_id", id, "no_wal", noWAL)
	}
	if metas, err := st.List(); err == nil {
		for _, m := range metas {
			if !m.Bad {
				s.newestCkp.Store(m.ID)
				break
			}
		}
	}
	return nil
}

func (s *Supervisor) close() error {
	var errs []error
	if s.wal != nil {
		if err := s.wal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close WAL: %w", err))
		}
	}
	_ = s.audit.Close()
	if s.lock != nil {
		_ = os.Remove(filepath.Join(s.cfg.DataDir, socketName))
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
			ErrDataDirLocked, dir, string(trimNewline(b)))
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
	case s.force <- struct{}{}:
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
			s.shutting = true
			startTimer.Stop()
			s.abortTrial("the supervisor is stopping")
			if s.cur == nil {
				s.setState(StateStopped)
				return nil
			}
			s.log.Info("stopping: asking the agent to shut down", "timeout", s.cfg.ShutdownTimeout)
			s.setState(StateStopping)
			s.cur.stopping = true
			s.cur.stopReason = "shutdown"
			s.cur.sendMsg(&schema.Shutdown{Reason: "supervisor is stopping", CreateCheckpoint: true})
			shutdownTimer = time.After(s.cfg.ShutdownTimeout)

		case <-s.force:
			if s.cur != nil && s.shutting {
				s.log.Warn("second stop signal: killing the agent's process group without waiting")
				_ = s.cur.proc.signalGroup(syscall.SIGKILL)
			}

		case <-shutdownTimer:
			shutdownTimer = nil
			if s.cur != nil {
				s.log.Warn("agent did not exit within --shutdown-timeout; killing its process group", "timeout", s.cfg.ShutdownTimeout)
				_ = s.cur.proc.signalGroup(syscall.SIGKILL)
			}

		case <-startTimer.C:
			if s.shutting {
				continue
			}
			if err := s.startPrimary(); err != nil {
				s.answerPending("the agent could not be restarted to deliver the restore: " + err.Error())
				if errors.Is(err, ErrConfig) {
					return err
				}
				s.log.Error("cannot start the agent", "err", err)
				if stop, rerr := s.scheduleRestart("spawn_failed", true, startTimer); stop {
					return rerr
				}
				continue
			}
			s.armHeartbeat(hbTimer)

		case <-hbTimer.C:
			s.checkHeartbeat(hbTimer)

		case <-s.trialTimer():
			s.concludeTrial()

		case <-trialTick.C:
			s.checkShadowHeartbeat()

		case ev := <-s.events:
			if ev.inst.role == RoleShadow {
				s.shadowEvent(ev)
				continue
			}
			if ev.inst != s.cur {
				continue // an event from an instance already finished
			}
			switch ev.kind {
			case evFirstHeartbeat:
				if s.state == StateStarting {
					s.setState(StateRunning)
					s.met.agentUp.WithLabelValues(RolePrimary).Set(1)
					s.log.Info("agent is up", "pid", ev.inst.proc.pid, "start_seconds", time.Since(ev.inst.started).Seconds())
				}
				s.armHeartbeat(hbTimer)
			case evStreamEnded:
				s.streamEnded(ev)
			case evUnresponsive:
				if !ev.inst.stopping {
					s.log.Error("agent stopped reading its input (outbound queue full); restarting it",
						"queued_bytes", ev.inst.outQueued.Load(), "max_frames", outboundQueue, "max_bytes", outboundBytes)
					s.stopInstance(ev.inst, "unresponsive")
				}
			case evEvolutionIntent:
				s.evolutionIntent(ev.inst, ev.msg.(*schema.EvolutionIntent))
			case evExited:
				hbTimer.Stop()
				stop, err := s.instanceExited(ev.inst, startTimer)
				if stop {
					return err
				}
			}

		case call := <-s.control:
			if resp := s.handleControl(call.req, call.reply); resp.OK || resp.Error != "" {
				call.reply <- resp
			}
		}
	}
}

func (s *Supervisor) setState(st State) {
	s.state = st
	s.statusMu.Lock()
	s.status.State = string(st)
	s.statusMu.Unlock()
}

// startPrimary assembles the restore (if there is state), spawns the agent and
// queues the restore as its first frame.
func (s *Supervisor) startPrimary() error {
	// Checkpoints the previous incarnation sent are stored first (its reader
	// is drained, so no more can come): the restore must see them, and a
	// rollback must not be overtaken by one of them landing afterwards.
	s.waitCheckpoints(walDurableTimeout + 5*time.Second)
	point := s.pendingPoint
	plan, err := s.buildRestore(point)
	if err != nil {
		if point == nil {
			return fmt.Errorf("assemble restore: %w", err)
		}
		s.log.Error("the recorded restore point cannot be used; restoring from the newest checkpoint instead",
			"checkpoint_id", point.checkpointID, "err", err)
		if plan, err = s.buildRestore(nil); err != nil {
			return fmt.Errorf("assemble restore: %w", err)
		}
		point = nil
	}
	if point != nil && point.noWAL && plan != nil {
		meta, err := s.store.Stat(point.checkpointID)
		if err == nil {
			err = s.rewindWAL(meta)
		}
		if err != nil {
			return fmt.Errorf("roll back to checkpoint %s for a --no-wal restore: %w", point.checkpointID, err)
		}
	}
	s.pendingPoint = nil
	proc, err := startProcess(procSpec{Path: s.cfg.Command[0], Args: s.cfg.Command[1:], Env: s.agentEnv(RolePrimary, plan != nil), Stdio: s.cfg.Stdio})
	if err != nil {
		if !s.startedOnce && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		return err
	}
	s.startedOnce = true
	s.incarnation++
	inst := newInstance(s.incarnation, RolePrimary, proc, s.codec, s.cfg.MaxFrameSize, primarySinks{s}, s.events, s.met, s.log)
	s.cur = inst
	s.curPtr.Store(inst)
	s.setState(StateStarting)
	s.statusMu.Lock()
	s.status.PID = proc.pid
	s.status.Incarnation = s.incarnation
	s.status.AgentStartedAt = inst.started
	s.statusMu.Unlock()
	s.log.Info("agent started", "pid", proc.pid, "incarnation", s.incarnation, "command", s.cfg.Command, "restore", plan != nil)
	created := time.Time{}
	trigger := "start"
	if s.pendingReply != nil {
		trigger = "operator"
	}
	if plan != nil {
		s.sendRestore(inst, plan, trigger)
		created = plan.created
	}
	if s.pendingReply != nil {
		resp := ControlResponse{Error: "the restore point could not be used; the agent was restored from the newest checkpoint instead"}
		if plan != nil && point != nil {
			resp = ControlResponse{OK: true, Message: "restore sent to the restarted agent", Restore: &RestoreInfo{
				CheckpointID: plan.checkpointID, Watermark: plan.watermark, WALEntries: plan.entries,
				LastSequence: plan.lastSeq, Sent: true, NoWAL: point.noWAL}}
		}
		s.pendingReply <- resp
		s.pendingReply = nil
	}
	// Promoted code newer than the restored state is applied again.
	s.resendPromotions(inst, created)
	return nil
}

// answerPending fails an operator restore still waiting for its answer.
func (s *Supervisor) answerPending(msg string) {
	if s.pendingReply != nil {
		s.pendingReply <- ControlResponse{Error: msg}
		s.pendingReply = nil
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
	if s.cur == nil || s.cur.stopping {
		t.Stop()
		return
	}
	age, seen := s.cur.heartbeatAge(time.Now())
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
	in := s.cur
	if in == nil || in.stopping {
		return
	}
	age, seen := in.heartbeatAge(time.Now())
	switch {
	case !seen && age >= s.cfg.StartTimeout:
		s.log.Error("agent sent no heartbeat within --start-timeout; stopping it", "start_timeout", s.cfg.StartTimeout, "pid", in.proc.pid)
		s.stopInstance(in, "start_timeout")
	case seen && age >= s.cfg.HeartbeatTimeout:
		s.log.Error("agent is hung: no heartbeat within --heartbeat-timeout; stopping it", "heartbeat_timeout", s.cfg.HeartbeatTimeout, "last_heartbeat_age", age.Round(time.Millisecond), "pid", in.proc.pid)
		s.stopInstance(in, "hung")
	default:
		s.armHeartbeat(t)
	}
}

// stopInstance stops an instance in the background: SIGTERM to its group,
// SIGKILL after --kill-timeout. Its exit arrives as an evExited event.
func (s *Supervisor) stopInstance(in *instance, reason string) {
	if in.stopping {
		return
	}
	in.stopping = true
	in.stopReason = reason
	if in == s.cur {
		s.setState(StateStopping)
		s.met.agentUp.WithLabelValues(in.role).Set(0)
	}
	go func() {
		if in.proc.stopGroup(s.cfg.KillTimeout) {
			in.log.Warn("agent ignored SIGTERM; killed it with SIGKILL", "kill_timeout", s.cfg.KillTimeout)
		}
	}()
}

func (s *Supervisor) streamEnded(ev event) {
	in := ev.inst
	if ev.err == nil || errors.Is(ev.err, os.ErrClosed) {
		return
	}
	if errors.Is(ev.err, io.EOF) {
		in.log.Debug("agent closed its output")
		return
	}
	if wire.IsFramingError(ev.err) {
		rule := framingRule(ev.err)
		s.met.invalid.WithLabelValues("FRAMING_ERROR", rule).Inc()
		if in.stopping {
			return
		}
		in.log.Error("framing error from the agent: its output can no longer be trusted; restarting it", "err", ev.err)
		_ = s.audit.Record(AuditFraming, map[string]any{"pid": in.proc.pid, "error": ev.err.Error(), "rule": rule})
		s.stopInstance(in, "framing_error")
		return
	}
	in.log.Error("reading from the agent failed", "err", ev.err)
	s.stopInstance(in, "read_error")
}

// instanceExited finishes an exited primary and decides what happens next.
// stop=true ends Run with err.
func (s *Supervisor) instanceExited(in *instance, startTimer *time.Timer) (stop bool, err error) {
	st := in.finish(drainTimeout)
	now := time.Now()
	s.cur = nil
	s.curPtr.Store(nil)
	s.met.agentUp.WithLabelValues(RolePrimary).Set(0)
	if v := in.version.Load(); v > s.agentVersion {
		s.agentVersion = v
	}
	desc, failed := exitDescription(st)
	reason := in.stopReason
	if reason == "" {
		switch {
		case st != nil && !st.Exited():
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
	if s.trial != nil && !s.trial.decided {
		s.concludeTrial() // the primary is gone: rejected, with the reason
	}
	uptime := now.Sub(in.started)
	s.log.Info("agent stopped", "pid", in.proc.pid, "status", desc, "reason", reason, "uptime", uptime.Round(time.Millisecond))

	if s.shutting {
		s.setState(StateStopped)
		s.waitCheckpoints(s.cfg.ShutdownTimeout)
		return true, nil
	}

	if reason == reasonOperatorRestore {
		s.setState(StateBackingOff)
		startTimer.Reset(0)
		return false, nil
	}
	if first := in.firstHBAt.Load(); first != 0 && now.Sub(time.Unix(0, first)) >= s.cfg.HealthyReset {
		s.bo.reset()
	}
	s.trackPoison(in, failed, now)

	switch s.cfg.Restart {
	case RestartNever:
		s.setState(StateStopped)
		if failed {
			s.gaveUp.Store(true)
			msg := fmt.Sprintf("agent %s (%s) and --restart is never", desc, reason)
			s.log.Error(msg)
			_ = s.audit.Record(AuditGaveUp, map[string]any{"reason": reason, "status": desc, "policy": "never"})
			return true, fmt.Errorf("%w: %s", ErrCrashLoop, msg)
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
	delay, giveUp := s.bo.next(now)
	if giveUp {
		s.setState(StateGivenUp)
		s.gaveUp.Store(true)
		msg := fmt.Sprintf("agent restarted more than --max-restarts=%d times within --restart-window=%s (last run ended: %s); giving up. "+
			"Check the agent's own output in this log (lines with stream=stderr) and `supervisor audit --data-dir %s` for each exit; "+
			"raise --max-restarts or use --max-restarts 0 to keep retrying",
			s.cfg.MaxRestarts, s.cfg.RestartWindow, reason, s.cfg.DataDir)
		s.log.Error(msg)
		_ = s.audit.Record(AuditGaveUp, map[string]any{"reason": reason, "restarts_in_window": s.bo.recent(now), "max_restarts": s.cfg.MaxRestarts, "window": s.cfg.RestartWindow.String()})
		return true, fmt.Errorf("%w: %s", ErrCrashLoop, msg)
	}
	s.restarts++
	s.lastReason = reason
	s.met.restarts.WithLabelValues(reason).Inc()
	s.statusMu.Lock()
	s.status.Restarts = s.restarts
	s.status.LastRestartReason = reason
	s.status.PID = 0
	s.statusMu.Unlock()
	s.setState(StateBackingOff)
	s.log.Info("restarting the agent", "reason", reason, "delay", delay.Round(time.Millisecond), "restarts", s.restarts)
	_ = s.audit.Record(AuditRestart, map[string]any{"reason": reason, "failed": failed, "delay_seconds": delay.Seconds(), "restarts": s.restarts})
	startTimer.Reset(delay)
	return false, nil
}

// trackPoison marks a checkpoint bad when the agent died twice within the
// restart window, each time soon after being restored from it.
func (s *Supervisor) trackPoison(in *instance, failed bool, now time.Time) {
	id := in.restoredFrom
	if id == "" || !failed || now.Sub(time.Unix(0, in.restoreSentAt.Load())) > s.cfg.PoisonGrace {
		return
	}
	deaths := s.poison[id][:0:0]
	for _, t := range s.poison[id] {
		if now.Sub(t) <= s.cfg.RestartWindow {
			deaths = append(deaths, t)
		}
	}
	deaths = append(deaths, now)
	s.poison[id] = deaths
	if len(deaths) < 2 {
		return
	}
	delete(s.poison, id)
	reason := fmt.Sprintf("agent died %d times within %s, each within %s of being restored from it", len(deaths), s.cfg.RestartWindow, s.cfg.PoisonGrace)
	s.storeMu.Lock()
	err := s.store.MarkBad(id, reason)
	s.storeMu.Unlock()
	if err != nil {
		s.log.Error("cannot mark poison checkpoint bad", "checkpoint_id", id, "err", err)
		return
	}
	s.met.checkpointPoison.Inc()
	s.log.Error("checkpoint marked bad (poison): the next restore uses the previous good checkpoint and a longer WAL replay", "checkpoint_id", id, "reason", reason)
	_ = s.audit.Record(AuditCheckpointBad, map[string]any{"checkpoint_id": id, "reason": reason})
}

// waitCheckpoints waits for queued checkpoint saves (bounded).
func (s *Supervisor) waitCheckpoints(limit time.Duration) {
	done := make(chan struct{})
	go func() { s.ckptWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		s.log.Warn("checkpoint still being stored at exit; it will not be acknowledged", "waited", limit)
	}
}

func (s *Supervisor) heartbeatAgeSeconds() float64 {
	in := s.curPtr.Load()
	if in == nil {
		return 0
	}
	age, seen := in.heartbeatAge(time.Now())
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

// rateLimiter lets through at most n events per window (for logging and
// auditing floods of invalid input).
type rateLimiter struct {
	mu         sync.Mutex
	n          int
	window     time.Duration
	start      time.Time
	count      int
	suppressed int
}

func newRateLimiter(n int, window time.Duration) *rateLimiter {
	return &rateLimiter{n: n, window: window}
}

// allow reports whether to record this event, and how many were suppressed
// since the last one allowed.
func (r *rateLimiter) allow(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= r.window {
		r.start, r.count = now, 0
	}
	if r.count >= r.n {
		r.suppressed++
		return false, 0
	}
	r.count++
	s := r.suppressed
	r.suppressed = 0
	return true, s
}
