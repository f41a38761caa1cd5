package evolution

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Pair is one mirrored request as answered by the candidate and by the
// control (or, with no control, by the candidate and the primary). The trial
// builds a Pair when both answers have arrived, or when one side answered
// and the other did not by its deadline (that side is Missing); duplicates,
// answers to unknown ids and requests neither side answered never become a
// Pair.
type Pair struct {
	// Answer latencies: process_request written → request_result read.
	// A latency that is NaN, ±Inf, zero or negative is not used (the pair
	// still counts for errors and answers) and is counted in
	// [Evidence.InvalidLatencies].
	CandidateLatency, ControlLatency time.Duration
	// The answer was an error, or is missing.
	CandidateFailed, ControlFailed bool
	// No answer came by the deadline ([Pairer.Expire]); a missing answer
	// counts as a failure (Add treats it so even if Failed is false), and
	// its latency is not used.
	CandidateMissing, ControlMissing bool
	// The answer's data differs canonically from the primary's answer to the
	// same request. Without a control ControlDisagrees is false.
	CandidateDisagrees, ControlDisagrees bool
}

// JudgeConfig is the judge's part of the operator's configuration.
type JudgeConfig struct {
	// Confidence is --evolution-confidence: the judge's verdict is wrong with
	// probability at most 1 − Confidence (see [Judge] for how the budget is
	// split). In (0, 1); default 0.95.
	Confidence float64
	// MaxLatencyIncrease is --evolution-max-latency-increase, the tolerance
	// on the latency ratio on both sides: reject when the ratio is shown
	// above 1 + it, prove latency when the ratio is shown at or below it.
	// Default 0.10.
	MaxLatencyIncrease float64
	// MaxErrorRateIncrease is --evolution-max-error-rate-increase: reject
	// when the candidate's error rate is shown to exceed the control's by
	// more than it (absolute, 0.01 = one percentage point). Default 0.
	MaxErrorRateIncrease float64
	// MaxDisagreement is --evolution-max-disagreement: reject when the
	// candidate is shown to disagree with the primary more often than the
	// control does by more than it. Default 0.
	MaxDisagreement float64
	// MaxMemoryIncrease is --evolution-max-memory-increase: reject when the
	// candidate's sampled memory exceeds the control's by more than this
	// ratio. Default 0.25.
	MaxMemoryIncrease float64
	// MinDuration is --shadow-duration: no promotion before it. Default 30s.
	MinDuration time.Duration
	// MaxDuration is --evolution-max-duration: latency still unproven then
	// rejects as inconclusive. Default 4 × MinDuration.
	MaxDuration time.Duration
	// Control is false when the candidate is compared with the primary
	// instead of a control shadow (--evolution-control=false): cheaper and
	// biased, and the evidence says so.
	Control bool
}

// DefaultJudgeConfig returns the defaults of SPEC §6 and §10.
func DefaultJudgeConfig() JudgeConfig {
	return JudgeConfig{
		Confidence:           0.95,
		MaxLatencyIncrease:   0.10,
		MaxErrorRateIncrease: 0,
		MaxDisagreement:      0,
		MaxMemoryIncrease:    0.25,
		MinDuration:          30 * time.Second,
		MaxDuration:          120 * time.Second,
		Control:              true,
	}
}

// ErrInvalidJudgeConfig is wrapped by the errors of [JudgeConfig.Validate].
var ErrInvalidJudgeConfig = errors.New("evolution: invalid judge configuration")

