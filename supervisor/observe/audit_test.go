package observe

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestAuditSurvivesTornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAudit(path, nil, nil)
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
	a, err = OpenAudit(path, nil, nil)
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

// Record never waits on the disk: with the writer stuck (its file is a pipe
// nobody reads), records are queued up to the bound, then dropped and
// counted, and an audit_records_dropped record says how many once writing
// resumes. Nothing recorded before the drop is lost.
func TestAuditRecordNeverBlocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var dropped atomic.Int64
	a, err := OpenAudit(path, func() { dropped.Add(1) }, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.f.Close()
	a.f = w // a stuck disk: writes block once the pipe's buffer is full
	a.mu.Unlock()

	done := make(chan struct{})
	const n = 3 * auditQueueRecords
	go func() {
		defer close(done)
		for i := range n {
			_ = a.Record(AuditRestart, map[string]any{"i": i, "pad": strings.Repeat("p", 200)})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Record blocked on a stuck audit file")
	}
	if dropped.Load() == 0 {
		t.Fatal("no record was dropped although the writer was stuck")
	}
	// The disk comes back: read everything the writer writes.
	got := make(chan []AuditRecord, 1)
	go func() {
		var recs []AuditRecord
		_, _ = ReadAudit(r, time.Time{}, func(rec AuditRecord) error { recs = append(recs, rec); return nil })
		got <- recs
	}()
	a.Close()
	w.Close()
	recs := <-got
	written, note := 0, 0
	for _, rec := range recs {
		switch rec.Kind {
		case AuditRestart:
			if int(rec.Fields["i"].(float64)) != written {
				t.Fatalf("record %d written as number %v: records lost before the drop", written, rec.Fields["i"])
			}
			written++
		case AuditDropped:
			note += int(rec.Fields["dropped"].(float64))
		}
	}
	if written+note != n || int64(note) != dropped.Load() {
		t.Fatalf("%d written + %d counted dropped != %d recorded (metric counted %d)", written, note, n, dropped.Load())
	}
}
