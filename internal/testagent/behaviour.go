package testagent

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Behaviour is the agent's simulated behaviour, set by the code of its
// modules (hot_reload) and reported in its metrics.
type Behaviour struct {
	LatencyMS float64 // simulated work per request, milliseconds
	ErrorRate float64 // fraction of requests that fail, 0..1
	MemoryMB  float64 // reported memory_usage in MiB; 0 reports the real heap
	// Jitter is the latency noise: each request takes LatencyMS × a
	// uniform factor in [1−Jitter, 1+Jitter]. 0.2 by default.
	Jitter float64
	// Differ is the fraction of answers (with --answer) that carry a random
	// "variant": answers that differ from any other agent's, as an agent
	// built on an LLM rarely answers twice alike. 0 by default.
	Differ float64
}

// DefaultBehaviour is the behaviour with no module loaded.
func DefaultBehaviour() Behaviour { return Behaviour{LatencyMS: 5, Jitter: 0.2} }

// ErrCode: module code the reference agent cannot load.
var ErrCode = errors.New("testagent: invalid module code")

// maxCodeSize bounds module code; the code travels in a WAL entry.
const maxCodeSize = 4 << 10

// ParseBehaviour applies module code to base. The code is a tiny config
// language: settings of the form key=value separated by spaces, tabs,
// newlines, commas or semicolons; '#' starts a comment that runs to the end
// of the line. Keys: latency_ms (0..60000), error_rate (0..1), memory_mb
// (0..1048576), jitter (0..1), differ (0..1). Empty code leaves base as it is. Anything else is an error
// wrapping [ErrCode] that names the offending setting.
//
//	latency_ms=5 error_rate=0.01 memory_mb=80
func ParseBehaviour(code string, base Behaviour) (Behaviour, error) {
	if len(code) > maxCodeSize {
		return base, fmt.Errorf("%w: %d bytes, at most %d", ErrCode, len(code), maxCodeSize)
	}
	b := base
	for lineNo, line := range strings.Split(code, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.FieldsFunc(line, func(r rune) bool {
			return r == ' ' || r == '\t' || r == '\r' || r == ',' || r == ';'
		})
		for _, f := range fields {
			key, val, ok := strings.Cut(f, "=")
			if !ok {
				return base, fmt.Errorf("%w: line %d: %q is not key=value", ErrCode, lineNo+1, f)
			}
			x, err := strconv.ParseFloat(val, 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
				return base, fmt.Errorf("%w: line %d: %s=%q is not a number", ErrCode, lineNo+1, key, val)
			}
			var dst *float64
			var hi float64
			switch key {
			case "latency_ms":
				dst, hi = &b.LatencyMS, 60000
			case "error_rate":
				dst, hi = &b.ErrorRate, 1
			case "memory_mb":
				dst, hi = &b.MemoryMB, 1<<20
			case "jitter":
				dst, hi = &b.Jitter, 1
			case "differ":
				dst, hi = &b.Differ, 1
			default:
				return base, fmt.Errorf("%w: line %d: unknown setting %q (want latency_ms, error_rate, memory_mb, jitter or differ)", ErrCode, lineNo+1, key)
			}
			if x < 0 || x > hi {
				return base, fmt.Errorf("%w: line %d: %s=%v out of range 0..%v", ErrCode, lineNo+1, key, x, hi)
			}
			*dst = x
		}
	}
	return b, nil
}

// behaviourOf is base (the default behaviour, or --behaviour's) overlaid by
// every module's code in module-name order. Code that does not parse (a foreign snapshot) is
// skipped; the error names the modules that were.
func behaviourOf(base Behaviour, modules map[string]string) (Behaviour, error) {
	names := make([]string, 0, len(modules))
	for m := range modules {
		names = append(names, m)
	}
	sort.Strings(names)
	b := base
	var errs []error
	for _, m := range names {
		nb, err := ParseBehaviour(modules[m], b)
		if err != nil {
			errs = append(errs, fmt.Errorf("module %q: %w", m, err))
			continue
		}
		b = nb
	}
	return b, errors.Join(errs...)
}
