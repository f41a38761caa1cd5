package supervisor

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/internal/clip"
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
	s      *Supervisor
	role   string
	wal    *wal.Log                                    // where entries become durable (wal_ack)
	add    func([]wal.Entry) (wal.AppendResult, error) // stores.append, or the scratch WAL's Append
	ckpts  *ckptDest                                   // where the store worker saves checkpoints
	trial  *trial                                      // a shadow's trial; nil for the primary
	shadow *shadow                                     // which of its shadows
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
	// store is the checkpoint store a large checkpoint is staged in as it
	// arrives (conn.StreamSink); commit stores a staged one as save does.
	store   *checkpoint.Store
	commit  func(staged *checkpoint.Staged, watermark uint64, at int64) (meta checkpoint.Meta, pruned []string, segs int, err error)
	primary bool // a stored checkpoint is counted and audited (a shadow's are scratch)
}

var _ conn.Sink = (*sinks)(nil)

func (s *Supervisor) primarySinks() *sinks {
	return &sinks{s: s, role: RolePrimary, wal: s.st.WAL(), add: s.st.Append, ckpts: &ckptDest{
		wal: s.st.WAL(), arrived: s.st.CheckpointArrived, save: s.st.SaveCheckpoint,
		store: s.st.Checkpoints(), commit: s.st.CommitCheckpoint, primary: true}}
}

func (s *Supervisor) shadowSinks(t *trial, sh *shadow) *sinks {
	return &sinks{s: s, role: RoleShadow, wal: sh.wal, add: func(es []wal.Entry) (wal.AppendResult, error) { return sh.wal.Append(es...) },
		ckpts: &ckptDest{wal: sh.wal,
			arrived: func() (uint64, int64) { return sh.wal.LastSequence(), 0 },
			save: func(data, zdata []byte, wm uint64, _ int64) (checkpoint.Meta, []string, int, error, error) {
				meta, invalid, err := durable.SaveCheckpointTo(sh.store, s.codec, data, zdata, wm)
				return meta, nil, 0, invalid, err
			},
			store: sh.store,
			commit: func(staged *checkpoint.Staged, wm uint64, _ int64) (checkpoint.Meta, []string, int, error) {
				meta, err := staged.Commit(wm)
				return meta, nil, 0, err
			}},
		trial: t, shadow: sh}
}

// collecting is the trial whose collector takes these reports, with the
// side they count for; nil when no trial runs or they do not count. The
// candidate's reports are the Shadow side; the reference side (Primary) is
// the control's with a control, the primary's without.
func (k *sinks) collecting() (*trial, evolution.Side) {
	if k.trial != nil {
		if k.shadow.role == evolution.RoleCandidate {
			return k.trial, evolution.Shadow
		}
		return k.trial, evolution.Primary
	}
	if t := k.s.current().trial; t != nil && !t.control {
		return t, evolution.Primary
	}
	return nil, evolution.Primary
}

func (k *sinks) AppendWAL(in *conn.Instance, recs []schema.WALRecord, ack bool) {
	if k.role == RolePrimary {
		k.s.requestsDoneDurably(recs)
	}
	k.s.appendWAL(in, k.wal, k.add, recs, ack)
}

// requestsDoneDurably holds a request_done entry (docs/protocol.md, steps)
// until the record that finished its request is in the request journal:
// the agent answers first and logs request_done after, and a restart must
// never see the steps forgotten while the request is still pending (it
// would be redelivered and every step run again). The reader waits here, on
// our storage's time (inside the sink, like an append).
func (s *Supervisor) requestsDoneDurably(recs []schema.WALRecord) {
	if s.book == nil {
		return
	}
	for _, r := range recs {
		if r.Operation != schema.OpRequestDone {
			continue
		}
		id, ok := requestIDParam(r.Params)
		if !ok {
			continue
		}
		if err := s.book.FinishedDurably(id); err != nil {
			s.log.Warn("request_done logged before its request's answer could be journaled", "request_id", clip.String(id, 64), "err", err)
		}
	}
}

