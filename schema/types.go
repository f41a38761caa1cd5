package schema

import (
	"github.com/vmihailenco/msgpack/v5"
)

// Message types. The first seven are sent by the agent, the last six by the
// supervisor; [TypeError] goes both ways.
const (
	TypeHeartbeat       = "heartbeat"
	TypeCheckpoint      = "checkpoint"
	TypeWALEntry        = "wal_entry"
	TypeWALBatch        = "wal_batch"
	TypeEvolutionIntent = "evolution_intent"
	TypeMetrics         = "metrics"
	TypeError           = "error"
	TypeCheckpointAck   = "checkpoint_ack"
	TypeRestore         = "restore"
	TypeHotReload       = "hot_reload"
	TypeEvolutionResult = "evolution_result"
	TypeProcessRequest  = "process_request"
	TypeShutdown        = "shutdown"
	// The opt-in extensions (see extensions.go): a supervisor → agent
	// durability acknowledgement, an agent → supervisor request answer, and
	// a supervisor → agent cancellation of a request in flight (sent only to
	// an agent whose heartbeats accept it).
	TypeWALAck        = "wal_ack"
	TypeRequestResult = "request_result"
	TypeCancelRequest = "cancel_request"
)

// Direction says who sent a message.
type Direction uint8

const (
	// FromAgent: the agent sent it to the supervisor.
	FromAgent Direction = 1
	// ToAgent: the supervisor sent it to the agent.
	ToAgent Direction = 2
)

// String returns "from_agent" or "to_agent" (metric label friendly).
func (d Direction) String() string {
	switch d {
	case FromAgent:
		return "from_agent"
	case ToAgent:
		return "to_agent"
	}
	return "unknown_direction"
}

// Error codes carried in error messages' error.code.
const (
	CodeInvalidMessage   = "INVALID_MESSAGE"
	CodeWALFull          = "WAL_FULL"
	CodeWALFailed        = "WAL_FAILED"
	CodeCheckpointFailed = "CHECKPOINT_FAILED"
	// CodeSequenceConflict: a WAL entry at or below the log's last sequence
	// that is not a byte-identical replay of the entry stored there (or one
	// jumping absurdly far ahead). details: sequence, last_sequence.
	CodeSequenceConflict = "SEQUENCE_CONFLICT"
)

// The built-in WAL operations. Others are accepted only when listed in
// [Options.ExtraWALOperations].
const (
	OpMemoryAdd    = "memory_add"
	OpToolRegister = "tool_register"
	OpStateUpdate  = "state_update"
	// The durable-requests extension's operations (docs/protocol.md,
	// "Steps"): a step's logged result, params {request_id, index, name,
	// result}, and the end of a request's steps, params {request_id}.
	OpRequestStep = "request_step"
	OpRequestDone = "request_done"
)

// Checkpoint data.agent_state.status values.
const (
	StatusIdle     = "idle"
	StatusThinking = "thinking"
	StatusActing   = "acting"
	StatusEvolving = "evolving"
)

// Evolution decisions.
const (
	DecisionPromoted = "promoted"
	DecisionRejected = "rejected"
)

// CompressionZstd is the only supported value of the compression field.
const CompressionZstd = "zstd"

// CompressThreshold: bodies above this many bytes may be sent compressed (v2).
const CompressThreshold = 1 << 20

// Header holds the fields every message has.
type Header struct {
	// Timestamp is Unix seconds. Encode writes the current time when it is 0
	// (without changing the message).
	Timestamp int64
	// Version is the protocol version the sender speaks: 1 when absent on
	// input. Encode writes it when it is not 0 (and at least 2 when the
	// message is compressed).
	Version int
	// Metadata is the raw bytes of the optional metadata map; nil when
	// absent. Decode aliases the payload.
	Metadata msgpack.RawMessage
}

// Head returns h itself; through embedding it gives every message type
// access to its [Header].
func (h *Header) Head() *Header { return h }

// Message is one of the 16 message types (the seed's 13 and the three
// extensions). Only pointers to the types of this
// package implement it.
type Message interface {
	// MessageType returns the wire type, one of the Type constants.
	MessageType() string
	// Head returns the message's common fields.
	Head() *Header
}

// Heartbeat: the agent is alive (agent → supervisor, about every second).
type Heartbeat struct {
	Header
	// Accepts lists the optional supervisor → agent messages the agent
	// handles (extension; [TypeCancelRequest] is the one defined); nil when
	// absent or empty. Encode writes it when not empty. The whole heartbeat
	// stays within its 100-byte limit.
	Accepts []string
}