// Validate reports a configuration the judge cannot work with; the error
// wraps [ErrInvalidJudgeConfig] and names the flag to fix. A tolerance of
// +Inf switches its test off (for latency: latency counts as proven once
// the burn-in has passed); an error-rate or disagreement tolerance of 1 or
// more can never be exceeded.
func (c JudgeConfig) Validate() error {
	bad := func(flag string, v any, want string) error {
		return fmt.Errorf("%w: --%s is %v; %s", ErrInvalidJudgeConfig, flag, v, want)
	}
	if !(c.Confidence > 0 && c.Confidence < 1) {
		return bad("evolution-confidence", c.Confidence, "give a probability between 0 and 1 exclusive, e.g. 0.95")
	}
	if !(c.MaxLatencyIncrease > -1) {
		return bad("evolution-max-latency-increase", c.MaxLatencyIncrease, "give a ratio above -1, e.g. 0.10 for +10% (+Inf switches the test off)")
	}
	if !(c.MaxErrorRateIncrease >= -1) {
		return bad("evolution-max-error-rate-increase", c.MaxErrorRateIncrease, "give a difference of rates of at least -1, e.g. 0.01 (+Inf switches the test off)")
	}
	if !(c.MaxDisagreement >= -1) {
		return bad("evolution-max-disagreement", c.MaxDisagreement, "give a difference of rates of at least -1, e.g. 0.05 (+Inf switches the test off)")
	}
	if !(c.MaxMemoryIncrease >= -1) {
		return bad("evolution-max-memory-increase", c.MaxMemoryIncrease, "give a ratio of at least -1, e.g. 0.25 (+Inf switches the test off)")
	}
	if c.MinDuration < 0 {
		return bad("shadow-duration", c.MinDuration, "give a duration of at least 0")
	}
	if c.MaxDuration < c.MinDuration {
		return bad("evolution-max-duration", c.MaxDuration, fmt.Sprintf("give at least the shadow duration (%v)", c.MinDuration))
	}
	return nil
}

// The split of the error budget α = 1 − Confidence. A verdict makes one
// claim: a promotion claims the latency ratio is at most 1 + tolerance; a
// rejection claims that one test found the candidate worse than its
// tolerance. Each side of the latency confidence sequence and each
// rejecting test errs with at most its share of α:
//
//   - a promotion is wrong only when the latency ratio is above the
//     tolerance; then the upper side of the latency sequence must have
//     missed, which has probability at most α (the whole budget: when the
//     latency is worse no other test can make a promotion wrong);
//   - a rejection of a candidate within every tolerance needs one of the
//     rejecting tests to err: the lower side of the latency sequence
//     (α/2), the errors test (α/4) or the answers test (α/4), together at
//     most α.
//
// So whatever the truth, the verdict is wrong with probability at most α,
// at every look, however long the trial. (A promotion does not claim that
// errors, answers and memory are no worse, only that the trial did not show
// them worse; an "inconclusive" rejection claims nothing.)
const (
	shareLatencyProof  = 1.0
	shareLatencyReject = 0.5
	shareErrors        = 0.25
	shareAnswers       = 0.25
)

// latencyBurnIn is the number of latency pairs before the latency sequence
// is used: the plug-in standard deviation of a handful of pairs is too
// unsteady to scale a boundary with (see sigma).
const latencyBurnIn = 16

// The numbers of pairs at which the latency boundaries are tightest
// (confseq's v_opt): about where a 10% tolerance is proven, and where a 20%
// slower candidate is rejected, under ±25% noise. The boundaries stay valid
// at every other n; they are only a little wider there.
const (
	latencyTuneProof  = 32
	latencyTuneReject = 48
)

// minSigma is the floor of the plug-in standard deviation of ln(ratio): an
// agent whose answer times do not vary at all is treated as varying by 1%.
const minSigma = 0.01

// pathCap bounds [Judge.Path].
const pathCap = 64

// latencyStats is Welford's running mean and sum of squares of
// d = ln(candidate/control).
type latencyStats struct {
	n        int
	mean, m2 float64
}

func (s *latencyStats) add(d float64) {
	s.n++
	delta := d - s.mean
	s.mean += delta / float64(s.n)
	s.m2 += delta * (d - s.mean)
}

// sigma is the plug-in standard deviation of d, with a small-sample
// correction: the sample variance × (1 + 2/n), about the variance of
// Student's t with n−1 degrees of freedom. Without it the few pairs after
// the burn-in underestimate the spread often enough that a candidate
// exactly at the tolerance was rejected in 2.6% of simulated trials, over
// its α/2 = 2.5%; with it, 2.3% (40,000 trials).
func (s latencyStats) sigma() float64 {
	if s.n < 4 {
		return math.Inf(1)
	}
	n := float64(s.n)
	return math.Max(math.Sqrt(s.m2/(n-1)*(1+2/n)), minSigma)
}

