package testagent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
)

func mustApply(t testing.TB, s *State, op string, seq uint64, params map[string]any, lim Limits) {
	t.Helper()
	raw, err := schema.MarshalMap(params)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(op, seq, raw, lim); err != nil {
		t.Fatal(err)
	}
}

func TestChainDefinition(t *testing.T) {
	s := NewState()
	mustApply(t, s, schema.OpMemoryAdd, 1, map[string]any{"content": "hi"}, Limits{})
	// ["memory_add", 1, {"content": "hi"}] in MessagePack, after an empty chain.
	entry := []byte{0x93, 0xaa}
	entry = append(entry, "memory_add"...)
	entry = append(entry, 0x01, 0x81, 0xa7)
	entry = append(entry, "content"...)
	entry = append(entry, 0xa2, 'h', 'i')
	sum := sha256.Sum256(entry)
	first := hex.EncodeToString(sum[:])
	if s.Chain != first {
		t.Fatalf("chain after one entry = %s, want %s", s.Chain, first)
	}
	mustApply(t, s, schema.OpStateUpdate, 2, map[string]any{"status": "acting"}, Limits{})
	prev, _ := hex.DecodeString(first)
	entry = []byte{0x93, 0xac}
	entry = append(entry, "state_update"...)
	entry = append(entry, 0x02, 0x81, 0xa6)
	entry = append(entry, "status"...)
	entry = append(entry, 0xa6)
	entry = append(entry, "acting"...)
	sum = sha256.Sum256(append(prev, entry...))
	if want := hex.EncodeToString(sum[:]); s.Chain != want {
		t.Fatalf("chain after two entries = %s, want %s", s.Chain, want)
	}
	if s.LastSeq != 2 || s.AgentState.Status != StatusActing {
		t.Errorf("state = seq %d status %s", s.LastSeq, s.AgentState.Status)
	}
}

func TestStateApplyAndRoundTrip(t *testing.T) {
	s := NewState()
	lim := Limits{MemoryBlocks: 10, History: 4}
	for i := range 15 {
		mustApply(t, s, schema.OpMemoryAdd, uint64(i+1), map[string]any{
			"content": fmt.Sprintf("note %d", i+1), "importance": 7, "created": 1705392000 + i,
			"metadata": map[string]any{"n": i, "tags": []any{"a", "b"}, "f32": float32(0.25)},
			"turns":    []any{map[string]any{"role": "user", "content": "q", "timestamp": 1}},
		}, lim)
	}
	mustApply(t, s, schema.OpToolRegister, 16, map[string]any{"name": "calc", "params": []any{"expr", 3}, "doc": "math"}, lim)
	mustApply(t, s, schema.OpToolRegister, 17, map[string]any{"name": "calc", "params": []any{"expression"}, "doc": "v2"}, lim)
	mustApply(t, s, schema.OpStateUpdate, 18, map[string]any{"status": "bogus", "context": map[string]any{"task": "x"}}, lim)
	mustApply(t, s, schema.OpStateUpdate, 19, map[string]any{"module": "memory", "code": "latency_ms=1"}, lim)
	mustApply(t, s, "custom_op", 21, map[string]any{"anything": true}, lim) // an extra op: a gap is allowed
	mustApply(t, s, schema.OpMemoryAdd, 22, map[string]any{"content": "req", "request_id": "r", "latency_ms": 4.0, "failed": true}, lim)

	if len(s.MemoryBlocks) != 10 || s.MemoryBlocks[0].ID != "mem-7" || s.MemoryBlocks[9].ID != "mem-22" {
		t.Errorf("memory blocks: %d, first %s, last %s; want 10 from mem-7 to mem-22",
			len(s.MemoryBlocks), s.MemoryBlocks[0].ID, s.MemoryBlocks[len(s.MemoryBlocks)-1].ID)
	}
	if b := s.MemoryBlocks[0]; b.Importance != 1 || len(b.Embedding) != EmbeddingDims {
		t.Errorf("block = importance %v (clamped to 1), %d dims", b.Importance, len(b.Embedding))
	}
	if len(s.ConversationHistory) != 4 {
		t.Errorf("history = %d turns, want the newest 4", len(s.ConversationHistory))
	}
	if tools := s.ToolRegistry.Tools; len(tools) != 1 || tools[0].Doc != "v2" || len(tools[0].Params) != 1 {
		t.Errorf("tools = %+v, want calc replaced by v2", tools)
	}
	if s.AgentState.Status != StatusIdle || s.AgentState.Context["task"] != "x" {
		t.Errorf("agent_state = %+v: an invalid status is ignored, the context kept", s.AgentState)
	}
	if s.Modules["memory"] != "latency_ms=1" || s.LastSeq != 22 {
		t.Errorf("modules %v, last_seq %d", s.Modules, s.LastSeq)
	}
	if m := s.Metrics; m.TotalRequests != 1 || m.AvgLatency != 4 || m.ErrorCount != 1 {
		t.Errorf("metrics = %+v", m)
	}

	b1, err := s.MarshalCanonical()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadSnapshot(b1)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := loaded.MarshalCanonical()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatal("a loaded snapshot does not encode to the bytes it was loaded from")
	}
	// And both go on identically.
	next := map[string]any{"content": "after", "created": 1}
	mustApply(t, s, schema.OpMemoryAdd, 23, next, lim)
	mustApply(t, loaded, schema.OpMemoryAdd, 23, next, lim)
	d1, _ := s.Digest()
	d2, _ := loaded.Digest()
	if d1 != d2 || s.Chain != loaded.Chain {
		t.Errorf("diverged after one more entry: %s/%s vs %s/%s", d1, s.Chain, d2, loaded.Chain)
	}
}

