package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// evolutionIntent handles an evolution_intent from the primary (owner only).
func (s *Supervisor) evolutionIntent(in *agent, m *schema.EvolutionIntent) {
	h := m.Hypothesis
	reject := func(reason string) {
		s.decided(in, nil, h, "", rejected(nil, reason))
	}
	if s.lc.trial != nil {
		reject(fmt.Sprintf("another evolution (target %q, started %s ago) is being tested; propose again after its evolution_result",
			clip.String(s.lc.trial.intent.Target, 256), time.Since(s.lc.trial.started).Round(time.Second)))
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
	t       *trial // scratch stores open, restores built, backup pinned; nil on failure
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
	t, err := s.openTrial(p.intent, backup)
	if err != nil {
		s.unpinNow(backup.ID)
		p.primary.Log().Error("cannot prepare the shadow agent", "err", err)
		p.reject = "the shadow agent could not be started: " + err.Error()
		return
	}
	p.t = t
}

// trialPrepared starts the shadows of a prepared trial (owner only): their
// processes are spawned off the loop and taken by shadowSpawned.
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
	s.spawnAsync(agentproc.Spec{Path: s.cfg.Command[0], Args: s.cfg.Command[1:], Env: s.agentEnv(RoleShadow, p.t.candidate().plan != nil), Stdio: s.cfg.Stdio},
		spawnResult{trial: p})
}

// shadowSpawned makes the spawned processes the trial's shadows, sends
// each its restore (and the candidate the code under test), and starts the
// trial (owner only).
func (s *Supervisor) shadowSpawned(r spawnResult) {
	p := r.trial
	if r.err != nil {
		p.primary.Log().Error("cannot start the shadow agents", "err", r.err)
		s.rejectTrial(p, "the shadow agent could not be started: "+r.err.Error())
		return
	}
	if s.lc.shutting || p.primary != s.lc.cur || p.primary.stopping {
		go agentproc.Discard(r.proc)
		if r.ctrl != nil {
			go agentproc.Discard(r.ctrl)
		}
		s.rejectTrial(p, "the primary agent restarted or is stopping; propose the evolution again")
		return
	}
	s.lc.trialPrep = false
	t := p.t
	procs := []agentproc.Proc{r.proc, r.ctrl}
	for i, sh := range t.shadows {
		sh.agent = &agent{Instance: conn.Start(conn.Config{N: s.lc.incarnation, Role: RoleShadow, Proc: procs[i], Codec: s.codec,
			MaxFrame: s.cfg.MaxFrameSize, Sink: s.shadowSinks(t, sh), Events: s.inbox.events, Metrics: s.met,
			Log: s.log.With("trial", t.id, "shadow", sh.name())})}
		sh.conn.Store(sh.agent.Instance)
		if sh.plan != nil {
			s.sendRestore(sh.agent.Instance, sh.plan, "shadow")
			sh.plan = nil
		}
		if sh.role == evolution.RoleCandidate {
			sh.agent.SendMsg(&schema.HotReload{Code: t.intent.NewCode, Module: t.intent.Target, BackupCheckpointID: t.backup.ID})
		}
	}
	t.started = time.Now()
	t.primaryPG = p.primary.Proc().ID()
	t.judge = evolution.NewJudge(t.cfg)
	var ctx context.Context
	ctx, t.stopMem = context.WithCancel(context.Background())
	t.memDone = make(chan struct{})
	go t.sampleMemory(ctx, memorySampleInterval)
	s.lc.trial = t
	s.publish()
	args := []any{"trial", t.id, "target", t.intent.Target, "backup_checkpoint_id", t.backup.ID,
		"candidate_pid", r.proc.ID(), "min_duration", t.cfg.MinDuration, "max_duration", t.cfg.MaxDuration}
	if r.ctrl != nil {
		args = append(args, "control_pid", r.ctrl.ID())
	}
	p.primary.Log().Info("evolution trial started", args...)
}

// memorySampleInterval is how often a trial samples its shadows' memory.
const memorySampleInterval = 500 * time.Millisecond

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