// requestIDParam reads params.request_id of a request_done entry.
func requestIDParam(params []byte) (string, bool) {
	var p struct {
		RequestID string `msgpack:"request_id"`
	}
	if err := schema.Unmarshal(params, &p); err != nil || p.RequestID == "" {
		return "", false
	}
	return p.RequestID, true
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
	if size > ckptQueueBytes {
		job.stored = make(chan struct{})
	}
	s.bmet.CkptQueueBytes.Add(float64(size))
	if !s.work.Queue(job, size, k.queueCancel(in)) {
		// A shadow being finished, or the worker stopping: this checkpoint
		// is not stored.
		s.bmet.CkptQueueBytes.Sub(float64(size))
		return
	}
	if job.stored != nil {
		// A checkpoint larger than the queue is the only one in memory: the
		// reader reads no further frame until it is stored (the agent's pipe
		// fills meanwhile: back-pressure, on our time).
		select {
		case <-job.stored:
		case <-in.Abandoned():
			return
		}
		// Its bytes are garbage now: collected and given back before the
		// next frame is read, so that two never meet in memory. One
		// collection per checkpoint over 8 MiB.
		cp.Data, job = nil, ckptJob{}
		debug.FreeOSMemory()
	}
}

// queueCancel ends a checkpoint's wait for room in the store worker's
// queue. A primary's checkpoint waits however long our storage takes, also
// after the agent has exited: the final checkpoint it sent on shutdown, then
// exiting without waiting long for the ack, is stored (SPEC §3: frames the
// agent wrote before it stopped are kept). The owner waits for the
// primary's reader (conn.Finished) before the worker is stopped, so only a
// stopping worker ends that wait. A shadow's gives up once the owner lets
// the shadow go (its trial's scratch store is about to close).
func (k *sinks) queueCancel(in *conn.Instance) <-chan struct{} {
	if k.role == RolePrimary {
		return k.s.work.Stopping()
	}
	return in.Abandoned()
}

var _ conn.StreamSink = (*sinks)(nil)

// StageCheckpoint begins a checkpoint too large to hold: its data is
// compressed into a temporary file of the store as it is read from the
// pipe, before the frame is known valid (conn.StreamSink).
func (k *sinks) StageCheckpoint(in *conn.Instance) (io.Writer, error) {
	staged, err := k.ckpts.store.Stage()
	if err != nil {
		return nil, err
	}
	return staged, nil
}

// StageAborted throws away a staged checkpoint whose frame was invalid.
func (k *sinks) StageAborted(in *conn.Instance, w io.Writer) {
	if staged, ok := w.(*checkpoint.Staged); ok {
		staged.Abort()
	}
}

