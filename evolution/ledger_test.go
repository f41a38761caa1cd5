package evolution

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func promo(id, module string, at time.Time) Promotion {
	return Promotion{
		ID: id, Module: module, Code: "(def " + id + ")", Target: module, Reason: "within all limits",
		BackupCheckpointID: "0190f1a2-0000-7000-8000-000000000001", At: at,
		Metrics: map[string]float64{MetricLatencyImprovement: -0.15, MetricErrorRateChange: 0, MetricMemoryIncrease: 0.1},
	}
}

func ids(ps []Promotion) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

func mustRecord(t *testing.T, l *Ledger, ps ...Promotion) {
	t.Helper()
	for _, p := range ps {
		if err := l.Record(p); err != nil {
			t.Fatalf("Record(%s): %v", p.ID, err)
		}
	}
}

func TestOpenLedgerMissingFileIsEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "evolution.json")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Promotions(); len(got) != 0 {
		t.Errorf("Promotions() = %v, want none", got)
	}
	if got := l.Since(time.Time{}); got != nil {
		t.Errorf("Since(zero) = %v, want nil", got)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		t.Errorf("the ledger's directory was not created: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("opening created the file: %v", err)
	}
}

func TestLedgerRecordSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	in := []Promotion{promo("a", "memory", t0), promo("b", "tools", t0.Add(time.Minute))}
	in[1].At = in[1].At.In(time.FixedZone("CEST", 2*3600)) // stored in UTC
	mustRecord(t, l, in...)

	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("ledger mode %v, want 0600: it holds the agent's code", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the ledger (no temporary files)", len(entries))
	}

	re, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	got := re.Promotions()
	if len(got) != len(in) {
		t.Fatalf("reopened ledger holds %d promotions, want %d", len(got), len(in))
	}
	for i := range in {
		if !samePromotion(got[i], in[i]) {
			t.Errorf("promotion %d\n got %+v\nwant %+v", i, got[i], in[i])
		}
		if got[i].At.Location() != time.UTC {
			t.Errorf("promotion %d time not in UTC: %v", i, got[i].At)
		}
	}
	if !slices.Equal(ids(l.Promotions()), ids(got)) {
		t.Errorf("in memory %v, on disk %v", ids(l.Promotions()), ids(got))
	}
}

func samePromotion(a, b Promotion) bool {
	if a.ID != b.ID || a.Module != b.Module || a.Code != b.Code || a.Target != b.Target || a.Reason != b.Reason ||
		a.BackupCheckpointID != b.BackupCheckpointID || !a.At.Equal(b.At) || len(a.Metrics) != len(b.Metrics) {
		return false
	}
	for k, v := range a.Metrics {
		if w, ok := b.Metrics[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestLedgerSince(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	// memory promoted at t0 and again at t0+2m; tools at t0+1m.
	mustRecord(t, l,
		promo("mem-1", "memory", t0),
		promo("tools-1", "tools", t0.Add(time.Minute)),
		promo("mem-2", "memory", t0.Add(2*time.Minute)),
	)
	tests := []struct {
		name       string
		checkpoint time.Time
		want       []string
	}{
		{"no checkpoint: every module's newest", time.Time{}, []string{"tools-1", "mem-2"}},
		{"checkpoint before everything", t0.Add(-time.Hour), []string{"tools-1", "mem-2"}},
		{"checkpoint between the memory promotions", t0.Add(30 * time.Second), []string{"tools-1", "mem-2"}},
		{"checkpoint at a promotion's instant includes it", t0.Add(time.Minute), []string{"tools-1", "mem-2"}},
		{"checkpoint just after tools", t0.Add(time.Minute + time.Nanosecond), []string{"mem-2"}},
		{"checkpoint after everything", t0.Add(time.Hour), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := l.Since(tt.checkpoint)
			if !slices.Equal(ids(got), tt.want) {
				t.Errorf("Since(%v) = %v, want %v", tt.checkpoint, ids(got), tt.want)
			}
			for _, p := range got {
				if p.Code == "" {
					t.Errorf("%s: live promotion without its code", p.ID)
				}
			}
		})
	}
}

// TestLedgerSinceClockSteppedBack: the last recorded promotion of a module is
// the live one even when the wall clock went backwards between the two.
func TestLedgerSinceClockSteppedBack(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, l, promo("first", "memory", t0.Add(time.Hour)), promo("second", "memory", t0))
	if got := ids(l.Since(time.Time{})); !slices.Equal(got, []string{"second"}) {
		t.Errorf("Since = %v, want [second]", got)
	}
}

func TestLedgerSupersededCodeIsDropped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, l, promo("mem-1", "memory", t0), promo("tools-1", "tools", t0), promo("mem-2", "memory", t0.Add(time.Second)))
	re, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ledger := range []*Ledger{l, re} {
		got := ledger.Promotions()
		if !slices.Equal(ids(got), []string{"mem-1", "tools-1", "mem-2"}) {
			t.Fatalf("Promotions() = %v", ids(got))
		}
		if got[0].Code != "" || got[0].Reason == "" || got[0].Metrics == nil {
			t.Errorf("superseded promotion: want code dropped and history kept, got %+v", got[0])
		}
		if got[1].Code == "" || got[2].Code == "" {
			t.Errorf("live promotions lost their code: %+v", got)
		}
	}
}

