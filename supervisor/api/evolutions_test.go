package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// Trial ids begin with their time, so trials a minute apart share their
// first 8 characters: a prefix of two is said to be ambiguous (409, and
// the CLI says so), not "no evolution" (404) as before.
func TestEvolutionPrefixOfSeveralIsAmbiguous(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	var b strings.Builder
	for _, id := range []string{"01a22a2b-3b7f-7cdb-8f05-744901db9be6", "01a22a2b-3c19-7935-97f8-60cc070fed6f"} {
		line, _ := json.Marshal(observe.AuditRecord{ID: "a-" + id, Time: time.Now().UTC(), Kind: observe.AuditEvolution,
			Fields: map[string]any{"trial": id, "decision": "rejected"}})
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := FindEvolution(path, "01a22a2b-3c19"); !ok || err != nil || e.ID != "01a22a2b-3c19-7935-97f8-60cc070fed6f" {
		t.Fatalf("a unique prefix: %+v %v %v", e, ok, err)
	}
	_, ok, err := FindEvolution(path, "01a22a2b")
	if ok || !errors.Is(err, ErrAmbiguousEvolution) || !strings.Contains(err.Error(), "matches 2") {
		t.Fatalf("a prefix of two: ok %v, err %v; want ErrAmbiguousEvolution", ok, err)
	}
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	s, err := New(Options{Log: slog.New(slog.DiscardHandler), Metrics: met, Bounds: observe.NewBoundsMetrics(met.Reg, nil),
		Retention: time.Minute, AuditPath: path}, pageOwner{dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{"01a22a2b": 409, "01a22a2b-3b7f": 200, "01a22a2c": 404} {
		rw := httptest.NewRecorder()
		s.Handler().ServeHTTP(rw, httptest.NewRequest("GET", "/v1/evolutions/"+id, nil))
		if rw.Code != want {
			t.Errorf("GET /v1/evolutions/%s: %d %s, want %d", id, rw.Code, rw.Body, want)
		}
	}
}
