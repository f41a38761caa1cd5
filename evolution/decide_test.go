package evolution

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// full returns a Summary of n reports that all carried the three keys.
func full(n int, latency, errRate, memory float64) Summary {
	return Summary{
		Reports: n, AvgLatency: latency, ErrorRate: errRate, MemoryUsage: memory,
		LatencyReports: n, ErrorRateReports: n, MemoryReports: n,
	}
}

var alive = Outcome{ShadowAlive: true, MinReports: 1}

func TestDecide(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	base := full(5, 10, 0.01, 100e6)
	tests := []struct {
		name     string
		primary  Summary
		shadow   Summary
		outcome  Outcome
		th       Thresholds
		promote  bool
		reason   []string           // substrings the reason must contain
		metrics  map[string]float64 // exact figures expected (nil: not checked)
		excluded []string           // keys that must be absent from Metrics
	}{
		{
			name: "better on every figure promotes", primary: base, shadow: full(5, 8.5, 0.01, 110e6),
			promote: true,
			reason:  []string{"within all limits", "shadow latency -15.0% (limit +5.0%), error rate +0.000 (limit +0.010), memory +10.0% (limit +25.0%)"},
			metrics: map[string]float64{MetricLatencyImprovement: 8.5/10 - 1, MetricErrorRateChange: 0, MetricMemoryIncrease: 110e6/100e6 - 1},
		},
		{
			name: "exactly at every threshold promotes", primary: full(3, 10, 0.01, 100), shadow: full(3, 10.5, 0.02, 125),
			promote: true, reason: []string{"latency +5.0% (limit +5.0%)", "error rate +0.010 (limit +0.010)", "memory +25.0% (limit +25.0%)"},
		},
		{
			name: "negative figures are improvements and promote", primary: full(3, 20, 0.10, 200), shadow: full(3, 5, 0.0, 50),
			promote: true, metrics: map[string]float64{MetricLatencyImprovement: -0.75, MetricErrorRateChange: -0.10, MetricMemoryIncrease: -0.75},
		},
		{
			name: "latency just over its limit rejects", primary: full(3, 10, 0.01, 100), shadow: full(3, 10.52, 0.01, 100),
			reason: []string{"over the latency limit:", "latency +5.2% (limit +5.0%)"},
		},
		{
			name: "error rate over its limit rejects", primary: full(3, 10, 0.01, 100), shadow: full(3, 10, 0.03, 100),
			reason: []string{"over the error rate limit:", "error rate +0.020 (limit +0.010)"},
		},
		{
			name: "every figure over its limit names them all", primary: full(3, 10, 0.0, 100), shadow: full(3, 12, 0.15, 150),
			reason:  []string{"over the latency, error rate and memory limits:", "latency +20.0%", "error rate +0.150", "memory +50.0%"},
			metrics: map[string]float64{MetricLatencyImprovement: 12.0/10 - 1, MetricErrorRateChange: 0.15, MetricMemoryIncrease: 0.5},
		},
		{
			name: "both latencies zero is no change", primary: full(2, 0, 0, 100), shadow: full(2, 0, 0, 100),
			promote: true, metrics: map[string]float64{MetricLatencyImprovement: 0, MetricErrorRateChange: 0, MetricMemoryIncrease: 0},
		},
		{
			name: "primary latency zero against a slower shadow is unbounded", primary: full(2, 0, 0, 100), shadow: full(2, 3, 0, 100),
			reason:   []string{"shadow avg_latency 3 ms against a primary avg_latency of 0 ms: the increase is unbounded (limit +5.0%)"},
			excluded: []string{MetricLatencyImprovement},
			metrics:  map[string]float64{MetricErrorRateChange: 0, MetricMemoryIncrease: 0},
		},
		{
			name: "primary memory zero against a shadow using some is unbounded", primary: full(2, 10, 0, 0), shadow: full(2, 10, 0, 4096),
			reason: []string{"memory_usage 4096 bytes against a primary memory_usage of 0 bytes", "unbounded"}, excluded: []string{MetricMemoryIncrease},
		},
		{
			name: "a ratio that overflows is unbounded", primary: full(2, 1e-300, 0, 100), shadow: full(2, 1e300, 0, 100),
			reason: []string{"unbounded"}, excluded: []string{MetricLatencyImprovement},
		},
		{
			name: "shadow never reported memory_usage", primary: base,
			shadow: Summary{Reports: 5, AvgLatency: 9, ErrorRate: 0, LatencyReports: 5, ErrorRateReports: 5},
			reason: []string{"not enough data: shadow never reported memory_usage"}, excluded: []string{MetricMemoryIncrease},
		},
		{
			name: "primary never reported avg_latency", shadow: base,
			primary: Summary{Reports: 5, ErrorRate: 0.01, MemoryUsage: 100e6, ErrorRateReports: 5, MemoryReports: 5},
			reason:  []string{"not enough data: primary never reported avg_latency"},
		},
		{
			name: "a key carried by too few reports", primary: full(4, 10, 0, 100),
			shadow:  Summary{Reports: 4, AvgLatency: 9, MemoryUsage: 100, LatencyReports: 4, ErrorRateReports: 4, MemoryReports: 1},
			outcome: Outcome{ShadowAlive: true, MinReports: 3},
			reason:  []string{"shadow reported memory_usage in 1 of 4 reports, at least 3 needed"},
		},
		{
			name: "too few reports from the shadow", primary: full(6, 10, 0, 100), shadow: full(1, 9, 0, 100),
			outcome: Outcome{ShadowAlive: true, MinReports: 3},
			reason:  []string{"not enough data: the primary sent 6 metrics reports and the shadow 1, at least 3 from each are needed"},
		},
		{
			name: "no reports at all, minimum below one counts as one", primary: Summary{}, shadow: Summary{},
			outcome: Outcome{ShadowAlive: true, MinReports: 0},
			reason:  []string{"the primary sent 0 metrics reports and the shadow 0, at least 1 from each"},
		},
		{
			name: "shadow exited: rejected whatever its figures", primary: base, shadow: full(5, 1, 0, 1),
			outcome: Outcome{ShadowAlive: false, ShadowFailure: "shadow exited with code 3", MinReports: 1},
			reason:  []string{"shadow failed during the trial: shadow exited with code 3"},
			metrics: map[string]float64{MetricLatencyImprovement: -0.9, MetricErrorRateChange: -0.01, MetricMemoryIncrease: 1/100e6 - 1},
		},
		{
			name: "shadow hung", primary: base, shadow: base,
			outcome: Outcome{ShadowAlive: true, ShadowFailure: "shadow hung: no heartbeat for 5s", MinReports: 1},
			reason:  []string{"shadow failed during the trial: shadow hung"},
		},
		{
			name: "zero Outcome is a dead shadow", primary: base, shadow: base, outcome: Outcome{},
			reason: []string{"shadow did not stay alive and heartbeating"},
		},
		{
			name: "shadow NaN latency mean", primary: base, shadow: full(5, nan, 0, 100e6),
			reason: []string{"impossible figures", "shadow avg_latency averaged NaN"}, excluded: []string{MetricLatencyImprovement},
		},
		{
			name: "primary +Inf memory mean", primary: full(5, 10, 0, inf), shadow: base,
			reason: []string{"impossible figures", "primary memory_usage averaged +Inf"}, excluded: []string{MetricMemoryIncrease},
		},
		{
			name: "error rate above 1", primary: base, shadow: full(5, 10, 1.5, 100e6),
			reason: []string{"shadow error_rate averaged 1.5"}, excluded: []string{MetricErrorRateChange},
		},
		{
			name: "negative latency", primary: base, shadow: full(5, -1, 0, 100e6),
			reason: []string{"shadow avg_latency averaged -1"},
		},
		{
			name: "values the collector set aside", primary: base,
			shadow: func() Summary { s := full(5, 5, 0, 1); s.Invalid, s.FirstInvalid = 2, "error_rate=NaN"; return s }(),
			reason: []string{"shadow sent 2 impossible values (first: error_rate=NaN)"},
		},
		{
			name: "NaN threshold fails safe", primary: base, shadow: base,
			th:     Thresholds{MaxLatencyIncrease: nan, MaxErrorRateIncrease: 0.01, MaxMemoryIncrease: 0.25},
			reason: []string{"cannot compare", "max latency increase is NaN"},
		},
		{
			name: "+Inf threshold is no limit", primary: full(2, 10, 0, 100), shadow: full(2, 100, 0, 100),
			th:      Thresholds{MaxLatencyIncrease: inf, MaxErrorRateIncrease: 0.01, MaxMemoryIncrease: 0.25},
			promote: true, reason: []string{"latency +900.0% (no limit)"},
		},
		{
			name: "negative threshold demands an improvement", primary: full(2, 10, 0, 100), shadow: full(2, 9.5, 0, 100),
			th:     Thresholds{MaxLatencyIncrease: -0.10, MaxErrorRateIncrease: 0.01, MaxMemoryIncrease: 0.25},
			reason: []string{"over the latency limit", "latency -5.0% (limit -10.0%)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.outcome == (Outcome{}) && !strings.HasPrefix(tt.name, "zero Outcome") {
				tt.outcome = alive
			}
			if tt.th == (Thresholds{}) {
				tt.th = DefaultThresholds()
			}
			d := Decide(tt.primary, tt.shadow, tt.outcome, tt.th)
			t.Logf("reason: %s", d.Reason)
			if d.Promote != tt.promote {
				t.Errorf("Promote = %v, want %v", d.Promote, tt.promote)
			}
			wantDecision := DecisionRejected
			if tt.promote {
				wantDecision = DecisionPromoted
			}
			if d.Decision != wantDecision {
				t.Errorf("Decision = %q, want %q", d.Decision, wantDecision)
			}
			for _, s := range tt.reason {
				if !strings.Contains(d.Reason, s) {
					t.Errorf("reason %q does not contain %q", d.Reason, s)
				}
			}
			if d.Metrics == nil {
				t.Fatal("Metrics is nil")
			}
			for k, v := range d.Metrics {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Errorf("Metrics[%s] = %v, must be finite", k, v)
				}
			}
			for k, want := range tt.metrics {
				if got, ok := d.Metrics[k]; !ok || got != want {
					t.Errorf("Metrics[%s] = %v (present %v), want %v", k, got, ok, want)
				}
			}
			for _, k := range tt.excluded {
				if v, ok := d.Metrics[k]; ok {
					t.Errorf("Metrics[%s] = %v, want it left out", k, v)
				}
			}
		})
	}
}

