package evolution

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkJudgeAdd measures one judge update as the trial makes it after
// every pair: Add, then Verdict. SPEC §8: under 10 µs of CPU.
func BenchmarkJudgeAdd(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	pairs := make([]Pair, 4096)
	for i := range pairs {
		pairs[i] = Pair{
			CandidateLatency:   time.Duration(100e6 * (0.75 + 0.5*rng.Float64())),
			ControlLatency:     time.Duration(100e6 * (0.75 + 0.5*rng.Float64())),
			CandidateFailed:    rng.Float64() < 0.02,
			ControlFailed:      rng.Float64() < 0.02,
			CandidateDisagrees: rng.Float64() < 0.3,
			ControlDisagrees:   rng.Float64() < 0.3,
		}
	}
	j := NewJudge(DefaultJudgeConfig())
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j.Add(pairs[i%len(pairs)])
		if v := j.Verdict(time.Second); v.Decision != VerdictContinue {
			j = NewJudge(DefaultJudgeConfig()) // a decided trial ends; start the next
		}
		i++
	}
}

// BenchmarkJudgeEvidence measures computing the evidence with all its
// bounds after a new pair (the cache is then stale), as the trial does when
// a trial ends or is shown.
func BenchmarkJudgeEvidence(b *testing.B) {
	j := NewJudge(DefaultJudgeConfig())
	for i := range 500 {
		j.Add(Pair{CandidateLatency: time.Duration(90+i%20) * time.Millisecond, ControlLatency: 100 * time.Millisecond, CandidateDisagrees: i%7 == 0, ControlDisagrees: i%9 == 0})
	}
	b.ReportAllocs()
	p := Pair{CandidateLatency: 95 * time.Millisecond, ControlLatency: 100 * time.Millisecond}
	for b.Loop() {
		j.Add(p)
		_ = j.Evidence()
	}
}
