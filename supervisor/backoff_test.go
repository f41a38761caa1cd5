package supervisor

import (
	"testing"
	"time"
)

func TestBackoffGrowsWithJitterAndCaps(t *testing.T) {
	b := backoff{initial: 100 * time.Millisecond, max: time.Second, maxRestarts: 0, window: time.Minute}
	now := time.Unix(1000, 0)
	wantMax := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	for i, w := range wantMax {
		w *= time.Millisecond
		d, giveUp := b.next(now)
		if giveUp {
			t.Fatalf("attempt %d: gave up with maxRestarts 0", i)
		}
		if d < w/2 || d > w {
			t.Fatalf("attempt %d: delay %s outside [%s, %s]", i, d, w/2, w)
		}
		now = now.Add(time.Second)
	}
	b.reset()
	if d, _ := b.next(now); d > 100*time.Millisecond {
		t.Fatalf("after reset: delay %s, want <= 100ms", d)
	}
}

func TestBackoffCrashLoopLimit(t *testing.T) {
	b := backoff{initial: time.Millisecond, max: time.Millisecond, maxRestarts: 3, window: 10 * time.Second}
	now := time.Unix(1000, 0)
	for i := 0; i < 3; i++ {
		if _, giveUp := b.next(now); giveUp {
			t.Fatalf("gave up at restart %d, limit 3", i+1)
		}
		now = now.Add(time.Second)
	}
	if _, giveUp := b.next(now); !giveUp {
		t.Fatal("4th restart within the window did not give up")
	}
}

func TestBackoffWindowSlides(t *testing.T) {
	b := backoff{initial: time.Millisecond, max: time.Millisecond, maxRestarts: 2, window: 10 * time.Second}
	now := time.Unix(1000, 0)
	for i := 0; i < 10; i++ {
		// One restart every 6 s: never more than 2 within 10 s.
		if _, giveUp := b.next(now); giveUp {
			t.Fatalf("gave up at restart %d although restarts were spread out", i+1)
		}
		now = now.Add(6 * time.Second)
	}
}