func TestDecideReasonWording(t *testing.T) {
	d := Decide(full(6, 10, 0.01, 100), full(4, 8.5, 0.01, 110), alive, DefaultThresholds())
	want := "within all limits over 6 primary and 4 shadow metrics reports: " +
		"shadow latency -15.0% (limit +5.0%), error rate +0.000 (limit +0.010), memory +10.0% (limit +25.0%)"
	if d.Reason != want {
		t.Errorf("reason\n got %q\nwant %q", d.Reason, want)
	}
}

func TestThresholdsValidate(t *testing.T) {
	tests := []struct {
		name string
		th   Thresholds
		ok   bool
	}{
		{"defaults", DefaultThresholds(), true},
		{"no limits", Thresholds{math.Inf(1), math.Inf(1), math.Inf(1)}, true},
		{"demand improvement", Thresholds{-0.2, -0.01, -1}, true},
		{"NaN", Thresholds{0.05, math.NaN(), 0.25}, false},
		{"-Inf", Thresholds{math.Inf(-1), 0.01, 0.25}, false},
		{"below -100%", Thresholds{0.05, 0.01, -1.5}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.th.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidThresholds) {
				t.Errorf("error %v does not wrap ErrInvalidThresholds", err)
			}
		})
	}
	if got := DefaultThresholds(); got != (Thresholds{0.05, 0.01, 0.25}) {
		t.Errorf("DefaultThresholds() = %+v", got)
	}
}

