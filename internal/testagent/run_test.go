package testagent

import (
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// quietConfig is a config with nothing self-driven and fast heartbeats.
func quietConfig() Config {
	cfg := DefaultConfig()
	cfg.HeartbeatInterval = 20 * time.Millisecond
	cfg.CheckpointInterval = 0
	cfg.MetricsInterval = 0
	return cfg
}

func rawEntries(recs []schema.WALRecord, above uint64) []msgpack.RawMessage {
	var out []msgpack.RawMessage
	for _, r := range recs {
		if r.Sequence > above {
			out = append(out, msgpack.RawMessage(r.Raw))
		}
	}
	return out
}

func checkSequences(t *testing.T, recs []schema.WALRecord, first uint64) {
	t.Helper()
	for i, r := range recs {
		if want := first + uint64(i); r.Sequence != want {
			t.Fatalf("WAL record %d has sequence %d, want %d", i, r.Sequence, want)
		}
	}
}

func eventWith(key string, val uint64) func(event) bool {
	return func(e event) bool { return e.num(key) == val }
}

// TestRestoreReproducesState runs an agent through self-driven entries,
// checkpoints, requests of every kind and a hot reload, then restores two
// fresh agents from what a supervisor would have kept — one from a
// checkpoint plus the WAL after it, one from the WAL alone — and checks
// they reach the same chain and state digest.
func TestRestoreReproducesState(t *testing.T) {
	cfg := quietConfig()
	cfg.WALRate = 5000
	cfg.WALBatch = 10
	cfg.WALMax = 50
	cfg.CheckpointEvery = 20
	cfg.EntrySize = 300
	a := startAgent(t, cfg, agentOpts{})
	a.waitUntil("50 self-driven entries and 2 checkpoints", func() bool { return len(a.wal) >= 50 && len(a.checkpoints) >= 2 })
	a.send(&schema.ProcessRequest{RequestID: "r1", Data: schema.RequestData{Message: "remember the milk", UserID: "u1"}})
	a.send(&schema.ProcessRequest{RequestID: "r2", Data: schema.RequestData{Message: "/tool calculator expression"}})
	a.send(&schema.HotReload{Module: "memory", Code: "latency_ms=1 memory_mb=64"})
	a.send(&schema.ProcessRequest{RequestID: "r3", Data: schema.RequestData{Message: "/status thinking"}})
	a.waitUntil("54 entries", func() bool { return len(a.wal) >= 54 })
	a.send(&schema.Shutdown{Reason: "test", CreateCheckpoint: true})
	if err := a.result(); err != nil {
		t.Fatalf("Run = %v, want nil after shutdown", err)
	}

	wal := a.walCopy()
	if len(wal) != 54 {
		t.Fatalf("WAL has %d entries, want 54", len(wal))
	}
	checkSequences(t, wal, 1)
	for i, want := range map[int]string{0: "memory_add", 49: "memory_add", 50: "memory_add", 51: "tool_register", 52: "state_update", 53: "state_update"} {
		if wal[i].Operation != want {
			t.Errorf("entry %d operation = %s, want %s", i+1, wal[i].Operation, want)
		}
	}
	if n := len(wal[10].Raw); n < 250 || n > 350 {
		t.Errorf("padded self-driven entry is %d bytes, want about 300", n)
	}
	cp2 := a.waitEvent("checkpoint_sent", eventWith("last_seq", 40))
	final := a.waitEvent("checkpoint_sent", eventWith("last_seq", 54))
	if acked := a.waitEvent("checkpoint_acked", eventWith("last_seq", 54)); acked.str("state_digest") != final.str("state_digest") {
		t.Errorf("final ack event digest %s, sent %s", acked.str("state_digest"), final.str("state_digest"))
	}
	chain54 := a.waitEvent("applied", eventWith("seq", 54)).str("chain")
	if final.str("chain") != chain54 {
		t.Errorf("final checkpoint chain %s, last applied chain %s", final.str("chain"), chain54)
	}
	a.mu.Lock()
	checkpoints := a.checkpoints
	a.mu.Unlock()
	if len(checkpoints) != 3 {
		t.Fatalf("checkpoints = %d, want 3 (after 20, after 40, at shutdown)", len(checkpoints))
	}
	if got := digestOf(checkpoints[1].Data); got != cp2.str("state_digest") {
		t.Errorf("digest of checkpoint bytes %s, event says %s", got, cp2.str("state_digest"))
	}
	if checkpoints[2].Status != StatusThinking {
		t.Errorf("final checkpoint status %q, want thinking", checkpoints[2].Status)
	}

	t.Run("checkpoint plus WAL", func(t *testing.T) {
		bcfg := quietConfig()
		bcfg.WALRate = 5000
		bcfg.WALMax = 5
		b := startAgent(t, bcfg, agentOpts{restorePending: true})
		b.waitUntil("3 heartbeats", func() bool { return b.heartbeats >= 3 })
		if n := len(b.walCopy()); n != 0 {
			t.Fatalf("%d WAL entries before the pending restore", n)
		}
		// Entries 31..40 are already in the snapshot and must be skipped.
		b.send(&schema.Restore{CheckpointID: "cp-2", Snapshot: checkpoints[1].Data, WALEntries: rawEntries(wal, 30)})
		r := b.waitEvent("restored", nil)
		if r.str("snapshot_digest") != cp2.str("state_digest") || r.num("snapshot_last_seq") != 40 {
			t.Errorf("snapshot loaded as %s at %d, checkpoint was %s at 40", r.str("snapshot_digest"), r.num("snapshot_last_seq"), cp2.str("state_digest"))
		}
		if r.num("wal_entries") != 24 || r.num("wal_applied") != 14 {
			t.Errorf("wal_entries %d applied %d, want 24 and 14", r.num("wal_entries"), r.num("wal_applied"))
		}
		if r.num("last_seq") != 54 || r.str("chain") != chain54 || r.str("state_digest") != final.str("state_digest") {
			t.Errorf("restored to seq %d chain %s digest %s; original seq 54 chain %s digest %s",
				r.num("last_seq"), r.str("chain"), r.str("state_digest"), chain54, final.str("state_digest"))
		}
		b.waitUntil("5 new entries", func() bool { return len(b.wal) >= 5 })
		checkSequences(t, b.walCopy(), 55)
	})

	t.Run("WAL only", func(t *testing.T) {
		c := startAgent(t, quietConfig(), agentOpts{restorePending: true})
		c.send(&schema.Restore{WALEntries: rawEntries(wal, 0)})
		r := c.waitEvent("restored", nil)
		if r.num("last_seq") != 54 || r.str("chain") != chain54 || r.str("state_digest") != final.str("state_digest") {
			t.Errorf("restored to seq %d chain %s digest %s; original seq 54 chain %s digest %s",
				r.num("last_seq"), r.str("chain"), r.str("state_digest"), chain54, final.str("state_digest"))
		}
	})
}

func TestCompressedCheckpointRoundTrip(t *testing.T) {
	cfg := quietConfig()
	cfg.WALRate = 100000
	cfg.WALBatch = 10
	cfg.WALMax = 140
	cfg.EntrySize = 8000
	a := startAgent(t, cfg, agentOpts{})
	a.waitUntil("140 entries", func() bool { return len(a.wal) >= 140 })
	a.send(&schema.Shutdown{CreateCheckpoint: true})
	if err := a.result(); err != nil {
		t.Fatal(err)
	}
	sent := a.waitEvent("checkpoint_sent", nil)
	a.mu.Lock()
	cp := a.checkpoints[0]
	a.mu.Unlock()
	if !cp.Compress || len(cp.Data) <= schema.CompressThreshold {
		t.Fatalf("checkpoint of %d bytes arrived compressed=%v; want a compressed one above %d bytes", len(cp.Data), cp.Compress, schema.CompressThreshold)
	}

	b := startAgent(t, quietConfig(), agentOpts{restorePending: true})
	b.send(&schema.Restore{CheckpointID: "cp-1", Snapshot: cp.Data, Compress: true})
	r := b.waitEvent("restored", nil)
	if r["compressed"] != true {
		t.Errorf("restore event compressed = %v, want true", r["compressed"])
	}
	if r.str("state_digest") != sent.str("state_digest") || r.num("last_seq") != 140 {
		t.Errorf("restored digest %s at %d, checkpoint %s at 140", r.str("state_digest"), r.num("last_seq"), sent.str("state_digest"))
	}
}

func TestShutdown(t *testing.T) {
	t.Run("checkpoint, ack, exit 0", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{})
		a.send(&schema.ProcessRequest{RequestID: "r1", Data: schema.RequestData{Message: "hi"}})
		a.waitUntil("the request's entry", func() bool { return len(a.wal) >= 1 })
		a.send(&schema.Shutdown{Reason: "SIGTERM", CreateCheckpoint: true})
		err := a.result()
		if err != nil || ExitCode(err) != ExitOK {
			t.Fatalf("Run = %v, want nil", err)
		}
		acked := a.waitEvent("checkpoint_acked", nil)
		if acked.str("checkpoint_id") != "cp-1" || acked.num("last_seq") != 1 {
			t.Errorf("ack event = %v", acked)
		}
		if e := a.waitEvent("shutdown", nil); e.str("reason") != "SIGTERM" {
			t.Errorf("shutdown event = %v", e)
		}
	})
	t.Run("no ack within the wait", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{noAck: true})
		a.send(&schema.Shutdown{CreateCheckpoint: true})
		if err := a.result(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if len(a.events("checkpoint_sent")) != 1 || len(a.events("checkpoint_acked")) != 0 {
			t.Errorf("events: %d sent, %d acked; want 1 and 0", len(a.events("checkpoint_sent")), len(a.events("checkpoint_acked")))
		}
	})
	t.Run("without checkpoint", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{})
		a.send(&schema.Shutdown{Reason: "stop"})
		if err := a.result(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if n := len(a.events("checkpoint_sent")); n != 0 {
			t.Errorf("%d checkpoints sent, want none", n)
		}
	})
	t.Run("before the pending restore no checkpoint is sent", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{restorePending: true})
		a.send(&schema.Shutdown{CreateCheckpoint: true})
		if err := a.result(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if n := len(a.events("checkpoint_sent")); n != 0 {
			t.Errorf("%d checkpoints of a never-restored state sent, want none", n)
		}
	})
	t.Run("supervisor gone", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{})
		a.waitUntil("a heartbeat", func() bool { return a.heartbeats >= 1 })
		a.supOut.Close()
		err := a.result()
		if !errors.Is(err, agent.ErrSupervisorGone) || ExitCode(err) != ExitOK {
			t.Fatalf("Run = %v (exit %d), want ErrSupervisorGone and exit 0", err, ExitCode(err))
		}
	})
}

