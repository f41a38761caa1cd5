package testagent

import (
	"math"
	"runtime/metrics"
	"slices"
	"time"
)

// requestStats collects the requests handled since the last metrics report.
type requestStats struct {
	since     time.Time
	latencies []float64 // milliseconds
	failed    int
}

func (s *requestStats) reset(now time.Time) {
	s.since = now
	s.latencies = s.latencies[:0]
	s.failed = 0
}

func (s *requestStats) record(latencyMS float64, failed bool) {
	s.latencies = append(s.latencies, latencyMS)
	if failed {
		s.failed++
	}
}

// report returns the metrics message's data. With no requests in the window
// the latency and error figures are the configured behaviour's, so a shadow
// and a primary can be compared without traffic.
func (a *refAgent) report(now time.Time) map[string]float64 {
	s := &a.stats
	m := map[string]float64{
		"active_tools":  float64(len(a.st.ToolRegistry.Tools)),
		"memory_blocks": float64(len(a.st.MemoryBlocks)),
		"memory_usage":  a.memoryUsage(),
		"throughput":    0,
	}
	if n := len(s.latencies); n > 0 {
		sorted := slices.Clone(s.latencies)
		slices.Sort(sorted)
		var sum float64
		for _, l := range sorted {
			sum += l
		}
		m["avg_latency"] = sum / float64(n)
		m["p50_latency"] = percentile(sorted, 0.50)
		m["p95_latency"] = percentile(sorted, 0.95)
		m["p99_latency"] = percentile(sorted, 0.99)
		m["error_rate"] = float64(s.failed) / float64(n)
		if secs := now.Sub(s.since).Seconds(); secs > 0 {
			m["throughput"] = float64(n) / secs
		}
	} else {
		for _, k := range []string{"avg_latency", "p50_latency", "p95_latency", "p99_latency"} {
			m[k] = a.beh.LatencyMS
		}
		m["error_rate"] = a.beh.ErrorRate
	}
	return m
}

func (a *refAgent) sendMetrics(now time.Time) error {
	m := a.report(now)
	a.stats.reset(now)
	return a.conn.SendMetrics(m)
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

var heapSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}

// memoryUsage is the behaviour's memory_mb when set, else the live heap.
func (a *refAgent) memoryUsage() float64 {
	if a.beh.MemoryMB > 0 {
		return a.beh.MemoryMB * (1 << 20)
	}
	metrics.Read(heapSample)
	if heapSample[0].Value.Kind() == metrics.KindUint64 {
		return float64(heapSample[0].Value.Uint64())
	}
	return 0
}