// snapshot is everything the evidence is computed from.
type snapshot struct {
	pairs   int
	lat     latencyStats
	errs    pairedSign
	answers pairedSign
}

// Judge is the sequential judge of one evolution trial: a pure state, fed
// one [Pair] at a time, asked for its [Verdict] after each. Its memory is
// constant however long the trial. It is not safe for concurrent use.
//
// # The tests
//
// Latency: d = ln(candidate latency / control latency) per pair. The
// centre of d gets a confidence sequence from the one-sided normal mixture
// boundary of Howard et al. (2021) on each side, with the plug-in standard
// deviation of d, corrected for small samples (an asymptotic confidence
// sequence, Waudby-Smith et al.,
// "Time-uniform central limit theory and asymptotic confidence sequences",
// 2021) after a burn-in of 16 pairs, tuned to be tightest near 32 pairs
// (upper side) and 48 pairs (lower side).
// latency_ratio = exp(mean d), its bounds exp of the sequence's ends. The
// simulation (sim_test.go) chose this over an empirical-Bernstein or
// betting sequence: d is unbounded, and with ±25% noise the mixture decides
// within the targets while keeping the false rejections below the budget.
//
// Errors and answers: a paired betting test on X = [candidate only] −
// [control only] (see pairedSign), whose mean is the difference of the
// rates; its confidence sequence gives error_rate_change and
// disagreement_excess with their bounds.
//
// Memory: candidate ÷ control − 1 of the latest sampled memory.
//
// The error budget is split as the constants above say: latency proof α,
// latency rejection α/2, errors α/4, answers α/4.
type Judge struct {
	cfg   JudgeConfig
	cfgOK error

	logProof, logLatReject, logErrors, logAnswers float64 // ln(1/α_i)
	rhoProof, rhoReject                           float64 // mixture ρ in units of pairs

	cur                snapshot
	invalidLatencies   int
	candidateMissing   int
	controlMissing     int
	candidateOwes      int
	errE, ansE         eCache
	owedErrE, owedAnsE eCache // the tests with what the candidate owes counted missing

	ev      Evidence // cached evidence of evSnap
	evSnap  snapshot
	evValid bool

	memCandidate, memControl float64
	memSet                   bool
	invalidMemory            int

	path     []snapshot
	pathStep int
}

// NewJudge returns a judge for one trial. A configuration that fails
// [JudgeConfig.Validate] gives a judge whose every verdict is a rejection
// saying why.
func NewJudge(c JudgeConfig) *Judge {
	j := &Judge{cfg: c, cfgOK: c.Validate(), path: make([]snapshot, 0, pathCap), pathStep: 1}
	alpha := 0.05
	if j.cfgOK == nil {
		alpha = 1 - c.Confidence
	}
	j.logProof = math.Log(1 / (alpha * shareLatencyProof))
	j.logLatReject = math.Log(1 / (alpha * shareLatencyReject))
	j.logErrors = math.Log(1 / (alpha * shareErrors))
	j.logAnswers = math.Log(1 / (alpha * shareAnswers))
	j.rhoProof = mixtureRho(latencyTuneProof, 2*alpha*shareLatencyProof)
	j.rhoReject = mixtureRho(latencyTuneReject, 2*alpha*shareLatencyReject)
	return j
}

// Add records one pair. It costs a few arithmetic operations and allocates
// nothing.
func (j *Judge) Add(p Pair) {
	if p.CandidateMissing {
		p.CandidateFailed = true
		j.candidateMissing++
	}
	if p.ControlMissing {
		p.ControlFailed = true
		j.controlMissing++
	}
	j.cur.pairs++
	if p.CandidateFailed != p.ControlFailed {
		if p.CandidateFailed {
			j.cur.errs.plus++
		} else {
			j.cur.errs.minus++
		}
	}
	j.cur.errs.n++
	if p.CandidateDisagrees != p.ControlDisagrees {
		if p.CandidateDisagrees {
			j.cur.answers.plus++
		} else {
			j.cur.answers.minus++
		}
	}
	j.cur.answers.n++
	// Latency only from pairs where both answered without error: an error is
	// often fast, and would make a failing candidate look quick; a missing
	// answer has no latency (Pairer.missingPairOf says why).
	if !p.CandidateFailed && !p.ControlFailed {
		if d, ok := logRatio(p.CandidateLatency, p.ControlLatency); ok {
			j.cur.lat.add(d)
		} else {
			j.invalidLatencies++
		}
	}
	j.record()
}

