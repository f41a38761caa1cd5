package interop

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// python is Debian's interpreter, where apt installs python3-msgpack; the
// python3 first on PATH may be another one without it.
const python = "/usr/bin/python3"

// requirePython skips the test when python or one of modules is missing,
// unless CI=true, where that is a failure.
func requirePython(t *testing.T, modules ...string) {
	t.Helper()
	for _, m := range modules {
		out, err := exec.Command(python, "-c", "import "+m).CombinedOutput()
		if err == nil {
			continue
		}
		pkg := "python3-" + m
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s cannot import %s (%v: %s); CI must install it: apt-get install %s", python, m, err, bytes.TrimSpace(out), pkg)
		}
		t.Skipf("%s cannot import %s; install it with apt-get install %s (required when CI=true)", python, m, pkg)
	}
}

func hasModule(m string) bool { return exec.Command(python, "-c", "import "+m).Run() == nil }

func TestPythonAgentMessagesDecodeInGo(t *testing.T) {
	requirePython(t, "msgpack")
	withZstd := hasModule("zstandard")
	if !withZstd && os.Getenv("CI") == "true" {
		t.Fatal("python3-zstandard is missing; CI must install it (apt-get install python3-zstandard)")
	}
	cmd := exec.Command(python, "interop.py", "agent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("interop.py agent: %v\n%s", err, stderr.String())
	}

	data := map[string]any{"agent_state": map[string]any{"status": "idle"}, "blob": strings.Repeat("state ", 10000)}
	zstdCase := func(t *testing.T, m schema.Message) {
		cp := m.(*schema.Checkpoint)
		if !cp.Compress || cp.Status != "idle" || cp.Version != 2 {
			t.Fatalf("compress=%v status=%q version=%d", cp.Compress, cp.Status, cp.Version)
		}
		var got map[string]any
		if err := msgpack.Unmarshal(cp.Data, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, data) {
			t.Fatal("decompressed data differs")
		}
	}
	ts := func(want int64) func(*testing.T, schema.Message) {
		return func(t *testing.T, m schema.Message) {
			if got := m.Head().Timestamp; got != want {
				t.Fatalf("timestamp %d, want %d", got, want)
			}
		}
	}
	seq := func(op string, want uint64) func(*testing.T, schema.Message) {
		return func(t *testing.T, m schema.Message) {
			e := m.(*schema.WALEntry).Entry
			if e.Operation != op || e.Sequence != want {
				t.Fatalf("got %s/%d, want %s/%d", e.Operation, e.Sequence, op, want)
			}
			if !bytes.HasPrefix(e.Raw, []byte{0x83}) || len(e.Params) == 0 {
				t.Fatalf("raw entry % x", e.Raw)
			}
		}
	}
	expect := map[string]func(*testing.T, schema.Message){
		"heartbeat":             ts(1705392000),
		"heartbeat_fixint_ts":   ts(5),
		"heartbeat_uint8_ts":    ts(200),
		"heartbeat_uint16_ts":   ts(60000),
		"heartbeat_uint64_ts":   ts(1 << 40),
		"heartbeat_negative_ts": ts(-100),
		"heartbeat_accepts": func(t *testing.T, m schema.Message) {
			if a := m.(*schema.Heartbeat).Accepts; len(a) != 1 || a[0] != schema.TypeCancelRequest {
				t.Fatalf("accepts %q", a)
			}
		},
		"heartbeat_v2_metadata": func(t *testing.T, m schema.Message) {
			if h := m.Head(); h.Version != 2 || !bytes.Equal(h.Metadata, schema.RawMap(map[string]any{"k": "v"})) {
				t.Fatalf("header %+v", h)
			}
		},
		"checkpoint": func(t *testing.T, m schema.Message) {
			cp := m.(*schema.Checkpoint)
			var got map[string]any
			if err := msgpack.Unmarshal(cp.Data, &got); err != nil {
				t.Fatal(err)
			}
			if cp.Status != "thinking" || got["blob"] == nil || len(got["long_text"].(string)) != 70000 {
				t.Fatalf("status %q data keys %v", cp.Status, reflect.ValueOf(got).MapKeys())
			}
		},
		"wal_entry_uint16_seq": seq("memory_add", 12345),
		"wal_entry_uint32_seq": seq("tool_register", 70000),
		"wal_entry_uint64_seq": seq("state_update", math.MaxInt64),
		"wal_entry_fixint_seq": seq("memory_add", 1),
		"wal_batch_20": func(t *testing.T, m schema.Message) {
			b := m.(*schema.WALBatch)
			if len(b.Entries) != 20 || b.Entries[19].Sequence != 119 {
				t.Fatalf("%d entries", len(b.Entries))
			}
		},
		"evolution_intent": func(t *testing.T, m schema.Message) {
			h := m.(*schema.EvolutionIntent).Hypothesis
			want := schema.Hypothesis{Reason: "Optimize memory search with SIMD", Target: "memory_system", NewCode: "(def (memory-search ...) ...)",
				ExpectedImprovement: map[string]float64{"latency": -0.2, "memory": 0, "accuracy": 0.1}}
			if !reflect.DeepEqual(h, want) {
				t.Fatalf("got %+v", h)
			}
		},
		"metrics_float64": func(t *testing.T, m schema.Message) {
			want := map[string]float64{"avg_latency": 10.5, "p50_latency": 8, "p95_latency": 25, "p99_latency": 50, "error_rate": 0.01,
				"memory_usage": 80000000, "throughput": 1000, "active_tools": 5, "memory_blocks": 1000}
			if got := m.(*schema.Metrics).Data; !reflect.DeepEqual(got, want) {
				t.Fatalf("got %v", got)
			}
		},
		"metrics_float32": func(t *testing.T, m schema.Message) {
			if got := m.(*schema.Metrics).Data; !reflect.DeepEqual(got, map[string]float64{"avg_latency": 10.5, "error_rate": 0.25}) {
				t.Fatalf("got %v", got)
			}
		},
		"metrics_map16": func(t *testing.T, m schema.Message) {
			if got := m.(*schema.Metrics).Data; len(got) != 20 || got["g19"] != 19 {
				t.Fatalf("got %v", got)
			}
		},
		"error": func(t *testing.T, m schema.Message) {
			e := m.(*schema.Error).Error
			if e.Code != "TOOL_FAILED" || e.Message != "boom" || e.StackTrace != "line 1" || len(e.Context) == 0 {
				t.Fatalf("got %+v", e)
			}
		},
	}
	if withZstd {
		expect["checkpoint_zstd_bin"] = zstdCase
		expect["checkpoint_zstd_base64"] = zstdCase
		expect["checkpoint_zstd_stream"] = zstdCase
	} else {
		t.Log("python3-zstandard missing: compressed cases skipped")
	}

	r := wire.NewReader(bytes.NewReader(out), 0)
	seen := map[string]bool{}
	for {
		nameFrame, err := r.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var name string
		if err := msgpack.Unmarshal(nameFrame, &name); err != nil {
			t.Fatal(err)
		}
		payload, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		check, ok := expect[name]
		if !ok {
			t.Errorf("python sent case %q the test does not know", name)
			continue
		}
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			m, err := schema.Decode(schema.FromAgent, payload)
			if err != nil {
				t.Fatalf("%v\npayload % x", err, payload[:min(len(payload), 200)])
			}
			check(t, m)
		})
	}
	for name := range expect {
		if !seen[name] {
			t.Errorf("case %q not produced by interop.py", name)
		}
	}
}

