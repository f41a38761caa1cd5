package supervisor

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// trial is one evolution under test: a shadow agent restored from a pinned
// backup, hot-reloaded with the proposed code, compared with the primary for
// --shadow-duration. The owner goroutine alone changes it.
type trial struct {
	id     string
	intent schema.Hypothesis
	backup checkpoint.Meta
	dir    string // scratch data directory of the shadow
	wal    *wal.Log
	store  *checkpoint.Store
	shadow *agent
	// shadowConn is the shadow's connection for the API's goroutines
	// (mirrored requests); set once, when the shadow starts.
	shadowConn atomic.Pointer[conn.Instance]
	collector  *evolution.Collector
	started    time.Time
	timer      *time.Timer
	failure    string // why the shadow failed, "" while healthy
	decided    bool
}

// evolutionIntent handles an evolution_intent from the primary (owner only).
func (s *Supervisor) evolutionIntent(in *agent, m *schema.EvolutionIntent) {
	h := m.Hypothesis
	reject := func(reason string) {
		s.decided(in, nil, h, "", rejected(nil, reason))
	}
	if s.lc.trial != nil {
		reject(fmt.Sprintf("another evolution (target %q, started %s ago) is being tested; propose again after its evolution_result",
			s.lc.trial.intent.Target, time.Since(s.lc.trial.started).Round(time.Second)))
		return
	}
	if s.lc.shutting || in.stopping {
		reject("the supervisor is stopping the agent")
		return
	}
	if s.lc.trialPrep {
		reject("another evolution is being prepared; propose again after its evolution_result")
		return
	}
	// The backup is pinned and the shadow's restore assembled on the store
	// worker (a 100 MiB checkpoint takes a while); trialPrepared spawns it.
	p := &trialPrep{intent: h, primary: in}
	s.lc.trialPrep = true
	s.work.Post(func() {
		s.prepareTrial(p)
		s.report(storeResult{trial: p})
	})
}

// trialPrep is an evolution's backup and its shadow's scratch stores and
// restore, prepared on the store worker (prepareTrial) and answered to the
// owner (trialPrepared).
type trialPrep struct {
	intent  schema.Hypothesis
	primary *agent // the primary that proposed it
	t       *trial // scratch stores open, backup pinned; nil on failure
	plan    *durable.Plan
	reject  string // why the evolution cannot be tried ("" = ready)
}

// prepareTrial pins the newest checkpoint as the backup, opens the trial's
// scratch stores and assembles the shadow's restore. Store worker only.
func (s *Supervisor) prepareTrial(p *trialPrep) {
	// The newest checkpoint by its header: the shadow's restore loads (and
	// verifies) it once.
	backup, ok := s.st.NewestGood()
	if !ok {
		p.reject = "no checkpoint to back up: send a checkpoint first, then propose the evolution again"
		return
	}
	if err := s.st.Checkpoints().Pin(backup.ID); err != nil {
		p.reject = "cannot pin a backup checkpoint: " + err.Error()
		return
	}
	t, plan, err := s.openTrial(p.intent, backup)
	if err != nil {
		s.unpinNow(backup.ID)
		p.primary.Log().Error("cannot prepare the shadow agent", "err", err)
		p.reject = "the shadow agent could not be started: " + err.Error()
		return
	}
	p.t, p.plan = t, plan
}

// trialPrepared starts the shadow of a prepared trial (owner only): its
// process is spawned off the loop and taken by shadowSpawned.
func (s *Supervisor) trialPrepared(p *trialPrep) {
	switch {
	case p.reject != "":
		s.rejectTrial(p, p.reject)
		return
	case s.lc.shutting || p.primary != s.lc.cur || p.primary.stopping:
		s.rejectTrial(p, "the primary agent restarted or is stopping; propose the evolution again")
		return
	}
	// Still preparing (s.lc.trialPrep) until shadowSpawned takes the process.
	s.spawnAsync(agentproc.Spec{Path: s.cfg.Command[0], Args: s.cfg.Command[1:], Env: s.agentEnv(RoleShadow, p.plan != nil), Stdio: s.cfg.Stdio},
		spawnResult{trial: p})
}

