package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/wal"
)

// `wal dump` reads entries through the schema's bounds walk: bytes that are
// not exactly one well-formed MessagePack value (here a map followed by a
// stray byte, and arrays nested past the limit, both of which msgpack/v5
// alone would decode) are printed raw, never decoded.
func TestWALDumpDecodesOnlyCheckedEntries(t *testing.T) {
	dir := t.TempDir()
	l, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), NoPreallocate: true})
	if err != nil {
		t.Fatal(err)
	}
	good := []byte("\x83\xa9operation\xaamemory_add\xa6params\x81\xa4text\xa2hi\xa8sequence\x01")
	trailing := []byte{0x80, 0x00}
	deep := append(append([]byte{0x81, 0xa1, 0x61}, bytes.Repeat([]byte{0x91}, 200)...), 0x01) // {"a": [[[...1]]]}
	if _, err := l.Append(wal.Entry{Sequence: 1, Data: good}, wal.Entry{Sequence: 2, Data: trailing}, wal.Entry{Sequence: 3, Data: deep}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, nil, "wal", "dump", "--data-dir", dir, "--json")
	if code != exitOK {
		t.Fatalf("wal dump: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("wal dump printed %d lines, want 3:\n%s", len(lines), out)
	}
	var recs []map[string]any
	for _, line := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		recs = append(recs, r)
	}
	if e, ok := recs[0]["entry"].(map[string]any); !ok || e["operation"] != "memory_add" {
		t.Errorf("a valid entry is decoded: got %v", recs[0])
	}
	for i, data := range [][]byte{trailing, deep} {
		r := recs[i+1]
		if _, decoded := r["entry"]; decoded || r["raw_hex"] == nil {
			t.Errorf("entry %d (% x) was decoded, want it printed raw: %v", i+2, data[:min(len(data), 3)], r)
		}
	}
}