func TestLedgerPrunesOldestSuperseded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	l, err := openLedger(path, 3, MaxLedgerSize)
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, l, promo("tools-1", "tools", t0), promo("dsl-1", "dsl", t0))
	for i := range 4 {
		mustRecord(t, l, promo(fmt.Sprintf("mem-%d", i), "memory", t0.Add(time.Duration(i)*time.Second)))
	}
	// Live: tools-1, dsl-1, mem-3. Over the cap of 3 only superseded ones go.
	if got := ids(l.Promotions()); !slices.Equal(got, []string{"tools-1", "dsl-1", "mem-3"}) {
		t.Errorf("Promotions() = %v", got)
	}
	// More live modules than the cap: none is dropped.
	mustRecord(t, l, promo("x-1", "x", t0))
	if got := ids(l.Since(time.Time{})); !slices.Equal(got, []string{"tools-1", "dsl-1", "mem-3", "x-1"}) {
		t.Errorf("Since = %v", got)
	}
}

func TestLedgerRecordDefaults(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	mustRecord(t, l, Promotion{Module: "memory", Code: "x"})
	p := l.Promotions()[0]
	id, err := uuid.Parse(p.ID)
	if err != nil || id.Version() != 7 {
		t.Errorf("ID %q: want a UUIDv7 (%v)", p.ID, err)
	}
	if p.At.Before(before.Add(-time.Second)) || p.At.After(time.Now().Add(time.Second)) {
		t.Errorf("At = %v, want about now", p.At)
	}
}

func TestLedgerRecordRejects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	l, err := openLedger(path, defaultMaxHistory, 4096)
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, l, promo("a", "memory", t0))
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	nanMetric := promo("b", "memory", t0)
	nanMetric.Metrics[MetricMemoryIncrease] = math.NaN()
	infMetric := promo("c", "memory", t0)
	infMetric.Metrics = map[string]float64{"x": math.Inf(-1)}
	farFuture := promo("d", "memory", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))
	huge := promo("e", "memory", t0)
	huge.Code = strings.Repeat("x", 8192)

	tests := []struct {
		name string
		p    Promotion
		want error
	}{
		{"duplicate id", promo("a", "tools", t0), ErrInvalidPromotion},
		{"NaN metric", nanMetric, ErrInvalidPromotion},
		{"-Inf metric", infMetric, ErrInvalidPromotion},
		{"time JSON cannot carry", farFuture, ErrInvalidPromotion},
		{"over the size limit", huge, ErrLedgerFull},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := l.Record(tt.p)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Record = %v, want %v", err, tt.want)
			}
			if got := ids(l.Promotions()); !slices.Equal(got, []string{"a"}) {
				t.Errorf("in memory %v after a refused Record", got)
			}
			after, _ := os.ReadFile(path)
			if string(after) != string(before) {
				t.Error("file changed after a refused Record")
			}
		})
	}
}

func TestLedgerRecordIOFailureChangesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	l, err := OpenLedger(filepath.Join(dir, "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	mustRecord(t, l, promo("a", "memory", t0))
	// Replace the directory by a file: the temporary file cannot be created
	// (chmod would not stop root).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err = l.Record(promo("b", "memory", t0))
	if err == nil {
		t.Fatal("Record succeeded without a directory")
	}
	if !strings.Contains(err.Error(), "record promotion b") {
		t.Errorf("error %q does not say what failed", err)
	}
	if got := ids(l.Promotions()); !slices.Equal(got, []string{"a"}) {
		t.Errorf("in memory %v after a failed Record", got)
	}
	if p := l.Promotions()[0]; p.Code == "" {
		t.Error("a failed Record dropped the live promotion's code")
	}
}

func TestOpenLedgerRemovesStaleTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "evolution.json")
	stale := filepath.Join(dir, "evolution.json.12345.tmp")
	other := filepath.Join(dir, "audit.jsonl")
	for _, f := range []string{stale, other} {
		if err := os.WriteFile(f, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := OpenLedger(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temporary file kept: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("unrelated file removed: %v", err)
	}
}

func TestOpenLedgerCorrupt(t *testing.T) {
	const good = `{"version":1,"promotions":[{"id":"a","module":"m","code":"c","target":"m","reason":"r","backup_checkpoint_id":"x","at":"2025-06-01T12:00:00Z"}]}`
	tests := []struct {
		name     string
		contents string
		detail   string
	}{
		{"empty file", "", "not a ledger"},
		{"garbage", "\x00\x01garbage", "not a ledger"},
		{"torn write", good[:len(good)/2], "not a ledger"},
		{"trailing data", good + `{}`, "data after the JSON object"},
		{"JSON null", "null", "format version 0"},
		{"no version", `{"promotions":[]}`, "format version 0"},
		{"future version", `{"version":2,"promotions":[]}`, "format version 2"},
		{"promotions not a list", `{"version":1,"promotions":{}}`, "not a ledger"},
		{"empty id", `{"version":1,"promotions":[{"id":"","at":"2025-06-01T12:00:00Z"}]}`, "promotion 0: empty id"},
		{"no time", `{"version":1,"promotions":[{"id":"a"}]}`, "promotion 0: no time"},
		{"time beyond 9999 in UTC", `{"version":1,"promotions":[{"id":"a","at":"9999-12-31T23:00:00-05:00"}]}`, "out of range"},
		{"bad time", `{"version":1,"promotions":[{"id":"a","at":"yesterday"}]}`, "not a ledger"},
		{"duplicate id", `{"version":1,"promotions":[{"id":"a","at":"2025-06-01T12:00:00Z"},{"id":"a","at":"2025-06-01T12:00:01Z"}]}`, `promotion 1: id "a" appears twice`},
		{"metric not a number", `{"version":1,"promotions":[{"id":"a","at":"2025-06-01T12:00:00Z","metrics":{"x":"1"}}]}`, "not a ledger"},
		{"metric out of range", `{"version":1,"promotions":[{"id":"a","at":"2025-06-01T12:00:00Z","metrics":{"x":1e999}}]}`, "not a ledger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "evolution.json")
			if err := os.WriteFile(path, []byte(tt.contents), 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := OpenLedger(path)
			if !errors.Is(err, ErrCorruptLedger) {
				t.Fatalf("OpenLedger = %v, %v; want ErrCorruptLedger", l, err)
			}
			for _, s := range []string{path, tt.detail, "move it aside"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
	t.Run("good file opens", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "evolution.json")
		if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenLedger(path); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOpenLedgerTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"promotions":[]}`+strings.Repeat(" ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := openLedger(path, defaultMaxHistory, 64)
	if !errors.Is(err, ErrCorruptLedger) || !strings.Contains(err.Error(), "larger than 64 bytes") {
		t.Errorf("OpenLedger = %v, want ErrCorruptLedger naming the size", err)
	}
}

func TestLedgerCopiesAreIndependent(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := promo("a", "memory", t0)
	mustRecord(t, l, p)
	p.Metrics[MetricLatencyImprovement] = 99 // the caller's map after Record
	l.Promotions()[0].Metrics[MetricLatencyImprovement] = 98
	l.Since(time.Time{})[0].Metrics[MetricLatencyImprovement] = 97
	if got := l.Promotions()[0].Metrics[MetricLatencyImprovement]; got != -0.15 {
		t.Errorf("stored figure changed through a caller's map: %v", got)
	}
}

func TestLedgerConcurrentRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "evolution.json")
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := l.Record(promo(fmt.Sprint(i), fmt.Sprint("m", i%3), t0)); err != nil {
				t.Error(err)
			}
			_ = l.Since(t0)
		})
	}
	wg.Wait()
	re, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(re.Promotions()), ids(l.Promotions()); len(got) != 8 || !slices.Equal(got, want) {
		t.Errorf("on disk %v, in memory %v", got, want)
	}
	if got := len(re.Since(time.Time{})); got != 3 {
		t.Errorf("%d live promotions, want one per module (3)", got)
	}
}
