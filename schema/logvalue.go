package schema

import "log/slog"

// LogValue describes m for a log line: its type, version and timestamp, and
// per type the facts worth logging (operations, sequences, sizes, ids,
// codes). It never includes payload content such as params, checkpoint data
// or code; an error's message is cut to 200 bytes.
func LogValue(m Message) slog.Value {
	if m == nil {
		return slog.StringValue("<nil message>")
	}
	h := m.Head()
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("type", m.MessageType()), slog.Int("version", h.Version), slog.Int64("timestamp", h.Timestamp))
	switch m := m.(type) {
	case *Checkpoint:
		attrs = append(attrs, slog.Int("data_bytes", len(m.Data)), slog.Bool("compressed", m.Compress))
		if m.Status != "" {
			attrs = append(attrs, slog.String("status", m.Status))
		}
	case *WALEntry:
		attrs = append(attrs, slog.String("operation", m.Entry.Operation), slog.Uint64("sequence", m.Entry.Sequence), slog.Int("bytes", len(m.Entry.Raw)))
	case *WALBatch:
		attrs = append(attrs, slog.Int("entries", len(m.Entries)))
		if n := len(m.Entries); n > 0 {
			size := 0
			for _, e := range m.Entries {
				size += len(e.Raw)
			}
			attrs = append(attrs, slog.Uint64("first_sequence", m.Entries[0].Sequence), slog.Uint64("last_sequence", m.Entries[n-1].Sequence), slog.Int("bytes", size))
		}
	case *EvolutionIntent:
		attrs = append(attrs, slog.String("target", m.Hypothesis.Target), slog.Int("code_bytes", len(m.Hypothesis.NewCode)))
	case *Metrics:
		attrs = append(attrs, slog.Int("values", len(m.Data)))
	case *Error:
		msg := m.Error.Message
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		attrs = append(attrs, slog.String("code", m.Error.Code), slog.String("message", msg))
	case *CheckpointAck:
		attrs = append(attrs, slog.String("checkpoint_id", m.CheckpointID), slog.Int64("size", m.Size))
	case *Restore:
		attrs = append(attrs, slog.String("checkpoint_id", m.CheckpointID), slog.Int("snapshot_bytes", len(m.Snapshot)),
			slog.Int("wal_entries", len(m.WALEntries)), slog.Bool("compressed", m.Compress))
	case *HotReload:
		attrs = append(attrs, slog.String("module", m.Module), slog.String("backup_checkpoint_id", m.BackupCheckpointID), slog.Int("code_bytes", len(m.Code)))
	case *EvolutionResult:
		attrs = append(attrs, slog.String("decision", m.Decision), slog.Bool("success", m.Success))
	case *Heartbeat:
		if len(m.Accepts) > 0 {
			attrs = append(attrs, slog.Int("accepts", len(m.Accepts)))
		}
	case *ProcessRequest:
		attrs = append(attrs, slog.String("request_id", m.RequestID), slog.Int("message_bytes", len(m.Data.Message)))
		if m.Attempt > 0 {
			attrs = append(attrs, slog.Uint64("attempt", m.Attempt))
		}
	case *CancelRequest:
		id := m.RequestID
		if len(id) > 64 {
			id = id[:64] + "..."
		}
		attrs = append(attrs, slog.String("request_id", id))
	case *Shutdown:
		attrs = append(attrs, slog.String("reason", m.Reason), slog.Bool("create_checkpoint", m.CreateCheckpoint))
	case *WALAck:
		attrs = append(attrs, slog.Uint64("sequence", m.Sequence))
	case *RequestResult:
		id := m.RequestID
		if len(id) > 64 {
			id = id[:64] + "..."
		}
		attrs = append(attrs, slog.String("request_id", id), slog.Int("data_bytes", len(m.Data)))
		if m.Error != nil {
			code := m.Error.Code
			if len(code) > 64 {
				code = code[:64] + "..."
			}
			attrs = append(attrs, slog.String("error_code", code))
		}
	}
	return slog.GroupValue(attrs...)
}

// LogValue implements slog.LogValuer; see the package function LogValue.
func (m *Heartbeat) LogValue() slog.Value       { return LogValue(m) }
func (m *Checkpoint) LogValue() slog.Value      { return LogValue(m) }
func (m *WALEntry) LogValue() slog.Value        { return LogValue(m) }
func (m *WALBatch) LogValue() slog.Value        { return LogValue(m) }
func (m *EvolutionIntent) LogValue() slog.Value { return LogValue(m) }
func (m *Metrics) LogValue() slog.Value         { return LogValue(m) }
func (m *Error) LogValue() slog.Value           { return LogValue(m) }
func (m *CheckpointAck) LogValue() slog.Value   { return LogValue(m) }
func (m *Restore) LogValue() slog.Value         { return LogValue(m) }
func (m *HotReload) LogValue() slog.Value       { return LogValue(m) }
func (m *EvolutionResult) LogValue() slog.Value { return LogValue(m) }
func (m *ProcessRequest) LogValue() slog.Value  { return LogValue(m) }
func (m *Shutdown) LogValue() slog.Value        { return LogValue(m) }
func (m *WALAck) LogValue() slog.Value          { return LogValue(m) }
func (m *RequestResult) LogValue() slog.Value   { return LogValue(m) }
func (m *CancelRequest) LogValue() slog.Value   { return LogValue(m) }
