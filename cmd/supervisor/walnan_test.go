package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/wal"
)

// An agent may log params holding NaN or ±Inf (a Python float('nan') in an
// embedding): the schema takes any map as params. `wal dump` must still
// print every entry — valid JSON with --json, the params in text — and exit
// 0: exit 1 and "stopped after N entries" mean a corrupt WAL.
func TestWALDumpPrintsNonFiniteFloats(t *testing.T) {
	dir := t.TempDir()
	l, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), NoPreallocate: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		data, _ := msgpack.Marshal(map[string]any{"operation": "memory_add", "params": map[string]any{"text": "x", "score": f}, "sequence": i + 1})
		if _, err := l.Append(wal.Entry{Sequence: uint64(i + 1), Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, nil, "wal", "dump", "--data-dir", dir, "--json")
	if code != exitOK {
		t.Errorf("wal dump --json: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Errorf("wal dump --json printed %d lines, want 3:\n%s", len(lines), out)
	}
	for _, line := range lines {
		if !json.Valid([]byte(line)) {
			t.Errorf("not JSON: %q", line)
		}
	}
	code, out, errOut = runCLI(t, nil, "wal", "dump", "--data-dir", dir)
	if code != exitOK {
		t.Errorf("wal dump: exit %d, stderr %q", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Split(line, "\t"); len(f) != 3 || !strings.Contains(f[2], `"text":"x"`) {
			t.Errorf("wal dump line %q lacks its params", line)
		}
	}
}
