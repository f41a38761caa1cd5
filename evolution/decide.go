package evolution

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Keys of an agent's metrics report that the comparison reads. Values are in
// the seed's units: milliseconds, a fraction 0..1, bytes.
const (
	KeyAvgLatency  = "avg_latency"
	KeyErrorRate   = "error_rate"
	KeyMemoryUsage = "memory_usage"
)

// Keys of [Decision.Metrics], as sent in evolution_result.metrics.
const (
	MetricLatencyImprovement = "latency_improvement" // shadow avg latency ÷ primary − 1; negative is better
	MetricErrorRateChange    = "error_rate_change"   // shadow error rate − primary error rate
	MetricMemoryIncrease     = "memory_increase"     // shadow memory usage ÷ primary − 1

	// From the answers (request_result) to requests mirrored to both sides,
	// present only when both answered at least one:
	MetricRequestErrorRateChange    = "request_error_rate_change"   // shadow error answers ÷ answers − primary's
	MetricRequestLatencyImprovement = "request_latency_improvement" // shadow mean answer time ÷ primary − 1
)

// Values of [Decision.Decision], as sent in evolution_result.decision.
const (
	DecisionPromoted = "promoted"
	DecisionRejected = "rejected"
)

// ErrInvalidThresholds is returned by [Thresholds.Validate].
var ErrInvalidThresholds = errors.New("evolution: invalid threshold")

// tolerance absorbs binary rounding when a figure is compared with its limit,
// so that a figure exactly at the limit in decimal (10.5 ms against 10 ms with
// a +5% limit) counts as within it. Figures are also rounded to 9 decimals
// (see clean) before they are compared or sent.
const tolerance = 1e-9

// Thresholds are the largest changes a shadow may show and still be promoted.
// A change equal to its limit is within it. +Inf disables a limit; a negative
// limit demands an improvement (MaxLatencyIncrease -0.10: the shadow must be
// at least 10% faster).
type Thresholds struct {
	MaxLatencyIncrease   float64 // limit on latency_improvement (a ratio: 0.05 = +5%)
	MaxErrorRateIncrease float64 // limit on error_rate_change (absolute: 0.01 = one percentage point)
	MaxMemoryIncrease    float64 // limit on memory_increase (a ratio: 0.25 = +25%)
}

// DefaultThresholds returns the spec's defaults: latency +5%, error rate +0.01,
// memory +25%.
func DefaultThresholds() Thresholds {
	return Thresholds{MaxLatencyIncrease: 0.05, MaxErrorRateIncrease: 0.01, MaxMemoryIncrease: 0.25}
}

// Validate reports a limit that can never be met or is not a number: NaN,
// -Inf, or below -1 (a ratio cannot fall below -100%, an error rate cannot
// drop by more than 1). The error wraps [ErrInvalidThresholds].
func (t Thresholds) Validate() error {
	for _, l := range []struct {
		name string
		v    float64
	}{
		{"max latency increase", t.MaxLatencyIncrease},
		{"max error rate increase", t.MaxErrorRateIncrease},
		{"max memory increase", t.MaxMemoryIncrease},
	} {
		if math.IsNaN(l.v) || l.v < -1 {
			return fmt.Errorf("%w: %s is %v; give a number of at least -1 (use +Inf for no limit)", ErrInvalidThresholds, l.name, l.v)
		}
	}
	return nil
}

// Outcome is what the supervisor saw of the shadow process during the trial.
type Outcome struct {
	// ShadowAlive is true when the shadow ran and heartbeated for the whole
	// trial. The zero Outcome is a failed trial.
	ShadowAlive bool
	// ShadowFailure says what went wrong, e.g. "shadow exited with code 3" or
	// "shadow hung: no heartbeat for 5s"; "" when nothing did.
	ShadowFailure string
	// MinReports is the number of metrics reports needed from each side, and
	// the number of reports that must carry each compared key. Values below 1
	// count as 1.
	MinReports int
}

// Decision is the verdict of a trial, ready for evolution_result and the audit
// log.
type Decision struct {
	Promote  bool
	Decision string // DecisionPromoted or DecisionRejected
	// Metrics holds latency_improvement, error_rate_change and
	// memory_increase, each only when it could be computed as a finite
	// number: never NaN or Inf. Never nil.
	Metrics map[string]float64
	// Reason is one human sentence with the figures and their limits.
	Reason string
}