func TestGoSupervisorMessagesDecodeInPython(t *testing.T) {
	requirePython(t, "msgpack")
	withZstd := hasModule("zstandard")
	if !withZstd && os.Getenv("CI") == "true" {
		t.Fatal("python3-zstandard is missing; CI must install it (apt-get install python3-zstandard)")
	}
	h := schema.Header{Timestamp: 1705392000}
	entry := schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": "hi"}, "sequence": 12345})
	snapshot := schema.RawMap(map[string]any{"agent_state": map[string]any{"status": "idle"}, "n": -5, "big": uint64(1) << 40, "f": 0.5})
	walFull := schema.NewError(schema.CodeWALFull, "no space left on device", map[string]any{"free_bytes": 0})
	walFull.Timestamp = 1705392000
	cases := []struct {
		m    schema.Message
		want string // JSON as python prints it
	}{
		{&schema.CheckpointAck{Header: h, CheckpointID: "550e8400-e29b-41d4-a716-446655440000", Size: 1024000},
			`{"type":"checkpoint_ack","timestamp":1705392000,"checkpoint_id":"550e8400-e29b-41d4-a716-446655440000","size":1024000}`},
		{&schema.Restore{Header: h, CheckpointID: "c1", Snapshot: snapshot, WALEntries: []msgpack.RawMessage{entry}, LastSequence: 12345},
			`{"type":"restore","timestamp":1705392000,"checkpoint_id":"c1","snapshot":{"agent_state":{"status":"idle"},"big":1099511627776,"f":0.5,"n":-5},
			  "last_sequence":12345,"wal_entries":[{"operation":"memory_add","params":{"content":"hi"},"sequence":12345}]}`},
		{&schema.Restore{Header: h, WALEntries: []msgpack.RawMessage{entry}},
			`{"type":"restore","timestamp":1705392000,"checkpoint_id":"","snapshot":{},"last_sequence":0,"wal_entries":[{"operation":"memory_add","params":{"content":"hi"},"sequence":12345}]}`},
		{&schema.HotReload{Header: schema.Header{Timestamp: 1705392000, Version: 2}, Code: "latency_ms=5", Module: "memory", BackupCheckpointID: "b1"},
			`{"type":"hot_reload","timestamp":1705392000,"version":2,"code":"latency_ms=5","module":"memory","backup_checkpoint_id":"b1"}`},
		{&schema.EvolutionResult{Header: h, Success: true, Decision: "promoted", Metrics: map[string]float64{"latency_improvement": -0.15, "error_rate_change": -0.05, "memory_increase": 0.1}, Reason: "Shadow instance showed 15% latency improvement"},
			`{"type":"evolution_result","timestamp":1705392000,"success":true,"decision":"promoted","metrics":{"latency_improvement":-0.15,"error_rate_change":-0.05,"memory_increase":0.1},"reason":"Shadow instance showed 15% latency improvement"}`},
		{&schema.ProcessRequest{Header: h, RequestID: "r-1", Data: schema.RequestData{Message: strings.Repeat("é", 40), Context: schema.RawMap(map[string]any{"k": []any{1, "two"}}), UserID: "u"}},
			`{"type":"process_request","timestamp":1705392000,"request_id":"r-1","data":{"message":"` + strings.Repeat("é", 40) + `","context":{"k":[1,"two"]},"user_id":"u"}}`},
		{&schema.ProcessRequest{Header: h, RequestID: "r-2", Data: schema.RequestData{Message: "again"}, Attempt: 300},
			`{"type":"process_request","timestamp":1705392000,"request_id":"r-2","attempt":300,"data":{"message":"again","user_id":""}}`},
		{&schema.CancelRequest{Header: h, RequestID: "r-2"},
			`{"type":"cancel_request","timestamp":1705392000,"request_id":"r-2"}`},
		{&schema.Shutdown{Header: h, Reason: "SIGTERM", CreateCheckpoint: true},
			`{"type":"shutdown","timestamp":1705392000,"reason":"SIGTERM","create_checkpoint":true}`},
		{walFull,
			`{"type":"error","timestamp":1705392000,"error":{"code":"WAL_FULL","message":"no space left on device","details":{"free_bytes":0}}}`},
		{&schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000, Metadata: schema.RawMap(map[string]any{"a": "b"})}},
			`{"type":"heartbeat","timestamp":1705392000,"metadata":{"a":"b"}}`},
	}
	if withZstd {
		cases = append(cases, struct {
			m    schema.Message
			want string
		}{&schema.Restore{Header: h, CheckpointID: "c2", Snapshot: snapshot, Compress: true},
			`{"type":"restore","timestamp":1705392000,"version":2,"compressed":true,"compression":"zstd","checkpoint_id":"c2",
			  "snapshot":{"agent_state":{"status":"idle"},"big":1099511627776,"f":0.5,"n":-5},"last_sequence":0,"wal_entries":[]}`})
	}

	var in bytes.Buffer
	for _, c := range cases {
		p, err := schema.Encode(c.m)
		if err != nil {
			t.Fatalf("%s: %v", c.m.MessageType(), err)
		}
		in.Write(wire.AppendFrame(nil, p))
	}
	cmd := exec.Command(python, "interop.py", "supervisor")
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("interop.py supervisor: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	i := 0
	for ; sc.Scan(); i++ {
		if i >= len(cases) {
			t.Fatalf("python printed more lines than frames sent: %s", sc.Text())
		}
		var got, want any
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(cases[i].want), &want); err != nil {
			t.Fatalf("case %d: bad expectation: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: python decoded\n %s\nwant\n %s", cases[i].m.MessageType(), sc.Text(), cases[i].want)
		}
	}
	if i != len(cases) {
		t.Fatalf("python decoded %d of %d frames", i, len(cases))
	}
}
