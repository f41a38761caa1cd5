package observe

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuditRecordsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAudit(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	huge := strings.Repeat("k", 4<<20)
	a.Record(AuditInvalid, map[string]any{"error": huge, "nested": map[string]any{huge: []any{huge}}})
	many := map[string]any{}
	for i := range 200 {
		many[strings.Repeat("x", 100)+string(rune('a'+i%26))+strings.Repeat("y", i)] = strings.Repeat("v", 1000)
	}
	a.Record(AuditInvalid, many)
	a.Sync()
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if len(line) > maxAuditRecord {
			t.Fatalf("audit line of %d bytes", len(line))
		}
		var rec AuditRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("unparsable line: %v", err)
		}
	}
	// Rotation: move away, reopen, the next record lands in a new file.
	os.Rename(path, path+".1")
	if err := a.Reopen(); err != nil {
		t.Fatal(err)
	}
	a.Record(AuditStop, nil)
	a.Sync()
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), AuditStop) {
		t.Fatal("record after Reopen not in the new file")
	}
}
