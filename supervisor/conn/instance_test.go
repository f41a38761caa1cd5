package conn

import (
	"testing"
	"testing/synctest"
	"time"
)

// Time the reader spends inside our sinks (blocked on our storage, or on a
// full checkpoint queue) does not count against the agent's heartbeat, while
// it lasts and after. Fake time (synctest): exact, no sleeping.
func TestTimeInSinksDoesNotAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := &Instance{started: time.Now()}
		if age, seen := in.HeartbeatAge(time.Now()); age != 0 || seen {
			t.Fatalf("at start: %s, %v", age, seen)
		}
		time.Sleep(2 * time.Second)
		start := in.sinkBegin() // before the first heartbeat: start timeout
		time.Sleep(time.Minute)
		in.sinkEnd(start)
		if age, _ := in.HeartbeatAge(time.Now()); age != 2*time.Second {
			t.Fatalf("age %s after a minute in a sink before the first heartbeat, want 2s", age)
		}
		in.lastHeartbeat.Store(time.Now().UnixNano())
		in.blockedNano.Store(0)
		time.Sleep(time.Second)
		start = in.sinkBegin()
		time.Sleep(10 * time.Second)
		if age, _ := in.HeartbeatAge(time.Now()); age != time.Second {
			t.Errorf("age %s while blocked in a sink, want 1s", age)
		}
		in.sinkEnd(start)
		if age, _ := in.HeartbeatAge(time.Now()); age != time.Second {
			t.Fatalf("age %s after 10s in a sink, want 1s", age)
		}
		time.Sleep(2 * time.Second)
		if age, _ := in.HeartbeatAge(time.Now()); age != 3*time.Second {
			t.Fatalf("age %s 2s later, want 3s: the agent's own silence counts", age)
		}
	})
}
