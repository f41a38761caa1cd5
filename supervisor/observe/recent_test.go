package observe

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
)

// The recorder keeps the newest audit records in memory, bounded, newest
// first, and the newest of a kind however many came after it.
func TestRecorderRecentAudit(t *testing.T) {
	a, err := OpenAudit(filepath.Join(t.TempDir(), "audit.jsonl"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r := NewRecorder(slog.New(slog.DiscardHandler))
	if got := r.Recent(20); got != nil {
		t.Fatalf("Recent before the audit log is attached = %v, want nil", got)
	}
	r.AttachAudit(a)
	r.Audit(AuditEvolution, map[string]any{"decision": "promote"})
	for i := range 3 * auditRingSize {
		r.Audit(AuditCheckpoint, map[string]any{"i": i})
	}
	got := r.Recent(1000)
	if len(got) != auditRingSize {
		t.Fatalf("Recent kept %d records, want the bound %d", len(got), auditRingSize)
	}
	if fmt.Sprint(got[0].Fields["i"]) != fmt.Sprint(3*auditRingSize-1) || got[0].ID == "" || got[0].Time.IsZero() {
		t.Fatalf("newest record = %+v, want i=%d with an id and a time", got[0], 3*auditRingSize-1)
	}
	if n := len(r.Recent(20)); n != 20 {
		t.Fatalf("Recent(20) returned %d records", n)
	}
	ev, ok := r.Last(AuditEvolution)
	if !ok || ev.Fields["decision"] != "promote" {
		t.Fatalf("Last(evolution) = %+v, %v; want the one evolution record", ev, ok)
	}
}
