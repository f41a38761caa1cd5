package testagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/schema"
)

// Exit codes of the reference agent.
const (
	ExitOK             = 0 // shutdown, or the supervisor went away
	ExitFailure        = 1 // the connection broke, or an internal error
	ExitUsage          = 2 // bad flags, or not started by a supervisor
	ExitCrashOnRestore = 3 // --crash-on-restore matched
	ExitRestoreFailed  = 4 // a restore could not be applied
)

// ExitError ends the agent with a chosen exit code (faults, failed restore).
type ExitError struct {
	Code   int
	Reason string
	Err    error
}

func (e *ExitError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("testagent: exit %d: %s: %v", e.Code, e.Reason, e.Err)
	}
	return fmt.Sprintf("testagent: exit %d: %s", e.Code, e.Reason)
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode maps Run's result to the process exit code.
func ExitCode(err error) int {
	var ee *ExitError
	switch {
	case err == nil, errors.Is(err, agent.ErrSupervisorGone), errors.Is(err, agent.ErrShutdown):
		return ExitOK
	case errors.As(err, &ee):
		return ee.Code
	case errors.Is(err, ErrUsage), errors.Is(err, agent.ErrNotSupervised), errors.Is(err, agent.ErrTransport):
		return ExitUsage
	default:
		return ExitFailure
	}
}

// Limits of what one request may put in the WAL: an entry must stay within
// the supervisor's 10 KiB wal_entry limit.
const maxRequestText = 2 << 10

// shutdownAckWait bounds the wait for the final checkpoint's ack.
const shutdownAckWait = 2 * time.Second

// walPause is how long self-driven work stops after WAL_FULL or WAL_FAILED.
const walPause = time.Second

