package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// pageOwner is an Owner for the status page's tests: a running agent,
// twenty checkpoint records in the audit ring.
type pageOwner struct {
	rec *observe.Recorder
	dir string
}

func (o pageOwner) Status() Status {
	now := time.Now()
	return Status{Running: true, SupervisorPID: 1, State: "running", PID: 42, Incarnation: 2, AgentStartedAt: now.Add(-time.Minute),
		UptimeSeconds: 60, LastHeartbeat: now.Add(-300 * time.Millisecond), Restarts: 1, LastRestartReason: "killed",
		NewestCheckpoint: "01a21f93-5b65-74e2-9c72-e74bf5602ce1", LastWALSequence: 123456, DurableWALSequence: 123400}
}
func (pageOwner) Health(time.Time) (bool, bool, time.Duration, time.Duration) {
	return false, false, 0, 0
}
func (o pageOwner) Readiness() (bool, string, Status)            { return true, "", o.Status() }
func (pageOwner) Target() (Agent, Mirror, string)                { return nil, nil, "" }
func (pageOwner) CheckpointMeta(string) (checkpoint.Meta, error) { return checkpoint.Meta{}, nil }
func (pageOwner) CheckpointList() ([]checkpoint.Meta, error) {
	return []checkpoint.Meta{{ID: "01a21f93-5b65-74e2-9c72-e74bf5602ce1", Watermark: 123000, Size: 80 << 10, StoredSize: 20 << 10, Created: time.Now()}}, nil
}
func (o pageOwner) Details() Details {
	return Details{HeartbeatTimeout: 5 * time.Second, WALDir: o.dir, Recorder: o.rec,
		RecentRestarts: []RestartRecord{{Time: time.Now(), Reason: "killed", Restarts: 1, PID: 41}}}
}
func (pageOwner) Control(context.Context, ControlRequest, checkpoint.Meta) ControlResponse {
	return ControlResponse{}
}

