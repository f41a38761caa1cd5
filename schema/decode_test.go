package schema_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/vmihailenco/msgpack/v5"
)

var params = obj(kv{"content", "User asked about weather"}, kv{"importance", 0.7})

func TestDecodeAgentMessages(t *testing.T) {
	checkpointData := obj(
		kv{"agent_state", obj(kv{"id", "a1"}, kv{"status", "thinking"})},
		kv{"memory_blocks", arr(obj(kv{"id", "m1"}, kv{"embedding", arr(float32(0.1), 0.2)}))},
		kv{int8(7), "non-string keys are fine inside data"},
	)
	rec1 := walRec("memory_add", uint16(12345), params)
	rec2 := walRec("tool_register", int64(12346), obj(kv{"name", "calculator"}))
	tests := []struct {
		name    string
		payload []byte
		want    schema.Message
	}{
		{
			name:    "heartbeat",
			payload: msg("heartbeat"),
			want:    &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000, Version: 1}},
		},
		{
			name:    "heartbeat with version, metadata and an unknown field",
			payload: msg("heartbeat", kv{"version", uint8(2)}, kv{"metadata", obj(kv{"k", "v"})}, kv{"future", arr(1, 2)}),
			want:    &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000, Version: 2, Metadata: msgpack.RawMessage(obj(kv{"k", "v"}))}},
		},
		{
			name:    "heartbeat with nil metadata and version",
			payload: msg("heartbeat", kv{"version", nil}, kv{"metadata", nil}),
			want:    &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000, Version: 1}},
		},
		{
			name:    "checkpoint",
			payload: msg("checkpoint", kv{"data", checkpointData}),
			want:    &schema.Checkpoint{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Data: msgpack.RawMessage(checkpointData), Status: "thinking"},
		},
		{
			name:    "checkpoint without agent_state",
			payload: msg("checkpoint", kv{"data", obj(kv{"x", 1})}),
			want:    &schema.Checkpoint{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Data: msgpack.RawMessage(obj(kv{"x", 1}))},
		},
		{
			name:    "wal_entry",
			payload: msg("wal_entry", kv{"data", rec1}),
			want: &schema.WALEntry{Header: schema.Header{Timestamp: 1705392000, Version: 1},
				Entry: schema.WALRecord{Operation: "memory_add", Sequence: 12345, Params: msgpack.RawMessage(params), Raw: msgpack.RawMessage(rec1)}},
		},
		{
			name:    "wal_batch",
			payload: msg("wal_batch", kv{"data", arr(rec1, rec2)}),
			want: &schema.WALBatch{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Entries: []schema.WALRecord{
				{Operation: "memory_add", Sequence: 12345, Params: msgpack.RawMessage(params), Raw: msgpack.RawMessage(rec1)},
				{Operation: "tool_register", Sequence: 12346, Params: msgpack.RawMessage(obj(kv{"name", "calculator"})), Raw: msgpack.RawMessage(rec2)},
			}},
		},
		{
			name: "evolution_intent",
			payload: msg("evolution_intent", kv{"hypothesis", obj(kv{"reason", "SIMD"}, kv{"target", "memory_system"}, kv{"new_code", "(def ...)"},
				kv{"expected_improvement", obj(kv{"latency", float32(-0.25)}, kv{"memory", int8(0)}, kv{"accuracy", 0.1})})}),
			want: &schema.EvolutionIntent{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Hypothesis: schema.Hypothesis{
				Reason: "SIMD", Target: "memory_system", NewCode: "(def ...)",
				ExpectedImprovement: map[string]float64{"latency": -0.25, "memory": 0, "accuracy": 0.1}}},
		},
		{
			name:    "evolution_intent without expected_improvement",
			payload: msg("evolution_intent", kv{"hypothesis", obj(kv{"reason", ""}, kv{"target", "t"}, kv{"new_code", "c"})}),
			want:    &schema.EvolutionIntent{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Hypothesis: schema.Hypothesis{Target: "t", NewCode: "c"}},
		},
		{
			name: "metrics in every number encoding",
			payload: msg("metrics", kv{"data", obj(kv{"avg_latency", 10.5}, kv{"p50_latency", float32(8)}, kv{"memory_usage", uint32(80000000)},
				kv{"throughput", uint64(1000)}, kv{"active_tools", int8(5)}, kv{"error_rate", 0.01}, kv{"custom_gauge", int64(-3)})}),
			want: &schema.Metrics{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Data: map[string]float64{
				"avg_latency": 10.5, "p50_latency": 8, "memory_usage": 80000000, "throughput": 1000, "active_tools": 5, "error_rate": 0.01, "custom_gauge": -3}},
		},
		{
			name:    "error from the agent",
			payload: msg("error", kv{"error", obj(kv{"code", "TOOL_FAILED"}, kv{"message", "boom"}, kv{"stack_trace", "at x"}, kv{"context", obj(kv{"tool", "calc"})})}),
			want: &schema.Error{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Error: schema.ErrorBody{
				Code: "TOOL_FAILED", Message: "boom", StackTrace: "at x", Context: msgpack.RawMessage(obj(kv{"tool", "calc"}))}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := schema.Decode(schema.FromAgent, tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func TestDecodeIntegerWidths(t *testing.T) {
	for _, ts := range []any{int8(100), int16(1000), int32(1705392000), int64(1705392000), uint8(200), uint16(60000), uint32(1705392000), uint64(1705392000), 5} {
		for _, seq := range []any{int8(1), int16(300), int32(70000), int64(1 << 40), uint8(255), uint16(65535), uint32(1 << 31), uint64(math.MaxInt64)} {
			p := obj(kv{"type", "wal_entry"}, kv{"timestamp", ts}, kv{"data", walRec("state_update", seq, obj())})
			m, err := schema.Decode(schema.FromAgent, p)
			if err != nil {
				t.Fatalf("timestamp %T, sequence %T: %v", ts, seq, err)
			}
			e := m.(*schema.WALEntry)
			if e.Timestamp != reflect.ValueOf(ts).Convert(reflect.TypeFor[int64]()).Int() {
				t.Errorf("timestamp %T(%v) decoded as %d", ts, ts, e.Timestamp)
			}
			if e.Entry.Sequence != reflect.ValueOf(seq).Convert(reflect.TypeFor[uint64]()).Uint() {
				t.Errorf("sequence %T(%v) decoded as %d", seq, seq, e.Entry.Sequence)
			}
		}
	}
}

func TestDecodeStringEncodings(t *testing.T) {
	for name, typ := range map[string]raw{"fixstr": enc("heartbeat"), "str8": raw(append([]byte{0xd9, 9}, "heartbeat"...)), "str16": str16("heartbeat"), "str32": str32("heartbeat")} {
		p := obj(kv{str32("type"), typ}, kv{str16("timestamp"), 1})
		if _, err := schema.Decode(schema.FromAgent, p); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Maps and arrays in their 16-bit encodings.
	p := raw(append([]byte{0xde, 0, 3}, append(append(enc("type"), enc("wal_batch")...), append(enc("timestamp"), 1)...)...))
	p = append(p, enc("data")...)
	p = append(p, 0xdc, 0, 1)
	p = append(p, walRec("memory_add", 1, raw{0xde, 0, 0})...)
	if _, err := schema.Decode(schema.FromAgent, p); err != nil {
		t.Errorf("map16/array16: %v", err)
	}
}

func TestDecodeExtraWALOperations(t *testing.T) {
	p := msg("wal_entry", kv{"data", walRec("file_write", 1, obj())})
	if _, err := schema.Decode(schema.FromAgent, p); schema.RuleOf(err) != schema.RuleFieldValue {
		t.Fatalf("default codec: got %v, want a field_value error", err)
	}
	c := schema.NewCodec(schema.Options{ExtraWALOperations: []string{"file_write", "", "memory_add"}})
	m, err := c.Decode(schema.FromAgent, p)
	if err != nil {
		t.Fatal(err)
	}
	if op := m.(*schema.WALEntry).Entry.Operation; op != "file_write" {
		t.Fatalf("operation %q", op)
	}
	if got := c.WALOperations(); !reflect.DeepEqual(got, []string{"memory_add", "tool_register", "state_update", "request_step", "request_done", "file_write"}) {
		t.Fatalf("WALOperations = %v", got)
	}
}

func TestDecodeAliasesPayload(t *testing.T) {
	p := msg("wal_entry", kv{"data", walRec("memory_add", 7, params)})
	m, err := schema.Decode(schema.FromAgent, p)
	if err != nil {
		t.Fatal(err)
	}
	r := m.(*schema.WALEntry).Entry.Raw
	if &r[0] != &p[len(p)-len(r)] {
		t.Fatal("Raw does not alias the payload (the documented contract)")
	}
}

// invalid describes a payload and the rule and field it must break.
type invalid struct {
	name    string
	dir     schema.Direction
	payload []byte
	rule    schema.Rule
	field   string
}

func TestDecodeInvalid(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 100), 0xc0)
	tooManyEntries := make([]any, 101)
	for i := range tooManyEntries {
		tooManyEntries[i] = walRec("memory_add", i+1, obj())
	}
	bigEntry := walRec("memory_add", 1, obj(kv{"x", strings.Repeat("a", 10<<10)}))
	zstdGarbage := []byte("definitely not zstd")
	tests := []invalid{
		{"empty payload", schema.FromAgent, nil, schema.RuleMalformed, ""},
		{"array32 claiming 2^32-1 elements", schema.FromAgent, []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, schema.RuleMalformed, ""},
		{"map32 claiming 2^32-1 pairs", schema.FromAgent, []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, schema.RuleMalformed, ""},
		{"bin32 claiming 4 GiB", schema.FromAgent, []byte{0xc6, 0xff, 0xff, 0xff, 0xff}, schema.RuleMalformed, ""},
		{"str32 claiming 4 GiB", schema.FromAgent, []byte{0xdb, 0xff, 0xff, 0xff, 0xff}, schema.RuleMalformed, ""},
		{"nesting 100 deep", schema.FromAgent, msg("heartbeat", kv{"x", raw(deep)}), schema.RuleMalformed, ""},
		{"trailing garbage after a valid map", schema.FromAgent, append(msg("heartbeat"), 0x01), schema.RuleMalformed, ""},
		{"two maps", schema.FromAgent, append(msg("heartbeat"), msg("heartbeat")...), schema.RuleMalformed, ""},
		{"payload is an array", schema.FromAgent, arr("heartbeat", 1), schema.RuleNotMap, ""},
		{"payload is a string", schema.FromAgent, enc("heartbeat"), schema.RuleNotMap, ""},
		{"payload is nil", schema.FromAgent, []byte{0xc0}, schema.RuleNotMap, ""},
		{"map with non-string keys", schema.FromAgent, obj(kv{1, "heartbeat"}, kv{"timestamp", 1}), schema.RuleNotMap, ""},
		{"map with a binary key", schema.FromAgent, obj(kv{[]byte("type"), "heartbeat"}, kv{"timestamp", 1}), schema.RuleNotMap, ""},
		{"duplicate type key", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"type", "checkpoint"}, kv{"timestamp", 1}), schema.RuleMalformed, "type"},
		{"type missing", schema.FromAgent, obj(kv{"timestamp", 1}), schema.RuleMissingField, "type"},
		{"type not a string", schema.FromAgent, obj(kv{"type", 3}, kv{"timestamp", 1}), schema.RuleFieldType, "type"},
		{"type as binary", schema.FromAgent, obj(kv{"type", []byte("heartbeat")}, kv{"timestamp", 1}), schema.RuleFieldType, "type"},
		{"type empty", schema.FromAgent, msg(""), schema.RuleUnknownType, "type"},
		{"type unknown", schema.FromAgent, msg("telemetry"), schema.RuleUnknownType, "type"},
		{"agent-bound type sent by the agent", schema.FromAgent, msg("checkpoint_ack", kv{"checkpoint_id", "x"}, kv{"size", 1}), schema.RuleWrongDirection, "type"},
		{"restore sent by the agent", schema.FromAgent, msg("restore"), schema.RuleWrongDirection, "type"},
		{"agent type sent to the agent", schema.ToAgent, msg("heartbeat"), schema.RuleWrongDirection, "type"},
		{"timestamp missing", schema.FromAgent, obj(kv{"type", "heartbeat"}), schema.RuleMissingField, "timestamp"},
		{"timestamp as a string", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"timestamp", "1705392000"}), schema.RuleFieldType, "timestamp"},
		{"timestamp as a float", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"timestamp", 1705392000.0}), schema.RuleFieldType, "timestamp"},
		{"timestamp as a float32", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"timestamp", float32(1)}), schema.RuleFieldType, "timestamp"},
		{"timestamp nil", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"timestamp", nil}), schema.RuleFieldType, "timestamp"},
		{"timestamp above int64", schema.FromAgent, obj(kv{"type", "heartbeat"}, kv{"timestamp", uint64(math.MaxUint64)}), schema.RuleFieldValue, "timestamp"},
		{"version 0", schema.FromAgent, msg("heartbeat", kv{"version", 0}), schema.RuleFieldValue, "version"},
		{"version as a string", schema.FromAgent, msg("heartbeat", kv{"version", "2"}), schema.RuleFieldType, "version"},
		{"metadata not a map", schema.FromAgent, msg("heartbeat", kv{"metadata", arr()}), schema.RuleFieldType, "metadata"},
		{"heartbeat over 100 bytes", schema.FromAgent, msg("heartbeat", kv{"pad", strings.Repeat("x", 80)}), schema.RuleTooLarge, ""},
		{"heartbeat compressed", schema.FromAgent, msg("heartbeat", kv{"compressed", true}), schema.RuleCompression, "compressed"},

		{"checkpoint without data", schema.FromAgent, msg("checkpoint"), schema.RuleMissingField, "data"},
		{"checkpoint data not a map", schema.FromAgent, msg("checkpoint", kv{"data", arr()}), schema.RuleFieldType, "data"},
		{"checkpoint agent_state not a map", schema.FromAgent, msg("checkpoint", kv{"data", obj(kv{"agent_state", "idle"})}), schema.RuleFieldType, "data.agent_state"},
		{"checkpoint status unknown", schema.FromAgent, msg("checkpoint", kv{"data", obj(kv{"agent_state", obj(kv{"status", "sleeping"})})}), schema.RuleFieldValue, "data.agent_state.status"},
		{"checkpoint status not a string", schema.FromAgent, msg("checkpoint", kv{"data", obj(kv{"agent_state", obj(kv{"status", 1})})}), schema.RuleFieldType, "data.agent_state.status"},

		{"wal_entry without data", schema.FromAgent, msg("wal_entry"), schema.RuleMissingField, "data"},
		{"wal_entry data not a map", schema.FromAgent, msg("wal_entry", kv{"data", "x"}), schema.RuleFieldType, "data"},
		{"wal_entry sequence 0", schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", 0, obj())}), schema.RuleFieldValue, "data.sequence"},
		{"wal_entry sequence negative", schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", int8(-5), obj())}), schema.RuleFieldValue, "data.sequence"},
		{"wal_entry sequence above int64", schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", uint64(math.MaxInt64)+1, obj())}), schema.RuleFieldValue, "data.sequence"},
		{"wal_entry sequence a float", schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", 1.0, obj())}), schema.RuleFieldType, "data.sequence"},
		{"wal_entry sequence missing", schema.FromAgent, msg("wal_entry", kv{"data", obj(kv{"operation", "memory_add"}, kv{"params", obj()})}), schema.RuleMissingField, "data.sequence"},
		{"wal_entry params not a map", schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", 1, arr(1))}), schema.RuleFieldType, "data.params"},
		{"wal_entry params missing", schema.FromAgent, msg("wal_entry", kv{"data", obj(kv{"operation", "memory_add"}, kv{"sequence", 1})}), schema.RuleMissingField, "data.params"},
		{"wal_entry operation unknown", schema.FromAgent, msg("wal_entry", kv{"data", walRec("rm_rf", 1, obj())}), schema.RuleFieldValue, "data.operation"},
		{"wal_entry operation missing", schema.FromAgent, msg("wal_entry", kv{"data", obj(kv{"params", obj()}, kv{"sequence", 1})}), schema.RuleMissingField, "data.operation"},
		{"wal_entry operation not a string", schema.FromAgent, msg("wal_entry", kv{"data", walRec2(1, 1)}), schema.RuleFieldType, "data.operation"},
		{"wal_entry duplicate sequence key", schema.FromAgent, msg("wal_entry", kv{"data", obj(kv{"operation", "memory_add"}, kv{"params", obj()}, kv{"sequence", 1}, kv{"sequence", 2})}), schema.RuleMalformed, "data.sequence"},
		{"wal_entry over 10 KiB", schema.FromAgent, msg("wal_entry", kv{"data", bigEntry}), schema.RuleTooLarge, ""},

		{"wal_batch empty", schema.FromAgent, msg("wal_batch", kv{"data", arr()}), schema.RuleFieldValue, "data"},
		{"wal_batch with 101 entries", schema.FromAgent, msg("wal_batch", kv{"data", arr(tooManyEntries...)}), schema.RuleTooLarge, "data"},
		{"wal_batch data a map", schema.FromAgent, msg("wal_batch", kv{"data", obj()}), schema.RuleFieldType, "data"},
		{"wal_batch bad third entry", schema.FromAgent, msg("wal_batch", kv{"data", arr(walRec("memory_add", 1, obj()), walRec("memory_add", 2, obj()), walRec("memory_add", 3, "p"))}), schema.RuleFieldType, "data[2].params"},
		{"wal_batch entry over 10 KiB", schema.FromAgent, msg("wal_batch", kv{"data", arr(walRec("memory_add", 1, obj()), bigEntry)}), schema.RuleTooLarge, "data[1]"},

		{"evolution_intent without hypothesis", schema.FromAgent, msg("evolution_intent"), schema.RuleMissingField, "hypothesis"},
		{"evolution_intent new_code not a string", schema.FromAgent, msg("evolution_intent", kv{"hypothesis", obj(kv{"reason", "r"}, kv{"target", "t"}, kv{"new_code", 1})}), schema.RuleFieldType, "hypothesis.new_code"},
		{"evolution_intent target empty", schema.FromAgent, msg("evolution_intent", kv{"hypothesis", obj(kv{"reason", "r"}, kv{"target", ""}, kv{"new_code", "c"})}), schema.RuleFieldValue, "hypothesis.target"},
		{"evolution_intent improvement not numbers", schema.FromAgent, msg("evolution_intent", kv{"hypothesis", obj(kv{"reason", "r"}, kv{"target", "t"}, kv{"new_code", "c"}, kv{"expected_improvement", obj(kv{"latency", "fast"})})}), schema.RuleFieldType, "hypothesis.expected_improvement.latency"},

		{"metrics value a string", schema.FromAgent, msg("metrics", kv{"data", obj(kv{"avg_latency", "10"})}), schema.RuleFieldType, "data.avg_latency"},
		{"metrics NaN", schema.FromAgent, msg("metrics", kv{"data", obj(kv{"avg_latency", math.NaN()})}), schema.RuleFieldValue, "data.avg_latency"},
		{"metrics error_rate above 1", schema.FromAgent, msg("metrics", kv{"data", obj(kv{"error_rate", 1.5})}), schema.RuleFieldValue, "data.error_rate"},
		{"metrics negative latency", schema.FromAgent, msg("metrics", kv{"data", obj(kv{"p99_latency", -1})}), schema.RuleFieldValue, "data.p99_latency"},
		{"metrics non-string key", schema.FromAgent, msg("metrics", kv{"data", obj(kv{1, 1})}), schema.RuleFieldType, "data"},
		{"metrics over 10 KiB", schema.FromAgent, msg("metrics", kv{"data", obj(kv{strings.Repeat("k", 11<<10), 1})}), schema.RuleTooLarge, ""},

		{"error without error", schema.FromAgent, msg("error"), schema.RuleMissingField, "error"},
		{"error without code", schema.FromAgent, msg("error", kv{"error", obj(kv{"message", "m"})}), schema.RuleMissingField, "error.code"},
		{"error message not a string", schema.FromAgent, msg("error", kv{"error", obj(kv{"code", "C"}, kv{"message", 1})}), schema.RuleFieldType, "error.message"},

		{"compression gzip", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "gzip"}, kv{"data", bin([]byte{1})}), schema.RuleCompression, "compression"},
		{"compression missing", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"data", bin([]byte{1})}), schema.RuleCompression, "compression"},
		{"compressed not a bool", schema.FromAgent, msg("checkpoint", kv{"compressed", "yes"}, kv{"data", obj()}), schema.RuleFieldType, "compressed"},
		{"compressed body not zstd", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdGarbage)}), schema.RuleCompression, "data"},
		{"compressed body not base64", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", "%%%"}), schema.RuleCompression, "data"},
		{"compressed body a map", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", obj()}), schema.RuleCompression, "data"},
		{"compressed body missing", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}), schema.RuleMissingField, "data"},
		{"compressed body decompresses to garbage", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdBytes(t, []byte{0xdd, 0xff, 0xff, 0xff, 0xff}))}), schema.RuleMalformed, "data"},
		{"compressed body decompresses to an array", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdBytes(t, arr()))}), schema.RuleFieldType, "data"},
		{"compressed wal_entry over 10 KiB", schema.FromAgent, msg("wal_entry", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdStream(t, bigEntry))}), schema.RuleCompression, "data"},
		{"compressed evolution_intent", schema.FromAgent, msg("evolution_intent", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"hypothesis", obj()}), schema.RuleCompression, "compressed"},

		{"checkpoint_ack without size", schema.ToAgent, msg("checkpoint_ack", kv{"checkpoint_id", "x"}), schema.RuleMissingField, "size"},
		{"checkpoint_ack negative size", schema.ToAgent, msg("checkpoint_ack", kv{"checkpoint_id", "x"}, kv{"size", -1}), schema.RuleFieldValue, "size"},
		{"restore snapshot not a map", schema.ToAgent, msg("restore", kv{"checkpoint_id", ""}, kv{"snapshot", arr()}), schema.RuleFieldType, "snapshot"},
		{"restore wal entry not a map", schema.ToAgent, msg("restore", kv{"checkpoint_id", ""}, kv{"snapshot", obj()}, kv{"wal_entries", arr(1)}), schema.RuleFieldType, "wal_entries[0]"},
		{"restore wal entry sequence 0", schema.ToAgent, msg("restore", kv{"checkpoint_id", ""}, kv{"snapshot", obj()}, kv{"wal_entries", arr(walRec("x", 0, obj()))}), schema.RuleFieldValue, "wal_entries[0].sequence"},
		{"hot_reload without code", schema.ToAgent, msg("hot_reload", kv{"module", "m"}), schema.RuleMissingField, "code"},
		{"evolution_result decision unknown", schema.ToAgent, msg("evolution_result", kv{"success", true}, kv{"decision", "maybe"}), schema.RuleFieldValue, "decision"},
		{"evolution_result success contradicts decision", schema.ToAgent, msg("evolution_result", kv{"success", true}, kv{"decision", "rejected"}), schema.RuleFieldValue, "decision"},
		{"evolution_result success not a bool", schema.ToAgent, msg("evolution_result", kv{"success", 1}, kv{"decision", "promoted"}), schema.RuleFieldType, "success"},
		{"process_request without data", schema.ToAgent, msg("process_request", kv{"request_id", "r"}), schema.RuleMissingField, "data"},
		{"process_request message missing", schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"data", obj()}), schema.RuleMissingField, "data.message"},
		{"shutdown create_checkpoint not a bool", schema.ToAgent, msg("shutdown", kv{"create_checkpoint", "yes"}), schema.RuleFieldType, "create_checkpoint"},
	}
	runInvalid(t, schema.NewCodec(schema.Options{}), tests)
}