// Run is the reference agent on an established connection. It returns nil
// on shutdown or when ctx ends, agent.ErrSupervisorGone when the supervisor
// closed the pipe, an *ExitError for faults and a failed restore, and other
// errors when the connection broke. Every goroutine it starts has ended when
// it returns.
func Run(ctx context.Context, conn *agent.Conn, cfg Config) error {
	if cfg.Logger == nil {
		w := cfg.Stderr
		if w == nil {
			w = os.Stderr
		}
		cfg.Logger = slog.New(slog.NewTextHandler(w, nil))
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	ev, err := openEventLog(cfg.EventsPath, conn.Config().Role)
	if err != nil {
		return err
	}
	defer ev.close()
	a := &refAgent{
		conn:  conn,
		cfg:   cfg,
		log:   cfg.Logger.With("role", conn.Config().Role, "pid", os.Getpid()),
		ev:    ev,
		lim:   Limits{MemoryBlocks: cfg.MemoryLimit, History: cfg.MemoryLimit},
		st:    NewState(),
		ready: !conn.Config().RestorePending,
	}
	base, err := ParseBehaviour(cfg.Behaviour, DefaultBehaviour())
	if err != nil {
		return fmt.Errorf("--behaviour: %w", err)
	}
	a.base, a.beh = base, base
	a.padding = a.paddingFor(cfg.EntrySize)
	return a.run(ctx)
}

type refAgent struct {
	conn *agent.Conn
	cfg  Config
	log  *slog.Logger
	ev   *eventLog
	lim  Limits

	// Owned by the run loop.
	st              *State
	beh             Behaviour
	base            Behaviour // --behaviour over the default: what modules' code overlays
	ready           bool      // no restore pending, or it has been applied
	pendingAcks     []sentCheckpoint
	sinceCheckpoint int
	selfCount       int
	selfDone        bool
	credit          float64
	lastCredit      time.Time
	pausedUntil     time.Time
	padding         string
	stats           requestStats
	reloaded        bool // a hot_reload arrived (a shadow that got none is a control)
}

type sentCheckpoint struct {
	lastSeq uint64
	digest  string
}

func (a *refAgent) run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	start := []any{"version", a.conn.Version(), "restore_pending", !a.ready, "transport", a.conn.Config().Transport}
	if a.cfg.GrandchildPID != 0 {
		start = append(start, "grandchild_pid", a.cfg.GrandchildPID)
	}
	a.emit("start", start...)
	a.log.Info("reference agent started", "version", a.conn.Version(), "restore_pending", !a.ready)

	if a.cfg.Garbage != "" {
		if err := a.conn.SendHeartbeat(); err != nil {
			return err
		}
		if err := a.sendGarbage(); err != nil {
			return err
		}
	}
	hbCtx, stopHeartbeats := context.WithCancel(ctx)
	defer stopHeartbeats()
	wg.Go(func() { a.conn.Heartbeats(hbCtx, a.cfg.HeartbeatInterval) })
	if a.cfg.StderrFlood {
		wg.Go(func() { flood(ctx, a.cfg.Stderr) })
	}
	msgs := a.conn.Messages()

	crashC := afterOrNil(a.cfg.CrashAfter)
	hangC := afterOrNil(a.cfg.HangAfter)
	stopReadingC := afterOrNil(a.cfg.StopReadingAfter)
	var evolveC, shadowCrashC, controlCrashC <-chan time.Time
	if a.conn.Config().Role == agent.RolePrimary {
		evolveC = afterOrNil(a.cfg.EvolveAfter)
	} else {
		shadowCrashC = afterOrNil(a.cfg.ShadowCrash)
		controlCrashC = afterOrNil(a.cfg.ControlCrash)
	}
	checkpointC, stopCheckpoints := tickerOrNil(a.cfg.CheckpointInterval)
	defer stopCheckpoints()
	metricsC, stopMetrics := tickerOrNil(a.cfg.MetricsInterval)
	defer stopMetrics()
	var workC <-chan time.Time
	if a.cfg.WALRate > 0 {
		var stopWork func()
		workC, stopWork = tickerOrNil(a.workInterval())
		defer stopWork()
	}
	a.lastCredit = time.Now()
	a.stats.reset(time.Now())

	behind := false
	for {
		var now <-chan struct{}
		if behind {
			now = alwaysReady
		}
		if a.selfDone {
			workC = nil
		}
		var err error
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return a.conn.Err()
			}
			if stop, err := a.handle(ctx, m); stop {
				return err
			}
		case <-workC:
			behind, err = a.selfDrive(time.Now())
		case <-now:
			behind, err = a.selfDrive(time.Now())
		case <-checkpointC:
			if a.ready {
				err = a.checkpoint()
			}
		case <-metricsC:
			err = a.sendMetrics(time.Now())
		case <-crashC:
			a.emit("crash", "code", a.cfg.CrashCode)
			return &ExitError{Code: a.cfg.CrashCode, Reason: "--crash-after " + a.cfg.CrashAfter.String()}
		case <-controlCrashC:
			if !a.reloaded {
				a.emit("crash", "code", 1)
				return &ExitError{Code: 1, Reason: "--control-crash-after " + a.cfg.ControlCrash.String()}
			}
		case <-shadowCrashC:
			a.emit("crash", "code", 1)
			return &ExitError{Code: 1, Reason: "--shadow-crash-after " + a.cfg.ShadowCrash.String()}
		case <-hangC:
			a.emit("hang")
			a.log.Warn("hanging as asked by --hang-after: no more heartbeats, no more reading")
			stopHeartbeats()
			<-ctx.Done()
			return nil
		case <-stopReadingC:
			a.emit("stop_reading")
			a.log.Warn("no longer reading input, as asked by --stop-reading-after; heartbeats go on")
			<-ctx.Done()
			return nil
		case <-evolveC:
			if !a.ready {
				evolveC = time.After(time.Second)
				break
			}
			evolveC = nil
			if a.cfg.EvolveRepeat > 0 {
				evolveC = time.After(a.cfg.EvolveRepeat)
			}
			err = a.evolve()
		}
		if err != nil {
			return err
		}
	}
}

var alwaysReady = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func afterOrNil(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return time.After(d)
}