// shadowSpawned makes a spawned process the trial's shadow, sends it its
// restore and the code under test, and starts the trial (owner only).
func (s *Supervisor) shadowSpawned(r spawnResult) {
	p := r.trial
	if r.err != nil {
		p.primary.Log().Error("cannot start the shadow agent", "err", r.err)
		s.rejectTrial(p, "the shadow agent could not be started: "+r.err.Error())
		return
	}
	if s.lc.shutting || p.primary != s.lc.cur || p.primary.stopping {
		go agentproc.Discard(r.proc)
		s.rejectTrial(p, "the primary agent restarted or is stopping; propose the evolution again")
		return
	}
	s.lc.trialPrep = false
	t, proc := p.t, r.proc
	t.shadow = &agent{Instance: conn.Start(conn.Config{N: s.lc.incarnation, Role: RoleShadow, Proc: proc, Codec: s.codec,
		MaxFrame: s.cfg.MaxFrameSize, Sink: s.shadowSinks(t), Events: s.inbox.events, Metrics: s.met, Log: s.log.With("trial", t.id)})}
	t.shadowConn.Store(t.shadow.Instance)
	if p.plan != nil {
		s.sendRestore(t.shadow.Instance, p.plan, "shadow")
	}
	t.shadow.SendMsg(&schema.HotReload{Code: t.intent.NewCode, Module: t.intent.Target, BackupCheckpointID: t.backup.ID})
	t.started = time.Now()
	t.timer = time.NewTimer(s.cfg.ShadowDuration)
	s.lc.trial = t
	s.publish()
	p.primary.Log().Info("evolution trial started", "trial", t.id, "target", t.intent.Target, "backup_checkpoint_id", t.backup.ID,
		"shadow_pid", proc.ID(), "duration", s.cfg.ShadowDuration)
}

// rejectTrial ends a trial that never started: what it holds is released
// and the primary that proposed it, if it still runs, is told (owner only).
func (s *Supervisor) rejectTrial(p *trialPrep, reason string) {
	s.lc.trialPrep = false
	if p.t != nil {
		s.dropTrial(p.t)
	}
	in := p.primary
	if in != s.lc.cur {
		in = nil // that primary is gone; nobody to tell
	}
	s.decided(in, nil, p.intent, "", rejected(nil, reason))
}

// openTrial creates the scratch stores of a trial and assembles the
// shadow's restore from the backup. Store worker only.
func (s *Supervisor) openTrial(h schema.Hypothesis, backup checkpoint.Meta) (t *trial, plan *durable.Plan, err error) {
	id := observe.NewUUID()
	dir := filepath.Join(s.cfg.DataDir, "shadow", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create shadow scratch directory: %w", err)
	}
	t = &trial{id: id, intent: h, backup: backup, dir: dir, collector: evolution.NewCollector(), started: time.Now()}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	// Scratch: never fsynced, small unpreallocated segments (a trial is short).
	if t.wal, err = wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), Sync: wal.SyncNone, SegmentSize: 4 << 20,
		NoPreallocate: true, Logger: s.log.With("component", "shadow-wal")}); err != nil {
		return nil, nil, fmt.Errorf("open shadow WAL: %w", err)
	}
	if t.store, err = checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{Retain: 2}); err != nil {
		return nil, nil, fmt.Errorf("open shadow checkpoint store: %w", err)
	}
	if plan, err = s.st.BuildRestore(durable.Point{CheckpointID: backup.ID}); err != nil {
		return nil, nil, fmt.Errorf("assemble the shadow's restore: %w", err)
	}
	return t, plan, nil
}

// dropTrial unpins a trial's backup and removes its scratch stores, on the
// store worker; it does not wait. Called by the owner, and by a spawn
// goroutine whose answer the loop will never take (spawn.go): it touches no
// owner state, only posts to the store worker.
func (s *Supervisor) dropTrial(t *trial) {
	s.work.Post(func() {
		s.unpinNow(t.backup.ID)
		t.close()
	})
}

// close releases the scratch stores and removes the scratch directory.
func (t *trial) close() {
	if t.wal != nil {
		_ = t.wal.Close()
	}
	_ = os.RemoveAll(t.dir)
}

// unpin releases an evolution backup, on the store worker (owner only).
func (s *Supervisor) unpin(id string) {
	s.work.Post(func() { s.unpinNow(id) })
}

// unpinNow releases an evolution backup. Store worker only.
func (s *Supervisor) unpinNow(id string) {
	if err := s.st.Checkpoints().Unpin(id); err != nil {
		s.log.Warn("cannot unpin evolution backup", "checkpoint_id", id, "err", err)
	}
}

// trialTimer returns the running trial's timer channel (nil: none).
func (s *Supervisor) trialTimer() <-chan time.Time {
	if s.lc.trial == nil || s.lc.trial.decided || s.lc.trial.timer == nil {
		return nil
	}
	return s.lc.trial.timer.C
}

