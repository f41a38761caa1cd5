package evolution

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func equalPair() Pair { return Pair{CandidateLatency: 100 * ms, ControlLatency: 100 * ms} }

func judgeWith(t *testing.T, mod func(*JudgeConfig)) *Judge {
	t.Helper()
	c := DefaultJudgeConfig()
	if mod != nil {
		mod(&c)
	}
	return NewJudge(c)
}

func TestJudgeConfigValidate(t *testing.T) {
	if err := DefaultJudgeConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		flag string
		mod  func(*JudgeConfig)
	}{
		{"evolution-confidence", func(c *JudgeConfig) { c.Confidence = 1 }},
		{"evolution-confidence", func(c *JudgeConfig) { c.Confidence = math.NaN() }},
		{"evolution-max-latency-increase", func(c *JudgeConfig) { c.MaxLatencyIncrease = -1 }},
		{"evolution-max-latency-increase", func(c *JudgeConfig) { c.MaxLatencyIncrease = math.NaN() }},
		{"evolution-max-error-rate-increase", func(c *JudgeConfig) { c.MaxErrorRateIncrease = math.NaN() }},
		{"evolution-max-disagreement", func(c *JudgeConfig) { c.MaxDisagreement = -2 }},
		{"evolution-max-memory-increase", func(c *JudgeConfig) { c.MaxMemoryIncrease = -2 }},
		{"shadow-duration", func(c *JudgeConfig) { c.MinDuration = -1 }},
		{"evolution-max-duration", func(c *JudgeConfig) { c.MaxDuration = c.MinDuration - 1 }},
	} {
		cfg := DefaultJudgeConfig()
		c.mod(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidJudgeConfig) || !strings.Contains(err.Error(), "--"+c.flag+" ") {
			t.Errorf("%s: Validate() = %v, want ErrInvalidJudgeConfig naming the flag", c.flag, err)
		}
		v := NewJudge(cfg).Verdict(time.Hour)
		if v.Decision != VerdictRejected || !v.Inconclusive || !strings.HasPrefix(v.Reason, "cannot judge: ") {
			t.Errorf("%s: verdict %+v, want an inconclusive rejection saying it cannot judge", c.flag, v)
		}
	}
}

func TestJudgePromotesProvenLatencyAfterMinDuration(t *testing.T) {
	j := judgeWith(t, nil)
	for range latencyBurnIn - 1 {
		j.Add(equalPair())
	}
	if v := j.Verdict(20 * time.Second); v.Decision != VerdictContinue {
		t.Fatalf("before the burn-in: %s %q, want continue", v.Decision, v.Reason)
	}
	j.Add(equalPair())
	if v := j.Verdict(29 * time.Second); v.Decision != VerdictContinue {
		t.Fatalf("proven before --shadow-duration: %s %q, want continue", v.Decision, v.Reason)
	}
	v := j.Verdict(30 * time.Second)
	if v.Decision != VerdictPromoted || !strings.HasPrefix(v.Reason, "latency proven within +10.0% of the control") {
		t.Fatalf("verdict %s %q, want promoted on proven latency", v.Decision, v.Reason)
	}
	if e := v.Evidence; e.LatencyRatio != 1 || !e.LatencyBounded || e.LatencyRatioHigh > 1.1 || e.LatencyRatioLow >= 1 {
		t.Errorf("evidence %+v: want ratio 1 with bounds around it, high ≤ 1.1", e)
	}
}