// record keeps the path bounded: a snapshot every pathStep pairs; when
// pathCap are kept, every second one is dropped and the step doubles.
func (j *Judge) record() {
	if j.cur.pairs%j.pathStep != 0 {
		return
	}
	if len(j.path) == pathCap {
		for i := 0; i < pathCap/2; i++ {
			j.path[i] = j.path[2*i+1]
		}
		j.path = j.path[:pathCap/2]
		j.pathStep *= 2
		if j.cur.pairs%j.pathStep != 0 {
			return
		}
	}
	j.path = append(j.path, j.cur)
}

func logRatio(candidate, control time.Duration) (float64, bool) {
	if candidate <= 0 || control <= 0 {
		return 0, false
	}
	return math.Log(float64(candidate) / float64(control)), true
}

// SetCandidateOwes records how many more answers the candidate still owes
// than the other side, within their answer deadline ([Pairer.Expire]). A promotion waits while counting them all as missing
// would make the test of errors or of answers reject: otherwise an agent
// slow enough that the deadline outlasts the minimum trial time could be
// promoted before its missing answers are judged. Only the promotion waits
// (a rejection still needs the judged pairs alone), so every verdict keeps
// its validity; a candidate that answers at last is promoted at a later look.
func (j *Judge) SetCandidateOwes(n int) { j.candidateOwes = max(n, 0) }

// SetMemory records the latest sampled memory (bytes, RSS of each shadow's
// process group). A sample that is NaN, ±Inf, negative, or a zero control
// against a nonzero candidate is ignored and counted in
// [Evidence.InvalidMemory].
func (j *Judge) SetMemory(candidateBytes, controlBytes float64) {
	if !validMemory(candidateBytes) || !validMemory(controlBytes) || math.IsInf(candidateBytes, 0) || math.IsInf(controlBytes, 0) ||
		(controlBytes == 0 && candidateBytes != 0) {
		j.invalidMemory++
		return
	}
	j.memCandidate, j.memControl, j.memSet = candidateBytes, controlBytes, true
}

// Evidence is what the judge knows now: each test's estimate and bounds.
// Every float is finite, so it encodes as JSON.
type Evidence struct {
	Samples int `json:"samples"` // pairs
	// LatencySamples pairs carried two valid latencies of answers that were
	// not errors; InvalidLatencies pairs carried an invalid one.
	LatencySamples   int `json:"latency_samples"`
	InvalidLatencies int `json:"invalid_latencies,omitempty"`
	// LatencyRatio is exp(mean ln(candidate/control)), the geometric mean of
	// the ratio; 1 before any latency pair. LatencyRatioLow/High bound it
	// once LatencyBounded (after the burn-in); before, they are 0 and the
	// metrics leave them out.
	LatencyRatio     float64 `json:"latency_ratio"`
	LatencyRatioLow  float64 `json:"latency_ratio_low"`
	LatencyRatioHigh float64 `json:"latency_ratio_high"`
	LatencyBounded   bool    `json:"latency_bounded"`
	// ErrorRateChange = candidate's error rate − control's, with bounds;
	// CandidateOnlyFailures and ControlOnlyFailures are the discordant
	// pairs it is tested on.
	ErrorRateChange       float64 `json:"error_rate_change"`
	ErrorRateChangeLow    float64 `json:"error_rate_change_low"`
	ErrorRateChangeHigh   float64 `json:"error_rate_change_high"`
	CandidateOnlyFailures int     `json:"candidate_only_failures"`
	ControlOnlyFailures   int     `json:"control_only_failures"`
	// CandidateMissing and ControlMissing are the pairs in which that side
	// gave no answer by its deadline (each also a failure of that side).
	CandidateMissing int `json:"candidate_missing"`
	ControlMissing   int `json:"control_missing"`
	// DisagreementExcess = P(candidate ≠ primary) − P(control ≠ primary)
	// (without a control: P(candidate ≠ primary)), with bounds.
	DisagreementExcess         float64 `json:"disagreement_excess"`
	DisagreementExcessLow      float64 `json:"disagreement_excess_low"`
	DisagreementExcessHigh     float64 `json:"disagreement_excess_high"`
	CandidateOnlyDisagreements int     `json:"candidate_only_disagreements"`
	ControlOnlyDisagreements   int     `json:"control_only_disagreements"`
	// MemoryIncrease = candidate ÷ control − 1 of the latest valid sample;
	// 0 and MemoryMeasured false before one.
	MemoryIncrease float64 `json:"memory_increase"`
	MemoryMeasured bool    `json:"memory_measured"`
	InvalidMemory  int     `json:"invalid_memory,omitempty"`

	Confidence float64 `json:"confidence"`
	Control    bool    `json:"control"`
}

