package supervisor

import (
	"bytes"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
)

// The final checkpoint an agent sends on shutdown is stored even when our
// storage is slow: the checkpoint queue is full (eight checkpoints of about
// 1 MiB wait for a stalled disk), the agent waits for its ack as the
// protocol says ("wait briefly"), gives up and exits. The checkpoint it sent
// is ours to keep — SPEC §3: frames the agent wrote before it stopped are read
// to the end and kept, however long our own storage takes. Before, the exit
// cancelled the reader's wait for room in the queue and the final checkpoint
// was silently dropped: the restore came from the one before it.
func TestFinalCheckpointKeptWhenQueueIsFullAtExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShutdownTimeout = 10 * time.Second
		ckpt := func(name string) *schema.Checkpoint {
			data, err := msgpack.Marshal(map[string]any{"name": name, "pad": bytes.Repeat([]byte{'x'}, 1000<<10)})
			if err != nil {
				t.Fatal(err)
			}
			return &schema.Checkpoint{Data: data}
		}
		ready := make(chan struct{})
		sent := make(chan struct{})
		h := startLoop(t, cfg, func(a *fakeAgent) {
			heartbeat := func() { a.send(t, &schema.Heartbeat{}) }
			heartbeat()
			<-ready // the store worker is stalled
			for i := range 8 {
				a.send(t, ckpt(string(rune('a'+i))))
			}
			close(sent)
			a.serve(t, time.Second, heartbeat, func(m schema.Message) bool {
				if _, ok := m.(*schema.Shutdown); ok {
					a.send(t, ckpt("final"))
					time.Sleep(2 * time.Second) // no ack came in time
					a.exit(agentproc.ExitStatus{Known: true})
					return true
				}
				return false
			})
		})
		defer h.stop()
		h.next()
		release := make(chan struct{})
		h.s.work.Post(func() { <-release }) // a stalled disk
		synctest.Wait()
		close(ready)
		<-sent
		synctest.Wait()
		h.cancel()
		time.Sleep(5 * time.Second) // the agent has given up on the ack and exited
		close(release)
		if err := h.wait(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		_, data, _, err := h.s.st.Checkpoints().Latest()
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Name string `msgpack:"name"`
		}
		if err := msgpack.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		if got.Name != "final" {
			t.Fatalf("newest stored checkpoint is %q, want the final checkpoint the agent sent before it exited", got.Name)
		}
	})
}