func TestJudgeRejectsEachTest(t *testing.T) {
	for _, c := range []struct {
		name   string
		pair   Pair
		memory [2]float64
		prefix string
		within int // pairs
	}{
		{"latency", Pair{CandidateLatency: 150 * ms, ControlLatency: 100 * ms}, [2]float64{}, "latency: the candidate is slower than the control beyond the +10.0% tolerance", latencyBurnIn},
		{"errors", Pair{CandidateLatency: 100 * ms, ControlLatency: 100 * ms, CandidateFailed: true}, [2]float64{}, "errors: the candidate fails more often than the control beyond +0.000", 12},
		{"answers", Pair{CandidateLatency: 100 * ms, ControlLatency: 100 * ms, CandidateDisagrees: true}, [2]float64{}, "answers: the candidate disagrees with the primary more often than the control beyond +0.000", 12},
		{"memory", equalPair(), [2]float64{126, 100}, "memory: the candidate uses +26.0% more memory than the control, over the +25.0% limit", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := judgeWith(t, nil)
			if c.memory[1] != 0 {
				j.SetMemory(c.memory[0], c.memory[1])
			}
			for i := 1; i <= c.within; i++ {
				j.Add(c.pair)
				v := j.Verdict(time.Duration(i) * time.Second)
				if v.Decision == VerdictContinue {
					continue
				}
				if v.Decision != VerdictRejected || v.Inconclusive || !strings.HasPrefix(v.Reason, c.prefix) {
					t.Fatalf("after %d pairs: %s (inconclusive %v) %q, want a rejection starting %q", i, v.Decision, v.Inconclusive, v.Reason, c.prefix)
				}
				return
			}
			t.Fatalf("not rejected within %d pairs: %+v", c.within, j.Evidence())
		})
	}
}

func TestJudgeToleratesUpToTheLimits(t *testing.T) {
	j := judgeWith(t, func(c *JudgeConfig) { c.MaxDisagreement = 0.5; c.MaxErrorRateIncrease = 0.5 })
	j.SetMemory(125, 100) // exactly at the limit
	for i := range 200 {
		p := equalPair()
		p.CandidateDisagrees = i%4 == 0 // 25% < 50%
		p.CandidateFailed = i%5 == 0    // 20% < 50%
		j.Add(p)
	}
	if v := j.Verdict(time.Minute); v.Decision != VerdictPromoted {
		t.Fatalf("verdict %s %q, want promoted", v.Decision, v.Reason)
	}
}

// +Inf switches a test off.
func TestJudgeInfiniteTolerances(t *testing.T) {
	j := judgeWith(t, func(c *JudgeConfig) {
		c.MaxLatencyIncrease, c.MaxErrorRateIncrease, c.MaxDisagreement, c.MaxMemoryIncrease = math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)
	})
	if err := j.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	j.SetMemory(1e9, 1)
	for range latencyBurnIn {
		j.Add(Pair{CandidateLatency: 10 * time.Second, ControlLatency: ms, CandidateFailed: false, CandidateDisagrees: true})
	}
	for range 50 {
		j.Add(Pair{CandidateLatency: 10 * time.Second, ControlLatency: ms, CandidateFailed: true})
	}
	if v := j.Verdict(time.Minute); v.Decision != VerdictPromoted {
		t.Fatalf("verdict %s %q, want promoted with every test off", v.Decision, v.Reason)
	}
}

func TestJudgeInconclusiveAtMaxDuration(t *testing.T) {
	j := judgeWith(t, nil)
	v := j.Verdict(2 * time.Minute)
	if v.Decision != VerdictRejected || !v.Inconclusive || !strings.Contains(v.Reason, "inconclusive: latency not proven within 2m0s: no mirrored request was answered by both sides, over 0 pairs") {
		t.Fatalf("no pairs: %s %q", v.Decision, v.Reason)
	}
	// Noisy latencies around 1.10: neither side of the tolerance.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		j.Add(Pair{CandidateLatency: time.Duration(110e6 * (0.5 + rng.Float64())), ControlLatency: 100 * ms})
	}
	if v := j.Verdict(time.Minute); v.Decision != VerdictContinue {
		t.Fatalf("before max duration: %s %q, want continue", v.Decision, v.Reason)
	}
	v = j.Verdict(2 * time.Minute)
	if v.Decision != VerdictRejected || !v.Inconclusive || !strings.HasPrefix(v.Reason, "inconclusive: latency not proven within 2m0s: latency ratio ") ||
		!strings.HasSuffix(v.Reason, "over 40 pairs; give the trial more requests or a longer --evolution-max-duration") {
		t.Fatalf("unproven: %s %q", v.Decision, v.Reason)
	}
}