func TestProcessRequestLogsBeforeApplying(t *testing.T) {
	a := startAgent(t, quietConfig(), agentOpts{})
	a.send(&schema.ProcessRequest{RequestID: "r1", Data: schema.RequestData{Message: "what is the weather", UserID: "u7"}})
	a.waitUntil("the request's WAL entry", func() bool { return len(a.wal) >= 1 })
	// walOrderWriter has checked that the entry was not applied when it was written.
	req := a.waitEvent("request", nil)
	applied := a.waitEvent("applied", eventWith("seq", 1))
	if req.str("request_id") != "r1" || applied.str("op") != schema.OpMemoryAdd {
		t.Errorf("request event %v, applied event %v", req, applied)
	}
	rec := a.walCopy()[0]
	params, err := DecodeParams(rec.Params)
	if err != nil {
		t.Fatal(err)
	}
	if params["content"] != "what is the weather" || params["request_id"] != "r1" {
		t.Errorf("params = %v", params)
	}
	turns, _ := params["turns"].([]any)
	if len(turns) != 2 {
		t.Errorf("turns = %v, want a user and an assistant turn", params["turns"])
	}
}

func TestRequestBeforeRestoreIsRejected(t *testing.T) {
	a := startAgent(t, quietConfig(), agentOpts{restorePending: true})
	a.send(&schema.ProcessRequest{RequestID: "early", Data: schema.RequestData{Message: "hi"}})
	a.waitUntil("an error", func() bool { return len(a.errs) >= 1 })
	if e := a.firstError(); e.Code != "NOT_READY" || len(a.walCopy()) != 0 {
		t.Errorf("error %+v, %d WAL entries; want NOT_READY and none", e, len(a.walCopy()))
	}
}

