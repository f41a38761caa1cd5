package testagent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
)

// Statuses of agent_state.status (the seed's enumeration).
const (
	StatusIdle     = schema.StatusIdle
	StatusThinking = schema.StatusThinking
	StatusActing   = schema.StatusActing
	StatusEvolving = schema.StatusEvolving
)

// EmbeddingDims is the length of a memory block's embedding.
const EmbeddingDims = 8

// AgentState is the checkpoint's agent_state.
type AgentState struct {
	ID      string         `msgpack:"id"`
	Name    string         `msgpack:"name"`
	Version string         `msgpack:"version"`
	Status  string         `msgpack:"status"`
	Context map[string]any `msgpack:"context,omitempty"`
}

// MemoryBlock is one entry of memory_blocks.
type MemoryBlock struct {
	ID          string         `msgpack:"id"`
	Text        string         `msgpack:"text"`
	Embedding   []float32      `msgpack:"embedding"`
	Metadata    map[string]any `msgpack:"metadata"`
	Importance  float64        `msgpack:"importance"`
	AccessCount int64          `msgpack:"access_count"`
	Created     int64          `msgpack:"created"`
}

// Tool is one entry of tool_registry.tools.
type Tool struct {
	Name   string   `msgpack:"name"`
	Params []string `msgpack:"params"`
	Doc    string   `msgpack:"doc"`
	Unsafe bool     `msgpack:"unsafe"`
}

// ToolRegistry is the checkpoint's tool_registry.
type ToolRegistry struct {
	Tools []Tool `msgpack:"tools"`
}

// Turn is one entry of conversation_history.
type Turn struct {
	Role      string `msgpack:"role"`
	Content   string `msgpack:"content"`
	Timestamp int64  `msgpack:"timestamp"`
}

// StateMetrics is the checkpoint's metrics: figures derived from applied
// WAL entries only, so a restore reproduces them.
type StateMetrics struct {
	TotalRequests int64   `msgpack:"total_requests"`
	AvgLatency    float64 `msgpack:"avg_latency"`
	ErrorCount    int64   `msgpack:"error_count"`
}

// State is the reference agent's whole state and the `data` of its
// checkpoints: the seed's checkpoint schema plus last_seq (the highest
// applied WAL sequence), chain (the running digest of every applied entry)
// and modules (module name → code loaded by hot_reload).
//
// Every change goes through [State.Apply], so a state rebuilt from a
// snapshot and the WAL after it equals the original, digest for digest.
type State struct {
	AgentState          AgentState        `msgpack:"agent_state"`
	MemoryBlocks        []MemoryBlock     `msgpack:"memory_blocks"`
	ToolRegistry        ToolRegistry      `msgpack:"tool_registry"`
	ConversationHistory []Turn            `msgpack:"conversation_history"`
	Metrics             StateMetrics      `msgpack:"metrics"`
	LastSeq             uint64            `msgpack:"last_seq"`
	Chain               string            `msgpack:"chain"`
	Modules             map[string]string `msgpack:"modules"`
}

// NewState returns the state of a reference agent that has applied nothing.
func NewState() *State {
	return &State{
		AgentState:          AgentState{ID: "refagent", Name: "reference-agent", Version: "1.0.0", Status: StatusIdle},
		MemoryBlocks:        []MemoryBlock{},
		ToolRegistry:        ToolRegistry{Tools: []Tool{}},
		ConversationHistory: []Turn{},
		Modules:             map[string]string{},
	}
}

// ErrSnapshot: a restore's snapshot is not a reference agent state.
var ErrSnapshot = errors.New("testagent: unusable snapshot")

// LoadSnapshot decodes a checkpoint's data (a restore's snapshot) into a
// State. Keys it does not know are ignored; keys it lacks keep NewState's
// values. The bytes must have passed schema's bounds walk (they have, when
// they came in a decoded restore).
func LoadSnapshot(raw []byte) (*State, error) {
	st := NewState()
	if err := msgpack.Unmarshal(raw, st); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	if st.Modules == nil {
		st.Modules = map[string]string{}
	}
	return st, nil
}

// Limits bound the state's growth; they are configuration, not state, so an
// agent restored with different limits ends in a different state.
type Limits struct {
	MemoryBlocks int // oldest blocks are evicted beyond this; 0 = unlimited
	History      int // oldest turns are dropped beyond this; 0 = unlimited
}

