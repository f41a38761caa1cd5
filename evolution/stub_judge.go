package evolution

// TEMPORARY stand-in for the judge helper's evolution/judge.go (same API);
// removed when branch judge is merged.

import (
	"math"
	"time"
)

type Pair struct {
	CandidateLatency, ControlLatency     time.Duration
	CandidateFailed, ControlFailed       bool
	CandidateDisagrees, ControlDisagrees bool
}

type JudgeConfig struct {
	Confidence, MaxLatencyIncrease, MaxErrorRateIncrease, MaxDisagreement, MaxMemoryIncrease float64
	MinDuration, MaxDuration                                                                 time.Duration
	Control                                                                                  bool
}

func DefaultJudgeConfig() JudgeConfig {
	return JudgeConfig{Confidence: 0.95, MaxLatencyIncrease: 0.10, MaxMemoryIncrease: 0.25, MinDuration: 30 * time.Second, MaxDuration: 120 * time.Second, Control: true}
}
func (c JudgeConfig) Validate() error { return nil }

type Judge struct {
	c        JudgeConfig
	n        int
	sum      float64
	cm, ctlm float64
	path     []PathPoint
}

type PathPoint struct {
	Samples          int
	LatencyRatioLow  float64
	LatencyRatioHigh float64
}

func NewJudge(c JudgeConfig) *Judge { return &Judge{c: c} }
func (j *Judge) Add(p Pair) {
	j.n++
	j.sum += math.Log(float64(max(p.CandidateLatency, time.Microsecond)) / float64(max(p.ControlLatency, time.Microsecond)))
}
func (j *Judge) SetMemory(c, k float64) { j.cm, j.ctlm = c, k }

type Evidence struct {
	Samples                                                  int
	LatencyRatio, LatencyRatioLow, LatencyRatioHigh          float64
	ErrorRateChange, ErrorRateChangeLow, ErrorRateChangeHigh float64
	DisagreementExcess, DisagreementExcessHigh               float64
	MemoryIncrease, Confidence                               float64
	Control                                                  bool
}

func (j *Judge) Evidence() Evidence {
	r := 1.0
	if j.n > 0 {
		r = math.Exp(j.sum / float64(j.n))
	}
	w := 1.0 / math.Sqrt(float64(j.n)+1)
	return Evidence{Samples: j.n, LatencyRatio: r, LatencyRatioLow: r * (1 - w), LatencyRatioHigh: r * (1 + w), Confidence: j.c.Confidence, Control: j.c.Control}
}
func (e Evidence) Metrics() map[string]float64 {
	c := 0.0
	if e.Control {
		c = 1
	}
	return map[string]float64{"samples": float64(e.Samples), "latency_ratio": e.LatencyRatio, "latency_ratio_low": e.LatencyRatioLow,
		"latency_ratio_high": e.LatencyRatioHigh, "latency_improvement": e.LatencyRatio - 1, "confidence": e.Confidence, "control": c}
}
func (j *Judge) Path() []PathPoint { return j.path }

type Verdict struct {
	Decision     string
	Inconclusive bool
	Reason       string
	Evidence     Evidence
}

func (j *Judge) Verdict(elapsed time.Duration) Verdict {
	e := j.Evidence()
	switch {
	case j.n >= 5 && e.LatencyRatioLow > 1+j.c.MaxLatencyIncrease:
		return Verdict{Decision: "rejected", Reason: "latency over the tolerance", Evidence: e}
	case elapsed >= j.c.MinDuration && e.LatencyRatioHigh <= 1+j.c.MaxLatencyIncrease:
		return Verdict{Decision: "promoted", Reason: "latency proven within the tolerance", Evidence: e}
	case elapsed >= j.c.MaxDuration:
		return Verdict{Decision: "rejected", Inconclusive: true, Reason: "inconclusive: latency not proven", Evidence: e}
	}
	return Verdict{Decision: "continue", Evidence: e}
}
