package supervisor

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestAuditSurvivesTornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := openAudit(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Record(AuditRestart, map[string]any{"reason": "crashed"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	// A crash mid-write leaves half a record.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"id":"x","time":"2026-`)
	f.Close()
	a, err = openAudit(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Record(AuditRestore, map[string]any{"checkpoint_id": "c"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	f, _ = os.Open(path)
	defer f.Close()
	var kinds []string
	skipped, err := ReadAudit(f, time.Time{}, func(r AuditRecord) error {
		if r.ID == "" || r.Time.IsZero() {
			t.Fatalf("record without id or time: %+v", r)
		}
		kinds = append(kinds, r.Kind)
		return nil
	})
	if err != nil || skipped != 1 {
		t.Fatalf("skipped=%d err=%v, want 1 torn line skipped", skipped, err)
	}
	if len(kinds) != 2 || kinds[0] != AuditRestart || kinds[1] != AuditRestore {
		t.Fatalf("records %v: a torn line must not swallow the next record", kinds)
	}
}