func walRec2(op any, seq any) raw {
	return obj(kv{"operation", op}, kv{"params", obj()}, kv{"sequence", seq})
}

func runInvalid(t *testing.T, c *schema.Codec, tests []invalid) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := c.Decode(tt.dir, tt.payload)
			if err == nil {
				t.Fatalf("accepted: %#v", m)
			}
			if m != nil {
				t.Errorf("returned a message with the error")
			}
			var ve *schema.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
			}
			if !errors.Is(err, schema.ErrInvalidMessage) {
				t.Errorf("error does not unwrap to ErrInvalidMessage")
			}
			if ve.Rule != tt.rule || ve.Field != tt.field {
				t.Fatalf("got rule %q field %q, want rule %q field %q\n(%v)", ve.Rule, ve.Field, tt.rule, tt.field, err)
			}
			if ve.Reason == "" {
				t.Errorf("no reason given")
			}
		})
	}
}

func TestDecodeCompressed(t *testing.T) {
	data := obj(kv{"agent_state", obj(kv{"status", "idle"})}, kv{"blob", strings.Repeat("state ", 1000)})
	z := zstdBytes(t, data)
	for name, body := range map[string]raw{
		"bin":                     bin(z),
		"base64 str":              enc(base64.StdEncoding.EncodeToString(z)),
		"unpadded base64 str":     enc(base64.RawStdEncoding.EncodeToString(z)),
		"streamed, no size":       bin(zstdStream(t, data)),
		"two concatenated frames": bin(append(zstdBytes(t, data[:10]), zstdBytes(t, data[10:])...)),
	} {
		t.Run(name, func(t *testing.T) {
			p := msg("checkpoint", kv{"version", 2}, kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", body})
			m, err := schema.Decode(schema.FromAgent, p)
			if err != nil {
				t.Fatal(err)
			}
			cp := m.(*schema.Checkpoint)
			if !cp.Compress || cp.Status != "idle" || !bytes.Equal(cp.Data, data) {
				t.Fatalf("got compress=%v status=%q data %d bytes", cp.Compress, cp.Status, len(cp.Data))
			}
		})
	}
	t.Run("compressed false is plain", func(t *testing.T) {
		p := msg("checkpoint", kv{"compressed", false}, kv{"compression", "gzip"}, kv{"data", data})
		m, err := schema.Decode(schema.FromAgent, p)
		if err != nil {
			t.Fatal(err)
		}
		if m.(*schema.Checkpoint).Compress {
			t.Fatal("Compress set")
		}
	})
	t.Run("wal_batch", func(t *testing.T) {
		entries := arr(walRec("memory_add", 1, obj()), walRec("memory_add", 2, obj()))
		p := msg("wal_batch", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdBytes(t, entries))})
		m, err := schema.Decode(schema.FromAgent, p)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(m.(*schema.WALBatch).Entries); n != 2 {
			t.Fatalf("%d entries", n)
		}
	})
}