// PathPoint is the evidence after Pairs pairs, for the audit record's
// picture of the bounds over time.
type PathPoint struct {
	Pairs                  int     `json:"pairs"`
	LatencyRatio           float64 `json:"latency_ratio"`
	LatencyRatioLow        float64 `json:"latency_ratio_low"`
	LatencyRatioHigh       float64 `json:"latency_ratio_high"`
	ErrorRateChangeLow     float64 `json:"error_rate_change_low"`
	ErrorRateChangeHigh    float64 `json:"error_rate_change_high"`
	DisagreementExcess     float64 `json:"disagreement_excess"`
	DisagreementExcessHigh float64 `json:"disagreement_excess_high"`
}

// Evidence returns the current evidence. Inverting the tests for their
// bounds costs tens of microseconds; the result is kept until the next Add,
// so asking again (for metrics, say) is free.
func (j *Judge) Evidence() Evidence {
	if !j.evValid || j.evSnap != j.cur {
		j.ev, j.evSnap, j.evValid = j.evidence(j.cur), j.cur, true
	}
	e := j.ev
	e.InvalidLatencies = j.invalidLatencies
	e.InvalidMemory = j.invalidMemory
	e.CandidateMissing, e.ControlMissing = j.candidateMissing, j.controlMissing
	if j.memSet {
		e.MemoryMeasured = true
		if j.memControl > 0 {
			e.MemoryIncrease = finite(j.memCandidate/j.memControl - 1)
		}
	}
	return e
}

func (j *Judge) evidence(s snapshot) Evidence {
	e := Evidence{
		Samples:        s.pairs,
		LatencySamples: s.lat.n,
		LatencyRatio:   1,
		Confidence:     j.cfg.Confidence,
		Control:        j.cfg.Control,

		ErrorRateChange:       s.errs.mean(),
		ErrorRateChangeLow:    s.errs.lower(j.logErrors),
		ErrorRateChangeHigh:   s.errs.upper(j.logErrors),
		CandidateOnlyFailures: s.errs.plus,
		ControlOnlyFailures:   s.errs.minus,

		DisagreementExcess:         s.answers.mean(),
		DisagreementExcessLow:      s.answers.lower(j.logAnswers),
		DisagreementExcessHigh:     s.answers.upper(j.logAnswers),
		CandidateOnlyDisagreements: s.answers.plus,
		ControlOnlyDisagreements:   s.answers.minus,
	}
	if s.lat.n > 0 {
		e.LatencyRatio = finite(math.Exp(s.lat.mean))
	}
	if s.lat.n >= latencyBurnIn {
		sigma := s.lat.sigma()
		n := float64(s.lat.n)
		low := s.lat.mean - sigma*oneSidedBound(n, j.logLatReject, j.rhoReject)/n
		high := s.lat.mean + sigma*oneSidedBound(n, j.logProof, j.rhoProof)/n
		e.LatencyRatioLow, e.LatencyRatioHigh = finite(math.Exp(low)), finite(math.Exp(high))
		e.LatencyBounded = true
	}
	return e
}