func tickerOrNil(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// handle processes one message from the supervisor. stop reports that the
// agent is done, with err as Run's result.
func (a *refAgent) handle(ctx context.Context, msg schema.Message) (stop bool, err error) {
	switch m := msg.(type) {
	case *schema.Restore:
		if a.cfg.CrashOnRestore != "" && m.CheckpointID == a.cfg.CrashOnRestore {
			a.emit("crash", "code", ExitCrashOnRestore, "checkpoint_id", m.CheckpointID)
			return true, &ExitError{Code: ExitCrashOnRestore, Reason: "--crash-on-restore " + m.CheckpointID}
		}
		if err := a.restore(m); err != nil {
			a.emit("restore_failed", "checkpoint_id", m.CheckpointID, "error", err.Error())
			err = fmt.Errorf("restore from checkpoint %q with %d WAL entries: %w", m.CheckpointID, len(m.WALEntries), err)
			if serr := a.conn.SendError(agent.CodeRestoreFailed, err.Error()); serr != nil {
				a.log.Warn("could not report the failed restore to the supervisor", "err", serr)
			}
			return true, &ExitError{Code: ExitRestoreFailed, Reason: "restore failed", Err: err}
		}
	case *schema.CheckpointAck:
		a.acked(m)
	case *schema.HotReload:
		a.reloaded = true
		reject, fatal := a.hotReload(m)
		if reject != nil {
			a.log.Warn("hot reload failed; keeping the old code", "module", m.Module, "err", reject)
			if serr := a.conn.SendError(agent.CodeHotReloadFailed, fmt.Sprintf("hot reload of module %q: %v", m.Module, reject)); serr != nil {
				a.log.Warn("could not report the failed hot reload to the supervisor", "err", serr)
			}
		}
		return fatal != nil, fatal
	case *schema.EvolutionResult:
		err = a.evolutionResult(m)
	case *schema.ProcessRequest:
		err = a.processRequest(ctx, m)
	case *schema.Shutdown:
		return true, a.shutdown(ctx, m)
	case *schema.Error:
		a.supervisorError(m)
	}
	return err != nil, err
}

// change is one state change, logged and then applied: params, or raw when
// the params are already encoded (canonically).
type change struct {
	op     string
	params map[string]any
	raw    []byte
}

// logged is a change that is in the WAL and waits to be applied.
type logged struct {
	op  string
	seq uint64
	raw []byte
}

// logChanges sends changes to the WAL, numbered after the last applied
// sequence, as one wal_batch when batch is set and there are several.
func (a *refAgent) logChanges(changes []change, batch bool) ([]logged, error) {
	out := make([]logged, len(changes))
	ops := make([]agent.WALOp, len(changes))
	for i, c := range changes {
		raw := c.raw
		if raw == nil {
			var err error
			if raw, err = schema.MarshalMap(c.params); err != nil {
				return nil, fmt.Errorf("testagent: encode %s params: %w", c.op, err)
			}
		}
		seq := a.st.LastSeq + uint64(i) + 1
		out[i] = logged{op: c.op, seq: seq, raw: raw}
		ops[i] = agent.WALOp{Operation: c.op, Params: msgpack.RawMessage(raw), Sequence: seq}
	}
	if batch && len(ops) > 1 {
		if err := a.conn.SendWALBatch(ops); err != nil {
			return nil, err
		}
		return out, nil
	}
	for _, op := range ops {
		if err := a.conn.SendWAL(op.Operation, op.Params, op.Sequence); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// applyLogged applies logged changes in order, then checkpoints if
// --checkpoint-every says so.
func (a *refAgent) applyLogged(entries []logged) error {
	for _, e := range entries {
		if err := a.applyRaw(e.op, e.seq, e.raw, false); err != nil {
			return err
		}
		a.sinceCheckpoint++
	}
	if a.cfg.CheckpointEvery > 0 && a.sinceCheckpoint >= a.cfg.CheckpointEvery {
		return a.checkpoint()
	}
	return nil
}

func (a *refAgent) commit(changes []change, batch bool) error {
	entries, err := a.logChanges(changes, batch)
	if err != nil {
		return err
	}
	return a.applyLogged(entries)
}

// applyRaw applies one entry from its params bytes, the same path for live
// entries and for replayed ones.
func (a *refAgent) applyRaw(op string, seq uint64, raw []byte, replay bool) error {
	if err := a.st.Apply(op, seq, raw, a.lim); err != nil {
		return err
	}
	if replay {
		a.emit("applied", "seq", seq, "chain", a.st.Chain, "op", op, "replay", true)
	} else {
		a.emit("applied", "seq", seq, "chain", a.st.Chain, "op", op)
	}
	return nil
}

func (a *refAgent) markReady(now time.Time) {
	if !a.ready {
		a.ready = true
		a.lastCredit = now
		a.credit = 0
	}
}

// restore replaces the state by the snapshot (when there is a checkpoint)
// and replays the WAL entries above its last sequence.
func (a *refAgent) restore(m *schema.Restore) error {
	st := a.st
	if m.CheckpointID != "" {
		loaded, err := LoadSnapshot(m.Snapshot)
		if err != nil {
			return err
		}
		st = loaded
	}
	snapDigest, err := st.Digest()
	if err != nil {
		return err
	}
	snapLast := st.LastSeq
	prev := a.st
	a.st = st
	applied := 0
	for i, raw := range m.WALEntries {
		rec, err := decodeWALRecord(raw)
		if err != nil {
			a.st = prev
			return fmt.Errorf("wal_entries[%d]: %w", i, err)
		}
		if rec.Sequence <= a.st.LastSeq {
			continue
		}
		if err := a.applyRaw(rec.Operation, rec.Sequence, rec.Params, true); err != nil {
			a.st = prev
			return fmt.Errorf("wal_entries[%d]: %w", i, err)
		}
		applied++
	}
	beh, err := behaviourOf(a.base, a.st.Modules)
	if err != nil {
		a.log.Warn("restored module code that does not parse is ignored", "err", err)
	}
	a.beh = beh
	digest, err := a.st.Digest()
	if err != nil {
		return err
	}
	a.emit("restored",
		"checkpoint_id", m.CheckpointID,
		"snapshot_last_seq", snapLast,
		"snapshot_digest", snapDigest,
		"wal_entries", len(m.WALEntries),
		"wal_applied", applied,
		"last_seq", a.st.LastSeq,
		"chain", a.st.Chain,
		"state_digest", digest,
		"compressed", m.Compress,
	)
	a.log.Info("restored", "checkpoint_id", m.CheckpointID, "wal_entries", len(m.WALEntries),
		"wal_applied", applied, "last_seq", a.st.LastSeq)
	a.markReady(time.Now())
	return nil
}

func (a *refAgent) checkpoint() error {
	raw, err := a.st.MarshalCanonical()
	if err != nil {
		return fmt.Errorf("testagent: encode checkpoint: %w", err)
	}
	if err := a.conn.SendCheckpoint(msgpack.RawMessage(raw)); err != nil {
		return err
	}
	digest := digestOf(raw)
	a.pendingAcks = append(a.pendingAcks, sentCheckpoint{lastSeq: a.st.LastSeq, digest: digest})
	a.sinceCheckpoint = 0
	a.emit("checkpoint_sent", "last_seq", a.st.LastSeq, "chain", a.st.Chain, "state_digest", digest, "size", len(raw))
	return nil
}

func (a *refAgent) acked(m *schema.CheckpointAck) {
	kv := []any{"checkpoint_id", m.CheckpointID, "size", m.Size}
	if len(a.pendingAcks) > 0 {
		sent := a.pendingAcks[0]
		a.pendingAcks = a.pendingAcks[1:]
		kv = append(kv, "last_seq", sent.lastSeq, "state_digest", sent.digest)
	}
	a.emit("checkpoint_acked", kv...)
}

func (a *refAgent) supervisorError(m *schema.Error) {
	a.emit("error", "code", m.Error.Code, "message", m.Error.Message)
	switch m.Error.Code {
	case schema.CodeWALFull, schema.CodeWALFailed:
		a.log.Warn("the supervisor could not log a WAL entry; pausing self-driven work", "code", m.Error.Code,
			"message", m.Error.Message, "pause", walPause)
		a.pausedUntil = time.Now().Add(walPause)
	case schema.CodeCheckpointFailed:
		if len(a.pendingAcks) > 0 {
			a.pendingAcks = a.pendingAcks[1:]
		}
		a.log.Warn("the supervisor could not store a checkpoint", "message", m.Error.Message)
	default:
		a.log.Warn("the supervisor reported an error", "code", m.Error.Code, "message", m.Error.Message)
	}
}

func (a *refAgent) shutdown(ctx context.Context, m *schema.Shutdown) error {
	a.emit("shutdown", "reason", m.Reason, "create_checkpoint", m.CreateCheckpoint)
	a.log.Info("shutting down", "reason", m.Reason, "create_checkpoint", m.CreateCheckpoint)
	if !m.CreateCheckpoint {
		return nil
	}
	if !a.ready {
		a.log.Warn("no final checkpoint: the pending restore was never applied, so this state is not the agent's")
		return nil
	}
	if err := a.checkpoint(); err != nil {
		return err
	}
	// Every checkpoint sent is answered (acked or failed) in order; other
	// messages are of no use any more.
	deadline := time.NewTimer(shutdownAckWait)
	defer deadline.Stop()
	for len(a.pendingAcks) > 0 {
		select {
		case m, ok := <-a.conn.Messages():
			if !ok {
				a.log.Warn("final checkpoint not acknowledged", "err", a.conn.Err(), "unacknowledged", len(a.pendingAcks))
				return nil
			}
			switch m := m.(type) {
			case *schema.CheckpointAck:
				a.acked(m)
			case *schema.Error:
				a.supervisorError(m)
			}
		case <-deadline.C:
			a.log.Warn("final checkpoint not acknowledged", "waited", shutdownAckWait, "unacknowledged", len(a.pendingAcks))
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// hotReload loads module code. reject goes back to the supervisor as
// HOT_RELOAD_FAILED; fatal ends the agent.
func (a *refAgent) hotReload(m *schema.HotReload) (reject, fatal error) {
	if !a.ready {
		return errors.New("a restore is pending; hot reload after it"), nil
	}
	if m.Module == "" {
		return errors.New("hot_reload without a module"), nil
	}
	if _, err := ParseBehaviour(m.Code, DefaultBehaviour()); err != nil {
		return err, nil
	}
	err := a.commit([]change{{op: schema.OpStateUpdate, params: map[string]any{
		"status": a.st.AgentState.Status,
		"module": m.Module,
		"code":   m.Code,
	}}}, false)
	if err != nil {
		return nil, err
	}
	beh, err := behaviourOf(a.base, a.st.Modules)
	if err != nil {
		a.log.Warn("module code that does not parse is ignored", "err", err)
	}
	a.beh = beh
	a.emit("hot_reload", "module", m.Module, "code", m.Code, "backup_checkpoint_id", m.BackupCheckpointID)
	a.log.Info("module reloaded", "module", m.Module, "backup_checkpoint_id", m.BackupCheckpointID)
	return nil, nil
}

func (a *refAgent) evolve() error {
	if a.st.AgentState.Status != StatusEvolving {
		if err := a.commit([]change{{op: schema.OpStateUpdate, params: map[string]any{"status": StatusEvolving}}}, false); err != nil {
			return err
		}
	}
	h := schema.Hypothesis{
		Reason:              "reference agent: scheduled evolution (--evolve-after)",
		Target:              a.cfg.EvolveTarget,
		NewCode:             a.cfg.EvolveCode,
		ExpectedImprovement: map[string]float64{"latency": -0.1, "memory": 0, "accuracy": 0},
	}
	if err := a.conn.SendEvolutionIntent(h); err != nil {
		return err
	}
	a.emit("evolution_intent", "target", h.Target, "new_code", h.NewCode)
	return nil
}

func (a *refAgent) evolutionResult(m *schema.EvolutionResult) error {
	a.emit("evolution_result", "success", m.Success, "decision", m.Decision, "reason", m.Reason, "metrics", m.Metrics)
	a.log.Info("evolution decided", "decision", m.Decision, "reason", m.Reason)
	if a.ready && a.st.AgentState.Status == StatusEvolving {
		return a.commit([]change{{op: schema.OpStateUpdate, params: map[string]any{"status": StatusIdle}}}, false)
	}
	return nil
}

// processRequest logs the request's change, does the (simulated) work, then
// applies the change. A message starting with "/tool NAME [PARAM...]" registers
// a tool and "/status STATUS" sets the status; anything else is remembered.
func (a *refAgent) processRequest(ctx context.Context, m *schema.ProcessRequest) error {
	if !a.ready {
		a.emit("request_rejected", "request_id", m.RequestID, "reason", "restore pending")
		return a.conn.SendError("NOT_READY", fmt.Sprintf("request %s arrived before the pending restore; not processed", m.RequestID))
	}
	started := time.Now()
	failed := a.beh.ErrorRate > 0 && rand.Float64() < a.beh.ErrorRate
	latency := a.beh.LatencyMS
	if latency > 0 {
		latency *= 1 - a.beh.Jitter + 2*a.beh.Jitter*rand.Float64()
	}
	c := requestChange(m, started.Unix(), latency, failed, len(a.st.MemoryBlocks))
	entries, err := a.logChanges([]change{c}, false)
	if err != nil {
		return err
	}
	if latency > 0 {
		t := time.NewTimer(time.Duration(latency * float64(time.Millisecond)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if err := a.applyLogged(entries); err != nil {
		return err
	}
	a.stats.record(latency, failed)
	a.emit("request", "request_id", m.RequestID, "seq", entries[0].seq, "failed", failed)
	if !a.cfg.Answer || (a.cfg.ShadowSilent && a.conn.Config().Role != agent.RolePrimary) {
		return nil
	}
	for i := range a.cfg.AnswerUnknown {
		if err := a.conn.SendRequestResult(fmt.Sprintf("unknown-%s-%d", m.RequestID, i), map[string]any{"bogus": true}); err != nil {
			return err
		}
	}
	times := 1
	if a.cfg.AnswerTwice {
		times = 2
	}
	for range times {
		if err := a.answer(m, entries[0].seq, failed); err != nil {
			return err
		}
	}
	return nil
}

// answer sends the request_result of a processed request.
func (a *refAgent) answer(m *schema.ProcessRequest, seq uint64, failed bool) error {
	if failed {
		return a.conn.SendRequestError(m.RequestID, "SIMULATED_FAILURE", "failed as the behaviour's error_rate asked")
	}
	data := map[string]any{"seq": seq}
	if a.cfg.AnswerEcho {
		data = map[string]any{"echo": m.Data.Message}
	}
	if a.beh.Differ > 0 && rand.Float64() < a.beh.Differ {
		data["variant"] = rand.Int64()
	}
	if a.cfg.AnswerSize > 0 {
		data["padding"] = strings.Repeat("r", a.cfg.AnswerSize)
	}
	return a.conn.SendRequestResult(m.RequestID, data)
}

func requestChange(m *schema.ProcessRequest, now int64, latency float64, failed bool, blocks int) change {
	text := truncate(m.Data.Message, maxRequestText)
	common := func(p map[string]any) map[string]any {
		p["request_id"] = m.RequestID
		p["latency_ms"] = latency
		if failed {
			p["failed"] = true
		}
		return p
	}
	if rest, ok := strings.CutPrefix(text, "/tool "); ok {
		fields := strings.Fields(rest)
		if len(fields) > 0 {
			params := make([]any, 0, len(fields)-1)
			for _, f := range fields[1:] {
				params = append(params, f)
			}
			return change{op: schema.OpToolRegister, params: common(map[string]any{
				"name": fields[0], "params": params, "doc": "registered by request " + m.RequestID,
			})}
		}
	}
	if rest, ok := strings.CutPrefix(text, "/status "); ok && validStatus(strings.TrimSpace(rest)) {
		return change{op: schema.OpStateUpdate, params: common(map[string]any{
			"status": strings.TrimSpace(rest), "context": map[string]any{"request_id": m.RequestID},
		})}
	}
	md := map[string]any{"source": "request", "request_id": m.RequestID}
	if m.Data.UserID != "" {
		md["user_id"] = m.Data.UserID
	}
	reply := fmt.Sprintf("noted; %d memories", blocks+1)
	if failed {
		reply = "error: simulated failure"
	}
	return change{op: schema.OpMemoryAdd, params: common(map[string]any{
		"content":    text,
		"metadata":   md,
		"importance": 0.7,
		"created":    now,
		"turns": []any{
			map[string]any{"role": "user", "content": text, "timestamp": now},
			map[string]any{"role": "assistant", "content": reply, "timestamp": now},
		},
	})}
}

func truncate(s string, n int) string { return clip.String(s, n) }

func (a *refAgent) emit(name string, kv ...any) {
	if err := a.ev.emit(name, kv...); err != nil {
		a.log.Warn("event not recorded", "event", name, "err", err)
	}
}
