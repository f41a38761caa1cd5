package agent

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/agent-sidecar/supervisor/schema"
)

// WALOp is one entry of a WAL batch.
type WALOp struct {
	Operation string // memory_add, tool_register, state_update, or a configured extra
	Params    any    // encoded as a MessagePack map; nil is {}; msgpack.RawMessage is used as is
	Sequence  uint64 // > 0, above every sequence sent before
}

// Send encodes m and writes it as one frame. It fills in what the caller
// left zero: the header's Version (the Conn's version, when 2 or more) and
// Timestamp (now). Safe for concurrent use.
func (c *Conn) Send(m schema.Message) error {
	payload, err := c.encode(m)
	if err != nil {
		return fmt.Errorf("agent: encode %s: %w", m.MessageType(), err)
	}
	if err := c.writeFrame(payload); err != nil {
		return fmt.Errorf("agent: send %s: %w", m.MessageType(), err)
	}
	c.sentSequences(m)
	return nil
}

// encode fills in the header's version and encodes m.
func (c *Conn) encode(m schema.Message) ([]byte, error) {
	if h := m.Head(); h.Version == 0 && c.version >= 2 {
		h.Version = c.version
	}
	return c.codec.Encode(m)
}

// heartbeatAccepts is what every heartbeat says the agent handles: the
// Conn turns cancel_request into a cancelled context for the request's
// handler (see [Conn.StartRequest]).
var heartbeatAccepts = []string{schema.TypeCancelRequest}

// SendHeartbeat sends one heartbeat. It carries accepts: ["cancel_request"],
// the opt-in to cancellation (an agent that handles requests some other way
// receives the cancel_request messages and may ignore them).
func (c *Conn) SendHeartbeat() error {
	return c.Send(&schema.Heartbeat{Accepts: heartbeatAccepts})
}

// SendWAL logs one operation in the supervisor's write-ahead log. Send it
// before applying the operation; seq must be above every sequence sent
// before (the supervisor drops an entry at or below the last one it
// appended as a replayed duplicate).
func (c *Conn) SendWAL(op string, params any, seq uint64) error {
	rec, err := walRecord(op, params, seq)
	if err != nil {
		return err
	}
	return c.Send(&schema.WALEntry{Entry: rec})
}

// SendWALBatch logs several operations in one frame, appended by the
// supervisor as one unit: after a crash either all of them are in the log or
// none is. At most 100 entries (the supervisor's default batch limit).
func (c *Conn) SendWALBatch(entries []WALOp) error {
	if len(entries) == 0 {
		return fmt.Errorf("%w: empty WAL batch", ErrBadMessage)
	}
	if limit := schema.DefaultLimits().BatchEntries; len(entries) > limit {
		return fmt.Errorf("%w: WAL batch of %d entries; the supervisor accepts at most %d, split it", ErrBadMessage, len(entries), limit)
	}
	recs := make([]schema.WALRecord, len(entries))
	for i, e := range entries {
		rec, err := walRecord(e.Operation, e.Params, e.Sequence)
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		recs[i] = rec
	}
	return c.Send(&schema.WALBatch{Entries: recs})
}

func walRecord(op string, params any, seq uint64) (schema.WALRecord, error) {
	if op == "" {
		return schema.WALRecord{}, fmt.Errorf("%w: WAL entry without an operation", ErrBadMessage)
	}
	if seq == 0 {
		return schema.WALRecord{}, fmt.Errorf("%w: WAL entry %s with sequence 0; sequences start at 1", ErrBadMessage, op)
	}
	raw, err := encodeMap(params, "WAL params")
	if err != nil {
		return schema.WALRecord{}, err
	}
	return schema.WALRecord{Operation: op, Sequence: seq, Params: raw}, nil
}

// SendCheckpoint sends the agent's whole state as a checkpoint. data must
// encode to a MessagePack map (a map or a struct; a msgpack.RawMessage is
// sent as is). Under protocol version 2, data larger than
// schema.CompressThreshold is sent zstd-compressed. The supervisor answers
// with checkpoint_ack (see [Conn.AwaitCheckpointAck]) or an error
// CHECKPOINT_FAILED.
//
// While requests with logged steps are unanswered, their step table is added
// to the data under [StepsKey] (restores remove it again before the agent's
// code sees the snapshot), so that a checkpoint never loses a step.
func (c *Conn) SendCheckpoint(data any) error {
	raw, err := encodeMap(data, "checkpoint data")
	if err != nil {
		return err
	}
	c.steps.mu.Lock()
	defer c.steps.mu.Unlock()
	if raw, err = c.steps.checkpointDataLocked(raw); err != nil {
		return err
	}
	return c.Send(&schema.Checkpoint{
		Data:     raw,
		Compress: c.version >= 2 && len(raw) > schema.CompressThreshold,
	})
}

// SendMetrics reports the agent's figures. The supervisor knows avg_latency,
// p50_latency, p95_latency, p99_latency (milliseconds), error_rate (0..1),
// memory_usage (bytes), throughput (per second), active_tools and
// memory_blocks; other keys become generic gauges.
func (c *Conn) SendMetrics(m map[string]float64) error {
	return c.Send(&schema.Metrics{Data: m})
}

// SendEvolutionIntent proposes a change to the agent's own code. The
// supervisor tries it on a shadow and answers with evolution_result (and,
// when promoted, hot_reload).
func (c *Conn) SendEvolutionIntent(h schema.Hypothesis) error {
	return c.Send(&schema.EvolutionIntent{Hypothesis: h})
}

// SendError reports an error of the agent's own (code e.g. MEMORY_FULL,
// TOOL_FAILED). The supervisor logs it.
func (c *Conn) SendError(code, message string) error {
	return c.Send(&schema.Error{Error: schema.ErrorBody{Code: code, Message: message}})
}

// SendRawFrame writes payload as one frame without encoding or validating
// it: an escape hatch for tests and for messages built elsewhere.
func (c *Conn) SendRawFrame(payload []byte) error {
	if err := c.writeFrame(payload); err != nil {
		return fmt.Errorf("agent: send raw frame: %w", err)
	}
	return nil
}

// WriteRaw writes b to the transport as is, without a length prefix. It is
// for tests that need to break the framing; it never interleaves with a
// frame being written by another goroutine.
func (c *Conn) WriteRaw(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isClosed() {
		return ErrClosed
	}
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("agent: write raw bytes: %w", err)
	}
	return nil
}

func (c *Conn) writeFrame(payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isClosed() {
		return ErrClosed
	}
	return c.fw.WriteFrame(payload)
}

// encodeMap encodes v as a MessagePack map with compact integers and sorted
// keys (schema.MarshalMap), so the same value always gives the same bytes;
// nil is {} and a msgpack.RawMessage is used as is.
func encodeMap(v any, what string) (msgpack.RawMessage, error) {
	raw, ok := v.(msgpack.RawMessage)
	if !ok {
		m, err := schema.MarshalMap(v)
		if err != nil {
			return nil, fmt.Errorf("%w: encode %s: %w", ErrBadMessage, what, err)
		}
		return m, nil
	}
	if len(raw) == 0 || raw[0] == msgpcode.Nil {
		return msgpack.RawMessage{msgpcode.FixedMapLow}, nil
	}
	if c := raw[0]; !(msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32) {
		return nil, fmt.Errorf("%w: %s must encode to a MessagePack map, got type byte 0x%02x", ErrBadMessage, what, c)
	}
	return raw, nil
}
