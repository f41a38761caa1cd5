package evolution

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCollectorMeans(t *testing.T) {
	c := NewCollector()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c.Add(Primary, map[string]float64{KeyAvgLatency: 10, KeyErrorRate: 0.02, KeyMemoryUsage: 100, "throughput": 7}, t0)
	c.Add(Primary, map[string]float64{KeyAvgLatency: 20, KeyMemoryUsage: 300}, t0.Add(time.Second))
	c.Add(Primary, map[string]float64{"p99_latency": 99}, t0.Add(2*time.Second))
	c.Add(Shadow, map[string]float64{KeyAvgLatency: 5, KeyErrorRate: 0, KeyMemoryUsage: 1}, t0.Add(time.Second))

	got := c.Summary(Primary)
	want := Summary{
		Reports: 3, AvgLatency: 15, ErrorRate: 0.02, MemoryUsage: 200,
		LatencyReports: 2, ErrorRateReports: 1, MemoryReports: 2,
		First: t0, Last: t0.Add(2 * time.Second),
	}
	if got != want {
		t.Errorf("primary summary\n got %+v\nwant %+v", got, want)
	}
	if s := c.Summary(Shadow); s.Reports != 1 || s.AvgLatency != 5 || s.MemoryReports != 1 || !s.First.Equal(t0.Add(time.Second)) {
		t.Errorf("shadow summary %+v", s)
	}
}

func TestCollectorMissingKeyIsNotZero(t *testing.T) {
	c := NewCollector()
	c.Add(Shadow, map[string]float64{KeyAvgLatency: 10}, time.Time{})
	c.Add(Shadow, map[string]float64{}, time.Time{})
	s := c.Summary(Shadow)
	if s.AvgLatency != 10 || s.LatencyReports != 1 || s.Reports != 2 {
		t.Errorf("a report without avg_latency changed the mean: %+v", s)
	}
	if s.MemoryReports != 0 || s.MemoryUsage != 0 {
		t.Errorf("memory_usage was never reported: %+v", s)
	}
}

func TestCollectorSetsAsideImpossibleValues(t *testing.T) {
	tests := []struct {
		name   string
		report map[string]float64
		first  string
	}{
		{"NaN latency", map[string]float64{KeyAvgLatency: math.NaN()}, "avg_latency=NaN"},
		{"+Inf memory", map[string]float64{KeyMemoryUsage: math.Inf(1)}, "memory_usage=+Inf"},
		{"-Inf latency", map[string]float64{KeyAvgLatency: math.Inf(-1)}, "avg_latency=-Inf"},
		{"negative memory", map[string]float64{KeyMemoryUsage: -4}, "memory_usage=-4"},
		{"error rate above 1", map[string]float64{KeyErrorRate: 1.01}, "error_rate=1.01"},
		{"negative error rate", map[string]float64{KeyErrorRate: -0.5}, "error_rate=-0.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCollector()
			for range 3 {
				c.Add(Primary, map[string]float64{KeyAvgLatency: 10, KeyErrorRate: 0.5, KeyMemoryUsage: 100}, time.Time{})
				c.Add(Shadow, map[string]float64{KeyAvgLatency: 10, KeyErrorRate: 0.5, KeyMemoryUsage: 100}, time.Time{})
			}
			c.Add(Shadow, tt.report, time.Time{})
			s := c.Summary(Shadow)
			if s.Invalid != 1 || s.FirstInvalid != tt.first {
				t.Errorf("Invalid = %d, FirstInvalid = %q; want 1, %q", s.Invalid, s.FirstInvalid, tt.first)
			}
			if s.AvgLatency != 10 || s.ErrorRate != 0.5 || s.MemoryUsage != 100 {
				t.Errorf("an impossible value was averaged in: %+v", s)
			}
			d := Decide(c.Summary(Primary), s, alive, DefaultThresholds())
			if d.Promote || !strings.Contains(d.Reason, tt.first) {
				t.Errorf("Decide = %+v, want a rejection naming %q", d, tt.first)
			}
		})
	}
}

