package supervisor

// The owner's jobs on the store worker (durable.Worker) and their answers:
// checkpoint saves, restore assembly, rollbacks.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

type ckptJob struct {
	inst *conn.Instance
	dest *ckptDest
	data []byte // uncompressed data, or nil when zstd is set
	zstd []byte // the agent's compressed data, validated while it is stored
	// staged: a checkpoint compressed into a temporary file as it arrived
	// (data and zstd nil), committed here; stageErr: why staging failed.
	staged    *checkpoint.Staged
	stageErr  error
	size      int64 // bytes reserved in ckptGate
	watermark uint64
	tailAt    int64 // stores.checkpointArrived's accounting mark
	arrived   time.Time
	// stored, when set, is closed once the job is done (stored or not): a
	// checkpoint larger than the queue makes the frame reader wait for it
	// (Checkpoint), so no second one is read meanwhile.
	stored chan struct{}
}

// ckptQueueBytes bounds the checkpoints waiting to be stored (compressed ones
// count their compressed size). An agent that sends faster than they are
// stored is slowed down through its pipe.
const ckptQueueBytes = 8 << 20

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
	// restorePending: the agent was started during recovery and told a
	// restore is coming, so one is built even with no state (empty).
	restorePending bool

	plan      *durable.Plan // nil: no state yet (a fresh start)
	usedPoint bool          // point was used (false: it could not be, the newest was)
	err       error         // no restore can be built: the agent is not started
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
	if fe := s.st.WAL().Failure(); fe != nil {
		last, err := s.st.ReopenWAL()
		if err != nil {
			p.err = fmt.Errorf("%w: %w", errWALStopped, err)
			return
		}
		s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "WAL reopened from the disk after its failure; the agent is restored from what it holds",
			Kind: observe.AuditWALError, Fields: map[string]any{"reopened": true, "last_sequence": last, "failed_first_sequence": fe.First,
				"failed_last_sequence": fe.Last}})
	}
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
		plan, err := s.st.BuildRestore(durable.Point{OlderThan: p.fallbackFrom, Always: p.restorePending})
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
	if pt := p.point; pt != nil && pt.Recorded {
		// Acted on — applied (a --no-wal rollback done: a crash from now on
		// restores the checkpoint it kept, the newest good one), unusable,
		// or failed (the start goes on from the newest checkpoint, and a
		// rollback applied later would discard what the agent logs
		// meanwhile) — so it is cleared before the agent is started.
		if _, _, _, err := s.st.Checkpoints().TakeRestorePoint(); err != nil {
			s.log.Error("cannot clear the recorded restore point; remove DATA_DIR/checkpoints/restore-point.json before the next start, or it is applied again", "err", err)
		}
	}
}

// storeCheckpoint stores one queued checkpoint and acknowledges it. Store
// worker only (durable.Worker), in arrival order, for the primary and shadows
// alike.
func (s *Supervisor) storeCheckpoint(job ckptJob) {
	defer func() {
		s.work.Release(job.size)
		s.bmet.CkptQueueBytes.Sub(float64(job.size))
		if job.stored != nil {
			close(job.stored)
		}
	}()
	in, dest := job.inst, job.dest
	fail := func(stage string, err error) {
		in.SendMsg(schema.NewError(schema.CodeCheckpointFailed, fmt.Sprintf("checkpoint not stored (%s): %v", stage, err),
			map[string]any{"watermark": job.watermark}))
		if dest.primary {
			s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "checkpoint not stored; told the agent CHECKPOINT_FAILED", Log: in.Log(),
				Kind: observe.AuditCheckpointError, Fields: map[string]any{"stage": stage, "error": err.Error(), "watermark": job.watermark},
				Count: s.met.CheckpointFailed})
		} else {
			in.Log().Warn("shadow checkpoint not stored; told the shadow CHECKPOINT_FAILED", "stage", stage, "err", err)
		}
	}
	// Never acknowledge a checkpoint before the WAL entries ahead of it are durable.
	ctx, cancel := context.WithTimeout(context.Background(), walDurableTimeout)
	err := dest.wal.WaitDurable(ctx, job.watermark)
	cancel()
	if err == nil {
		// A log that stopped may have refused entries the agent's state
		// already holds: no checkpoint is taken from it until it reopens.
		if fe := dest.wal.Failure(); fe != nil {
			err = fe
		}
	}
	if err != nil {
		if job.staged != nil {
			job.staged.Abort()
		}
		fail("wal_durable", err)
		return
	}
	var (
		meta      checkpoint.Meta
		removed   []string
		truncated int
		invalid   error
	)
	switch {
	case job.stageErr != nil:
		err = job.stageErr
	case job.staged != nil:
		meta, removed, truncated, err = dest.commit(job.staged, job.watermark, job.tailAt)
		job.staged = nil
	default:
		meta, removed, truncated, invalid, err = dest.save(job.data, job.zstd, job.watermark, job.tailAt)
	}
	if invalid != nil {
		s.invalidMessage(in, invalid)
		return
	}
	if err != nil {
		fail("save", err)
		return
	}
	in.SendMsg(&schema.CheckpointAck{CheckpointID: meta.ID, Size: meta.StoredSize})
	if !dest.primary {
		return
	}
	took := time.Since(job.arrived)
	s.met.CheckpointSize.Set(float64(meta.StoredSize))
	s.met.CheckpointRaw.Set(float64(meta.Size))
	s.met.CheckpointDur.Observe(took.Seconds())
	s.rec.Record(observe.Occurrence{Level: slog.LevelInfo, Msg: "checkpoint stored", Log: in.Log(), Kind: observe.AuditCheckpoint,
		Fields: map[string]any{"checkpoint_id": meta.ID, "size": meta.Size, "stored_size": meta.StoredSize,
			"watermark": meta.Watermark, "checksum": meta.Checksum, "pruned": removed},
		LogOnly: []any{"seconds", took.Seconds(), "wal_segments_removed", truncated}, Count: s.met.Checkpoints})
}

// walDurableTimeout bounds how long a checkpoint waits for the WAL entries
// ahead of it to become durable before it is refused with CHECKPOINT_FAILED.
const walDurableTimeout = 30 * time.Second

// rewindWAL makes an operator's --no-wal restore to cp stick (stores.rewind)
// and audits what was set aside.
func (s *Supervisor) rewindWAL(cp checkpoint.Meta) error {
	abandoned, removed, last, err := s.st.Rewind(cp)
	for _, id := range abandoned {
		s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "checkpoint marked bad: it holds history a --no-wal restore abandoned",
			Kind: observe.AuditCheckpointBad, Fields: map[string]any{"checkpoint_id": id, "reason": "abandoned by a --no-wal restore to " + cp.ID}})
	}
	if err != nil {
		return err
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "history after the checkpoint set aside for a --no-wal restore", Kind: observe.AuditRollback,
		Fields: map[string]any{"checkpoint_id": cp.ID, "watermark": cp.Watermark, "wal_entries_removed": removed,
			"previous_last_sequence": last, "checkpoints_marked_bad": abandoned},
		LogOnly: []any{"removed_sequences", fmt.Sprintf("%d..%d", cp.Watermark+1, last)}})
	return nil
}
