package evolution

import (
	"fmt"
	"sync"
	"time"
)

// Side says which agent of a trial a metrics report came from.
type Side int

const (
	Primary Side = iota // the agent serving traffic
	Shadow              // the agent trying the new code
)

// String returns "primary" or "shadow".
func (s Side) String() string {
	switch s {
	case Primary:
		return "primary"
	case Shadow:
		return "shadow"
	}
	return fmt.Sprintf("Side(%d)", int(s))
}

// Summary aggregates one side's metrics reports during a trial.
//
// Each compared figure is the mean over the reports that carried its key with
// a valid value; a report without the key does not count towards it (it is
// not taken as zero), and the figure is 0 when no report carried it. The
// *Reports counts say how many reports did, which is how [Decide] tells a
// missing key ("never reported") from a real zero.
//
// A value that is NaN, ±Inf, negative, or (for error_rate) above 1 is not
// averaged in: it is counted in Invalid, and [Decide] rejects a trial in
// which either side sent one, since an agent reporting impossible figures
// cannot be compared fairly.
type Summary struct {
	Reports int // metrics reports received

	AvgLatency  float64 // mean avg_latency, milliseconds
	ErrorRate   float64 // mean error_rate, 0..1
	MemoryUsage float64 // mean memory_usage, bytes

	LatencyReports   int // reports that carried a valid avg_latency
	ErrorRateReports int // reports that carried a valid error_rate
	MemoryReports    int // reports that carried a valid memory_usage

	Invalid      int    // values set aside as impossible
	FirstInvalid string // the first of them, e.g. "error_rate=NaN"

	First, Last time.Time // arrival of the first and last report; zero when none

	// Answers to the requests mirrored to both sides during the trial
	// (request_result): how many came, how many were errors, and the mean
	// time from process_request to the answer, in seconds.
	Results       int
	ResultErrors  int
	ResultLatency float64
}

// Collector aggregates the metrics reports of both sides of a trial. It keeps
// running means, not the reports, so its memory is constant however long the
// trial. It is safe for concurrent use; the zero value is not usable, call
// [NewCollector].
type Collector struct {
	mu    sync.Mutex
	sides [2]Summary
}

// NewCollector returns an empty Collector.
func NewCollector() *Collector { return &Collector{} }

// Add records one metrics report (the decoded metrics.data map) from side,
// arrived at at. Keys other than avg_latency, error_rate and memory_usage are
// ignored. A report from a side other than [Primary] or [Shadow] is ignored.
func (c *Collector) Add(side Side, report map[string]float64, at time.Time) {
	if side != Primary && side != Shadow {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.sides[side]
	s.Reports++
	if s.First.IsZero() {
		s.First = at
	}
	s.Last = at
	for _, k := range [...]struct {
		name string
		mean *float64
		n    *int
	}{
		{KeyAvgLatency, &s.AvgLatency, &s.LatencyReports},
		{KeyErrorRate, &s.ErrorRate, &s.ErrorRateReports},
		{KeyMemoryUsage, &s.MemoryUsage, &s.MemoryReports},
	} {
		x, ok := report[k.name]
		if !ok {
			continue
		}
		if !valid(k.name, x) {
			if s.Invalid == 0 {
				s.FirstInvalid = fmt.Sprintf("%s=%v", k.name, x)
			}
			s.Invalid++
			continue
		}
		// A running mean stays finite for non-negative finite inputs, where
		// a sum of large memory figures could overflow.
		*k.n++
		*k.mean += (x - *k.mean) / float64(*k.n)
	}
}

// AddResult records one request_result from side: whether it was an error,
// and how long after the process_request it came. Negative latencies count
// as 0. A side other than [Primary] or [Shadow] is ignored.
func (c *Collector) AddResult(side Side, failed bool, latency time.Duration) {
	if side != Primary && side != Shadow {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.sides[side]
	s.Results++
	if failed {
		s.ResultErrors++
	}
	s.ResultLatency += (max(latency, 0).Seconds() - s.ResultLatency) / float64(s.Results)
}

// Summary returns side's aggregate so far. An unknown side gives the zero
// Summary.
func (c *Collector) Summary(side Side) Summary {
	if side != Primary && side != Shadow {
		return Summary{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sides[side]
}

type keyCount struct {
	name string
	n    int
}

func (s Summary) keys() [3]keyCount {
	return [3]keyCount{
		{KeyAvgLatency, s.LatencyReports},
		{KeyErrorRate, s.ErrorRateReports},
		{KeyMemoryUsage, s.MemoryReports},
	}
}

// impossible lists what makes s unusable for a comparison: values the
// Collector set aside, and means (of a Summary built by hand) out of range.
func (s Summary) impossible(side Side) []string {
	var out []string
	if s.Invalid > 0 {
		out = append(out, fmt.Sprintf("%s sent %d impossible %s (first: %s)",
			side, s.Invalid, plural(s.Invalid, "value", "values"), s.FirstInvalid))
	}
	for _, k := range [...]struct {
		name string
		v    float64
		n    int
	}{
		{KeyAvgLatency, s.AvgLatency, s.LatencyReports},
		{KeyErrorRate, s.ErrorRate, s.ErrorRateReports},
		{KeyMemoryUsage, s.MemoryUsage, s.MemoryReports},
	} {
		if k.n > 0 && !valid(k.name, k.v) {
			out = append(out, fmt.Sprintf("%s %s averaged %v", side, k.name, k.v))
		}
	}
	return out
}