func TestCollectorUnknownSide(t *testing.T) {
	c := NewCollector()
	c.Add(Side(7), map[string]float64{KeyAvgLatency: 1}, time.Time{})
	c.Add(Side(-1), map[string]float64{KeyAvgLatency: 1}, time.Time{})
	if c.Summary(Primary) != (Summary{}) || c.Summary(Shadow) != (Summary{}) || c.Summary(Side(7)) != (Summary{}) {
		t.Error("a report from an unknown side was recorded")
	}
	if Primary.String() != "primary" || Shadow.String() != "shadow" || Side(7).String() != "Side(7)" {
		t.Error("Side.String")
	}
}

// TestCollectorConcurrent is for the race detector: reports from both sides
// arrive on their own goroutines while the trial's owner reads summaries.
func TestCollectorConcurrent(t *testing.T) {
	c := NewCollector()
	const n = 500
	var wg sync.WaitGroup
	for _, side := range []Side{Primary, Shadow} {
		wg.Go(func() {
			for i := range n {
				c.Add(side, map[string]float64{KeyAvgLatency: float64(i % 10), KeyErrorRate: 0, KeyMemoryUsage: 1 << 20}, time.Now())
			}
		})
	}
	wg.Go(func() {
		for range n {
			_ = c.Summary(Shadow)
		}
	})
	wg.Wait()
	for _, side := range []Side{Primary, Shadow} {
		if s := c.Summary(side); s.Reports != n || math.Abs(s.AvgLatency-4.5) > 1e-9 {
			t.Errorf("%s: %+v", side, s)
		}
	}
}

// TestCollectorLargeValuesStayFinite: a sum of memory figures near the float
// limit would overflow; the running mean does not.
func TestCollectorLargeValuesStayFinite(t *testing.T) {
	c := NewCollector()
	for range 4 {
		c.Add(Primary, map[string]float64{KeyMemoryUsage: math.MaxFloat64}, time.Time{})
	}
	if s := c.Summary(Primary); s.MemoryUsage != math.MaxFloat64 {
		t.Errorf("mean of MaxFloat64 = %v", s.MemoryUsage)
	}
}

func TestCollectorToDecision(t *testing.T) {
	c := NewCollector()
	for i := range 5 {
		c.Add(Primary, map[string]float64{KeyAvgLatency: 10 + float64(i), KeyErrorRate: 0.01, KeyMemoryUsage: 80e6}, time.Time{})
		c.Add(Shadow, map[string]float64{KeyAvgLatency: 9 + float64(i), KeyErrorRate: 0.01, KeyMemoryUsage: 84e6}, time.Time{})
	}
	d := Decide(c.Summary(Primary), c.Summary(Shadow), Outcome{ShadowAlive: true, MinReports: 5}, DefaultThresholds())
	if !d.Promote {
		t.Fatalf("want promotion, got %+v", d)
	}
	if got := d.Metrics[MetricLatencyImprovement]; got != -0.083333333 {
		t.Errorf("latency_improvement = %v, want 11/12 - 1 rounded to 9 decimals", got)
	}
	if got := d.Metrics[MetricMemoryIncrease]; got != 0.05 {
		t.Errorf("memory_increase = %v", got)
	}
}

func BenchmarkCollectorAdd(b *testing.B) {
	c := NewCollector()
	report := map[string]float64{
		KeyAvgLatency: 10.5, "p50_latency": 8, "p95_latency": 25, "p99_latency": 50,
		KeyErrorRate: 0.01, KeyMemoryUsage: 80e6, "throughput": 1000, "active_tools": 5, "memory_blocks": 1000,
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		c.Add(Shadow, report, now)
	}
}

func TestCollectorAddResult(t *testing.T) {
	c := NewCollector()
	c.AddResult(Shadow, false, 10*time.Millisecond)
	c.AddResult(Shadow, true, 30*time.Millisecond)
	c.AddResult(Side(7), true, time.Second)
	s := c.Summary(Shadow)
	if s.Results != 2 || s.ResultErrors != 1 || s.ResultLatency < 0.0199 || s.ResultLatency > 0.0201 {
		t.Errorf("shadow summary %+v", s)
	}
	if p := c.Summary(Primary); p.Results != 0 {
		t.Errorf("primary got results: %+v", p)
	}
}