// shadowEvent handles events from a shadow instance (owner only).
func (s *Supervisor) shadowEvent(ev conn.Event) {
	t := s.lc.trial
	if t == nil || t.shadow == nil || ev.Inst != t.shadow.Instance {
		return
	}
	switch ev.Kind {
	case conn.Exited:
		s.drain(t.shadow)
	case conn.Finished:
		st := ev.Status
		if !t.decided {
			desc, _ := st.Describe()
			t.failure = "shadow " + desc
			s.concludeTrial()
		}
		s.endTrial()
	case conn.StreamEnded:
		if ev.Err != nil && !errors.Is(ev.Err, io.EOF) && !errors.Is(ev.Err, os.ErrClosed) && !t.decided {
			t.failure = "shadow broke the framing: " + ev.Err.Error()
			s.concludeTrial()
		}
	case conn.EvolutionIntent:
		d := rejected(nil, "a shadow agent cannot propose evolutions")
		ev.Inst.SendMsg(&schema.EvolutionResult{Success: false, Decision: d.Decision, Metrics: d.Metrics, Reason: d.Reason})
	}
}

// checkShadowHeartbeat fails the trial when the shadow stops heartbeating,
// or when its scratch WAL stopped.
func (s *Supervisor) checkShadowHeartbeat() {
	t := s.lc.trial
	if t == nil || t.decided || t.shadow == nil {
		return
	}
	if t.failure = s.shadowHeartbeatFailure(t, false); t.failure != "" {
		s.concludeTrial()
		return
	}
	if fe := t.wal.Failure(); fe != nil {
		// The trial's scratch WAL stopped (a failed write): what the shadow
		// logged is no longer all there, so its figures cannot be trusted.
		t.failure = "the trial's scratch WAL failed: " + fe.Error()
		s.concludeTrial()
	}
}

// shadowHeartbeatFailure says why the shadow's heartbeat disqualifies it, or
// "". During the trial a shadow gets --start-timeout for its first heartbeat;
// at the decision (final) one that never heartbeated fails outright.
func (s *Supervisor) shadowHeartbeatFailure(t *trial, final bool) string {
	switch b := s.heartbeat(t.shadow.Instance, time.Now()); {
	case !b.seen && final:
		return "shadow never sent a heartbeat"
	case b.late() && !b.seen:
		return fmt.Sprintf("shadow sent no heartbeat within --start-timeout (%s)", s.cfg.StartTimeout)
	case b.late():
		return fmt.Sprintf("shadow hung: no heartbeat for %s", b.age.Round(time.Millisecond))
	case b.unread():
		return fmt.Sprintf("shadow stopped reading its input: a frame has waited %s for it", b.stalled.Round(time.Millisecond))
	}
	return ""
}

// concludeTrial decides, tells the primary, records the decision and stops
// the shadow. The trial ends when the shadow has exited (endTrial).
func (s *Supervisor) concludeTrial() {
	t := s.lc.trial
	if t == nil || t.decided {
		return
	}
	t.decided = true
	t.timer.Stop()
	if t.failure == "" {
		t.failure = s.shadowHeartbeatFailure(t, true)
	}
	d := evolution.Decide(t.collector.Summary(evolution.Primary), t.collector.Summary(evolution.Shadow),
		evolution.Outcome{ShadowAlive: t.failure == "", ShadowFailure: t.failure, MinReports: s.cfg.EvolutionMinReports},
		s.cfg.EvolutionThresholds)
	primary := s.lc.cur
	if d.Promote && (primary == nil || primary.stopping) {
		d = rejected(d.Metrics, "the primary agent restarted during the trial; propose the evolution again")
	}
	if d.Promote {
		// Recorded durably (the ledger fsyncs) before it is applied: on the
		// store worker; promotionRecorded tells the primary.
		pr := &promotion{t: t, d: d, primary: primary, p: evolution.Promotion{Module: t.intent.Target, Code: t.intent.NewCode,
			Target: t.intent.Target, Reason: t.intent.Reason, BackupCheckpointID: t.backup.ID, At: time.Now(), Metrics: d.Metrics}}
		s.work.Post(func() {
			pr.err = s.ledger.Record(pr.p)
			s.report(storeResult{promotion: pr})
		})
	} else {
		s.decided(primary, t, t.intent, t.backup.ID, d)
		s.unpin(t.backup.ID)
	}
	if !t.shadow.stopping {
		t.shadow.stopping = true
		go t.shadow.Proc().StopGroup(s.cfg.KillTimeout)
	}
}

// promotion is an evolution being recorded in the ledger before it is
// applied (store worker), and the answer (promotionRecorded).
type promotion struct {
	t       *trial
	d       evolution.Decision
	primary *agent
	p       evolution.Promotion
	err     error
}