// Apply applies one WAL entry: operation op, sequence seq, and params, the
// entry's params bytes exactly as logged. It advances LastSeq and Chain.
// Apply is total: an unknown operation (one of the supervisor's extras)
// changes nothing but LastSeq and Chain, and ill-typed params take defaults,
// so replaying a logged entry never fails; only params that are not a
// MessagePack map are an error.
func (s *State) Apply(op string, seq uint64, params []byte, lim Limits) error {
	var mp memoryAddParams
	if op == schema.OpMemoryAdd && msgpack.Unmarshal(params, &mp) == nil {
		// The fast path for the common entry; any surprise in its types
		// falls back to the general one below, with the same result.
		s.memoryAdd(seq, mp, lim)
		s.countRequest(mp.RequestID, mp.LatencyMS, mp.Failed)
	} else {
		p, err := DecodeParams(params)
		if err != nil {
			return fmt.Errorf("testagent: entry %d: %w", seq, err)
		}
		switch op {
		case schema.OpMemoryAdd:
			content, _ := p["content"].(string)
			md, _ := p["metadata"].(map[string]any)
			turns, _ := p["turns"].([]any)
			s.memoryAdd(seq, memoryAddParams{Content: content, Metadata: md, Importance: p["importance"],
				Created: p["created"], Turns: turns}, lim)
		case schema.OpToolRegister:
			s.toolRegister(p)
		case schema.OpStateUpdate:
			s.stateUpdate(p)
		}
		s.countRequest(p["request_id"], p["latency_ms"], p["failed"])
	}
	s.LastSeq = seq
	s.Chain = ChainNext(s.Chain, op, seq, params)
	return nil
}

// memoryAddParams are a memory_add entry's params.
type memoryAddParams struct {
	Content    string         `msgpack:"content"`
	Metadata   map[string]any `msgpack:"metadata"`
	Importance any            `msgpack:"importance"`
	Created    any            `msgpack:"created"`
	Turns      []any          `msgpack:"turns"`
	RequestID  any            `msgpack:"request_id"`
	LatencyMS  any            `msgpack:"latency_ms"`
	Failed     any            `msgpack:"failed"`
}

// countRequest updates the state's metrics for an entry made by a request.
func (s *State) countRequest(requestID, latencyMS, failed any) {
	if id, _ := requestID.(string); id == "" {
		return
	}
	lat, _ := toFloat(latencyMS)
	n := s.Metrics.TotalRequests
	s.Metrics.AvgLatency = (s.Metrics.AvgLatency*float64(n) + lat) / float64(n+1)
	s.Metrics.TotalRequests = n + 1
	if f, _ := failed.(bool); f {
		s.Metrics.ErrorCount++
	}
}

func (s *State) memoryAdd(seq uint64, p memoryAddParams, lim Limits) {
	importance, ok := toFloat(p.Importance)
	if !ok {
		importance = 0.5
	}
	importance = math.Max(0, math.Min(1, importance))
	created, _ := toInt(p.Created)
	s.MemoryBlocks = append(s.MemoryBlocks, MemoryBlock{
		ID:         "mem-" + strconv.FormatUint(seq, 10),
		Text:       p.Content,
		Embedding:  Embed(p.Content),
		Metadata:   p.Metadata,
		Importance: importance,
		Created:    created,
	})
	if lim.MemoryBlocks > 0 && len(s.MemoryBlocks) > lim.MemoryBlocks {
		s.MemoryBlocks = dropOldest(s.MemoryBlocks, lim.MemoryBlocks)
	}
	if p.Turns == nil {
		return
	}
	for _, t := range p.Turns {
		tm, _ := t.(map[string]any)
		role, _ := tm["role"].(string)
		text, _ := tm["content"].(string)
		ts, _ := toInt(tm["timestamp"])
		s.ConversationHistory = append(s.ConversationHistory, Turn{Role: role, Content: text, Timestamp: ts})
	}
	if lim.History > 0 && len(s.ConversationHistory) > lim.History {
		s.ConversationHistory = dropOldest(s.ConversationHistory, lim.History)
	}
}

// dropOldest keeps the newest keep elements, in a fresh backing array once
// in a while so evicted elements are released.
func dropOldest[T any](s []T, keep int) []T {
	tail := s[len(s)-keep:]
	if cap(s) > 2*keep {
		return append(make([]T, 0, keep+keep/2), tail...)
	}
	return tail
}