// TestDecompressionBounded: bodies that inflate past the type's limit are
// payload errors, whether or not the zstd frame declares its size.
func TestDecompressionBounded(t *testing.T) {
	c := schema.NewCodec(schema.Options{Limits: schema.Limits{Checkpoint: 1 << 20}})
	over := obj(kv{"blob", bytes.Repeat([]byte{0}, 1<<20)})
	frame := zstdBytes(t, obj(kv{"blob", bytes.Repeat([]byte{0}, 512<<10)}))
	var many []byte // 64 frames of 512 KiB each: 32 MiB from a few KiB
	for range 64 {
		many = append(many, frame...)
	}
	runInvalid(t, c, []invalid{
		{"declared size over the limit", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdBytes(t, over))}), schema.RuleCompression, "data"},
		{"undeclared size over the limit", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdStream(t, over))}), schema.RuleCompression, "data"},
		{"concatenated frames over the limit", schema.FromAgent, msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(many)}), schema.RuleCompression, "data"},
		{"restore snapshot over the limit", schema.ToAgent, msg("restore", kv{"checkpoint_id", "c"}, kv{"compressed", true}, kv{"compression", "zstd"}, kv{"snapshot", bin(zstdStream(t, over))}), schema.RuleCompression, "snapshot"},
	})
}

