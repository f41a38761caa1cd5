package testagent

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
)

func sampleState(t testing.TB) []byte {
	s := NewState()
	mustApply(t, s, schema.OpMemoryAdd, 1, map[string]any{"content": "hi", "metadata": map[string]any{"k": []any{1, "x"}}, "created": 5}, Limits{})
	mustApply(t, s, schema.OpToolRegister, 2, map[string]any{"name": "calc", "params": []any{"e"}}, Limits{})
	mustApply(t, s, schema.OpStateUpdate, 3, map[string]any{"status": "thinking", "module": "m", "code": "latency_ms=1"}, Limits{})
	b, err := s.MarshalCanonical()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzRestore feeds a restore, as the supervisor would send it, through the
// agent's restore path: the snapshot and one WAL entry come from the
// fuzzer. What loads must re-encode to bytes that load to the same state.
func FuzzRestore(f *testing.F) {
	entry := schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": "x"}, "sequence": 9})
	f.Add(sampleState(f), []byte(entry))
	f.Add([]byte{0x80}, []byte(entry))
	f.Add([]byte(schema.RawMap(map[string]any{"memory_blocks": []any{map[string]any{"metadata": map[string]any{"a": nil}}}})), []byte{0x80})
	f.Add([]byte(schema.RawMap(map[string]any{"modules": map[string]any{"m": "nonsense"}, "last_seq": 3})),
		[]byte(schema.RawMap(map[string]any{"operation": "state_update", "params": map[string]any{"context": map[string]any{"d": 1.5}}, "sequence": 4})))
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, snapshot, walEntry []byte) {
		payload, err := schema.Encode(&schema.Restore{CheckpointID: "cp", Snapshot: snapshot, WALEntries: []msgpack.RawMessage{walEntry}})
		if err != nil {
			return
		}
		m, err := schema.Decode(schema.ToAgent, payload)
		if err != nil {
			return
		}
		a := &refAgent{log: discard, st: NewState(), beh: DefaultBehaviour(), base: DefaultBehaviour(), lim: Limits{MemoryBlocks: 100, History: 100}}
		if err := a.restore(m.(*schema.Restore)); err != nil {
			return
		}
		b1, err := a.st.MarshalCanonical()
		if err != nil {
			t.Fatalf("a restored state does not encode: %v", err)
		}
		again, err := LoadSnapshot(b1)
		if err != nil {
			t.Fatalf("a restored state's own checkpoint does not load: %v", err)
		}
		b2, err := again.MarshalCanonical()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("checkpoint → load → checkpoint changed the bytes:\n%x\n%x", b1, b2)
		}
	})
}

func FuzzParseBehaviour(f *testing.F) {
	for _, s := range []string{"", "latency_ms=5 error_rate=0.01 memory_mb=80", "# c\nlatency_ms=1;error_rate=1", "x", "latency_ms=1e400", "=", "error_rate=-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, code string) {
		b, err := ParseBehaviour(code, DefaultBehaviour())
		if err != nil {
			if b != DefaultBehaviour() {
				t.Fatalf("a rejected code changed the behaviour to %+v", b)
			}
			return
		}
		if b.LatencyMS < 0 || b.LatencyMS > 60000 || b.ErrorRate < 0 || b.ErrorRate > 1 || b.MemoryMB < 0 || b.MemoryMB > 1<<20 {
			t.Fatalf("accepted out-of-range behaviour %+v", b)
		}
	})
}

var update = flag.Bool("update", false, "rewrite the seed corpora in testdata/fuzz")

// TestFuzzCorpus keeps testdata/fuzz in step with the seeds in code;
// go test -run TestFuzzCorpus -update rewrites it.
func TestFuzzCorpus(t *testing.T) {
	entry := []byte(schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": "x"}, "sequence": 9}))
	corpora := map[string][]string{
		"FuzzRestore": {
			fmt.Sprintf("[]byte(%q)\n[]byte(%q)\n", sampleState(t), entry),
			fmt.Sprintf("[]byte(%q)\n[]byte(%q)\n", []byte{0x80}, entry),
			fmt.Sprintf("[]byte(%q)\n[]byte(%q)\n", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, entry), // map32 claiming 4G pairs
		},
		"FuzzParseBehaviour": {
			fmt.Sprintf("string(%q)\n", "latency_ms=5 error_rate=0.01 memory_mb=80"),
			fmt.Sprintf("string(%q)\n", "# comment\nlatency_ms=1;error_rate=1,memory_mb=0"),
			fmt.Sprintf("string(%q)\n", "(def (memory-search q) ...)"),
		},
	}
	for name, seeds := range corpora {
		dir := filepath.Join("testdata", "fuzz", name)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for i, s := range seeds {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte("go test fuzz v1\n"+s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) < len(seeds) {
			t.Errorf("%s: %d files, %v; want at least %d (go test -run TestFuzzCorpus -update)", dir, len(entries), err, len(seeds))
		}
	}
}
