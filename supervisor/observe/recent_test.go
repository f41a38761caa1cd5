package observe

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
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
	if got := r.Recent(20); got.Records != nil {
		t.Fatalf("Recent before the audit log is attached = %v, want nil", got)
	}
	r.AttachAudit(a)
	r.Audit(AuditEvolution, map[string]any{"decision": "promote"})
	for i := range 3 * auditRingSize {
		r.Audit(AuditCheckpoint, map[string]any{"i": i})
	}
	all := r.Recent(1000)
	got := all.Records
	if len(got) != auditRingSize {
		t.Fatalf("Recent kept %d records, want the bound %d", len(got), auditRingSize)
	}
	if fmt.Sprint(got[0].Fields["i"]) != fmt.Sprint(3*auditRingSize-1) || got[0].ID == "" || got[0].Time.IsZero() {
		t.Fatalf("newest record = %+v, want i=%d with an id and a time", got[0], 3*auditRingSize-1)
	}
	if n := len(r.Recent(20).Records); n != 20 {
		t.Fatalf("Recent(20) returned %d records", n)
	}
	// The records encode as the audit log's lines, and decode back.
	b, err := json.Marshal(struct {
		A AuditRecords `json:"audit,omitzero"`
		B AuditRecords `json:"none,omitzero"`
	}{A: all})
	if err != nil {
		t.Fatal(err)
	}
	var back struct{ Audit AuditRecords }
	if err := json.Unmarshal(b, &back); err != nil || len(back.Audit.Records) != auditRingSize || back.Audit.Records[0].ID != got[0].ID {
		t.Fatalf("round trip: %v, %d records; %s", err, len(back.Audit.Records), b[:min(len(b), 200)])
	}
	if strings.Contains(string(b), `"none"`) {
		t.Errorf("empty records not omitted: %s", b[:min(len(b), 200)])
	}
	ev, ok := r.Last(AuditEvolution)
	if !ok || ev.Fields["decision"] != "promote" {
		t.Fatalf("Last(evolution) = %+v, %v; want the one evolution record", ev, ok)
	}
}