// Checkpoint carries the agent's full state (agent → supervisor).
type Checkpoint struct {
	Header
	// Data is the checkpoint's data map: uncompressed MessagePack exactly as
	// the agent encoded it. It aliases the payload unless the message arrived
	// compressed, in which case it is a new decompressed buffer.
	Data msgpack.RawMessage
	// Compress: on decode, the message arrived zstd-compressed; on encode,
	// send data compressed (v2).
	Compress bool
	// Status is data.agent_state.status when present ("" otherwise); Decode
	// has checked it is one of the Status constants. Encode ignores it.
	Status string
	// Zstd is set instead of Data when the codec streams checkpoints
	// ([Options].StreamCheckpoints) and the message arrived compressed: the
	// agent's zstd bytes, not yet decompressed or validated beyond the
	// envelope. [Codec.CheckpointData] validates and inflates them as a
	// stream. Encode ignores it.
	Zstd []byte
}

// WALRecord is one write-ahead-log entry: {operation, params, sequence}.
type WALRecord struct {
	Operation string
	Sequence  uint64             // > 0
	Params    msgpack.RawMessage // raw map bytes
	// Raw is the original bytes of the whole entry map. Decode aliases the
	// payload (or the decompressed body); on encode, when set, Raw is sent
	// as is and the other fields are ignored.
	Raw msgpack.RawMessage
}

// WALEntry logs one operation before the agent performs it (agent →
// supervisor).
type WALEntry struct {
	Header
	Entry WALRecord
	// Ack asks for a wal_ack once the entry is durable (the ack: true
	// extension); false when absent.
	Ack bool
}

// WALBatch logs several operations at once (agent → supervisor).
type WALBatch struct {
	Header
	Entries []WALRecord // encode: from Raw if set, else from the fields
	// Ack asks for a wal_ack once the whole batch is durable.
	Ack bool
}

// Hypothesis is an evolution_intent's proposed change.
type Hypothesis struct {
	Reason, Target, NewCode string
	// ExpectedImprovement is optional (nil when absent).
	ExpectedImprovement map[string]float64
}

// EvolutionIntent announces a self-modification the agent wants tried
// (agent → supervisor).
type EvolutionIntent struct {
	Header
	Hypothesis Hypothesis
}

// Metrics reports the agent's own figures (agent → supervisor). Known keys:
// avg_latency, p50_latency, p95_latency, p99_latency (milliseconds),
// error_rate (0..1), memory_usage (bytes), throughput (per second),
// active_tools, memory_blocks; any other numeric key is allowed.
type Metrics struct {
	Header
	Data map[string]float64
}

// The metric keys the seed defines.
const (
	MetricAvgLatency   = "avg_latency"   // milliseconds
	MetricP50Latency   = "p50_latency"   // milliseconds
	MetricP95Latency   = "p95_latency"   // milliseconds
	MetricP99Latency   = "p99_latency"   // milliseconds
	MetricErrorRate    = "error_rate"    // 0..1
	MetricMemoryUsage  = "memory_usage"  // bytes
	MetricThroughput   = "throughput"    // per second
	MetricActiveTools  = "active_tools"  // count
	MetricMemoryBlocks = "memory_blocks" // count
)

// KnownMetric is one of the seed's metric keys: its value is never
// negative, and at most Max when Max > 0.
type KnownMetric struct {
	Name string
	Max  float64
}

// KnownMetrics is the one list of the seed's metric keys: Decode checks
// their ranges, and the supervisor exports each as its own gauge (any other
// key becomes a generic one).
var KnownMetrics = []KnownMetric{
	{MetricAvgLatency, 0}, {MetricP50Latency, 0}, {MetricP95Latency, 0}, {MetricP99Latency, 0},
	{MetricErrorRate, 1}, {MetricMemoryUsage, 0}, {MetricThroughput, 0}, {MetricActiveTools, 0},
	{MetricMemoryBlocks, 0},
}

// ErrorBody is an error message's error map. Agents send stack_trace and
// context; the supervisor sends details.
type ErrorBody struct {
	Code, Message, StackTrace string
	Details, Context          msgpack.RawMessage // raw maps, optional (nil when absent)
}

// Error reports a failure; valid in both directions.
type Error struct {
	Header
	Error ErrorBody
}

// CheckpointAck confirms a checkpoint was stored (supervisor → agent).
type CheckpointAck struct {
	Header
	CheckpointID string
	Size         int64 // bytes stored
}

// Restore gives the agent its state back (supervisor → agent).
type Restore struct {
	Header
	// CheckpointID is "" when restoring from the WAL only.
	CheckpointID string
	// Snapshot is the checkpoint's data map, spliced as is on encode (nil or
	// empty encodes {}). On decode it aliases the payload, or is a new buffer
	// when the message arrived compressed.
	Snapshot msgpack.RawMessage
	// WALEntries are raw entry maps, spliced as is on encode; on decode they
	// alias the payload (or the decompressed body).
	WALEntries []msgpack.RawMessage
	// Compress: on encode, zstd the snapshot (v2); on decode, it arrived
	// compressed (and Snapshot holds it decompressed).
	Compress bool
	// LastSequence is the WAL's last sequence when the restore was built
	// (always sent; 0 when absent on decode, from an older supervisor). The
	// agent numbers its next entries above it.
	LastSequence uint64
	// SnapshotZstd, on encode, is the snapshot already compressed: one zstd
	// frame of a checked data map, declaring its content size (a stored
	// checkpoint as it is on disk). It is sent as is, compressed, and
	// Snapshot is ignored: a 100 MiB snapshot is never held decompressed.
	// Decode never sets it.
	SnapshotZstd []byte
}

