package schema_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/klauspost/compress/zstd"
	"github.com/vmihailenco/msgpack/v5"
)

// allMessages returns one filled-in message of every type, with the
// direction it travels.
func allMessages() []struct {
	dir schema.Direction
	m   schema.Message
} {
	h := schema.Header{Timestamp: 1705392000, Version: 2, Metadata: schema.RawMap(map[string]any{"trace": "t-1"})}
	rec := schema.WALRecord{Operation: "memory_add", Sequence: 12345, Params: schema.RawMap(map[string]any{"content": "hi", "importance": 0.7})}
	type pair = struct {
		dir schema.Direction
		m   schema.Message
	}
	return []pair{
		{schema.FromAgent, &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000}}},
		{schema.FromAgent, &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000}, Accepts: []string{schema.TypeCancelRequest}}},
		{schema.FromAgent, &schema.Checkpoint{Header: h, Data: schema.RawMap(map[string]any{"agent_state": map[string]any{"status": "acting"}}), Status: "acting"}},
		{schema.FromAgent, &schema.Checkpoint{Header: h, Data: schema.RawMap(map[string]any{"blob": strings.Repeat("z", 5000)}), Compress: true}},
		{schema.FromAgent, &schema.WALEntry{Header: h, Entry: rec}},
		{schema.FromAgent, &schema.WALBatch{Header: h, Entries: []schema.WALRecord{rec, {Operation: "state_update", Sequence: 12346}}}},
		{schema.FromAgent, &schema.EvolutionIntent{Header: h, Hypothesis: schema.Hypothesis{Reason: "r", Target: "memory_system", NewCode: "latency_ms=3", ExpectedImprovement: map[string]float64{"latency": -0.2}}}},
		{schema.FromAgent, &schema.Metrics{Header: h, Data: map[string]float64{"avg_latency": 10.5, "memory_usage": 8e7, "error_rate": 0.01}}},
		{schema.FromAgent, &schema.Error{Header: h, Error: schema.ErrorBody{Code: "EVAL_ERROR", Message: "bad", StackTrace: "trace", Context: schema.RawMap(map[string]any{"k": 1})}}},
		{schema.ToAgent, &schema.CheckpointAck{Header: h, CheckpointID: "01890a5d-ac96-774b-bcce-b302099a8057", Size: 1024000}},
		{schema.ToAgent, &schema.Restore{Header: h, CheckpointID: "c1", Snapshot: schema.RawMap(map[string]any{"a": 1}), WALEntries: []msgpack.RawMessage{schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{}, "sequence": 1})}}},
		{schema.ToAgent, &schema.Restore{Header: h, CheckpointID: "c2", Snapshot: schema.RawMap(map[string]any{"blob": strings.Repeat("y", 5000)}), Compress: true}},
		{schema.ToAgent, &schema.HotReload{Header: h, Code: "latency_ms=5", Module: "memory", BackupCheckpointID: "b"}},
		{schema.ToAgent, &schema.EvolutionResult{Header: h, Success: true, Decision: "promoted", Metrics: map[string]float64{"latency_improvement": -0.15}, Reason: "faster"}},
		{schema.ToAgent, &schema.ProcessRequest{Header: h, RequestID: "r1", Data: schema.RequestData{Message: "hello", Context: schema.RawMap(map[string]any{"x": true}), UserID: "u1"}}},
		{schema.ToAgent, &schema.ProcessRequest{Header: h, RequestID: "r2", Data: schema.RequestData{Message: "again"}, Attempt: 3}},
		{schema.ToAgent, &schema.Shutdown{Header: h, Reason: "SIGTERM", CreateCheckpoint: true}},
		{schema.ToAgent, &schema.CancelRequest{Header: h, RequestID: "r1"}},
		{schema.FromAgent, &schema.RequestResult{Header: h, RequestID: "r1", Data: schema.RawMap(map[string]any{"answer": 42})}},
		{schema.ToAgent, &schema.WALAck{Header: h, Sequence: 12345}},
		{schema.ToAgent, &schema.Error{Header: h, Error: schema.ErrorBody{Code: "WAL_FULL", Message: "disk full", Details: schema.RawMap(map[string]any{"free": 0})}}},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, tt := range allMessages() {
		t.Run(tt.m.MessageType(), func(t *testing.T) {
			b, err := schema.Encode(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := schema.Decode(tt.dir, b)
			if err != nil {
				t.Fatal(err)
			}
			want := normalize(tt.m)
			if !reflect.DeepEqual(normalize(got), want) {
				t.Fatalf("round trip changed the message:\ngot  %#v\nwant %#v", got, want)
			}
			// Decoding and encoding again is stable (Decode fills in
			// version 1, so compare from the first re-encoding); compressed
			// bodies are left out, zstd output need not be identical.
			b2, err := schema.Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			got2, err := schema.Decode(tt.dir, b2)
			if err != nil {
				t.Fatal(err)
			}
			b3, err := schema.Encode(got2)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b2, b3) && !isCompressed(tt.m) {
				t.Fatalf("re-encoding differs:\n% x\n% x", b2, b3)
			}
			if tt.m.Head().Version != 0 && !bytes.Equal(b, b2) && !isCompressed(tt.m) {
				t.Fatalf("re-encoding differs from the original:\n% x\n% x", b, b2)
			}
		})
	}
}