// Decide compares the shadow's figures with the primary's and returns the
// verdict. It is a pure function. The checks run in this order and the first
// that fails gives the reason:
//
//  1. the shadow failed (o.ShadowFailure set or o.ShadowAlive false),
//     whatever its figures;
//  2. thresholds that fail [Thresholds.Validate];
//  3. impossible figures on either side: NaN, ±Inf, a negative latency or
//     memory usage, an error rate outside 0..1 (a summary mean, or values
//     the [Collector] set aside as invalid);
//  4. too few reports from either side, or a compared key carried by too few
//     of them ("not enough data");
//  5. a primary figure of 0 against a shadow figure above 0, which makes the
//     ratio unbounded (0 against 0 is no change);
//  6. any figure over its limit. When both sides answered mirrored requests
//     (request_result), their error share and mean answer time are figures
//     too, held to the error-rate and latency limits.
//
// Promotion needs all of them to pass. Metrics carries whatever figures were
// computable even on rejection, so the audit log shows them.
func Decide(primary, shadow Summary, o Outcome, t Thresholds) Decision {
	sides := [2]Summary{primary, shadow}
	f := compute(primary, shadow)
	reject := func(format string, args ...any) Decision {
		return Decision{Decision: DecisionRejected, Metrics: f.metrics(), Reason: fmt.Sprintf(format, args...)}
	}

	if o.ShadowFailure != "" {
		return reject("shadow failed during the trial: %s", o.ShadowFailure)
	}
	if !o.ShadowAlive {
		return reject("shadow did not stay alive and heartbeating through the trial")
	}
	if err := t.Validate(); err != nil {
		return reject("cannot compare: %v", err)
	}

	var bad []string
	for i, s := range sides {
		bad = append(bad, s.impossible(Side(i))...)
	}
	if len(bad) > 0 {
		return reject("impossible figures, not compared: %s (latency and memory must be finite and >= 0, error_rate within 0..1)", strings.Join(bad, "; "))
	}

	need := max(o.MinReports, 1)
	if primary.Reports < need || shadow.Reports < need {
		return reject("not enough data: the primary sent %d metrics %s and the shadow %d, at least %d from each are needed; lengthen the shadow duration or have the agent report metrics more often",
			primary.Reports, plural(primary.Reports, "report", "reports"), shadow.Reports, need)
	}
	var missing []string
	for i, s := range sides {
		side := Side(i)
		for _, k := range s.keys() {
			switch {
			case k.n == 0:
				missing = append(missing, fmt.Sprintf("%s never reported %s", side, k.name))
			case k.n < need:
				missing = append(missing, fmt.Sprintf("%s reported %s in %d of %d reports, at least %d needed", side, k.name, k.n, s.Reports, need))
			}
		}
	}
	if len(missing) > 0 {
		return reject("not enough data: %s", strings.Join(missing, "; "))
	}

	if !f.hasLatency {
		return reject("shadow avg_latency %s ms against a primary avg_latency of %s ms: the increase is unbounded (%s)",
			num(shadow.AvgLatency), num(primary.AvgLatency), limitPct(t.MaxLatencyIncrease))
	}
	if !f.hasMemory {
		return reject("shadow memory_usage %s bytes against a primary memory_usage of %s bytes: the increase is unbounded (%s)",
			num(shadow.MemoryUsage), num(primary.MemoryUsage), limitPct(t.MaxMemoryIncrease))
	}

	figures := fmt.Sprintf("shadow latency %s (%s), error rate %s (%s), memory %s (%s)",
		pct(f.latency), limitPct(t.MaxLatencyIncrease), abs3(f.errRate), limitAbs3(t.MaxErrorRateIncrease),
		pct(f.memory), limitPct(t.MaxMemoryIncrease))
	var over []string
	if !within(f.latency, t.MaxLatencyIncrease) {
		over = append(over, "latency")
	}
	if !within(f.errRate, t.MaxErrorRateIncrease) {
		over = append(over, "error rate")
	}
	if !within(f.memory, t.MaxMemoryIncrease) {
		over = append(over, "memory")
	}
	if f.hasReqErr {
		figures += fmt.Sprintf(", request errors %s (%s)", abs3(f.reqErr), limitAbs3(t.MaxErrorRateIncrease))
		if !within(f.reqErr, t.MaxErrorRateIncrease) {
			over = append(over, "request error")
		}
	}
	if f.hasReqLat {
		figures += fmt.Sprintf(", request latency %s (%s)", pct(f.reqLat), limitPct(t.MaxLatencyIncrease))
		if !within(f.reqLat, t.MaxLatencyIncrease) {
			over = append(over, "request latency")
		}
	}
	if len(over) > 0 {
		return reject("over the %s %s: %s", joinAnd(over), plural(len(over), "limit", "limits"), figures)
	}
	return Decision{
		Promote:  true,
		Decision: DecisionPromoted,
		Metrics:  f.metrics(),
		Reason: fmt.Sprintf("within all limits over %d primary and %d shadow metrics reports: %s",
			primary.Reports, shadow.Reports, figures),
	}
}

