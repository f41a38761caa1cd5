package observe

import (
	"sync"
	"time"
)

// RateLimiter lets through at most n events per window (for logging and
// auditing floods of invalid input).
type RateLimiter struct {
	mu         sync.Mutex
	n          int
	window     time.Duration
	start      time.Time
	count      int
	suppressed int
}

func NewRateLimiter(n int, window time.Duration) *RateLimiter {
	return &RateLimiter{n: n, window: window}
}

// allow reports whether to record this event, and how many were suppressed
// since the last one allowed.
func (r *RateLimiter) Allow(now time.Time) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.start) >= r.window {
		r.start, r.count = now, 0
	}
	if r.count >= r.n {
		r.suppressed++
		return false, 0
	}
	r.count++
	s := r.suppressed
	r.suppressed = 0
	return true, s
}