func TestJudgeWithoutControlSaysSo(t *testing.T) {
	j := judgeWith(t, func(c *JudgeConfig) { c.Control = false })
	for range latencyBurnIn {
		j.Add(Pair{CandidateLatency: 300 * ms, ControlLatency: 100 * ms})
	}
	v := j.Verdict(time.Second)
	if !strings.Contains(v.Reason, "the primary (no control shadow: the comparison is biased)") || v.Evidence.Control {
		t.Fatalf("verdict %q, evidence control %v: want the bias said", v.Reason, v.Evidence.Control)
	}
	if m := v.Evidence.Metrics(); m[MetricControl] != 0 {
		t.Errorf("metrics control = %v, want 0", m[MetricControl])
	}
}

// Bad input is counted and never skews a decision: the same good pairs with
// and without invalid ones interleaved give the same verdict and evidence.
func TestJudgeIgnoresInvalidInput(t *testing.T) {
	good := judgeWith(t, nil)
	bad := judgeWith(t, nil)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 100 {
		p := Pair{CandidateLatency: time.Duration(100e6 * (0.75 + 0.5*rng.Float64())), ControlLatency: time.Duration(100e6 * (0.75 + 0.5*rng.Float64()))}
		good.Add(p)
		bad.Add(p)
		good.SetMemory(100, 100)
		bad.SetMemory(100, 100)
		if i%10 == 0 {
			for _, b := range []Pair{
				{CandidateLatency: -5 * ms, ControlLatency: 100 * ms},
				{CandidateLatency: 100 * ms, ControlLatency: 0},
				{CandidateLatency: math.MinInt64, ControlLatency: math.MinInt64},
			} {
				bad.Add(b)
			}
			for _, m := range [][2]float64{{math.NaN(), 100}, {100, math.Inf(1)}, {-1, 100}, {5, 0}} {
				bad.SetMemory(m[0], m[1])
			}
		}
	}
	g, b := good.Evidence(), bad.Evidence()
	if b.InvalidLatencies != 30 || b.InvalidMemory != 40 {
		t.Errorf("counted %d invalid latencies and %d invalid memory samples, want 30 and 40", b.InvalidLatencies, b.InvalidMemory)
	}
	if g.LatencyRatio != b.LatencyRatio || g.LatencyRatioLow != b.LatencyRatioLow || g.LatencyRatioHigh != b.LatencyRatioHigh || g.MemoryIncrease != b.MemoryIncrease {
		t.Errorf("invalid input moved the evidence:\n good %+v\n bad  %+v", g, b)
	}
	if gv, bv := good.Verdict(time.Minute), bad.Verdict(time.Minute); gv.Decision != bv.Decision {
		t.Errorf("verdicts differ: %s against %s (%q)", gv.Decision, bv.Decision, bv.Reason)
	}
	if _, err := json.Marshal(b); err != nil {
		t.Errorf("evidence does not encode: %v", err)
	}
}

// A failed answer's latency is not compared: an error is often fast.
func TestJudgeLatencyOnlyFromSuccessfulAnswers(t *testing.T) {
	j := judgeWith(t, nil)
	j.Add(Pair{CandidateLatency: 1 * ms, ControlLatency: 100 * ms, CandidateFailed: true})
	j.Add(Pair{CandidateLatency: 100 * ms, ControlLatency: 1 * ms, ControlFailed: true})
	if e := j.Evidence(); e.LatencySamples != 0 || e.Samples != 2 || e.LatencyRatio != 1 {
		t.Errorf("evidence %+v: want 2 samples, no latency sample", e)
	}
}

