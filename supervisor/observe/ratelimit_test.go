package observe

import (
	"testing"
	"time"
)

func TestRateLimiter(t *testing.T) {
	r := NewRateLimiter(2, time.Second)
	now := time.Unix(0, 0)
	ok1, _ := r.Allow(now)
	ok2, _ := r.Allow(now)
	ok3, _ := r.Allow(now)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("allow = %v %v %v, want true true false", ok1, ok2, ok3)
	}
	ok, sup := r.Allow(now.Add(time.Second))
	if !ok || sup != 1 {
		t.Fatalf("next window: ok=%v suppressed=%d, want true 1", ok, sup)
	}
}