func BenchmarkDecide(b *testing.B) {
	p, s, th := full(30, 10, 0.01, 100e6), full(30, 9, 0.012, 105e6), DefaultThresholds()
	b.ReportAllocs()
	for b.Loop() {
		Decide(p, s, alive, th)
	}
}

// withResults adds request answers to a Summary.
func withResults(s Summary, n, errs int, latency float64) Summary {
	s.Results, s.ResultErrors, s.ResultLatency = n, errs, latency
	return s
}

func TestDecideRequestResults(t *testing.T) {
	base := full(3, 10, 0.01, 100)
	for _, c := range []struct {
		name    string
		p, s    Summary
		promote bool
		reason  string
		metrics map[string]float64
	}{
		{"no answers on one side: no request figures", withResults(base, 4, 0, 0.010), base, true, "within all limits", map[string]float64{}},
		{"shadow answers as well promotes", withResults(base, 4, 0, 0.010), withResults(base, 4, 0, 0.0101), true, "request errors +0.000 (limit +0.010), request latency +1.0% (limit +5.0%)",
			map[string]float64{MetricRequestErrorRateChange: 0, MetricRequestLatencyImprovement: 0.01}},
		{"shadow failing requests rejects", withResults(base, 4, 0, 0.010), withResults(base, 4, 2, 0.010), false, "over the request error limit", map[string]float64{MetricRequestErrorRateChange: 0.5}},
		{"shadow answering slower rejects", withResults(base, 4, 0, 0.010), withResults(base, 4, 0, 0.020), false, "over the request latency limit", map[string]float64{MetricRequestLatencyImprovement: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.p, c.s, alive, DefaultThresholds())
			if d.Promote != c.promote || !strings.Contains(d.Reason, c.reason) {
				t.Errorf("promote %v reason %q; want %v and %q", d.Promote, d.Reason, c.promote, c.reason)
			}
			for k, v := range c.metrics {
				if got, ok := d.Metrics[k]; !ok || math.Abs(got-v) > 1e-9 {
					t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
				}
			}
			if len(c.metrics) == 0 {
				if _, ok := d.Metrics[MetricRequestErrorRateChange]; ok {
					t.Errorf("request figures without answers on both sides: %v", d.Metrics)
				}
			}
		})
	}
}