func TestEvidenceMetrics(t *testing.T) {
	j := judgeWith(t, nil)
	j.Add(equalPair())
	m := j.Evidence().Metrics()
	want := []string{"samples", "latency_ratio", "latency_improvement", "error_rate_change", "error_rate_change_low", "error_rate_change_high",
		"disagreement_excess", "disagreement_excess_high", "confidence", "control", "candidate_missing", "control_missing"}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("metrics lack %s: %v", k, m)
		}
	}
	for _, k := range []string{"latency_ratio_low", "latency_ratio_high", "memory_increase"} {
		if _, ok := m[k]; ok {
			t.Errorf("metrics have %s before it can be known: %v", k, m)
		}
	}
	if m["control"] != 1 || m["confidence"] != 0.95 || m["samples"] != 1 || !(m["error_rate_change_low"] < -0.9 && m["error_rate_change_high"] > 0.9) {
		t.Errorf("metrics %v", m)
	}
	for range latencyBurnIn {
		j.Add(Pair{CandidateLatency: 90 * ms, ControlLatency: 100 * ms})
	}
	j.SetMemory(110, 100)
	m = j.Evidence().Metrics()
	if len(m) != len(want)+3 {
		t.Errorf("metrics %v: want %d keys", m, len(want)+3)
	}
	for k, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("metric %s = %v", k, v)
		}
	}
	if m["memory_increase"] != 0.1 || m["latency_improvement"] != clean(m["latency_ratio"]-1) || !(m["latency_ratio_low"] < m["latency_ratio"] && m["latency_ratio"] < m["latency_ratio_high"]) {
		t.Errorf("metrics %v", m)
	}
}

// The bounds bracket the estimate and tighten as pairs arrive.
func TestPairedSignBounds(t *testing.T) {
	thr := math.Log(80)
	empty := pairedSign{}
	if empty.lower(thr) != -1 || empty.upper(thr) != 1 {
		t.Errorf("no data: [%v, %v], want [-1, 1]", empty.lower(thr), empty.upper(thr))
	}
	prevWidth := 2.0
	for _, n := range []int{10, 100, 1000, 10000} {
		p := pairedSign{n: n, plus: n / 10, minus: n / 20} // mean 0.05
		lo, hi := p.lower(thr), p.upper(thr)
		if !(lo < p.mean() && p.mean() < hi) || hi-lo >= prevWidth {
			t.Errorf("n=%d: [%v, %v] around %v, previous width %v", n, lo, hi, p.mean(), prevWidth)
		}
		prevWidth = hi - lo
		// The lower bound is where the test starts rejecting.
		if p.logE(lo-1e-6) < thr || p.logE(lo+1e-6) >= thr {
			t.Errorf("n=%d: lower bound %v is not where logE crosses ln 80: %v, %v", n, lo, p.logE(lo-1e-6), p.logE(lo+1e-6))
		}
	}
	if hi := (pairedSign{n: 10000, plus: 500, minus: 250}).upper(thr); hi > 0.05 {
		t.Errorf("10,000 pairs at 0.025: upper %v, want < 0.05", hi)
	}
}

func TestJudgePathIsBounded(t *testing.T) {
	j := judgeWith(t, nil)
	if p := j.Path(); len(p) != 0 {
		t.Fatalf("empty judge has a path: %v", p)
	}
	for range 100_000 {
		j.Add(equalPair())
	}
	p := j.Path()
	if len(p) > pathCap+1 || len(p) < pathCap/2 {
		t.Fatalf("path of %d points, want %d..%d", len(p), pathCap/2, pathCap+1)
	}
	if last := p[len(p)-1]; last.Pairs != 100_000 {
		t.Errorf("path ends at %d pairs, want the current 100000", last.Pairs)
	}
	step := p[1].Pairs - p[0].Pairs
	for i := 1; i < len(p)-1; i++ {
		if p[i].Pairs-p[i-1].Pairs != step {
			t.Fatalf("uneven path at %d: %v", i, p[i-1:i+1])
		}
	}
	if allocs := testing.AllocsPerRun(1000, func() { j.Add(equalPair()) }); allocs != 0 {
		t.Errorf("Add allocates %v times per call", allocs)
	}
}