func isCompressed(m schema.Message) bool {
	switch m := m.(type) {
	case *schema.Checkpoint:
		return m.Compress
	case *schema.Restore:
		return m.Compress
	}
	return false
}

// normalize fills in what decoding adds: Version 1 when absent, WAL Raw
// bytes, empty slices.
func normalize(m schema.Message) schema.Message {
	v := reflect.New(reflect.TypeOf(m).Elem())
	v.Elem().Set(reflect.ValueOf(m).Elem())
	c := v.Interface().(schema.Message)
	if c.Head().Version == 0 {
		c.Head().Version = 1
	}
	switch c := c.(type) {
	case *schema.WALEntry:
		c.Entry.Raw = nil
	case *schema.WALBatch:
		entries := make([]schema.WALRecord, len(c.Entries))
		for i, e := range c.Entries {
			e.Raw = nil
			if e.Params == nil {
				e.Params = msgpack.RawMessage{0x80}
			}
			entries[i] = e
		}
		c.Entries = entries
	case *schema.Restore:
		if len(c.WALEntries) == 0 {
			c.WALEntries = nil
		}
	}
	return c
}

// TestEncodeIsPlainMessagePack: a generic decoder (msgpack/v5 into
// map[string]any) reads what we send with the expected values and types.
func TestEncodeIsPlainMessagePack(t *testing.T) {
	b, err := schema.Encode(&schema.EvolutionResult{Header: schema.Header{Timestamp: 1705392000}, Success: false, Decision: "rejected",
		Metrics: map[string]float64{"latency_improvement": 0.2, "memory_increase": 0.5}, Reason: "slower"})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := msgpack.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type": "evolution_result", "timestamp": uint32(1705392000), "success": false, "decision": "rejected",
		"metrics": map[string]any{"latency_improvement": 0.2, "memory_increase": 0.5}, "reason": "slower",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %#v\nwant %#v", got, want)
	}
	// Strings are str (never bin), integers compact, the map a fixmap.
	if b[0] != 0x86 || !bytes.Contains(b, []byte{0xa4, 't', 'y', 'p', 'e'}) || !bytes.Contains(b, []byte{0xce, 0x65, 0xa6, 0x37, 0x80}) {
		t.Fatalf("unexpected encoding % x", b)
	}
}

