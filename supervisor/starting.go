package supervisor

// Starting the primary: its restore assembled on the store worker, the
// process spawned off the loop, the restore sent as its first frame.

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// startFailed handles a start that could not be made: a configuration error
// or an unrestorable data directory ends Run; anything else is retried
// after a back-off (owner only).
func (s *Supervisor) startFailed(err error) (stop bool, _ error) {
	s.answerPending("the agent could not be restarted to deliver the restore: " + err.Error())
	if errors.Is(err, ErrConfig) {
		return true, err
	}
	if errors.Is(err, ErrUnrestorable) {
		s.refuseStart(err)
		return true, err
	}
	if errors.Is(err, errWALStopped) {
		s.log.Error("cannot start the agent until the WAL is reopened; retrying after a back-off", "err", err)
		s.restartAfter(reasonWALFailed, true, s.lc.bo.wait())
		return false, nil
	}
	s.log.Error("cannot start the agent", "err", err)
	return s.scheduleRestart("spawn_failed", true)
}

// prepareStart asks the store worker to assemble the next start's restore.
// It runs after every checkpoint queued before it, so it sees all that the
// previous incarnation sent; the owner goes on meanwhile, and spawns the
// agent when the answer comes (startPrepared).
func (s *Supervisor) prepareStart() {
	if s.lc.preparing != nil {
		return
	}
	p := &startPrep{point: s.lc.pendingPoint, fallbackFrom: s.lc.fallbackFrom, restorePending: s.earlyRestorePending()}
	s.lc.preparing = p
	s.work.Post(func() {
		s.assembleStart(p)
		s.report(storeResult{start: p})
	})
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
	if p.err == nil && s.st.WAL().Failure() != nil {
		// The WAL failed again after this restore was assembled: it may
		// hold entries the log no longer has.
		p.err = errWALStopped
	}
	if p.err == nil {
		s.lc.walFailed = nil // reopened (or never failed)
	}
	if p.err != nil {
		s.lc.preparing = nil
		if s.lc.pendingPoint == p.point {
			// An operator's point recorded while this start was assembled
			// stays pending: the next attempt starts from it.
			s.lc.pendingPoint = nil
		}
		s.dropEarly() // never sent a frame: it would not have started
		s.publish()
		return p.err
	}
	// Still preparing (s.lc.preparing) until spawnDone takes the process:
	// the one started during recovery (takeEarly), or a new one.
	if !s.useEarly(p) {
		s.spawnAsync(s.primarySpec(p.plan != nil), spawnResult{start: p})
	}
	return nil
}

// primarySpec is how a primary is started.
func (s *Supervisor) primarySpec(restorePending bool) agentproc.Spec {
	return agentproc.Spec{Path: s.cfg.Command[0], Args: s.cfg.Command[1:], Env: s.agentEnv(RolePrimary, restorePending), Stdio: s.cfg.Stdio}
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
	// Then every pending request, again (after the restore: the agent
	// finds its steps in it).
	s.book.AgentUp(inst)
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

// refuseStart reports that no complete restore can be built: the agent is
// not started and Run ends with err (exit code 3).
func (s *Supervisor) refuseStart(err error) {
	s.lc.failed = true
	s.setState(StateGivenUp)
	s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "refusing to start the agent: its state cannot be restored completely",
		Kind: observe.AuditRestoreRefused, Fields: map[string]any{"error": err.Error(), "wal_floor": s.st.WAL().Floor(),
			"wal_last_sequence": s.st.WAL().LastSequence()}, Count: s.met.RestoreRefused})
}

// sendRestore queues a restore to an instance and records it.
func (s *Supervisor) sendRestore(in *conn.Instance, plan *durable.Plan, trigger string) bool {
	var tail conn.Tail
	if plan.Tail != nil { // not a nil *WALTail in a non-nil interface
		tail = plan.Tail
	}
	if !in.SendRestore(plan.Frame, tail) {
		in.Log().Error("could not queue the restore for the agent", "trigger", trigger)
		return false
	}
	s.met.RestoreEntries.Add(float64(plan.Entries))
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "restore sent", Log: in.Log(), Kind: observe.AuditRestore,
		Fields: map[string]any{"trigger": trigger, "role": in.Role(), "checkpoint_id": plan.CheckpointID,
			"watermark": plan.Watermark, "wal_entries": plan.Entries, "last_sequence": plan.LastSequence, "compressed": plan.Compressed},
		Count: s.met.Restores.WithLabelValues(trigger)})
	return true
}