// Whatever the pairs and memory samples, the judge neither panics nor
// produces evidence that cannot be encoded.
func FuzzJudge(f *testing.F) {
	f.Add(int64(100e6), int64(90e6), uint8(0), 1.0, 1.0, uint16(20))
	f.Add(int64(-1), int64(math.MaxInt64), uint8(15), math.NaN(), math.Inf(1), uint16(300))
	f.Fuzz(func(t *testing.T, cand, ctrl int64, flags uint8, memC, memK float64, n uint16) {
		j := NewJudge(DefaultJudgeConfig())
		for i := range int(n % 1024) {
			j.Add(Pair{
				CandidateLatency: time.Duration(cand + int64(i)), ControlLatency: time.Duration(ctrl - int64(i)),
				CandidateFailed: flags&1 != 0 && i%2 == 0, ControlFailed: flags&2 != 0 && i%3 == 0,
				CandidateDisagrees: flags&4 != 0 && i%5 == 0, ControlDisagrees: flags&8 != 0 && i%7 == 0,
			})
			j.SetMemory(memC, memK)
			j.Verdict(time.Duration(i) * time.Second)
		}
		e := j.Evidence()
		if _, err := json.Marshal(e); err != nil {
			t.Fatalf("evidence %+v does not encode: %v", e, err)
		}
		if _, err := json.Marshal(j.Path()); err != nil {
			t.Fatalf("path does not encode: %v", err)
		}
		for k, v := range e.Metrics() {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("metric %s = %v", k, v)
			}
		}
	})
}

// A missing answer is a failure of its side (even when the pair does not
// say Failed), carries no latency, and the evidence counts it per side.
func TestJudgeCountsMissingAnswersAsFailures(t *testing.T) {
	j := judgeWith(t, func(c *JudgeConfig) { c.MinDuration = 0 })
	for i := range 100 {
		p := Pair{CandidateLatency: time.Duration(95+i%10) * ms, ControlLatency: time.Duration(95+(i*7)%10) * ms}
		switch {
		case i%10 < 3:
			p = Pair{ControlLatency: 100 * ms, CandidateMissing: true} // Failed left false on purpose
		case i == 5:
			p = Pair{CandidateLatency: 100 * ms, ControlMissing: true, ControlFailed: true}
		}
		j.Add(p)
	}
	e := j.Evidence()
	if e.CandidateMissing != 30 || e.ControlMissing != 1 || e.CandidateOnlyFailures != 30 || e.ControlOnlyFailures != 1 || e.LatencySamples != 69 {
		t.Fatalf("evidence %+v", e)
	}
	if m := e.Metrics(); m[MetricCandidateMissing] != 30 || m[MetricControlMissing] != 1 {
		t.Fatalf("metrics %v", m)
	}
	v := j.Verdict(time.Minute)
	if v.Decision != VerdictRejected || !strings.HasPrefix(v.Reason, "errors:") || !strings.Contains(v.Reason, "no answer by the deadline: the candidate 30, the other side 1") {
		t.Fatalf("verdict %s: %s", v.Decision, v.Reason)
	}
}

// A promotion waits while the answers the candidate still owes (the other
// side gave them, their deadline has not passed) would, were they missing,
// show it worse; it comes once they are answered. At the longest trial the
// wait is inconclusive, saying so.
func TestJudgeHoldsPromotionWhileTheCandidateOwesAnswers(t *testing.T) {
	j := judgeWith(t, func(c *JudgeConfig) { c.MinDuration, c.MaxDuration = 0, time.Hour })
	for i := range 100 {
		j.Add(Pair{CandidateLatency: time.Duration(95+i%10) * ms, ControlLatency: time.Duration(95+(i*7)%10) * ms})
	}
	if v := j.Verdict(time.Minute); v.Decision != VerdictPromoted {
		t.Fatalf("equal candidate: %s: %s", v.Decision, v.Reason)
	}
	j.SetCandidateOwes(2) // too few to show anything
	if v := j.Verdict(time.Minute); v.Decision != VerdictPromoted {
		t.Fatalf("owing 2 of 102: %s: %s", v.Decision, v.Reason)
	}
	j.SetCandidateOwes(40)
	if v := j.Verdict(time.Minute); v.Decision != VerdictContinue {
		t.Fatalf("owing 40 of 140: %s: %s", v.Decision, v.Reason)
	}
	if v := j.Verdict(time.Hour); v.Decision != VerdictRejected || !v.Inconclusive || !strings.Contains(v.Reason, "still owed 40 answers") {
		t.Fatalf("owing 40 at the longest trial: %s (inconclusive %v): %s", v.Decision, v.Inconclusive, v.Reason)
	}
	j.SetCandidateOwes(0)
	if v := j.Verdict(time.Minute); v.Decision != VerdictPromoted {
		t.Fatalf("answered at last: %s: %s", v.Decision, v.Reason)
	}
}