func TestDecodeSupervisorMessages(t *testing.T) {
	snap := obj(kv{"agent_state", obj(kv{"status", "idle"})})
	rec := walRec("custom_op", uint32(9), obj())
	tests := []struct {
		name    string
		payload []byte
		want    schema.Message
	}{
		{"checkpoint_ack", msg("checkpoint_ack", kv{"checkpoint_id", "550e8400"}, kv{"size", uint32(1024000)}),
			&schema.CheckpointAck{Header: schema.Header{Timestamp: 1705392000, Version: 1}, CheckpointID: "550e8400", Size: 1024000}},
		{"restore (custom operations pass: the supervisor checked them)", msg("restore", kv{"checkpoint_id", "c1"}, kv{"snapshot", snap}, kv{"wal_entries", arr(rec)}),
			&schema.Restore{Header: schema.Header{Timestamp: 1705392000, Version: 1}, CheckpointID: "c1", Snapshot: msgpack.RawMessage(snap), WALEntries: []msgpack.RawMessage{msgpack.RawMessage(rec)}}},
		{"restore without wal_entries", msg("restore", kv{"checkpoint_id", ""}, kv{"snapshot", obj()}),
			&schema.Restore{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Snapshot: msgpack.RawMessage(obj())}},
		{"hot_reload", msg("hot_reload", kv{"code", "latency_ms=5"}, kv{"module", "memory"}, kv{"backup_checkpoint_id", "b"}),
			&schema.HotReload{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Code: "latency_ms=5", Module: "memory", BackupCheckpointID: "b"}},
		{"evolution_result", msg("evolution_result", kv{"success", false}, kv{"decision", "rejected"}, kv{"metrics", obj(kv{"latency_improvement", float32(0.25)})}, kv{"reason", "slower"}),
			&schema.EvolutionResult{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Decision: "rejected", Metrics: map[string]float64{"latency_improvement": 0.25}, Reason: "slower"}},
		{"process_request", msg("process_request", kv{"request_id", "r1"}, kv{"data", obj(kv{"message", "hi"}, kv{"context", obj()}, kv{"user_id", "u"})}),
			&schema.ProcessRequest{Header: schema.Header{Timestamp: 1705392000, Version: 1}, RequestID: "r1", Data: schema.RequestData{Message: "hi", Context: msgpack.RawMessage(obj()), UserID: "u"}}},
		{"shutdown", msg("shutdown", kv{"reason", "SIGTERM"}, kv{"create_checkpoint", true}),
			&schema.Shutdown{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Reason: "SIGTERM", CreateCheckpoint: true}},
		{"shutdown bare", msg("shutdown"), &schema.Shutdown{Header: schema.Header{Timestamp: 1705392000, Version: 1}}},
		{"error to the agent", msg("error", kv{"error", obj(kv{"code", "WAL_FULL"}, kv{"message", "disk full"}, kv{"details", obj(kv{"free", 0})})}),
			&schema.Error{Header: schema.Header{Timestamp: 1705392000, Version: 1}, Error: schema.ErrorBody{Code: "WAL_FULL", Message: "disk full", Details: msgpack.RawMessage(obj(kv{"free", 0}))}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := schema.Decode(schema.ToAgent, tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
}