func TestEncodeSplicesRawBytes(t *testing.T) {
	// A snapshot with a float32 and an int64-width integer: a decode and
	// re-encode would change them; a splice keeps them.
	snap := obj(kv{"f", float32(0.5)}, kv{"n", int64(1)})
	entry := walRec("memory_add", uint64(3), obj())
	b, err := schema.Encode(&schema.Restore{Header: schema.Header{Timestamp: 1}, CheckpointID: "c", Snapshot: msgpack.RawMessage(snap), WALEntries: []msgpack.RawMessage{msgpack.RawMessage(entry)}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, snap) || !bytes.Contains(b, entry) {
		t.Fatal("raw bytes were not spliced unchanged")
	}
	b, err = schema.Encode(&schema.WALBatch{Header: schema.Header{Timestamp: 1}, Entries: []schema.WALRecord{{Raw: msgpack.RawMessage(entry), Operation: "ignored"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, entry) || bytes.Contains(b, []byte("ignored")) {
		t.Fatal("WALRecord.Raw not used as is")
	}
}

func TestEncodeTimestampAndVersion(t *testing.T) {
	hb := &schema.Heartbeat{}
	before := time.Now().Unix()
	b, err := schema.Encode(hb)
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.FromAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	if ts := m.Head().Timestamp; ts < before || ts > time.Now().Unix() {
		t.Fatalf("timestamp %d is not now", ts)
	}
	if hb.Timestamp != 0 {
		t.Fatal("Encode modified the message")
	}
	if len(b) > 40 {
		t.Fatalf("heartbeat is %d bytes", len(b))
	}
	// Compressed implies version 2.
	b, err = schema.Encode(&schema.Checkpoint{Header: schema.Header{Timestamp: 1}, Data: schema.RawMap(map[string]any{"a": 1}), Compress: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err = schema.Decode(schema.FromAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Head().Version != 2 || !m.(*schema.Checkpoint).Compress {
		t.Fatalf("version %d compress %v", m.Head().Version, m.(*schema.Checkpoint).Compress)
	}
}

func TestEncodeRestoreEmptySnapshot(t *testing.T) {
	b, err := schema.Encode(&schema.Restore{Header: schema.Header{Timestamp: 1}, WALEntries: []msgpack.RawMessage{msgpack.RawMessage(walRec("memory_add", 1, obj()))}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.ToAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	r := m.(*schema.Restore)
	if r.CheckpointID != "" || !bytes.Equal(r.Snapshot, []byte{0x80}) || len(r.WALEntries) != 1 {
		t.Fatalf("got %#v", r)
	}
}

func TestEncodeInvalid(t *testing.T) {
	tooMany := make([]schema.WALRecord, 101)
	for i := range tooMany {
		tooMany[i] = schema.WALRecord{Operation: "memory_add", Sequence: uint64(i + 1)}
	}
	tests := []struct {
		name  string
		m     schema.Message
		rule  schema.Rule
		field string
	}{
		{"nil message", (*schema.Heartbeat)(nil), schema.RuleMissingField, ""},
		{"heartbeat over 100 bytes", &schema.Heartbeat{Header: schema.Header{Metadata: schema.RawMap(map[string]any{"pad": strings.Repeat("x", 100)})}}, schema.RuleTooLarge, ""},
		{"metadata not a map", &schema.Heartbeat{Header: schema.Header{Metadata: msgpack.RawMessage{0x90}}}, schema.RuleMalformed, "metadata"},
		{"metadata with trailing bytes", &schema.Heartbeat{Header: schema.Header{Metadata: msgpack.RawMessage{0x80, 0x80}}}, schema.RuleMalformed, "metadata"},
		{"negative version", &schema.Heartbeat{Header: schema.Header{Version: -1}}, schema.RuleFieldValue, "version"},
		{"checkpoint without data", &schema.Checkpoint{}, schema.RuleMissingField, "data"},
		{"checkpoint data truncated", &schema.Checkpoint{Data: msgpack.RawMessage{0x81, 0xa1}}, schema.RuleMalformed, "data"},
		{"wal_entry sequence 0", &schema.WALEntry{Entry: schema.WALRecord{Operation: "memory_add"}}, schema.RuleFieldValue, "data.sequence"},
		{"wal_entry without operation", &schema.WALEntry{Entry: schema.WALRecord{Sequence: 1}}, schema.RuleMissingField, "data.operation"},
		{"wal_entry params an array", &schema.WALEntry{Entry: schema.WALRecord{Operation: "x", Sequence: 1, Params: msgpack.RawMessage{0x90}}}, schema.RuleMalformed, "data.params"},
		{"wal_entry over 10 KiB", &schema.WALEntry{Entry: schema.WALRecord{Operation: "x", Sequence: 1, Params: schema.RawMap(map[string]any{"p": strings.Repeat("x", 10<<10)})}}, schema.RuleTooLarge, ""},
		{"wal_batch empty", &schema.WALBatch{}, schema.RuleFieldValue, "data"},
		{"wal_batch 101 entries", &schema.WALBatch{Entries: tooMany}, schema.RuleTooLarge, "data"},
		{"wal_batch raw entry not a map", &schema.WALBatch{Entries: []schema.WALRecord{{Raw: msgpack.RawMessage{0x01}}}}, schema.RuleMalformed, "data[0]"},
		{"metrics NaN", &schema.Metrics{Data: map[string]float64{"x": math.NaN()}}, schema.RuleFieldValue, "data.x"},
		{"metrics nil", &schema.Metrics{}, schema.RuleMissingField, "data"},
		{"evolution_intent without code", &schema.EvolutionIntent{Hypothesis: schema.Hypothesis{Target: "t"}}, schema.RuleFieldValue, "hypothesis.new_code"},
		{"error without code", &schema.Error{}, schema.RuleMissingField, "error.code"},
		{"evolution_result bad decision", &schema.EvolutionResult{Decision: "maybe"}, schema.RuleFieldValue, "decision"},
		{"evolution_result contradiction", &schema.EvolutionResult{Success: false, Decision: "promoted"}, schema.RuleFieldValue, "decision"},
		{"checkpoint_ack negative size", &schema.CheckpointAck{Size: -1}, schema.RuleFieldValue, "size"},
		{"restore snapshot an array", &schema.Restore{Snapshot: msgpack.RawMessage{0x90}}, schema.RuleMalformed, "snapshot"},
		{"restore wal entry garbage", &schema.Restore{WALEntries: []msgpack.RawMessage{{0xc1}}}, schema.RuleMalformed, "wal_entries[0]"},
		{"process_request context not a map", &schema.ProcessRequest{Data: schema.RequestData{Context: msgpack.RawMessage{0x01}}}, schema.RuleMalformed, "data.context"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := schema.Encode(tt.m)
			var ve *schema.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v (% x), want a *ValidationError", err, b)
			}
			if ve.Rule != tt.rule || ve.Field != tt.field {
				t.Fatalf("got rule %q field %q, want %q %q (%v)", ve.Rule, ve.Field, tt.rule, tt.field, err)
			}
		})
	}
}

func TestErrorReply(t *testing.T) {
	_, derr := schema.Decode(schema.FromAgent, msg("wal_entry", kv{"data", walRec("memory_add", 0, obj())}))
	reply := schema.ErrorReply(derr)
	if reply.Error.Code != schema.CodeInvalidMessage || !strings.Contains(reply.Error.Message, "data.sequence") {
		t.Fatalf("reply %#v", reply.Error)
	}
	b, err := schema.Encode(reply)
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.ToAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	var details map[string]any
	if err := msgpack.Unmarshal(m.(*schema.Error).Error.Details, &details); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": "wal_entry", "field": "data.sequence", "rule": "field_value"}
	if !reflect.DeepEqual(details, want) {
		t.Fatalf("details %v, want %v", details, want)
	}

	// Not a ValidationError: reported as malformed, type and field left out.
	reply = schema.ErrorReply(errors.New("something odd"))
	if err := msgpack.Unmarshal(reply.Error.Details, &details); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(details, map[string]any{"rule": "malformed"}) || !strings.Contains(reply.Error.Message, "something odd") {
		t.Fatalf("reply %#v details %v", reply.Error, details)
	}
}

func TestNewError(t *testing.T) {
	e := schema.NewError(schema.CodeWALFull, "no space left on device", map[string]any{"path": "/data/wal", "free": 0, "bad": make(chan int)})
	b, err := schema.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.ToAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	var details map[string]any
	if err := msgpack.Unmarshal(m.(*schema.Error).Error.Details, &details); err != nil {
		t.Fatal(err)
	}
	if details["path"] != "/data/wal" || details["free"] != "0" {
		t.Fatalf("details %v", details)
	}
	if e := schema.NewError(schema.CodeWALFailed, "x", nil); e.Error.Details != nil {
		t.Fatal("nil details encoded")
	}
}

func TestMarshalMap(t *testing.T) {
	if _, err := schema.MarshalMap([]int{1}); err == nil {
		t.Fatal("a slice accepted as a map")
	}
	b, err := schema.MarshalMap(map[string]any{"b": 1, "a": int64(300)})
	if err != nil {
		t.Fatal(err)
	}
	// Sorted keys, compact ints.
	if want := []byte{0x82, 0xa1, 'a', 0xcd, 0x01, 0x2c, 0xa1, 'b', 0x01}; !bytes.Equal(b, want) {
		t.Fatalf("got % x, want % x", b, want)
	}
	if !bytes.Equal(schema.RawMap(nil), []byte{0x80}) {
		t.Fatal("RawMap(nil) is not {}")
	}
	// A value that encodes as nil is the empty map, as the agent package
	// sends nil params (it encodes through MarshalMap).
	for _, v := range []any{nil, map[string]any(nil), (*struct{ A int })(nil)} {
		if b, err := schema.MarshalMap(v); err != nil || !bytes.Equal(b, []byte{0x80}) {
			t.Errorf("MarshalMap(%#v) = % x, %v; want 80", v, b, err)
		}
	}
}

func TestCodecLimits(t *testing.T) {
	c := schema.NewCodec(schema.Options{})
	if got := c.MaxFrameSize(); got != 128<<20 {
		t.Errorf("MaxFrameSize = %d", got)
	}
	if got := c.MaxFrameSizeFor(schema.FromAgent); got != 100<<20+schema.EnvelopeAllowance {
		t.Errorf("MaxFrameSizeFor(FromAgent) = %d", got)
	}
	if got := c.FrameLimit(schema.TypeWALBatch); got != 100*10<<10+schema.EnvelopeAllowance {
		t.Errorf("wal_batch frame limit = %d", got)
	}
	if got, want := c.Limits(), schema.DefaultLimits(); got != want {
		t.Errorf("Limits() = %+v", got)
	}
	small := schema.NewCodec(schema.Options{Limits: schema.Limits{Heartbeat: 500}})
	if got := small.Limits(); got.Heartbeat != 500 || got.WALEntry != 10<<10 {
		t.Errorf("partial limits not defaulted: %+v", got)
	}
	// A 100-byte heartbeat decodes under the raised limit.
	p := msg("heartbeat", kv{"pad", strings.Repeat("x", 200)})
	if _, err := small.Decode(schema.FromAgent, p); err != nil {
		t.Errorf("raised heartbeat limit: %v", err)
	}
	if _, err := c.Decode(schema.FromAgent, p); schema.RuleOf(err) != schema.RuleTooLarge {
		t.Errorf("default heartbeat limit: %v", err)
	}
	// A payload above the direction's largest frame is rejected before the walk.
	if _, err := small.Decode(schema.FromAgent, make([]byte, c.MaxFrameSizeFor(schema.FromAgent)+1)); schema.RuleOf(err) != schema.RuleTooLarge {
		t.Errorf("oversized payload: %v", err)
	}
}

func TestTypes(t *testing.T) {
	if got := schema.Types(schema.FromAgent); len(got) != 8 || got[6] != schema.TypeError {
		t.Errorf("FromAgent types %v", got)
	}
	if got := schema.Types(schema.ToAgent); len(got) != 9 || got[0] != schema.TypeError || got[8] != schema.TypeCancelRequest {
		t.Errorf("ToAgent types %v", got)
	}
}

// TestCompressedFramesDeclareSize: one-shot decoders in other languages need
// the zstd frame content size, for tiny and large bodies alike.
func TestCompressedFramesDeclareSize(t *testing.T) {
	for _, n := range []int{0, 10, 300, 1000, 1100, 100 << 10, 3 << 20} {
		snap := schema.RawMap(map[string]any{"b": strings.Repeat("q", n)})
		b, err := schema.Encode(&schema.Restore{Header: schema.Header{Timestamp: 1}, Snapshot: snap, Compress: true})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var h zstd.Header
		if err := h.Decode(m["snapshot"].([]byte)); err != nil {
			t.Fatal(err)
		}
		if !h.HasFCS || h.FrameContentSize != uint64(len(snap)) {
			t.Errorf("%d-byte snapshot: frame declares size %v/%d", len(snap), h.HasFCS, h.FrameContentSize)
		}
	}
}

// TestRestoreBuilder: a restore assembled entry by entry round-trips with
// its last_sequence, and a tail crossing the restore limit is refused at
// the entry that crosses it.
func TestRestoreBuilder(t *testing.T) {
	c := schema.NewCodec(schema.Options{Limits: schema.Limits{Restore: 4096}})
	entry := func(seq int) []byte {
		b, err := msgpack.Marshal(map[string]any{"operation": "memory_add", "params": map[string]any{"pad": strings.Repeat("x", 100)}, "sequence": seq})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rb, err := c.NewRestore(schema.Header{}, "", nil, nil, false, 99, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; ; n++ {
		if err := rb.Add(entry(n + 1)); err != nil {
			var ve *schema.ValidationError
			if !errors.As(err, &ve) || ve.Rule != schema.RuleTooLarge {
				t.Fatalf("Add over the limit: %v, want RuleTooLarge", err)
			}
			break
		}
	}
	if n == 0 || rb.Len() > 4096 {
		t.Fatalf("added %d entries, payload %d bytes", n, rb.Len())
	}
	msg, err := c.Decode(schema.ToAgent, rb.Frame())
	if err != nil {
		t.Fatal(err)
	}
	r := msg.(*schema.Restore)
	if r.LastSequence != 99 || len(r.WALEntries) != n || r.CheckpointID != "" {
		t.Fatalf("decoded restore: last_sequence %d, %d entries (want 99, %d)", r.LastSequence, len(r.WALEntries), n)
	}
}