// Path returns the evidence at up to 64 pair counts spread evenly over the
// trial so far (every pair at first; as the trial grows, every second, then
// every fourth, ...). It computes the bounds afresh, so call it once at the
// end of a trial, not per pair.
func (j *Judge) Path() []PathPoint {
	out := make([]PathPoint, 0, len(j.path)+1)
	for _, s := range j.path {
		out = append(out, j.point(s))
	}
	if n := len(j.path); n == 0 || j.path[n-1].pairs != j.cur.pairs {
		if j.cur.pairs > 0 {
			out = append(out, j.point(j.cur))
		}
	}
	return out
}

func (j *Judge) point(s snapshot) PathPoint {
	e := j.evidence(s)
	return PathPoint{
		Pairs:                  e.Samples,
		LatencyRatio:           e.LatencyRatio,
		LatencyRatioLow:        e.LatencyRatioLow,
		LatencyRatioHigh:       e.LatencyRatioHigh,
		ErrorRateChangeLow:     e.ErrorRateChangeLow,
		ErrorRateChangeHigh:    e.ErrorRateChangeHigh,
		DisagreementExcess:     e.DisagreementExcess,
		DisagreementExcessHigh: e.DisagreementExcessHigh,
	}
}

// Values of [Verdict.Decision].
const (
	VerdictContinue = "continue"
	VerdictPromoted = DecisionPromoted
	VerdictRejected = DecisionRejected
)

// Verdict is the judge's answer after a look.
type Verdict struct {
	Decision     string   `json:"decision"`               // VerdictContinue, VerdictPromoted or VerdictRejected
	Inconclusive bool     `json:"inconclusive,omitempty"` // rejected at MaxDuration with latency unproven, or on a bad configuration
	Reason       string   `json:"reason,omitempty"`       // one sentence with the figures; "" while continuing
	Evidence     Evidence `json:"evidence"`               // zero while continuing: ask Judge.Evidence
}

