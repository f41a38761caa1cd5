package supervisor

import (
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
)

// Two SIGTERMs in quick succession: run cancels the loop's context for the
// first and calls ForceStop for the second, and the loop can take the
// second before the first (both ready at once, select picks at random).
// That second signal was dropped — the stop had not begun — and the
// supervisor then waited the whole --shutdown-timeout for an agent that
// does not answer its shutdown. It now applies once the stop begins: the
// agent's group is killed at once.
func TestSecondSignalTakenBeforeTheFirstStillSkipsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShutdownTimeout = 30 * time.Minute
		cfg.HeartbeatTimeout = 2 * time.Hour
		h := startLoop(t, cfg, func(a *fakeAgent) {
			a.mu.Lock()
			a.ignoreTerm = true
			a.mu.Unlock()
			a.send(t, &schema.Heartbeat{})
			for a.recv(t) != nil { // reads its input, ignores the shutdown
			}
		})
		a := h.next()
		synctest.Wait()
		began := time.Now()
		h.s.ForceStop() // the second signal, taken first
		synctest.Wait()
		h.cancel() // the first
		if err := h.wait(); err != nil {
			t.Fatalf("loop: %v", err)
		}
		h.s.close()
		if took := time.Since(began); took >= cfg.ShutdownTimeout {
			t.Fatalf("the stop took %s: the second signal was dropped and the whole --shutdown-timeout waited", took)
		}
		a.mu.Lock()
		sigs := append([]syscall.Signal(nil), a.signals...)
		a.mu.Unlock()
		if len(sigs) == 0 || sigs[0] != syscall.SIGKILL {
			t.Fatalf("signals sent to the agent's group: %v; want SIGKILL first", sigs)
		}
	})
}
