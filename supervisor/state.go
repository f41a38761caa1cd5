package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
)

// walDurableTimeout bounds how long a checkpoint waits for the WAL entries
// ahead of it to become durable before it is refused with CHECKPOINT_FAILED.
const walDurableTimeout = 30 * time.Second

func zstdLevel(n int) zstd.EncoderLevel {
	return zstd.EncoderLevelFromZstd(n)
}

// primarySinks route a primary's messages into the supervisor's stores.
type primarySinks struct{ s *Supervisor }

func (p primarySinks) appendWAL(in *instance, recs []schema.WALRecord) {
	p.s.appendWAL(in, p.s.wal, recs)
}

func (p primarySinks) checkpoint(in *instance, cp *schema.Checkpoint, arrived time.Time) {
	s := p.s
	// The reader appends WAL entries in frame order, so everything the agent
	// logged before this checkpoint is appended now: that is the watermark.
	wm := s.wal.LastSequence()
	// Bounded by bytes: while the queue is full the reader waits here, and
	// the agent's pipe fills (back-pressure). A compressed checkpoint is
	// queued compressed. The wait is our storage's time, not the agent's:
	// it does not count against the agent's heartbeat.
	size := int64(len(cp.Data) + len(cp.Zstd))
	resume := in.pauseLiveness()
	defer resume()
	if _, ok := s.ckptGate.acquire(size, in.abandoned); !ok {
		return // the instance is being finished; this checkpoint is not acknowledged
	}
	s.bmet.ckptQueueBytes.Add(float64(size))
	s.ckptWG.Add(1)
	s.ckptJobs <- ckptJob{inst: in, data: cp.Data, zstd: cp.Zstd, size: size, watermark: wm, arrived: arrived}
}

func (p primarySinks) agentMetrics(in *instance, m *schema.Metrics) {
	p.s.met.agentReport(in.role, m.Data)
	if t := p.s.trialPtr.Load(); t != nil {
		t.collector.Add(evolution.Primary, m.Data, time.Now())
	}
}

func (p primarySinks) agentError(in *instance, m *schema.Error) {
	p.s.met.agentErrors.Inc()
	if ok, sup := p.s.limiter.allow(time.Now()); ok {
		in.log.Warn("agent reported an error", "code", m.Error.Code, "message", m.Error.Message, "suppressed_before", sup)
	}
}

func (p primarySinks) invalid(in *instance, err error) {
	p.s.invalidMessage(in, err)
}

// invalidMessage answers a payload error with INVALID_MESSAGE, counts, logs
// and audits it (logs and audit records are rate-limited). Nothing is stored.
func (s *Supervisor) invalidMessage(in *instance, err error) {
	rule := string(schema.RuleMalformed)
	var ve *schema.ValidationError
	if errors.As(err, &ve) {
		rule = string(ve.Rule)
	}
	s.met.invalid.WithLabelValues(schema.CodeInvalidMessage, rule).Inc()
	in.sendMsg(schema.ErrorReply(err))
	if ok, sup := s.limiter.allow(time.Now()); ok {
		in.log.Warn("invalid message from the agent; replied INVALID_MESSAGE", "err", err, "suppressed_before", sup)
		fields := map[string]any{"role": in.role, "pid": in.proc.pid, "rule": rule, "error": err.Error()}
		if ve != nil {
			fields["type"], fields["field"] = ve.Type, ve.Field
		}
		_ = s.audit.Record(AuditInvalid, fields)
	}
}