// openTrial creates the scratch stores of a trial's shadows and assembles
// each one's restore from the backup. Store worker only.
func (s *Supervisor) openTrial(h schema.Hypothesis, backup checkpoint.Meta) (t *trial, err error) {
	id := observe.NewUUID()
	cfg := s.cfg.judgeConfig()
	t = &trial{id: id, intent: h, backup: backup, dir: filepath.Join(s.cfg.DataDir, "shadow", id), control: cfg.Control,
		collector: evolution.NewCollector(), pairs: evolution.NewPairer(cfg.Control, 0, s.cfg.RequestTimeout), started: time.Now(),
		cfg: cfg, met: s.met, verdict: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	roles := []evolution.Role{evolution.RoleCandidate}
	if cfg.Control {
		roles = append(roles, evolution.RoleControl)
	}
	for _, role := range roles {
		sh := &shadow{role: role, dir: filepath.Join(t.dir, role.String())}
		t.shadows = append(t.shadows, sh)
		if err := os.MkdirAll(sh.dir, 0o700); err != nil {
			return nil, fmt.Errorf("create shadow scratch directory: %w", err)
		}
		// Scratch: never fsynced, small unpreallocated segments (a trial is short).
		if sh.wal, err = wal.Open(wal.Options{Dir: filepath.Join(sh.dir, "wal"), Sync: wal.SyncNone, SegmentSize: 4 << 20,
			NoPreallocate: true, Logger: s.log.With("component", "shadow-wal", "shadow", role.String())}); err != nil {
			return nil, fmt.Errorf("open the %s shadow's WAL: %w", role, err)
		}
		if sh.store, err = checkpoint.Open(filepath.Join(sh.dir, "checkpoints"), checkpoint.Options{Retain: 2}); err != nil {
			return nil, fmt.Errorf("open the %s shadow's checkpoint store: %w", role, err)
		}
		// One restore each: a restore's WAL tail is streamed once.
		if sh.plan, err = s.st.BuildRestore(durable.Point{CheckpointID: backup.ID}); err != nil {
			return nil, fmt.Errorf("assemble the %s shadow's restore: %w", role, err)
		}
	}
	return t, nil
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

// releaseDeadTrials releases what trials of an earlier run left when that
// supervisor died without ending them (kill -9, a power cut): their scratch
// stores under shadow/, and their backups' pins. Nothing else would ever
// release them: the trial is gone, and a pinned checkpoint is never pruned.
// The backup of a promotion the ledger holds stays pinned, as it does when
// the promotion was made (it is the promoted code's backup_checkpoint_id).
// Called by open, before any trial can start.
func (s *Supervisor) releaseDeadTrials() {
	dir := filepath.Join(s.cfg.DataDir, "shadow")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("cannot list the scratch stores of earlier evolution trials", "dir", dir, "err", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			s.log.Warn("cannot remove an earlier evolution trial's scratch stores", "trial", e.Name(), "err", err)
			continue
		}
		s.log.Info("removed the scratch stores of an evolution trial the supervisor did not end (it stopped during the trial)", "trial", e.Name())
	}
	promoted := map[string]bool{}
	for _, p := range s.ledger.Promotions() {
		promoted[p.BackupCheckpointID] = true
	}
	metas, err := s.st.Checkpoints().List()
	if err != nil {
		s.log.Warn("cannot list the checkpoints to release earlier evolution backups", "err", err)
		return
	}
	for _, m := range metas {
		if !m.Pinned || promoted[m.ID] {
			continue
		}
		if err := s.st.Checkpoints().Unpin(m.ID); err != nil {
			s.log.Warn("cannot unpin an earlier evolution trial's backup", "checkpoint_id", m.ID, "err", err)
			continue
		}
		s.log.Info("unpinned the backup of an evolution trial the supervisor did not end (it stopped during the trial)", "checkpoint_id", m.ID)
	}
}

// trialVerdict is signalled when a pair made the running trial's judge
// decide (nil: no trial undecided).
func (s *Supervisor) trialVerdict() <-chan struct{} {
	if s.lc.trial == nil || s.lc.trial.decided {
		return nil
	}
	return s.lc.trial.verdict
}

// trialTicks is tick while a trial is undecided, else nil. Go's timers
// (1.23 on) leave a ticker out of the runtime's heap while no goroutine
// waits on its channel: with no trial, the loop is not woken four times a
// second for nothing (an idle supervisor's timers are its CPU, issue 31).
func (s *Supervisor) trialTicks(tick <-chan time.Time) <-chan time.Time {
	if s.lc.trial == nil || s.lc.trial.decided {
		return nil
	}
	return tick
}

// shadowEvent handles events from a shadow instance (owner only).
func (s *Supervisor) shadowEvent(ev conn.Event) {
	t := s.lc.trial
	if t == nil {
		return
	}
	sh := t.shadowOf(ev.Inst)
	if sh == nil {
		return
	}
	switch ev.Kind {
	case conn.Exited:
		s.drain(sh.agent)
	case conn.Finished:
		sh.agent.finished = true
		if !t.decided {
			desc, _ := ev.Status.Describe()
			s.shadowFailed(t, sh, sh.name()+" shadow "+desc)
		}
		s.endTrial()
	case conn.StreamEnded:
		if ev.Err != nil && !errors.Is(ev.Err, io.EOF) && !errors.Is(ev.Err, os.ErrClosed) && !t.decided {
			s.shadowFailed(t, sh, sh.name()+" shadow broke the framing: "+ev.Err.Error())
		}
	case conn.EvolutionIntent:
		d := rejected(nil, "a shadow agent cannot propose evolutions")
		ev.Inst.SendMsg(&schema.EvolutionResult{Success: false, Decision: d.Decision, Metrics: d.Metrics, Reason: d.Reason})
	}
}

// shadowFailed ends the trial on a shadow's failure: the candidate's
// rejects it, the control's makes it inconclusive (owner only).
func (s *Supervisor) shadowFailed(t *trial, sh *shadow, why string) {
	if sh.role == evolution.RoleControl {
		t.ctrlFail = why
	} else {
		t.failure = why
	}
	s.concludeTrial()
}

// checkTrial runs on the owner's trial tick: it fails the trial when a
// shadow stopped heartbeating or its scratch WAL stopped, and otherwise
// asks the judge (the time-driven decisions: promotion once the minimum
// trial time has passed, inconclusive at the longest).
func (s *Supervisor) checkTrial() {
	t := s.lc.trial
	if t == nil || t.decided {
		return
	}
	for _, sh := range t.shadows {
		if why := s.shadowHeartbeatFailure(sh, false); why != "" {
			s.shadowFailed(t, sh, why)
			return
		}
		if fe := sh.wal.Failure(); fe != nil {
			// The scratch WAL stopped (a failed write): what the shadow
			// logged is no longer all there, so it cannot be trusted.
			s.shadowFailed(t, sh, "the "+sh.name()+" shadow's scratch WAL failed: "+fe.Error())
			return
		}
	}
	elapsed := time.Since(t.started)
	if !t.mirroring.Load() && t.shadowsUp() {
		t.mirroring.Store(true)
		s.log.Info("evolution trial: the shadows are up; mirroring requests", "trial", t.id, "after", elapsed.Round(time.Millisecond))
	}
	if t.pairs.Stats().Mirrored == 0 {
		// No mirrored request yet: the agents' own figures decide at the
		// minimum trial time (trialDecision).
		if elapsed >= t.cfg.MinDuration {
			s.concludeTrial()
		}
		return
	}
	if v := t.verdictNow(); v.Decision != evolution.VerdictContinue {
		s.concludeTrial()
	}
}

// shadowHeartbeatFailure says why a shadow's heartbeat disqualifies it, or
// "". During the trial a shadow gets --start-timeout for its first
// heartbeat; at the decision (final) one that never heartbeated fails
// outright.
func (s *Supervisor) shadowHeartbeatFailure(sh *shadow, final bool) string {
	who := sh.name() + " shadow"
	switch b := s.heartbeat(sh.agent.Instance, time.Now()); {
	case !b.seen && final:
		return who + " never sent a heartbeat"
	case b.late() && !b.seen:
		return fmt.Sprintf("%s sent no heartbeat within --start-timeout (%s)", who, s.cfg.StartTimeout)
	case b.late():
		return fmt.Sprintf("%s hung: no heartbeat for %s", who, b.age.Round(time.Millisecond))
	case b.unread():
		return fmt.Sprintf("%s stopped reading its input: a frame has waited %s for it", who, b.stalled.Round(time.Millisecond))
	}
	return ""
}

// concludeTrial decides, tells the primary, records the decision and stops
// the shadows. The trial ends when both shadows have exited (endTrial).
func (s *Supervisor) concludeTrial() {
	t := s.lc.trial
	if t == nil || t.decided {
		return
	}
	t.decided = true
	t.stopSampling()
	if t.failure == "" && t.ctrlFail == "" {
		for _, sh := range t.shadows {
			if why := s.shadowHeartbeatFailure(sh, true); why != "" {
				if sh.role == evolution.RoleControl {
					t.ctrlFail = why
				} else {
					t.failure = why
				}
			}
		}
	}
	d, v := s.trialDecision(t)
	t.clearEvidence()
	primary := s.lc.cur
	if d.Promote && (primary == nil || primary.stopping) {
		d = rejected(d.Metrics, "the primary agent restarted during the trial; propose the evolution again")
	}
	t.final = t.record(v)
	p := t.pairs.Stats()
	s.log.Info("evolution trial decided", "trial", t.id, "decision", d.Decision, "pairs", p.Pairs, "mirrored", p.Mirrored,
		"candidate_missing", p.CandidateMissing, "control_missing", p.ControlMissing, "late", p.Late,
		"duplicates", p.Duplicates, "unknown", p.Unknown, "dropped", p.Dropped, "reason", d.Reason)
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
	for _, sh := range t.shadows {
		if !sh.agent.stopping {
			sh.agent.stopping = true
			go sh.agent.Proc().StopGroup(s.cfg.KillTimeout)
		}
	}
}

// trialDecision is the decision on a trial that ended (owner only), with
// the judge's last verdict. A failed candidate rejects; a failed control
// leaves the trial inconclusive (rejected, saying so); a trial that saw no
// mirrored request falls back on the agents' own reported figures; any
// other is the judge's.
func (s *Supervisor) trialDecision(t *trial) (evolution.Decision, evolution.Verdict) {
	v := t.verdictNow()
	metrics := v.Evidence.Metrics()
	st := t.pairs.Stats()
	switch {
	case t.failure != "":
		return rejected(metrics, "the candidate failed during the trial: "+t.failure+" ("+t.describe()+")"), v
	case t.cut != "":
		return rejected(metrics, "the trial was cut short: "+t.cut+" ("+t.describe()+")"), v
	case t.ctrlFail != "":
		v.Inconclusive = true
		return rejected(metrics, "inconclusive: the control failed during the trial, so the candidate could not be compared: "+
			t.ctrlFail+" ("+t.describe()+"); propose the evolution again"), v
	case st.Mirrored == 0:
		ref := "primary"
		if t.control {
			ref = "control"
		}
		d := evolution.Decide(t.collector.Summary(evolution.Primary), t.collector.Summary(evolution.Shadow),
			evolution.Outcome{ShadowAlive: true, MinReports: s.cfg.EvolutionMinReports}, s.cfg.fallbackThresholds())
		for k, x := range metrics {
			if _, ok := d.Metrics[k]; !ok {
				d.Metrics[k] = x
			}
		}
		d.Reason = "no requests were mirrored during the trial, so the agents' own reported figures (candidate against " + ref + ") decided: " + d.Reason
		return d, v
	case v.Decision == evolution.DecisionPromoted:
		return evolution.Decision{Decision: evolution.DecisionPromoted, Promote: true, Metrics: metrics, Reason: v.Reason}, v
	case v.Decision == evolution.DecisionRejected:
		return rejected(metrics, v.Reason), v
	}
	// Ended before the judge decided (the primary stopped or restarted).
	return rejected(metrics, "the trial ended before the judge decided ("+t.describe()+")"), v
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
		fields["started"] = t.started.UTC()
		fields["primary_reports"] = t.collector.Summary(evolution.Primary).Reports
		fields["shadow_reports"] = t.collector.Summary(evolution.Shadow).Reports
		fields["duration_seconds"] = time.Since(t.started).Seconds()
		for k, v := range t.final {
			fields[k] = v
		}
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "evolution decided", Kind: observe.AuditEvolution, Fields: fields,
		Count: s.met.Evolutions.WithLabelValues(d.Decision)})
}