func TestHotReloadSetsBehaviour(t *testing.T) {
	cfg := quietConfig()
	cfg.MetricsInterval = 20 * time.Millisecond
	a := startAgent(t, cfg, agentOpts{})
	a.waitUntil("default metrics", func() bool {
		return len(a.metrics) > 0 && a.metrics[len(a.metrics)-1].Data["avg_latency"] == DefaultBehaviour().LatencyMS
	})
	a.send(&schema.HotReload{Module: "memory", Code: "latency_ms=7 error_rate=0.5 memory_mb=80", BackupCheckpointID: "cp-0"})
	a.waitUntil("metrics of the new code", func() bool {
		if len(a.metrics) == 0 {
			return false
		}
		m := a.metrics[len(a.metrics)-1].Data
		return m["avg_latency"] == 7 && m["p99_latency"] == 7 && m["error_rate"] == 0.5 && m["memory_usage"] == 80<<20
	})
	wal := a.walCopy()
	if len(wal) != 1 || wal[0].Operation != schema.OpStateUpdate {
		t.Fatalf("WAL = %+v, want one state_update logging the reload", wal)
	}
	if e := a.waitEvent("hot_reload", nil); e.str("module") != "memory" || e.str("backup_checkpoint_id") != "cp-0" {
		t.Errorf("hot_reload event = %v", e)
	}

	a.send(&schema.HotReload{Module: "memory", Code: "latency_ms=fast"})
	a.waitUntil("HOT_RELOAD_FAILED", func() bool { return len(a.errs) >= 1 })
	if e := a.firstError(); e.Code != agent.CodeHotReloadFailed || !strings.Contains(e.Message, "latency_ms") {
		t.Errorf("error = %+v", e)
	}
	if n := len(a.walCopy()); n != 1 {
		t.Errorf("a rejected reload logged %d entries in all, want still 1", n)
	}
}

