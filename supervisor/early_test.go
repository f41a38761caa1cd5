package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/wal"
)

// --spawn-during-recovery (early.go): the first agent is started before its
// restore is built, told SUPERVISOR_RESTORE_PENDING from the files, and sent
// nothing until the restore is ready — then the restore, first.

// earlyConfig is testConfig with --spawn-during-recovery and 1 MiB WAL
// segments.
func earlyConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.SpawnDuringRecovery = true
	cfg.WALSegmentSize = 1 << 20
	return cfg
}

// seedWAL writes n entries (sequences 1..n) to the WAL of cfg's data
// directory, with its segment size, as an earlier run would have.
func seedWAL(t *testing.T, cfg Config, n int) {
	t.Helper()
	st, err := durable.Open(durable.Options{Dir: cfg.DataDir, Codec: newCodec(cfg), Log: cfg.Logger, MaxFrameSize: cfg.MaxFrameSize,
		WALSegmentSize: cfg.WALSegmentSize, WALSync: wal.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		raw, err := schema.MarshalMap(map[string]any{"operation": "memory_add", "params": map[string]any{"text": strings.Repeat("x", 200)}, "sequence": i})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append([]wal.Entry{{Sequence: uint64(i), Data: raw}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// firstThenHeartbeat hands the agent's first message to first (nil at EOF),
// then heartbeats like heartbeatEvery.
func firstThenHeartbeat(t *testing.T, first chan<- schema.Message) func(a *fakeAgent) {
	return func(a *fakeAgent) {
		m := a.recv(t)
		first <- m
		if m == nil {
			return
		}
		heartbeatEvery(t, time.Second)(a)
	}
}

func pendingEnv(a *fakeAgent) string {
	for _, kv := range a.env {
		if v, ok := strings.CutPrefix(kv, "SUPERVISOR_RESTORE_PENDING="); ok {
			return v
		}
	}
	return ""
}

// The agent is running while its restore cannot be built yet (the store
// worker busy: a minute of frozen disk), has been sent nothing, and gets
// the restore as its first frame once it can be built — the same process,
// not a second one.
func TestSpawnDuringRecoveryHoldsTheAgentUntilItsRestore(t *testing.T) {
	cfg := earlyConfig(t)
	seedWAL(t, cfg, 5)
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		first := make(chan schema.Message, 1)
		h := startLoop(t, cfg, firstThenHeartbeat(t, first), func(s *Supervisor) {
			s.work.Post(func() { <-release }) // the first start's restore queues behind this
		})
		defer h.stop()
		a := h.next()
		if got := pendingEnv(a); got != "1" {
			t.Fatalf("SUPERVISOR_RESTORE_PENDING=%q, want 1 (the WAL holds entries)", got)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case m := <-first:
			t.Fatalf("the agent was sent %T before its restore could be built", m)
		default:
		}
		if st := h.s.Status(); st.State != string(StateStarting) {
			t.Fatalf("state %s while the restore is being built, want starting", st.State)
		}
		close(release)
		r, ok := (<-first).(*schema.Restore)
		if !ok {
			t.Fatal("the first frame is not the restore")
		}
		if len(r.WALEntries) != 5 || r.LastSequence != 5 {
			t.Fatalf("restore holds %d entries up to %d, want 5 up to 5", len(r.WALEntries), r.LastSequence)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if st := h.s.Status(); st.State != string(StateRunning) || st.PID != a.ID() {
			t.Fatalf("status %s pid %d, want running as the early agent's pid %d", st.State, st.PID, a.ID())
		}
		if len(h.agents) != 0 {
			t.Fatal("a second agent was started")
		}
	})
}

// A data directory with no WAL segment and no checkpoint: the agent is told
// no restore is coming, and none is sent.
func TestSpawnDuringRecoveryFreshDirectory(t *testing.T) {
	cfg := earlyConfig(t)
	synctest.Test(t, func(t *testing.T) {
		restored := make(chan struct{}, 1)
		h := startLoop(t, cfg, func(a *fakeAgent) {
			heartbeat := func() { a.send(t, &schema.Heartbeat{}) }
			heartbeat()
			a.serve(t, time.Second, heartbeat, func(m schema.Message) bool {
				if _, ok := m.(*schema.Restore); ok {
					restored <- struct{}{}
				}
				return false
			})
		})
		defer h.stop()
		a := h.next()
		if got := pendingEnv(a); got != "0" {
			t.Fatalf("SUPERVISOR_RESTORE_PENDING=%q in a fresh data directory, want 0", got)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if len(restored) != 0 {
			t.Fatal("a restore was sent to an agent told none is coming")
		}
		if st := h.s.Status(); st.State != string(StateRunning) || st.PID != a.ID() {
			t.Fatalf("status %s pid %d, want running as pid %d", st.State, st.PID, a.ID())
		}
	})
}

// Segments but no entries (a run that logged nothing): the guess is
// "pending", and the agent gets the empty restore it was promised.
func TestSpawnDuringRecoveryEmptyRestoreKeepsThePromise(t *testing.T) {
	cfg := earlyConfig(t)
	seedWAL(t, cfg, 0)
	synctest.Test(t, func(t *testing.T) {
		first := make(chan schema.Message, 1)
		h := startLoop(t, cfg, firstThenHeartbeat(t, first))
		defer h.stop()
		a := h.next()
		if got := pendingEnv(a); got != "1" {
			t.Fatalf("SUPERVISOR_RESTORE_PENDING=%q with WAL segments present, want 1", got)
		}
		r, ok := (<-first).(*schema.Restore)
		if !ok {
			t.Fatal("the first frame is not the promised restore")
		}
		if r.CheckpointID != "" || len(r.WALEntries) != 0 {
			t.Fatalf("restore of checkpoint %q with %d entries, want an empty one", r.CheckpointID, len(r.WALEntries))
		}
	})
}

// No complete restore exists (the WAL's first segment is gone and no
// checkpoint covers it): the early agent is killed without having been sent
// a frame, and the loop ends with ErrUnrestorable, as without the flag.
func TestSpawnDuringRecoveryUnrestorableKillsTheAgentUnsent(t *testing.T) {
	cfg := earlyConfig(t)
	cfg.WALSegmentSize = 4096
	seedWAL(t, cfg, 60)
	segs, _ := filepath.Glob(filepath.Join(cfg.DataDir, "wal", "*.wal"))
	slices.Sort(segs)
	if len(segs) < 3 {
		t.Fatalf("%d segments, want several", len(segs))
	}
	if err := os.Remove(segs[0]); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		first := make(chan schema.Message, 1)
		h := startLoop(t, cfg, firstThenHeartbeat(t, first))
		defer h.stop()
		a := h.next()
		if err := h.wait(); !errors.Is(err, ErrUnrestorable) {
			t.Fatalf("loop ended with %v, want ErrUnrestorable", err)
		}
		<-a.exited
		if m := <-first; m != nil {
			t.Fatalf("the agent was sent %T though no restore could be built", m)
		}
		if sig := a.signalsSeen(); !slices.Contains(sig, syscall.SIGKILL) {
			t.Fatalf("signals %v, want SIGKILL", sig)
		}
		if len(h.agents) != 0 {
			t.Fatal("another agent was started")
		}
	})
}

// A wrong "no restore" guess (state the files did not show when the agent
// was started): that process is killed without having been sent a frame,
// and a second one is started the ordinary way, told a restore is coming,
// and restored.
func TestSpawnDuringRecoveryWrongGuessStartsAnother(t *testing.T) {
	cfg := earlyConfig(t)
	seedWAL(t, cfg, 5)
	synctest.Test(t, func(t *testing.T) {
		firsts := make(chan schema.Message, 2)
		h := startLoop(t, cfg, firstThenHeartbeat(t, firsts), func(s *Supervisor) {
			s.lc.early.pending = false // as if the files had shown nothing
		})
		defer h.stop()
		early := h.next()
		second := h.next()
		<-early.exited
		if sig := early.signalsSeen(); !slices.Contains(sig, syscall.SIGKILL) {
			t.Fatalf("signals %v, want SIGKILL", sig)
		}
		if got := pendingEnv(second); got != "1" {
			t.Fatalf("the second agent has SUPERVISOR_RESTORE_PENDING=%q, want 1", got)
		}
		// One first frame each, in either order: none for the killed agent
		// (nil: its input ended), the restore for the second.
		var restores, nothing int
		for range 2 {
			switch m := (<-firsts).(type) {
			case nil:
				nothing++
			case *schema.Restore:
				if len(m.WALEntries) != 5 {
					t.Fatalf("restore with %d entries, want 5", len(m.WALEntries))
				}
				restores++
			default:
				t.Fatalf("first frame %T", m)
			}
		}
		if restores != 1 || nothing != 1 {
			t.Fatalf("%d restores and %d agents sent nothing, want 1 and 1", restores, nothing)
		}
	})
}
