package supervisor

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
)

// A healthy run resets the back-off also when it ends in an operator's
// restore: an agent that crash-looped earlier, then ran well for a long
// time, is restarted for `supervisor restore`, and that restarted agent's
// first crash waits --backoff-initial, not the delay the old crash loop had
// reached. Before, the restore's restart returned before the healthy-run
// check, and the back-off kept doubling from the old crashes.
func TestOperatorRestoreAfterHealthyRunResetsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.MaxRestarts = 0
		cfg.BackoffInitial = time.Second
		cfg.BackoffMax = 30 * time.Second
		cfg.HealthyReset = 10 * time.Second
		acked := make(chan string, 1)
		var n atomic.Int32
		h := startLoop(t, cfg, func(a *fakeAgent) {
			switch n.Add(1) {
			case 1, 2, 3, 4, 6: // a crash loop; later the restored agent's one crash
				a.exit(agentproc.ExitStatus{Known: true, Code: 1})
			case 5: // healthy for a long time
				heartbeat := func() { a.send(t, &schema.Heartbeat{}) }
				heartbeat()
				a.send(t, &schema.Checkpoint{Data: []byte{0x81, 0xa1, 'k', 0x01}})
				a.serve(t, time.Second, heartbeat, func(m schema.Message) bool {
					if ack, ok := m.(*schema.CheckpointAck); ok {
						acked <- ack.CheckpointID
					}
					return false
				})
			default:
				heartbeatEvery(t, time.Second)(a)
			}
		})
		defer h.stop()
		for range 5 {
			h.next()
		}
		id := <-acked
		time.Sleep(time.Minute) // a healthy minute
		meta, err := h.s.st.Checkpoints().Stat(id)
		if err != nil {
			t.Fatal(err)
		}
		call := controlCall{req: ControlRequest{Op: OpRestore, CheckpointID: id}, reply: make(chan ControlResponse, 1), meta: meta}
		h.s.inbox.control <- call
		restored := h.next()
		if r := <-call.reply; !r.OK {
			t.Fatalf("restore answered %+v", r)
		}
		<-restored.exited
		crashed := time.Now()
		next := h.next()
		if gap := next.spawned.Sub(crashed); gap < cfg.BackoffInitial/2 || gap > cfg.BackoffInitial {
			t.Fatalf("back-off after the first crash following a healthy minute: %s, want %s..%s (--backoff-initial)", gap, cfg.BackoffInitial/2, cfg.BackoffInitial)
		}
	})
}