// Verdict returns the decision after elapsed time of trial, valid at every
// look:
//
//  1. a configuration that fails Validate rejects (inconclusive);
//  2. reject as soon as any test shows the candidate worse than its
//     tolerance: latency (latency_ratio_low > 1 + MaxLatencyIncrease, after
//     the burn-in), errors, answers, memory — in that order, the first
//     gives the reason;
//  3. promote when latency is proven (latency_ratio_high ≤ 1 +
//     MaxLatencyIncrease) and elapsed ≥ MinDuration;
//  4. at elapsed ≥ MaxDuration, reject as "inconclusive: …";
//  5. otherwise continue.
//
// The rejection tests are evaluated directly as e-values, so a look costs
// about a microsecond; the bounds in the evidence are computed by inverting
// the same tests.
func (j *Judge) Verdict(elapsed time.Duration) Verdict {
	if j.cfgOK != nil {
		return Verdict{Decision: VerdictRejected, Inconclusive: true, Reason: "cannot judge: " + j.cfgOK.Error(), Evidence: j.Evidence()}
	}
	c := j.cfg
	s := j.cur
	t := j.tests()
	latReject, errReject, ansReject, memReject := t.latReject, t.errReject, t.ansReject, t.memReject
	promote := t.latProven && !t.held && elapsed >= c.MinDuration
	if !latReject && !errReject && !ansReject && !memReject && !promote && elapsed < c.MaxDuration {
		return Verdict{Decision: VerdictContinue}
	}

	e := j.Evidence()
	v := Verdict{Decision: VerdictRejected, Evidence: e}
	conf := pct0(c.Confidence)
	versus := "the control"
	if !c.Control {
		versus = "the primary (no control shadow: the comparison is biased)"
	}
	switch {
	case latReject:
		v.Reason = fmt.Sprintf("latency: the candidate is slower than %s beyond the %s tolerance: ratio %.3f, %s bounds %.3f–%.3f, over %d pairs",
			versus, pct(c.MaxLatencyIncrease), e.LatencyRatio, conf, e.LatencyRatioLow, e.LatencyRatioHigh, e.LatencySamples)
	case errReject:
		v.Reason = fmt.Sprintf("errors: the candidate fails more often than %s beyond %s: error rate change %s, bounds %s..%s; in %d pairs only the candidate failed %d times, only the other side %d%s",
			versus, abs3(c.MaxErrorRateIncrease), abs3(e.ErrorRateChange), abs3(e.ErrorRateChangeLow), abs3(e.ErrorRateChangeHigh), e.Samples, e.CandidateOnlyFailures, e.ControlOnlyFailures, e.missing())
	case ansReject:
		what := "disagreement excess"
		if !c.Control {
			what = "disagreement"
		}
		v.Reason = fmt.Sprintf("answers: the candidate disagrees with the primary more often than %s beyond %s: %s %s, bounds %s..%s; in %d pairs only the candidate disagreed %d times, only the other side %d",
			versus, abs3(c.MaxDisagreement), what, abs3(e.DisagreementExcess), abs3(e.DisagreementExcessLow), abs3(e.DisagreementExcessHigh), e.Samples, e.CandidateOnlyDisagreements, e.ControlOnlyDisagreements)
	case memReject:
		v.Reason = fmt.Sprintf("memory: the candidate uses %s more memory than %s, over the %s limit", pct(e.MemoryIncrease), versus, pct(c.MaxMemoryIncrease))
	case promote:
		v.Decision = VerdictPromoted
		v.Reason = fmt.Sprintf("latency proven within %s of %s: ratio %.3f, %s bounds %.3f–%.3f, over %d pairs in %v; the trial showed no worse errors (change %s%s) or answers (excess %s)",
			pct(c.MaxLatencyIncrease), versus, e.LatencyRatio, conf, e.LatencyRatioLow, e.LatencyRatioHigh, e.LatencySamples, elapsed.Round(time.Millisecond),
			abs3(e.ErrorRateChange), e.missing(), abs3(e.DisagreementExcess))
	case t.held:
		v.Inconclusive = true
		v.Reason = fmt.Sprintf("inconclusive: latency proven within %s, but at %v the candidate still owed %d answers %s had given, enough to show it worse were they missing; over %d pairs%s",
			pct(c.MaxLatencyIncrease), c.MaxDuration, j.candidateOwes, versus, e.Samples, e.missing())
	default:
		v.Inconclusive = true
		var why string
		switch {
		case s.pairs == 0:
			why = "no mirrored request was answered by both sides"
		case !e.LatencyBounded:
			why = fmt.Sprintf("only %d of %d pairs had valid latencies of successful answers, at least %d are needed", e.LatencySamples, e.Samples, latencyBurnIn)
		default:
			why = fmt.Sprintf("latency ratio %.3f, %s bounds %.3f–%.3f, neither side of the %s tolerance", e.LatencyRatio, conf, e.LatencyRatioLow, e.LatencyRatioHigh, pct(c.MaxLatencyIncrease))
		}
		v.Reason = fmt.Sprintf("inconclusive: latency not proven within %v: %s, over %d pairs; give the trial more requests or a longer --evolution-max-duration",
			c.MaxDuration, why, e.Samples)
	}
	return v
}

// missing is the missing answers for a reason: "" when none, else e.g.
// "; no answer by the deadline: the candidate 12, the other side 0".
func (e Evidence) missing() string {
	if e.CandidateMissing == 0 && e.ControlMissing == 0 {
		return ""
	}
	return fmt.Sprintf("; no answer by the deadline: the candidate %d, the other side %d", e.CandidateMissing, e.ControlMissing)
}

// testResults is what each test says now.
type testResults struct {
	latReject, latProven, errReject, ansReject, memReject bool
	// held: latency is proven but the answers the candidate owes, were
	// they missing, would reject (SetCandidateOwes).
	held bool
}

func (j *Judge) tests() testResults {
	c := j.cfg
	s := j.cur
	var r testResults
	switch {
	case s.lat.n < latencyBurnIn:
	case math.IsInf(c.MaxLatencyIncrease, 1):
		r.latProven = true
	default:
		tol := math.Log1p(c.MaxLatencyIncrease)
		sigma := s.lat.sigma()
		n := float64(s.lat.n)
		r.latReject = oneSidedLogMixture(n*(s.lat.mean-tol)/sigma, n, j.rhoReject) >= j.logLatReject
		r.latProven = oneSidedLogMixture(n*(tol-s.lat.mean)/sigma, n, j.rhoProof) >= j.logProof
	}
	r.errReject = j.errE.logE(s.errs, c.MaxErrorRateIncrease) >= j.logErrors
	r.ansReject = j.ansE.logE(s.answers, c.MaxDisagreement) >= j.logAnswers
	r.memReject = j.memSet && j.memControl > 0 && !within(j.memCandidate/j.memControl-1, c.MaxMemoryIncrease)
	if r.latProven && j.candidateOwes > 0 && !r.errReject && !r.ansReject {
		errs, answers := s.errs, s.answers
		errs.n, errs.plus = errs.n+j.candidateOwes, errs.plus+j.candidateOwes
		answers.n, answers.plus = answers.n+j.candidateOwes, answers.plus+j.candidateOwes
		r.held = j.owedErrE.logE(errs, c.MaxErrorRateIncrease) >= j.logErrors || j.owedAnsE.logE(answers, c.MaxDisagreement) >= j.logAnswers
	}
	return r
}

