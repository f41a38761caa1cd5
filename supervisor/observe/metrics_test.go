package observe

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsFollowConventions lints every metric the supervisor exposes
// (names, units, _total counters, help texts) with client_golang's linter,
// the same rules promtool applies.
func TestMetricsFollowConventions(t *testing.T) {
	m := NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	m.AgentReport("primary", map[string]float64{"avg_latency": 12, "p99_latency": 50, "error_rate": 0.01, "memory_usage": 8e7, "custom": 3})
	m.Restarts.WithLabelValues("crashed").Inc()
	m.Invalid.WithLabelValues("INVALID_MESSAGE", "field_type").Inc()
	problems, err := testutil.GatherAndLint(m.Reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "go_") || strings.HasPrefix(p.Metric, "process_") {
			continue
		}
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

func TestAgentReportConvertsToBaseUnitsAndCapsKeys(t *testing.T) {
	m := NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	m.AgentReport("primary", map[string]float64{"avg_latency": 250, "memory_usage": 1024})
	if v := testutil.ToFloat64(m.AgentLatency.WithLabelValues("primary", "avg")); v != 0.25 {
		t.Fatalf("avg latency %v s, want 0.25 (250 ms)", v)
	}
	for i := 0; i < maxGenericAgentGauges+10; i++ {
		m.AgentReport("primary", map[string]float64{"k" + strings.Repeat("x", i): 1})
	}
	if n := testutil.CollectAndCount(m.AgentGeneric); n != maxGenericAgentGauges {
		t.Fatalf("%d generic gauges, want the cap %d", n, maxGenericAgentGauges)
	}
	if v := testutil.ToFloat64(m.GenericDenied); v != 10 {
		t.Fatalf("dropped %v, want 10", v)
	}
}