func newPageServer(tb testing.TB) *Server {
	tb.Helper()
	a, err := observe.OpenAudit(filepath.Join(tb.TempDir(), "audit.jsonl"), nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	rec := observe.NewRecorder(slog.New(slog.DiscardHandler))
	rec.AttachAudit(a)
	for i := range 30 {
		rec.Audit(observe.AuditCheckpoint, map[string]any{"checkpoint_id": "01a21f93-5b65-74e2-9c72-e74bf5602ce1", "checksum": "crc32c:fae484c0",
			"pruned": []string{"01a21f93-4af8-7841-ad86-11225882beec"}, "size": 82242 + i, "stored_size": 20567, "watermark": 524})
	}
	rec.Audit(observe.AuditEvolution, map[string]any{"decision": "rejected", "reason": "<script>alert(1)</script>", "target": "memory", "metrics": map[string]float64{"p95_latency_ms": 12}})
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	s, err := New(Options{Log: slog.New(slog.DiscardHandler), Metrics: met, Bounds: observe.NewBoundsMetrics(met.Reg, nil), Retention: time.Minute},
		pageOwner{rec: rec, dir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	for i := range samplePoints {
		s.sample(time.Now().Add(time.Duration(i-samplePoints) * sampleEvery))
	}
	return s
}

// The page escapes the agent's text and carries the security headers.
func TestStatusPageRenders(t *testing.T) {
	s := newPageServer(t)
	rw := httptest.NewRecorder()
	s.Handler().ServeHTTP(rw, httptest.NewRequest("GET", "/", nil))
	body := rw.Body.String()
	if rw.Code != 200 || rw.Header().Get("Content-Security-Policy") != "default-src 'self'" || rw.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("GET /: %d %v", rw.Code, rw.Header())
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the evolution's reason is not escaped")
	}
	if !strings.Contains(body, `id="pid">42<`) || !strings.Contains(body, `id="heartbeat">0.3s ago<`) {
		t.Errorf("GET / does not render pid and heartbeat:\n%s", body)
	}
}

// The sampler keeps the newest samplePoints points, oldest first, written
// in place: it runs every sampleEvery for the supervisor's whole life, and
// must not refill an idle heap (issue 31).
func TestSamplerRingKeepsTheNewestPointsInPlace(t *testing.T) {
	s := newPageServer(t)
	base := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for i := range samplePoints + 7 {
		s.status.lastAt = time.Time{} // a rate of 0; the heartbeat age is the point
		s.sample(base.Add(time.Duration(i) * sampleEvery))
	}
	h := s.history()
	if len(h.HeartbeatAge) != samplePoints || len(h.EntriesPerSec) != samplePoints {
		t.Fatalf("%d and %d points, want %d", len(h.HeartbeatAge), len(h.EntriesPerSec), samplePoints)
	}
	if want := base.Add(7 * sampleEvery); !h.Start.Equal(want) {
		t.Fatalf("the oldest point at %v, want %v (the first seven overwritten)", h.Start, want)
	}
	// A history handed out is a copy: later points do not change it.
	first := h.HeartbeatAge[0]
	// What is left is reading the appends counter (a few small objects);
	// copying the arrays was some 5 KiB a point.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 50 {
		s.sample(base.Add(time.Hour))
	}
	runtime.ReadMemStats(&after)
	if perPoint := (after.TotalAlloc - before.TotalAlloc) / 50; perPoint > 256 {
		t.Errorf("a point allocated %d bytes, want at most 256", perPoint)
	}
	if h.HeartbeatAge[0] != first {
		t.Error("a history handed out was written by the sampler")
	}
	if h2 := s.history(); !h2.Start.After(h.Start) {
		t.Errorf("after 50 more points the oldest is %v, was %v", h2.Start, h.Start)
	}
}

// The WAL's size is listed when someone looks, at most once per
// sampleEvery, and not by the sampler.
func TestWALSizeIsListedWhenLookedAt(t *testing.T) {
	s := newPageServer(t)
	dir := t.TempDir()
	if n, _ := s.walSize(dir); n != 0 {
		t.Fatalf("%d segments in an empty directory", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "0000000000000001.wal"), make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.walSize(dir); n != 0 {
		t.Fatalf("listed again within sampleEvery: %d segments", n)
	}
	s.status.mu.Lock()
	s.status.walAt = s.status.walAt.Add(-sampleEvery)
	s.status.mu.Unlock()
	if n, size := s.walSize(dir); n != 1 || size != 100 {
		t.Fatalf("%d segments of %d bytes, want 1 of 100", n, size)
	}
	at := s.status.walAt
	s.sample(time.Now())
	if s.status.walAt != at {
		t.Fatal("the sampler listed the WAL directory")
	}
}

// BenchmarkStatusHandler is GET /v1/status's server-side cost: twenty audit
// records, a full sample ring.
func BenchmarkStatusHandler(b *testing.B) {
	s := newPageServer(b)
	h := s.Handler()
	req := httptest.NewRequest("GET", "/v1/status", nil)
	b.ReportAllocs()
	for b.Loop() {
		rw := httptest.NewRecorder()
		h.ServeHTTP(rw, req)
		if rw.Code != http.StatusOK {
			b.Fatal(rw.Code)
		}
	}
}

// TestStatusCountsDroppedResults: answered requests whose result the book
// dropped (over requests.MaxResultBytes) stay counted: as dropped in
// /v1/status, and among the answered on the status page. Before, counts
// had no case for them and they vanished from every count.
func TestStatusCountsDroppedResults(t *testing.T) {
	s := newPageServer(t)
	b, _, err := requests.OpenBook(t.TempDir(), requests.Config{Retention: time.Hour, Timeout: time.Hour, MaxBytes: 1 << 30,
		Metrics: requests.NewMetrics(prometheus.NewRegistry()), Encode: schema.NewCodec(schema.Options{}).Encode})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s.requests.SetBook(b)
	data, _ := json.Marshal(strings.Repeat("r", 1<<20))
	const n = 20 // 20 MiB of results: some over the 16 MiB bound are dropped
	for i := range n {
		id := fmt.Sprintf("req-%02d", i)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Answer(id, data, nil); err != nil {
			t.Fatal(err)
		}
	}
	dropped := 0
	for _, v := range b.List() {
		if v.Status == requests.StatusDropped {
			dropped++
		}
	}
	if dropped == 0 {
		t.Fatal("no result was dropped; the test needs some")
	}
	st := s.FullStatus(time.Now())
	c := st.Requests
	if c.Dropped != dropped || c.Answered+c.Dropped != n {
		t.Errorf("status: %+v; the book holds %d answered, %d of them with their result dropped", *c, n, dropped)
	}
	if got := fields(st)["req_answered"]; got != strconv.Itoa(n) {
		t.Errorf("the status page shows %s answered, the agent answered %d", got, n)
	}
}