func (s *State) toolRegister(p map[string]any) {
	name, _ := p["name"].(string)
	if name == "" {
		return
	}
	doc, _ := p["doc"].(string)
	unsafe, _ := p["unsafe"].(bool)
	var params []string
	if ps, ok := p["params"].([]any); ok {
		params = make([]string, 0, len(ps))
		for _, x := range ps {
			if str, ok := x.(string); ok {
				params = append(params, str)
			}
		}
	}
	t := Tool{Name: name, Params: params, Doc: doc, Unsafe: unsafe}
	for i := range s.ToolRegistry.Tools {
		if s.ToolRegistry.Tools[i].Name == name {
			s.ToolRegistry.Tools[i] = t
			return
		}
	}
	s.ToolRegistry.Tools = append(s.ToolRegistry.Tools, t)
}

func (s *State) stateUpdate(p map[string]any) {
	if st, _ := p["status"].(string); validStatus(st) {
		s.AgentState.Status = st
	}
	if c, ok := p["context"].(map[string]any); ok {
		s.AgentState.Context = c
	}
	if m, _ := p["module"].(string); m != "" {
		code, _ := p["code"].(string)
		if s.Modules == nil {
			s.Modules = map[string]string{}
		}
		s.Modules[m] = code
	}
}

func validStatus(s string) bool {
	switch s {
	case StatusIdle, StatusThinking, StatusActing, StatusEvolving:
		return true
	}
	return false
}

// Embed is the deterministic stand-in for an embedding model: the text's
// CRC-32C spread over EmbeddingDims numbers in [-1, 1] (splitmix64).
func Embed(text string) []float32 {
	x := uint64(crc32.Checksum(unsafe.Slice(unsafe.StringData(text), len(text)), castagnoli)) // read only
	out := make([]float32, EmbeddingDims)
	for i := range out {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		out[i] = float32(float64(z>>11)/float64(1<<53)*2 - 1)
	}
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChainNext is the next value of the running chain digest:
//
//	chain = hex(SHA-256(raw(prev) || [op, seq, params]))
//
// raw(prev) is the previous chain's 32 bytes (nothing before the first
// entry); [op, seq, params] is a MessagePack array of three: op as a
// string, seq as an unsigned integer in its most compact form, and params
// verbatim as logged. The supervisor keeps an entry's bytes, so a restored
// agent hashes exactly what the original hashed.
func ChainNext(prev, op string, seq uint64, params []byte) string {
	prevRaw, err := hex.DecodeString(prev)
	if err != nil {
		prevRaw = []byte(prev) // a foreign snapshot's chain: still deterministic
	}
	var head [64]byte
	b := append(head[:0], 0x93)
	b = schema.AppendStr(b, op)
	b = schema.AppendUint(b, seq)
	h := sha256.New()
	h.Write(prevRaw)
	h.Write(b)
	h.Write(params)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// MarshalCanonical encodes the state as the checkpoint data it sends:
// MessagePack, struct fields in declaration order, map keys sorted, integers
// in their most compact form. Equal states give equal bytes.
func (s *State) MarshalCanonical() ([]byte, error) {
	return schema.MarshalMap(s)
}

// Digest is the state_digest: hex SHA-256 of [State.MarshalCanonical].
func (s *State) Digest() (string, error) {
	b, err := s.MarshalCanonical()
	if err != nil {
		return "", err
	}
	return digestOf(b), nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// DecodeParams decodes a WAL entry's params bytes the way [State.Apply]
// expects them: nested maps as map[string]any, arrays as []any.
func DecodeParams(raw []byte) (map[string]any, error) {
	if len(raw) == 0 {
		return map[string]any{}, nil
	}
	var m map[string]any
	if err := msgpack.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("testagent: decode WAL params: %w", err)
	}
	if m == nil {
		m = map[string]any{}
	}
	return m, nil
}

// walRecord is a WAL entry as it travels in a restore.
type walRecord struct {
	Operation string             `msgpack:"operation"`
	Params    msgpack.RawMessage `msgpack:"params"`
	Sequence  uint64             `msgpack:"sequence"`
}

func decodeWALRecord(raw []byte) (walRecord, error) {
	var r walRecord
	if err := msgpack.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("testagent: decode WAL entry: %w", err)
	}
	if r.Sequence == 0 {
		return r, errors.New("testagent: WAL entry without a sequence")
	}
	return r, nil
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	}
	if i, ok := toInt(v); ok {
		return float64(i), true
	}
	return 0, false
}

func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n <= math.MaxInt64 {
			return int64(n), true
		}
	case uint:
		if uint64(n) <= math.MaxInt64 {
			return int64(n), true
		}
	}
	return 0, false
}
