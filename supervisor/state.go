package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// walDurableTimeout bounds how long a checkpoint waits for the WAL entries
// ahead of it to become durable before it is refused with CHECKPOINT_FAILED.
const walDurableTimeout = 30 * time.Second

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
		in.SendMsg(schema.NewError(code, "the supervisor could not append these WAL entries: "+err.Error(), details))
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
	if ack { // issue 14: the agent waits for durability (acks.go)
		in.AckWhenDurable(l, recs[len(recs)-1].Sequence)
	}
}

// sendRestore queues a restore to an instance and records it.
func (s *Supervisor) sendRestore(in *conn.Instance, plan *durable.Plan, trigger string) bool {
	if !in.SendRestore(plan.Frame) {
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

// rewindWAL makes an operator's --no-wal restore to cp stick (stores.rewind)
// and audits what was set aside.
func (s *Supervisor) rewindWAL(cp checkpoint.Meta) error {
	abandoned, removed, last, err := s.st.Rewind(cp)
	if err != nil {
		return err
	}
	s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "history after the checkpoint set aside for a --no-wal restore", Kind: observe.AuditRollback,
		Fields: map[string]any{"checkpoint_id": cp.ID, "watermark": cp.Watermark, "wal_entries_removed": removed,
			"previous_last_sequence": last, "checkpoints_marked_bad": abandoned},
		LogOnly: []any{"removed_sequences", fmt.Sprintf("%d..%d", cp.Watermark+1, last)}})
	return nil
}
