package supervisor

import (
	"math/rand/v2"
	"time"
)

// backoff computes restart delays: exponential from initial to max with
// jitter, and the crash-loop limit in the manner of OTP's restart intensity
// (more than maxRestarts restarts within window → give up).
type backoff struct {
	initial, max time.Duration
	maxRestarts  int // 0: never give up
	window       time.Duration

	attempt  int         // consecutive restarts since the last healthy run
	restarts []time.Time // restart times within the window
}

// next records a restart at now and returns the delay before it, or
// giveUp=true when the crash-loop limit is exceeded.
func (b *backoff) next(now time.Time) (delay time.Duration, giveUp bool) {
	cut := now.Add(-b.window)
	kept := b.restarts[:0]
	for _, t := range b.restarts {
		if t.After(cut) {
			kept = append(kept, t)
		}
	}
	b.restarts = append(kept, now)
	if b.maxRestarts > 0 && len(b.restarts) > b.maxRestarts {
		return 0, true
	}
	return b.wait(), false
}

// wait returns the next delay (exponential, with jitter) without counting a
// restart towards the crash-loop limit: for restarts that are not the
// agent's failure (a stopped WAL waits for our own disk).
func (b *backoff) wait() time.Duration {
	d := b.initial
	for i := 0; i < b.attempt && d < b.max; i++ {
		d *= 2
	}
	if d > b.max {
		d = b.max
	}
	b.attempt++
	// Jitter: a uniformly random delay in [d/2, d], so restarts of many
	// supervisors do not synchronise.
	half := d / 2
	if half > 0 {
		d = half + time.Duration(rand.Int64N(int64(half)+1))
	}
	return d
}

// reset is called after the agent ran healthily for a while.
func (b *backoff) reset() { b.attempt = 0 }

// forget clears the crash-loop history: the restart intensity starts from
// zero (after a fallback to an older checkpoint).
func (b *backoff) forget() { b.attempt, b.restarts = 0, nil }

// recent reports how many restarts lie within the window ending at now.
func (b *backoff) recent(now time.Time) int {
	n := 0
	for _, t := range b.restarts {
		if t.After(now.Add(-b.window)) {
			n++
		}
	}
	return n
}
