package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// sinks are where an instance's valid messages go: a small struct of
// destinations. A primary's point at the supervisor's stores, a shadow's at
// its trial's scratch stores; every message takes the same path for both
// (this file). The two differ only where the product does: a primary's
// request results answer HTTP clients and a shadow's feed the trial; only
// the primary's protocol version is persisted and its checkpoints audited.
// Called on the instance's reader goroutine (a conn.Sink).
type sinks struct {
	s     *Supervisor
	role  string
	wal   *wal.Log                                    // where entries become durable (wal_ack)
	add   func([]wal.Entry) (wal.AppendResult, error) // stores.append, or the scratch WAL's Append
	ckpts *ckptDest                                   // where the store worker saves checkpoints
	trial *trial                                      // a shadow's trial; nil for the primary
}

// ckptDest is a checkpoint store as the store worker sees it: the primary's
// (with retention, WAL truncation and the restorability accounting) or a
// trial's scratch store.
type ckptDest struct {
	wal *wal.Log // a checkpoint is acknowledged once the entries before it are durable here
	// arrived gives a checkpoint arriving now its watermark and accounting
	// mark (frame order: everything appended before it is in wal).
	arrived func() (watermark uint64, at int64)
	save    func(data, zdata []byte, watermark uint64, at int64) (meta checkpoint.Meta, pruned []string, segs int, invalid, err error)
	primary bool // a stored checkpoint is counted and audited (a shadow's are scratch)
}

var _ conn.Sink = (*sinks)(nil)

func (s *Supervisor) primarySinks() *sinks {
	return &sinks{s: s, role: RolePrimary, wal: s.st.WAL(), add: s.st.Append, ckpts: &ckptDest{
		wal: s.st.WAL(), arrived: s.st.CheckpointArrived, save: s.st.SaveCheckpoint, primary: true}}
}

func (s *Supervisor) shadowSinks(t *trial) *sinks {
	return &sinks{s: s, role: RoleShadow, wal: t.wal, add: func(es []wal.Entry) (wal.AppendResult, error) { return t.wal.Append(es...) },
		ckpts: &ckptDest{wal: t.wal,
			arrived: func() (uint64, int64) { return t.wal.LastSequence(), 0 },
			save: func(data, zdata []byte, wm uint64, _ int64) (checkpoint.Meta, []string, int, error, error) {
				meta, invalid, err := durable.SaveCheckpointTo(t.store, s.codec, data, zdata, wm)
				return meta, nil, 0, invalid, err
			}},
		trial: t}
}

// collecting is the trial whose collector takes these reports, with the
// side they count for; nil when no trial runs.
func (k *sinks) collecting() (*trial, evolution.Side) {
	if k.trial != nil {
		return k.trial, evolution.Shadow
	}
	return k.s.current().trial, evolution.Primary
}

func (k *sinks) AppendWAL(in *conn.Instance, recs []schema.WALRecord, ack bool) {
	k.s.appendWAL(in, k.wal, k.add, recs, ack)
}

// versionSeen: the agent spoke a higher protocol version.
func (k *sinks) VersionSeen(_ *conn.Instance, v int32) {
	if k.role == RolePrimary {
		k.s.st.NoteVersion(v)
	}
}

// checkpoint queues a checkpoint for the store worker, which acknowledges it
// once stored. Bounded by bytes: while the queue is full the reader waits
// here, and the agent's pipe fills (back-pressure). A compressed checkpoint
// is queued compressed. The wait is our storage's time, not the agent's: the
// reader is inside a sink (instance.sinkBegin/sinkEnd), so it does not count
// against the agent's heartbeat.
func (k *sinks) Checkpoint(in *conn.Instance, cp *schema.Checkpoint, arrived time.Time) {
	s := k.s
	// The reader appends WAL entries in frame order, so everything the agent
	// logged before this checkpoint is appended now: that is the watermark.
	wm, at := k.ckpts.arrived()
	size := int64(len(cp.Data) + len(cp.Zstd))
	job := ckptJob{inst: in, dest: k.ckpts, data: cp.Data, zstd: cp.Zstd, size: size, watermark: wm, tailAt: at, arrived: arrived}
	s.bmet.CkptQueueBytes.Add(float64(size))
	if !s.work.Queue(job, size, in.Abandoned()) {
		// The instance is being finished; this checkpoint is not acknowledged.
		s.bmet.CkptQueueBytes.Sub(float64(size))
	}
}

func (k *sinks) AgentMetrics(in *conn.Instance, m *schema.Metrics) {
	k.s.met.AgentReport(k.role, m.Data)
	if t, side := k.collecting(); t != nil {
		t.collector.Add(side, m.Data, time.Now())
	}
}

func (k *sinks) AgentError(in *conn.Instance, m *schema.Error) {
	if k.role == RolePrimary {
		k.s.met.AgentErrors.Inc()
	}
	if ok, sup := k.s.rec.Allow(time.Now()); ok {
		in.Log().Warn("agent reported an error", "code", m.Error.Code, "message", m.Error.Message, "suppressed_before", sup)
	}
}

func (k *sinks) Invalid(in *conn.Instance, err error) { k.s.invalidMessage(in, err) }

// requestResult: a primary's answer completes its request (requests.go); a
// shadow's answer to a mirrored request only feeds the trial.
func (k *sinks) RequestResult(in *conn.Instance, m *schema.RequestResult) {
	if k.trial != nil {
		k.s.shadowResult(in, k.trial, m)
		return
	}
	k.s.primaryResult(in, m)
}

// storeCheckpoint stores one queued checkpoint and acknowledges it. Store
// worker only (durable.Worker), in arrival order, for the primary and shadows
// alike.
func (s *Supervisor) storeCheckpoint(job ckptJob) {
	defer func() {
		s.work.Release(job.size)
		s.bmet.CkptQueueBytes.Sub(float64(job.size))
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
	if err != nil {
		fail("wal_durable", err)
		return
	}
	meta, removed, truncated, invalid, err := dest.save(job.data, job.zstd, job.watermark, job.tailAt)
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