func TestEvolution(t *testing.T) {
	cfg := quietConfig()
	cfg.EvolveAfter = 10 * time.Millisecond
	cfg.EvolveCode = "latency_ms=2"
	cfg.EvolveTarget = "memory_system"
	a := startAgent(t, cfg, agentOpts{})
	a.waitUntil("an evolution intent", func() bool { return len(a.intents) >= 1 })
	if h := locked(a, func() schema.Hypothesis { return a.intents[0].Hypothesis }); h.Target != "memory_system" || h.NewCode != "latency_ms=2" {
		t.Errorf("hypothesis = %+v", h)
	}
	a.send(&schema.EvolutionResult{Success: true, Decision: schema.DecisionPromoted, Reason: "faster", Metrics: map[string]float64{"latency_improvement": -0.2}})
	a.waitUntil("status back to idle", func() bool { return len(a.wal) >= 2 })
	wal := a.walCopy()
	for i, want := range []string{StatusEvolving, StatusIdle} {
		p, err := DecodeParams(wal[i].Params)
		if err != nil {
			t.Fatal(err)
		}
		if wal[i].Operation != schema.OpStateUpdate || p["status"] != want {
			t.Errorf("entry %d = %s %v, want state_update to %s", i+1, wal[i].Operation, p, want)
		}
	}
	if e := a.waitEvent("evolution_result", nil); e.str("decision") != "promoted" {
		t.Errorf("evolution_result event = %v", e)
	}

	t.Run("a shadow does not evolve", func(t *testing.T) {
		s := startAgent(t, cfg, agentOpts{role: agent.RoleShadow})
		s.waitUntil("10 heartbeats", func() bool { return s.heartbeats >= 10 })
		if n := locked(s, func() int { return len(s.intents) }); n != 0 {
			t.Errorf("shadow sent %d intents", n)
		}
	})
}