// promotionRecorded applies a promotion the ledger now holds durably, or
// rejects it when it could not be recorded (owner only).
func (s *Supervisor) promotionRecorded(pr *promotion) {
	d := pr.decision()
	if pr.err != nil {
		s.unpin(pr.t.backup.ID)
	}
	primary := pr.primary
	if primary != s.lc.cur || primary.stopping {
		// It restarted meanwhile: its successor gets the recorded code from
		// the ledger with its restore (resendPromotions).
		primary = nil
	}
	s.decided(primary, pr.t, pr.t.intent, pr.t.backup.ID, d)
}

// promotionAfterLoop records the outcome of a promotion whose answer came
// after the owner loop returned (the supervisor stopped meanwhile): nobody
// is told, the next run's primary gets recorded code from the ledger with
// its restore, and the audit log says what was decided. Store worker only.
func (s *Supervisor) promotionAfterLoop(pr *promotion) {
	if pr.err != nil {
		s.unpinNow(pr.t.backup.ID)
	}
	s.decided(nil, pr.t, pr.t.intent, pr.t.backup.ID, pr.decision())
}

// decision is the promotion's outcome: the decision, or a rejection when it
// could not be recorded.
func (pr *promotion) decision() evolution.Decision {
	if pr.err == nil {
		return pr.d
	}
	return rejected(pr.d.Metrics, "the promotion could not be recorded durably, so it was not applied: "+pr.err.Error())
}

// decided tells the primary the outcome and records it.
func (s *Supervisor) decided(primary *agent, t *trial, h schema.Hypothesis, backupID string, d evolution.Decision) {
	if d.Metrics == nil {
		d.Metrics = map[string]float64{}
	}
	if primary != nil {
		if d.Promote {
			primary.SendMsg(&schema.HotReload{Code: h.NewCode, Module: h.Target, BackupCheckpointID: backupID})
		}
		primary.SendMsg(&schema.EvolutionResult{Success: d.Promote, Decision: d.Decision, Metrics: d.Metrics, Reason: d.Reason})
	}
	fields := map[string]any{"decision": d.Decision, "reason": d.Reason, "metrics": d.Metrics, "target": h.Target,
		"hypothesis_reason": h.Reason, "backup_checkpoint_id": backupID}
	if t != nil {
		fields["trial"] = t.id
		fields["primary_reports"] = t.collector.Summary(evolution.Primary).Reports
		fields["shadow_reports"] = t.collector.Summary(evolution.Shadow).Reports
		fields["duration_seconds"] = time.Since(t.started).Seconds()
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "evolution decided", Kind: observe.AuditEvolution, Fields: fields,
		Count: s.met.Evolutions.WithLabelValues(d.Decision)})
}

// endTrial forgets a finished trial once its shadow has exited.
func (s *Supervisor) endTrial() {
	t := s.lc.trial
	if t == nil {
		return
	}
	s.lc.trial = nil
	s.publish()
	s.work.Post(t.close)
}

// stopTrial ends a trial when the supervisor starts stopping, without
// waiting: it is decided, its shadow killed and drained; shadowEvent ends it
// when the shadow has finished (owner only).
func (s *Supervisor) stopTrial(reason string) {
	t := s.lc.trial
	if t == nil {
		return
	}
	if !t.decided {
		t.failure = reason
		s.concludeTrial()
	}
	_ = t.shadow.Proc().SignalGroup(syscall.SIGKILL)
	s.drain(t.shadow)
}

// abortTrial ends what is left of a trial when the owner loop has returned:
// it waits for the shadow to finish (after the loop, nothing else will),
// so its checkpoints are queued before its scratch stores are closed.
func (s *Supervisor) abortTrial(reason string) {
	t := s.lc.trial
	if t == nil {
		return
	}
	s.stopTrial(reason)
	t.shadow.Finish(drainTimeout) // safe beside drain's own finish: both wait for the same ends
	s.endTrial()
}

// resendPromotions re-sends, after a restore from a checkpoint created at
// created (zero: none), the promoted code newer than that checkpoint.
func (s *Supervisor) resendPromotions(in *agent, created time.Time) {
	for _, p := range s.ledger.Since(created) {
		in.SendMsg(&schema.HotReload{Code: p.Code, Module: p.Module, BackupCheckpointID: p.BackupCheckpointID})
		in.Log().Info("re-sent promoted code after restore", "module", p.Module, "promoted_at", p.At)
	}
}

// rejected is a rejection with its reason (metrics: what was measured, if
// anything).
func rejected(metrics map[string]float64, reason string) evolution.Decision {
	if metrics == nil {
		metrics = map[string]float64{}
	}
	return evolution.Decision{Decision: evolution.DecisionRejected, Metrics: metrics, Reason: reason}
}
