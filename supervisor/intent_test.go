package supervisor

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
)

// An evolution_intent proposed while another is being tested is rejected
// with a reason that names the running trial's target: the agent's own
// text, up to the 1 MiB an intent may hold. It was quoted whole (%q: up
// to 4 MiB with escapes) into the evolution_result, which then exceeded
// what the protocol carries: "cannot encode message for the agent", and
// the agent never got an answer to its intent. It is clipped, as the log
// and the audit log clip it.
func TestRejectionOfASecondIntentClipsTheTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShadowDuration = time.Hour
		results := make(chan *schema.EvolutionResult, 4)
		big := strings.Repeat("\x01T", 256<<10) // 512 KiB; %q makes each \x01 four bytes
		h := startLoop(t, cfg, func(a *fakeAgent) {
			shadow := slices.Contains(a.env, "SUPERVISOR_ROLE="+RoleShadow)
			beats := 0
			heartbeat := func() {
				a.send(t, &schema.Heartbeat{})
				if beats++; !shadow && beats == 5 { // the trial runs by now: propose again
					a.send(t, &schema.EvolutionIntent{Hypothesis: schema.Hypothesis{Reason: "again", Target: "other", NewCode: "pass"}})
				}
			}
			heartbeat()
			if !shadow {
				a.send(t, &schema.Checkpoint{Data: []byte{0x81, 0xa1, 'k', 0x01}})
			}
			a.serve(t, time.Second, heartbeat, func(m schema.Message) bool {
				switch m := m.(type) {
				case *schema.CheckpointAck:
					if !shadow && m.CheckpointID != "" {
						a.send(t, &schema.EvolutionIntent{Hypothesis: schema.Hypothesis{Reason: "faster", Target: big, NewCode: "pass"}})
					}
				case *schema.EvolutionResult:
					if !shadow {
						results <- m
					}
				case *schema.Shutdown:
					a.exit(agentproc.ExitStatus{Known: true})
					return true
				}
				return false
			})
		})
		defer h.stop()
		h.next() // the primary
		h.next() // a shadow: the trial runs
		select {
		case r := <-results:
			if r.Decision != "rejected" || !strings.Contains(r.Reason, "another evolution") {
				t.Fatalf("the second intent: %s %.200q", r.Decision, r.Reason)
			}
			if len(r.Reason) > 1024 {
				t.Fatalf("the rejection's reason is %d bytes: the running trial's target quoted whole", len(r.Reason))
			}
		case <-time.After(time.Minute):
			t.Fatal("no evolution_result for the second intent")
		}
	})
}