// comparison holds the three figures; has* is false when a figure could not
// be computed as a finite number.
type comparison struct {
	latency, errRate, memory          float64
	hasLatency, hasErrRate, hasMemory bool
	reqErr, reqLat                    float64
	hasReqErr, hasReqLat              bool
}

func compute(p, s Summary) comparison {
	var c comparison
	if p.LatencyReports > 0 && s.LatencyReports > 0 && validLatency(p.AvgLatency) && validLatency(s.AvgLatency) {
		c.latency, c.hasLatency = ratioChange(s.AvgLatency, p.AvgLatency)
	}
	if p.ErrorRateReports > 0 && s.ErrorRateReports > 0 && validErrorRate(p.ErrorRate) && validErrorRate(s.ErrorRate) {
		c.errRate, c.hasErrRate = clean(s.ErrorRate-p.ErrorRate), true
	}
	if p.MemoryReports > 0 && s.MemoryReports > 0 && validMemory(p.MemoryUsage) && validMemory(s.MemoryUsage) {
		c.memory, c.hasMemory = ratioChange(s.MemoryUsage, p.MemoryUsage)
	}
	if p.Results > 0 && s.Results > 0 {
		c.reqErr = clean(float64(s.ResultErrors)/float64(s.Results) - float64(p.ResultErrors)/float64(p.Results))
		c.hasReqErr = true
		if validLatency(p.ResultLatency) && validLatency(s.ResultLatency) {
			c.reqLat, c.hasReqLat = ratioChange(s.ResultLatency, p.ResultLatency)
		}
	}
	return c
}

func (c comparison) metrics() map[string]float64 {
	m := make(map[string]float64, 3)
	if c.hasLatency {
		m[MetricLatencyImprovement] = c.latency
	}
	if c.hasErrRate {
		m[MetricErrorRateChange] = c.errRate
	}
	if c.hasMemory {
		m[MetricMemoryIncrease] = c.memory
	}
	if c.hasReqErr {
		m[MetricRequestErrorRateChange] = c.reqErr
	}
	if c.hasReqLat {
		m[MetricRequestLatencyImprovement] = c.reqLat
	}
	return m
}

// ratioChange returns shadow ÷ primary − 1 for non-negative finite inputs. Both
// zero is no change; a zero primary against a positive shadow, or a quotient
// that overflows, is unbounded and reported as not computable.
func ratioChange(shadow, primary float64) (float64, bool) {
	if primary == 0 {
		if shadow == 0 {
			return 0, true
		}
		return 0, false
	}
	r := shadow/primary - 1
	if math.IsInf(r, 0) || math.IsNaN(r) {
		return 0, false
	}
	return clean(r), true
}

// clean rounds a figure to 9 decimal places, so that 8.5 ÷ 10 − 1 is sent as
// -0.15 rather than -0.15000000000000002, and turns -0 into 0.
func clean(x float64) float64 {
	if math.Abs(x) < 1e9 {
		x = math.Round(x*1e9) / 1e9
	}
	if x == 0 {
		return 0
	}
	return x
}

func within(x, limit float64) bool {
	return x <= limit || x-limit <= tolerance
}

func validLatency(x float64) bool   { return x >= 0 && !math.IsInf(x, 1) } // NaN fails x >= 0
func validMemory(x float64) bool    { return x >= 0 && !math.IsInf(x, 1) }
func validErrorRate(x float64) bool { return x >= 0 && x <= 1 }

func valid(key string, x float64) bool {
	switch key {
	case KeyAvgLatency:
		return validLatency(x)
	case KeyErrorRate:
		return validErrorRate(x)
	case KeyMemoryUsage:
		return validMemory(x)
	}
	return true
}

// pct formats a ratio as a signed percentage: 0.05 → "+5.0%".
func pct(x float64) string { return fmt.Sprintf("%+.1f%%", clean(x*100)) }

// abs3 formats an absolute error-rate change: 0.01 → "+0.010".
func abs3(x float64) string { return fmt.Sprintf("%+.3f", clean(x)) }

func limitPct(x float64) string {
	if math.IsInf(x, 1) {
		return "no limit"
	}
	return "limit " + pct(x)
}

func limitAbs3(x float64) string {
	if math.IsInf(x, 1) {
		return "no limit"
	}
	return "limit " + abs3(x)
}

func num(x float64) string { return fmt.Sprintf("%g", x) }

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func joinAnd(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