func TestEmbed(t *testing.T) {
	a, b := Embed("hello"), Embed("hello")
	if len(a) != EmbeddingDims || fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("Embed is not deterministic: %v %v", a, b)
	}
	for _, x := range a {
		if x < -1 || x > 1 {
			t.Errorf("component %v outside [-1, 1]", x)
		}
	}
	if fmt.Sprint(Embed("hello")) == fmt.Sprint(Embed("world")) {
		t.Error("different texts, same embedding")
	}
}

func TestLoadSnapshotErrors(t *testing.T) {
	for _, snap := range [][]byte{
		schema.RawMap(map[string]any{"memory_blocks": "nope"}),
		schema.RawMap(map[string]any{"last_seq": "ten"}),
		{0x93, 1, 2, 3},
	} {
		if _, err := LoadSnapshot(snap); err == nil {
			t.Errorf("LoadSnapshot(%x) succeeded", snap)
		}
	}
	st, err := LoadSnapshot(schema.RawMap(map[string]any{"foreign": 1, "last_seq": 9}))
	if err != nil || st.LastSeq != 9 || st.AgentState.ID != "refagent" {
		t.Errorf("foreign keys: %+v, %v; want them ignored and defaults kept", st, err)
	}
}

func TestSelfParamsAreCanonical(t *testing.T) {
	for _, tc := range []struct {
		seq     uint64
		created int64
		padding string
	}{
		{1, 0, ""}, {127, 1705392000, "x"}, {128, -5, strings.Repeat("x", 40)},
		{1 << 40, 1 << 33, strings.Repeat("x", 300)}, {99999, -200, strings.Repeat("x", 70000)},
	} {
		content := fmt.Sprintf("self-driven note %d", tc.seq)
		if tc.padding != "" {
			content += " " + tc.padding
		}
		want, err := schema.MarshalMap(map[string]any{
			"content": content, "metadata": map[string]any{"source": "self"}, "importance": 0.5, "created": tc.created,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := selfParams(nil, tc.seq, tc.created, tc.padding); !bytes.Equal(got, want) {
			t.Errorf("seq %d created %d padding %d: hand-encoded params differ from the canonical encoding\n got %x\nwant %x",
				tc.seq, tc.created, len(tc.padding), got[:min(len(got), 64)], want[:min(len(want), 64)])
		}
	}
}