// CheckpointStaged queues a staged checkpoint for the store worker, which
// commits and acknowledges it as it does a held one (Checkpoint), and
// waits for it: one checkpoint is staged at a time. storeErr, when set, is
// why it could not be staged: it is answered CHECKPOINT_FAILED in turn.
func (k *sinks) CheckpointStaged(in *conn.Instance, w io.Writer, cp *schema.Checkpoint, storeErr error, arrived time.Time) {
	s := k.s
	wm, at := k.ckpts.arrived()
	staged, _ := w.(*checkpoint.Staged)
	if storeErr != nil && staged != nil {
		staged.Abort()
		staged = nil
	}
	const size = 1 << 20 // what a staged checkpoint holds: the encoder's buffers
	job := ckptJob{inst: in, dest: k.ckpts, staged: staged, stageErr: storeErr, size: size, watermark: wm, tailAt: at,
		arrived: arrived, stored: make(chan struct{})}
	s.bmet.CkptQueueBytes.Add(size)
	if !s.work.Queue(job, size, k.queueCancel(in)) {
		s.bmet.CkptQueueBytes.Sub(size)
		if staged != nil {
			staged.Abort()
		}
		return
	}
	select {
	case <-job.stored:
	case <-in.Abandoned():
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

// RequestResult: a primary's answer completes its request (requestresults.go); a
// shadow's answer to a mirrored request only feeds the trial.
func (k *sinks) RequestResult(in *conn.Instance, m *schema.RequestResult) {
	if k.trial != nil {
		k.s.shadowResult(in, k.trial, k.shadow, m)
		return
	}
	k.s.primaryResult(in, m)
}

// invalidMessage answers a payload error with INVALID_MESSAGE, counts, logs
// and audits it (logs and audit records are rate-limited). Nothing is stored.
func (s *Supervisor) invalidMessage(in *conn.Instance, err error) {
	rule := string(schema.RuleMalformed)
	var ve *schema.ValidationError
	if errors.As(err, &ve) {
		rule = string(ve.Rule)
	}
	in.SendMsg(schema.ErrorReply(err))
	fields := map[string]any{"role": in.Role(), "pid": in.Proc().ID(), "rule": rule, "error": err.Error()}
	if ve != nil {
		fields["type"], fields["field"] = ve.Type, ve.Field
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "invalid message from the agent; replied INVALID_MESSAGE", Log: in.Log(),
		Kind: observe.AuditInvalid, Fields: fields, Count: s.met.Invalid.WithLabelValues(schema.CodeInvalidMessage, rule), Limited: true})
}

// appendWAL appends entries as one unit through appendFn (the primary's
// stores, or a shadow's scratch WAL l) and reports what went wrong to the
// agent: WAL_FULL / WAL_FAILED for storage, SEQUENCE_CONFLICT for an entry
// at an old sequence that is not a byte-identical replay. Nothing an agent
// sends is dropped silently. With ack, accepted entries (replays included)
// are answered with wal_ack once durable in l; refused ones only with the
// error.
func (s *Supervisor) appendWAL(in *conn.Instance, l *wal.Log, appendFn func([]wal.Entry) (wal.AppendResult, error), recs []schema.WALRecord, ack bool) {
	var one [1]wal.Entry // a wal_entry frame (the common case) needs no slice of its own
	entries := one[:min(len(recs), 1)]
	if len(recs) > 1 {
		entries = make([]wal.Entry, len(recs))
	}
	size := 0
	for i, r := range recs {
		entries[i] = wal.Entry{Sequence: r.Sequence, Data: r.Raw}
		size += len(r.Raw)
	}
	if ack && in.LastOfBurst() {
		// The agent waits for this ack and has sent nothing more: the
		// reader will make the entries durable itself if the syncer is
		// idle (conn.Instance.AckWhenDurable), so the append does not wake
		// the syncer for nothing.
		l.HoldKick()
		defer l.ReleaseKick()
	}
	res, err := appendFn(entries)
	if err != nil {
		if errors.Is(err, wal.ErrOutOfOrder) {
			// The batch itself is malformed: a payload error, not storage.
			s.invalidMessage(in, &schema.ValidationError{Type: schema.TypeWALBatch, Field: "data", Rule: schema.RuleFieldValue,
				Reason: "entries of a wal_batch must have increasing sequences"})
			return
		}
		details := map[string]any{"first_sequence": recs[0].Sequence, "last_sequence": recs[len(recs)-1].Sequence, "entries": len(recs)}
		var ce *wal.SequenceConflictError
		if errors.As(err, &ce) {
			details["sequence"], details["last_sequence"] = ce.Sequence, ce.LastSequence
			in.SendMsg(schema.NewError(schema.CodeSequenceConflict, fmt.Sprintf("WAL entry with sequence %d not appended: %s (the log's last sequence is %d)",
				ce.Sequence, ce.Reason, ce.LastSequence), details))
			s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "WAL sequence conflict: entries refused; told the agent SEQUENCE_CONFLICT", Log: in.Log(),
				Kind: observe.AuditSequenceConflict, Fields: map[string]any{"role": in.Role(), "sequence": ce.Sequence,
					"last_sequence": ce.LastSequence, "entries": len(recs), "reason": ce.Reason},
				Count: s.met.WALErrors.WithLabelValues(schema.CodeSequenceConflict), Limited: true})
			return
		}
		code := schema.CodeWALFailed
		if errors.Is(err, wal.ErrNoSpace) || errors.Is(err, durable.ErrRestoreFull) {
			code = schema.CodeWALFull
		}
		var fe *wal.FailedError
		if errors.As(err, &fe) {
			// The log stopped: these entries and its whole failed range are
			// not in it (walfailed.go restarts the agent from what it holds).
			in.SendMsg(walFailedError(fe, recs[0].Sequence, recs[len(recs)-1].Sequence))
		} else {
			in.SendMsg(schema.NewError(code, "the supervisor could not append these WAL entries: "+err.Error(), details))
		}
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "WAL append failed; told the agent", Log: in.Log(),
			Kind: observe.AuditWALError, Fields: map[string]any{"role": in.Role(), "code": code, "error": err.Error(), "first_sequence": recs[0].Sequence},
			Count: s.met.WALErrors.WithLabelValues(code), Limited: true})
		return
	}
	if in.Role() == RolePrimary {
		s.met.WALAppends.Add(float64(res.Appended))
		s.met.WALBytes.Add(float64(size))
		s.met.WALDuplicates.Add(float64(res.Duplicates))
		s.met.WALGaps.Add(float64(len(res.Gaps)))
	}
	for _, g := range res.Gaps {
		if ok, _ := s.rec.Allow(time.Now()); ok {
			in.Log().Info("gap in WAL sequences (allowed)", "after", g.After, "next", g.Next)
		}
	}
	if ack { // the agent waits for durability (conn/acks.go)
		in.AckWhenDurable(l, recs[len(recs)-1].Sequence)
	}
}