// HotReload tells the agent to load new code (supervisor → agent).
type HotReload struct {
	Header
	Code, Module, BackupCheckpointID string
}

// EvolutionResult tells the agent what became of its evolution_intent
// (supervisor → agent).
type EvolutionResult struct {
	Header
	Success  bool
	Decision string // DecisionPromoted or DecisionRejected
	Metrics  map[string]float64
	Reason   string
}

// ProcessRequest forwards a user request (supervisor → agent).
type ProcessRequest struct {
	Header
	RequestID string
	Data      RequestData
	// Attempt is the delivery's number (extension): 1 on the first delivery,
	// higher when the request is delivered again after the agent restarted.
	// 0 means absent on the wire, which counts as 1; Encode writes it when
	// it is above 0.
	Attempt uint64
}

// RequestData is a process_request's data map.
type RequestData struct {
	Message string
	Context msgpack.RawMessage // raw map, optional
	UserID  string
}

// Shutdown asks the agent to stop gracefully (supervisor → agent).
type Shutdown struct {
	Header
	Reason           string
	CreateCheckpoint bool
}

func (*Heartbeat) MessageType() string       { return TypeHeartbeat }
func (*Checkpoint) MessageType() string      { return TypeCheckpoint }
func (*WALEntry) MessageType() string        { return TypeWALEntry }
func (*WALBatch) MessageType() string        { return TypeWALBatch }
func (*EvolutionIntent) MessageType() string { return TypeEvolutionIntent }
func (*Metrics) MessageType() string         { return TypeMetrics }
func (*Error) MessageType() string           { return TypeError }
func (*CheckpointAck) MessageType() string   { return TypeCheckpointAck }
func (*Restore) MessageType() string         { return TypeRestore }
func (*HotReload) MessageType() string       { return TypeHotReload }
func (*EvolutionResult) MessageType() string { return TypeEvolutionResult }
func (*ProcessRequest) MessageType() string  { return TypeProcessRequest }
func (*Shutdown) MessageType() string        { return TypeShutdown }

// WALMessage is implemented by the two messages that carry WAL records,
// [*WALEntry] and [*WALBatch], so a caller can append either the same way.
type WALMessage interface {
	Message
	// Records returns the message's WAL records in order. Their Raw bytes
	// are what the WAL stores and what a restore sends back.
	Records() []WALRecord
}

// Records returns the single entry.
func (m *WALEntry) Records() []WALRecord { return []WALRecord{m.Entry} }

// Records returns the batch's entries.
func (m *WALBatch) Records() []WALRecord { return m.Entries }

// direction of each type; TypeError is both.
var typeDirections = map[string]Direction{
	TypeHeartbeat:       FromAgent,
	TypeCheckpoint:      FromAgent,
	TypeWALEntry:        FromAgent,
	TypeWALBatch:        FromAgent,
	TypeEvolutionIntent: FromAgent,
	TypeMetrics:         FromAgent,
	TypeError:           FromAgent | ToAgent,
	TypeCheckpointAck:   ToAgent,
	TypeRestore:         ToAgent,
	TypeHotReload:       ToAgent,
	TypeEvolutionResult: ToAgent,
	TypeProcessRequest:  ToAgent,
	TypeShutdown:        ToAgent,
	TypeWALAck:          ToAgent,
	TypeRequestResult:   FromAgent,
	TypeCancelRequest:   ToAgent,
}

// Types returns the message types valid in direction dir, in the order of
// the protocol document.
func Types(dir Direction) []string {
	var out []string
	for _, t := range allTypes {
		if typeDirections[t]&dir != 0 {
			out = append(out, t)
		}
	}
	return out
}

// allDirections[i] is the direction of allTypes[i].
var allDirections = func() []Direction {
	d := make([]Direction, len(allTypes))
	for i, t := range allTypes {
		d[i] = typeDirections[t]
	}
	return d
}()

var allTypes = []string{
	TypeHeartbeat, TypeCheckpoint, TypeWALEntry, TypeWALBatch, TypeEvolutionIntent,
	TypeMetrics, TypeError, TypeCheckpointAck, TypeRestore, TypeHotReload,
	TypeEvolutionResult, TypeProcessRequest, TypeShutdown, TypeRequestResult, TypeWALAck,
	TypeCancelRequest,
}