// appendWAL appends entries as one unit and reports storage failures to the
// agent as WAL_FULL / WAL_FAILED.
func (s *Supervisor) appendWAL(in *instance, l *wal.Log, recs []schema.WALRecord) {
	entries := make([]wal.Entry, len(recs))
	size := 0
	for i, r := range recs {
		entries[i] = wal.Entry{Sequence: r.Sequence, Data: r.Raw}
		size += len(r.Raw)
	}
	res, err := l.Append(entries...)
	if err != nil {
		code := schema.CodeWALFailed
		if errors.Is(err, wal.ErrNoSpace) {
			code = schema.CodeWALFull
		}
		if errors.Is(err, wal.ErrOutOfOrder) {
			// The batch itself is malformed: a payload error, not storage.
			s.invalidMessage(in, &schema.ValidationError{Type: schema.TypeWALBatch, Field: "data", Rule: schema.RuleFieldValue,
				Reason: "entries of a wal_batch must have increasing sequences"})
			return
		}
		s.met.walErrors.WithLabelValues(code).Inc()
		details := map[string]any{"first_sequence": recs[0].Sequence, "last_sequence": recs[len(recs)-1].Sequence, "entries": len(recs)}
		in.sendMsg(schema.NewError(code, "the supervisor could not append these WAL entries: "+err.Error(), details))
		if ok, sup := s.limiter.allow(time.Now()); ok {
			in.log.Error("WAL append failed; told the agent", "code", code, "err", err, "suppressed_before", sup)
			_ = s.audit.Record(AuditWALError, map[string]any{"role": in.role, "code": code, "error": err.Error(), "first_sequence": recs[0].Sequence})
		}
		return
	}
	if in.role == RolePrimary {
		s.met.walAppends.Add(float64(res.Appended))
		s.met.walBytes.Add(float64(size))
		s.met.walDuplicates.Add(float64(res.Duplicates))
		s.met.walGaps.Add(float64(len(res.Gaps)))
		s.met.walLastSeq.Set(float64(res.Last))
	}
	for _, g := range res.Gaps {
		if ok, _ := s.limiter.allow(time.Now()); ok {
			in.log.Info("gap in WAL sequences (allowed)", "after", g.After, "next", g.Next)
		}
	}
}

// checkpointWorker stores checkpoints one at a time, in arrival order, until
// ckptJobs is closed.
func (s *Supervisor) checkpointWorker() {
	for job := range s.ckptJobs {
		s.storeCheckpoint(job)
		job.data, job.zstd = nil, nil
		s.ckptGate.release(job.size)
		s.bmet.ckptQueueBytes.Sub(float64(job.size))
		s.ckptWG.Done()
	}
}

func (s *Supervisor) storeCheckpoint(job ckptJob) {
	in := job.inst
	fail := func(stage string, err error) {
		s.met.checkpointFailed.Inc()
		in.log.Error("checkpoint not stored; told the agent CHECKPOINT_FAILED", "stage", stage, "err", err)
		_ = s.audit.Record(AuditCheckpointError, map[string]any{"stage": stage, "error": err.Error(), "watermark": job.watermark})
		in.sendMsg(schema.NewError(schema.CodeCheckpointFailed, fmt.Sprintf("checkpoint not stored (%s): %v", stage, err),
			map[string]any{"watermark": job.watermark}))
	}
	// Never acknowledge a checkpoint before the WAL entries ahead of it are durable.
	ctx, cancel := context.WithTimeout(context.Background(), walDurableTimeout)
	err := s.wal.WaitDurable(ctx, job.watermark)
	cancel()
	if err != nil {
		fail("wal_durable", err)
		return
	}
	s.storeMu.Lock()
	var meta checkpoint.Meta
	var invalid error
	if job.zstd != nil {
		// Validated and stored as one stream: the decompressed body (up to
		// 100 MiB) is never held; a payload error aborts the save.
		// The stored frame declares the data's size, so that a restore can
		// send it as it is: the agent's frame declares it (CheckpointData
		// holds it to that), or a first validating pass counts it.
		size := int64(-1)
		if zh := (zstd.Header{}); zh.Decode(job.zstd) == nil && zh.HasFCS {
			size = int64(zh.FrameContentSize)
		} else if _, n, verr := s.codec.CheckpointData(job.zstd, io.Discard); verr != nil {
			err, invalid = verr, verr
		} else {
			size = n
		}
		if invalid == nil {
			meta, err = s.store.SaveStreamSized(job.watermark, size, func(w io.Writer) error {
				_, _, err := s.codec.CheckpointData(job.zstd, w)
				if errors.Is(err, schema.ErrInvalidMessage) {
					invalid = err
				}
				return err
			})
		}
	} else {
		meta, err = s.store.Save(job.data, job.watermark)
	}
	if err != nil {
		s.storeMu.Unlock()
		if invalid != nil {
			s.invalidMessage(in, invalid)
			return
		}
		fail("save", err)
		return
	}
	removed, perr := s.store.Prune()
	if perr != nil {
		in.log.Warn("checkpoint retention failed; old checkpoints kept", "err", perr)
	}
	var truncated int
	if wm, ok := s.store.OldestRetainedWatermark(); ok {
		n, terr := s.wal.TruncateBefore(wm)
		if terr != nil {
			in.log.Warn("WAL truncation failed; old segments kept", "err", terr)
		}
		truncated = n
	}
	s.storeMu.Unlock()
	s.newestCkp.Store(meta.ID)
	in.sendMsg(&schema.CheckpointAck{CheckpointID: meta.ID, Size: meta.StoredSize})
	took := time.Since(job.arrived)
	s.met.checkpoints.Inc()
	s.met.checkpointSize.Set(float64(meta.StoredSize))
	s.met.checkpointRaw.Set(float64(meta.Size))
	s.met.checkpointDur.Observe(took.Seconds())
	in.log.Info("checkpoint stored", "checkpoint_id", meta.ID, "size", meta.Size, "stored_size", meta.StoredSize,
		"watermark", meta.Watermark, "seconds", took.Seconds(), "pruned", len(removed), "wal_segments_removed", truncated)
	_ = s.audit.Record(AuditCheckpoint, map[string]any{"checkpoint_id": meta.ID, "size": meta.Size, "stored_size": meta.StoredSize,
		"watermark": meta.Watermark, "checksum": meta.Checksum, "pruned": removed})
}