func TestFaults(t *testing.T) {
	t.Run("crash-after", func(t *testing.T) {
		cfg := quietConfig()
		cfg.CrashAfter = 30 * time.Millisecond
		cfg.CrashCode = 7
		a := startAgent(t, cfg, agentOpts{})
		if err := a.result(); ExitCode(err) != 7 {
			t.Errorf("Run = %v (exit %d), want exit 7", err, ExitCode(err))
		}
	})
	t.Run("crash-on-restore", func(t *testing.T) {
		cfg := quietConfig()
		cfg.CrashOnRestore = "cp-poison"
		a := startAgent(t, cfg, agentOpts{restorePending: true})
		a.send(&schema.Restore{CheckpointID: "cp-poison", Snapshot: schema.RawMap(map[string]any{})})
		if err := a.result(); ExitCode(err) != ExitCrashOnRestore {
			t.Errorf("Run = %v, want exit %d", err, ExitCrashOnRestore)
		}
	})
	t.Run("unusable snapshot", func(t *testing.T) {
		a := startAgent(t, quietConfig(), agentOpts{restorePending: true})
		a.send(&schema.Restore{CheckpointID: "cp-foreign", Snapshot: schema.RawMap(map[string]any{"memory_blocks": "not a list"})})
		if err := a.result(); ExitCode(err) != ExitRestoreFailed || !errors.Is(err, ErrSnapshot) {
			t.Errorf("Run = %v, want exit %d wrapping ErrSnapshot", err, ExitRestoreFailed)
		}
		a.waitUntil("RESTORE_FAILED", func() bool { return len(a.errs) >= 1 })
		if e := a.firstError(); e.Code != agent.CodeRestoreFailed {
			t.Errorf("error = %+v", e)
		}
	})
	t.Run("hang-after", func(t *testing.T) {
		cfg := quietConfig()
		cfg.HangAfter = 60 * time.Millisecond
		a := startAgent(t, cfg, agentOpts{})
		a.waitEvent("hang", nil)
		// Heartbeats stop: one may have been on its way.
		a.mu.Lock()
		before := a.heartbeats
		a.mu.Unlock()
		a.send(&schema.ProcessRequest{RequestID: "ignored", Data: schema.RequestData{Message: "anyone?"}})
		time.Sleep(20 * cfg.HeartbeatInterval)
		a.mu.Lock()
		after, wal := a.heartbeats, len(a.wal)
		a.mu.Unlock()
		if after > before+1 || wal != 0 {
			t.Errorf("after hanging: %d more heartbeats and %d WAL entries, want at most 1 and 0", after-before, wal)
		}
		select {
		case err := <-a.done:
			t.Fatalf("a hung agent returned: %v", err)
		default:
		}
	})
	garbage := []struct {
		kind       string
		framingErr error // nil: a well-framed invalid payload
	}{
		{GarbageBytes, wire.ErrFrameTooLarge},
		{GarbageOversize, wire.ErrFrameTooLarge},
		{GarbageZero, wire.ErrZeroLength},
		{GarbageInvalid, nil},
		{GarbageNotMap, nil},
	}
	for _, g := range garbage {
		t.Run("garbage "+g.kind, func(t *testing.T) {
			cfg := quietConfig()
			cfg.Garbage = g.kind
			a := startAgent(t, cfg, agentOpts{})
			if g.framingErr != nil {
				a.waitUntil("a framing error", func() bool { return a.frameErr != nil })
				frameErr, heartbeats := locked(a, func() error { return a.frameErr }), locked(a, func() int { return a.heartbeats })
				if !errors.Is(frameErr, g.framingErr) || heartbeats != 1 {
					t.Errorf("reader ended with %v after %d heartbeats, want %v after 1", frameErr, heartbeats, g.framingErr)
				}
				return
			}
			a.waitUntil("an invalid frame then a heartbeat", func() bool { return len(a.invalid) == 1 && a.heartbeats >= 2 })
			if _, err := schema.Decode(schema.FromAgent, locked(a, func() []byte { return a.invalid[0] })); !errors.Is(err, schema.ErrInvalidMessage) {
				t.Errorf("garbage decodes with %v", err)
			}
		})
	}
	t.Run("stderr-flood", func(t *testing.T) {
		cfg := quietConfig()
		cfg.StderrFlood = true
		var w countingWriter
		cfg.Stderr = &w
		a := startAgent(t, cfg, agentOpts{})
		deadline := time.Now().Add(testTimeout)
		for w.n.Load() < 1000 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if w.n.Load() < 1000 {
			t.Errorf("only %d stderr lines", w.n.Load())
		}
		a.waitUntil("heartbeats through the flood", func() bool { return a.heartbeats >= 3 })
	})
	t.Run("fork-grandchild", func(t *testing.T) {
		pid, err := forkGrandchild()
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("grandchild %d not running: %v", pid, err)
		}
		if pgid, _ := syscall.Getpgid(pid); pgid != syscall.Getpgrp() {
			t.Errorf("grandchild in group %d, want ours %d", pgid, syscall.Getpgrp())
		}
		syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	})
}

type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(b []byte) (int, error) {
	w.n.Add(int64(strings.Count(string(b), "\n")))
	return len(b), nil
}