// eCache remembers the last e-value of a pairedSign test: it changes only
// when a discordant pair arrives (or, for a nonzero tolerance, any pair).
type eCache struct {
	key   pairedSign
	val   float64
	valid bool
}

func (c *eCache) logE(p pairedSign, m float64) float64 {
	k := p
	if m == 0 {
		k.n = 0 // concordant pairs multiply by 1
	}
	if !c.valid || c.key != k {
		c.key, c.val, c.valid = k, p.logE(m), true
	}
	return c.val
}

// Metric keys of the evidence in evolution_result.metrics, besides the
// seed's three.
const (
	MetricSamples                = "samples"
	MetricLatencyRatio           = "latency_ratio"
	MetricLatencyRatioLow        = "latency_ratio_low"
	MetricLatencyRatioHigh       = "latency_ratio_high"
	MetricErrorRateChangeLow     = "error_rate_change_low"
	MetricErrorRateChangeHigh    = "error_rate_change_high"
	MetricDisagreementExcess     = "disagreement_excess"
	MetricDisagreementExcessHigh = "disagreement_excess_high"
	MetricConfidence             = "confidence"
	MetricControl                = "control"
	MetricCandidateMissing       = "candidate_missing"
	MetricControlMissing         = "control_missing"
)

// Metrics returns the evolution_result.metrics of SPEC §6: the seed's
// latency_improvement (= latency_ratio − 1), error_rate_change and
// memory_increase, and the evidence keys (with the counts of answers
// missing on each side). Latency bounds before the burn-in
// and memory_increase before a sample are left out; control is 1 or 0.
// Every value is finite.
func (e Evidence) Metrics() map[string]float64 {
	m := map[string]float64{
		MetricSamples:                float64(e.Samples),
		MetricLatencyRatio:           clean(e.LatencyRatio),
		MetricLatencyImprovement:     clean(e.LatencyRatio - 1),
		MetricErrorRateChange:        clean(e.ErrorRateChange),
		MetricErrorRateChangeLow:     clean(e.ErrorRateChangeLow),
		MetricErrorRateChangeHigh:    clean(e.ErrorRateChangeHigh),
		MetricDisagreementExcess:     clean(e.DisagreementExcess),
		MetricDisagreementExcessHigh: clean(e.DisagreementExcessHigh),
		MetricConfidence:             e.Confidence,
		MetricControl:                0,
		MetricCandidateMissing:       float64(e.CandidateMissing),
		MetricControlMissing:         float64(e.ControlMissing),
	}
	if e.Control {
		m[MetricControl] = 1
	}
	if e.LatencyBounded {
		m[MetricLatencyRatioLow] = clean(e.LatencyRatioLow)
		m[MetricLatencyRatioHigh] = clean(e.LatencyRatioHigh)
	}
	if e.MemoryMeasured {
		m[MetricMemoryIncrease] = clean(e.MemoryIncrease)
	}
	return m
}

// finite maps ±Inf to ±MaxFloat64 and NaN to 0, so evidence always encodes.
func finite(x float64) float64 {
	switch {
	case math.IsNaN(x):
		return 0
	case math.IsInf(x, 1):
		return math.MaxFloat64
	case math.IsInf(x, -1):
		return -math.MaxFloat64
	}
	return x
}

// pct0 formats a confidence: 0.95 → "95%".
func pct0(x float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", x*100), "0"), ".") + "%"
}