// endTrial forgets a decided trial once all its shadows have exited.
func (s *Supervisor) endTrial() {
	t := s.lc.trial
	if t == nil {
		return
	}
	for _, sh := range t.shadows {
		if !sh.agent.finished {
			return
		}
	}
	s.lc.trial = nil
	s.publish()
	s.work.Post(t.close)
}

// stopTrial ends a trial when the supervisor starts stopping, without
// waiting: it is decided, its shadows killed and drained; shadowEvent ends
// it when they have finished (owner only).
func (s *Supervisor) stopTrial(reason string) {
	t := s.lc.trial
	if t == nil {
		return
	}
	if !t.decided {
		t.cut = reason
		s.concludeTrial()
	}
	for _, sh := range t.shadows {
		_ = sh.agent.Proc().SignalGroup(syscall.SIGKILL)
		s.drain(sh.agent)
	}
}

// abortTrial ends what is left of a trial when the owner loop has returned:
// it waits for the shadows to finish (after the loop, nothing else will),
// so their checkpoints are queued before the scratch stores are closed.
func (s *Supervisor) abortTrial(reason string) {
	t := s.lc.trial
	if t == nil {
		return
	}
	s.stopTrial(reason)
	for _, sh := range t.shadows {
		sh.agent.Finish(drainTimeout) // safe beside drain's own finish: both wait for the same ends
		sh.agent.finished = true
	}
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