// restorePlan is an assembled restore, ready to send.
type restorePlan struct {
	msg          *schema.Restore
	frame        []byte // msg encoded: a restore that cannot be encoded never starts an agent
	checkpointID string
	created      time.Time
	watermark    uint64
	entries      int
	lastSeq      uint64
	skipped      []checkpoint.Skipped
}

// buildRestore assembles a restore from the given point (nil: the newest good
// checkpoint) plus the WAL after its watermark. It returns nil when there is
// no state at all.
func (s *Supervisor) buildRestore(point *restorePoint) (*restorePlan, error) {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	plan := &restorePlan{}
	var (
		meta checkpoint.Meta
		data []byte
		err  error
	)
	noWAL := false
	// A v2 agent gets the stored zstd frame as it is: the snapshot (up to
	// 100 MiB) is checked as a stream and never held decompressed. A frame
	// that does not declare its size (stored by an older supervisor or from
	// an agent's frame without one) is loaded whole instead.
	var zdata []byte
	load, latest := s.store.Load, s.store.Latest
	if s.agentVersion >= 2 {
		load, latest = s.store.LoadCompressed, s.store.LatestCompressed
	}
	if point != nil {
		noWAL = point.noWAL
		meta, data, err = load(point.checkpointID)
		if errors.Is(err, checkpoint.ErrNoContentSize) {
			meta, data, err = s.store.Load(point.checkpointID)
		} else if err == nil && s.agentVersion >= 2 {
			zdata, data = data, nil
		}
		if err != nil {
			return nil, fmt.Errorf("load checkpoint %s: %w", point.checkpointID, err)
		}
	} else {
		var skipped []checkpoint.Skipped
		meta, data, skipped, err = latest()
		if errors.Is(err, checkpoint.ErrNoContentSize) {
			meta, data, skipped, err = s.store.Latest()
		} else if err == nil && s.agentVersion >= 2 {
			zdata, data = data, nil
		}
		plan.skipped = skipped
		for _, sk := range skipped {
			if errors.Is(sk.Err, checkpoint.ErrMarkedBad) {
				// Counted and audited once, when it was marked.
				s.log.Info("checkpoint marked bad earlier is passed over", "checkpoint_id", sk.ID, "err", sk.Err)
				continue
			}
			s.met.checkpointSkip.Inc()
			s.log.Error("checkpoint skipped at restore; using an older one with a longer WAL replay", "checkpoint_id", sk.ID, "err", sk.Err)
			_ = s.audit.Record(AuditCheckpointSkip, map[string]any{"checkpoint_id": sk.ID, "error": sk.Err.Error()})
		}
		if errors.Is(err, checkpoint.ErrNotFound) {
			err = nil
			meta = checkpoint.Meta{}
		}
		if err != nil {
			return nil, fmt.Errorf("find newest checkpoint: %w", err)
		}
	}
	if zdata != nil && meta.Size <= schema.CompressThreshold {
		// Small: sent uncompressed, as before (checked again by Load).
		zdata = nil
		if meta, data, err = s.store.Load(meta.ID); err != nil {
			return nil, fmt.Errorf("load checkpoint %s: %w", meta.ID, err)
		}
	}
	plan.checkpointID = meta.ID
	plan.created = meta.Created
	plan.watermark = meta.Watermark
	var entries []msgpack.RawMessage
	if !noWAL {
		if first := s.wal.FirstSequence(); first > meta.Watermark+1 {
			s.log.Error("the WAL no longer holds every entry after the restore's checkpoint; the restore will miss entries",
				"checkpoint_id", meta.ID, "watermark", meta.Watermark, "first_wal_sequence", first)
		}
		err := s.wal.ReadAfter(meta.Watermark, func(e wal.Entry) error {
			entries = append(entries, msgpack.RawMessage(append([]byte(nil), e.Data...)))
			plan.lastSeq = e.Sequence
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read WAL after sequence %d: %w", meta.Watermark, err)
		}
	}
	if meta.ID == "" && len(entries) == 0 {
		return nil, nil
	}
	plan.entries = len(entries)
	if plan.lastSeq == 0 {
		plan.lastSeq = meta.Watermark
	}
	snapshot := msgpack.RawMessage(data)
	plan.msg = &schema.Restore{
		CheckpointID: meta.ID,
		Snapshot:     snapshot,
		SnapshotZstd: zdata,
		WALEntries:   entries,
		Compress:     s.agentVersion >= 2 && (zdata != nil || len(data) > schema.CompressThreshold),
	}
	frame, err := s.codec.Encode(plan.msg)
	if err != nil {
		return nil, fmt.Errorf("the restore (checkpoint %q, %d bytes, + %d WAL entries) cannot be encoded: %w; "+
			"the agent is not started without its state. Have the agent checkpoint more often (a shorter WAL tail) "+
			"or speak protocol version 2 so the restore can be compressed", meta.ID, meta.Size, len(entries), err)
	}
	plan.frame = frame
	return plan, nil
}

// sendRestore queues a restore to an instance and records it.
func (s *Supervisor) sendRestore(in *instance, plan *restorePlan, trigger string) bool {
	if !in.send(plan.frame) {
		in.log.Error("could not queue the restore for the agent", "trigger", trigger)
		return false
	}
	s.met.frames.WithLabelValues("out", schema.TypeRestore).Inc()
	s.met.frameBytes.WithLabelValues("out").Add(float64(len(plan.frame)))
	in.restoredFrom = plan.checkpointID
	in.restoreSentAt.Store(time.Now().UnixNano())
	s.met.restores.WithLabelValues(trigger).Inc()
	s.met.restoreEntries.Add(float64(plan.entries))
	in.log.Info("restore sent", "trigger", trigger, "checkpoint_id", plan.checkpointID, "watermark", plan.watermark,
		"wal_entries", plan.entries, "last_sequence", plan.lastSeq, "compressed", plan.msg.Compress)
	_ = s.audit.Record(AuditRestore, map[string]any{"trigger": trigger, "role": in.role, "checkpoint_id": plan.checkpointID,
		"watermark": plan.watermark, "wal_entries": plan.entries, "last_sequence": plan.lastSeq, "compressed": plan.msg.Compress})
	return true
}

// rewindWAL makes a --no-wal restore to the checkpoint with watermark wm
// stick: WAL entries after wm and checkpoints newer than it describe history
// the operator abandoned. The entries are removed (so the agent's next
// sequences, which continue from the checkpoint, are not taken for
// duplicates) and the newer checkpoints are marked bad (so a later crash does
// not restore the abandoned history). Both are audited.
func (s *Supervisor) rewindWAL(cp checkpoint.Meta) error {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	id, wm := cp.ID, cp.Watermark
	metas, err := s.store.List()
	if err != nil {
		return fmt.Errorf("list checkpoints: %w", err)
	}
	var abandoned []string
	for _, m := range metas {
		newer := m.Created.After(cp.Created) || (m.Created.Equal(cp.Created) && m.ID > cp.ID)
		if m.ID == id || m.Bad || !newer {
			continue
		}
		if err := s.store.MarkBad(m.ID, "abandoned by a --no-wal restore to "+id); err != nil {
			return fmt.Errorf("mark checkpoint %s abandoned: %w", m.ID, err)
		}
		abandoned = append(abandoned, m.ID)
	}
	last := s.wal.LastSequence()
	removed, err := s.wal.TruncateAfter(wm)
	if err != nil {
		return fmt.Errorf("remove WAL entries after sequence %d: %w", wm, err)
	}
	if len(abandoned) > 0 {
		s.newestCkp.Store(id)
	}
	s.met.walLastSeq.Set(float64(s.wal.LastSequence()))
	s.log.Warn("history after the checkpoint set aside for a --no-wal restore", "checkpoint_id", id,
		"wal_entries_removed", removed, "removed_sequences", fmt.Sprintf("%d..%d", wm+1, last), "checkpoints_marked_bad", abandoned)
	_ = s.audit.Record(AuditRollback, map[string]any{"checkpoint_id": id, "watermark": wm, "wal_entries_removed": removed,
		"previous_last_sequence": last, "checkpoints_marked_bad": abandoned})
	return nil
}
