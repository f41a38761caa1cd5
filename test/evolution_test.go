package test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func roleEvents(s *sup, kind, role string) []ev {
	var out []ev
	for _, e := range s.eventsOf(kind) {
		if e.str("role") == role {
			out = append(out, e)
		}
	}
	return out
}

var evoFlags = append(append([]string{}, fastFlags...), "--shadow-duration", "2s", "--evolution-min-reports", "2", "--max-restarts", "0")

func evoAgent(code string, extra ...string) []string {
	return append([]string{"--heartbeat-interval", "50ms", "--metrics-interval", "100ms", "--wal-rate", "100",
		"--checkpoint-every", "20", "--evolve-after", "700ms", "--evolve-target", "memory_system", "--evolve-code", code}, extra...)
}

func waitResult(t *testing.T, s *sup) ev {
	t.Helper()
	var res ev
	waitFor(t, 60*time.Second, "evolution_result on the primary", func() bool {
		r := roleEvents(s, "evolution_result", "primary")
		if len(r) > 0 {
			res = r[0]
		}
		return res != nil
	})
	return res
}

func TestEvolutionFasterCodeIsPromoted(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags, agent: evoAgent("latency_ms=1")})
	res := waitResult(t, s)
	if res.str("decision") != "promoted" {
		t.Fatalf("decision %v", res)
	}
	hr := roleEvents(s, "hot_reload", "primary")
	if len(hr) != 1 || hr[0].str("code") != "latency_ms=1" || hr[0].str("module") != "memory_system" {
		t.Fatalf("primary hot_reloads %v", hr)
	}
	// hot_reload came before the result.
	all := s.allEvents()
	iHR, iRes := -1, -1
	for i, e := range all {
		if e.str("role") != "primary" {
			continue
		}
		switch e.str("event") {
		case "hot_reload":
			iHR = i
		case "evolution_result":
			iRes = i
		}
	}
	if iHR > iRes {
		t.Fatal("evolution_result arrived before hot_reload")
	}
	if len(roleEvents(s, "hot_reload", "shadow")) == 0 {
		t.Fatal("the shadow never got the new code")
	}
	waitFor(t, 10*time.Second, "evolutions counter", func() bool {
		return s.metric("supervisor_evolutions_total", `decision="promoted"`) == 1
	})
	found := false
	for _, r := range auditRecords(t, s.dataDir) {
		if r["kind"] == "evolution_decided" {
			f := r["fields"].(map[string]any)
			found = f["decision"] == "promoted" && f["metrics"] != nil
		}
	}
	if !found {
		t.Fatal("no evolution_decided audit record with figures")
	}

	// Survives a crash: the restored primary is re-sent the promoted code.
	pid := roleEvents(s, "start", "primary")[0].int("pid")
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 30*time.Second, "promoted code re-sent after restore", func() bool {
		return len(roleEvents(s, "hot_reload", "primary")) >= 2
	})
	if hr := roleEvents(s, "hot_reload", "primary"); hr[1].str("code") != "latency_ms=1" {
		t.Fatalf("re-sent %v", hr[1])
	}
}

func TestEvolutionSlowerCodeIsRejected(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags, agent: evoAgent("latency_ms=50 error_rate=0.2")})
	res := waitResult(t, s)
	if res.str("decision") != "rejected" || res["success"] != false {
		t.Fatalf("result %v", res)
	}
	if !strings.Contains(res.str("reason"), "limit") {
		t.Fatalf("reason does not give the figures: %q", res.str("reason"))
	}
	// SPEC §6: with no mirrored request the agents' own figures decide,
	// and the result says so.
	if !strings.Contains(res.str("reason"), "no requests were mirrored") {
		t.Fatalf("reason does not say the reported figures decided: %q", res.str("reason"))
	}
	if n := len(roleEvents(s, "hot_reload", "primary")); n != 0 {
		t.Fatalf("primary got %d hot_reloads for a rejected evolution", n)
	}
	// The shadow is stopped and its scratch data removed.
	waitFor(t, 20*time.Second, "shadow scratch dir removed", func() bool {
		entries, _ := os.ReadDir(filepath.Join(s.dataDir, "shadow"))
		return len(entries) == 0
	})
	// The shadow's checkpoints went to its scratch store, never the primary's.
	shadowAcks := roleEvents(s, "checkpoint_acked", "shadow")
	if len(shadowAcks) == 0 {
		t.Fatal("the shadow never checkpointed; the isolation check would prove nothing")
	}
	code, out, _ := cli(t, "checkpoints", "list", "--data-dir", s.dataDir)
	if code != 0 {
		t.Fatalf("checkpoints list: %d", code)
	}
	for _, a := range shadowAcks {
		if strings.Contains(out, a.str("checkpoint_id")) {
			t.Fatalf("shadow checkpoint %s is in the primary's store", a.str("checkpoint_id"))
		}
	}
}

func TestEvolutionWithoutCheckpointIsRejected(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags,
		agent: []string{"--heartbeat-interval", "50ms", "--metrics-interval", "100ms", "--evolve-after", "300ms",
			"--evolve-target", "memory_system", "--evolve-code", "latency_ms=1"}})
	res := waitResult(t, s)
	if res.str("decision") != "rejected" || !strings.Contains(res.str("reason"), "checkpoint first") {
		t.Fatalf("result %v", res)
	}
	if len(roleEvents(s, "start", "shadow")) != 0 {
		t.Fatal("a shadow was started without a backup checkpoint")
	}
}

func TestEvolutionShadowCrashIsRejected(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags, agent: evoAgent("latency_ms=1", "--shadow-crash-after", "500ms")})
	res := waitResult(t, s)
	if res.str("decision") != "rejected" || !strings.Contains(res.str("reason"), "shadow exited with code 1") {
		t.Fatalf("result %v", res)
	}
	if n := len(roleEvents(s, "hot_reload", "primary")); n != 0 {
		t.Fatalf("primary got %d hot_reloads", n)
	}
	// The primary is untouched: one start, still serving.
	if n := len(roleEvents(s, "start", "primary")); n != 1 {
		t.Fatalf("primary restarted (%d starts)", n)
	}
	if c, _ := s.get("/readyz"); c != 200 {
		t.Fatalf("readyz %d", c)
	}
}

func TestEvolutionSecondIntentDuringTrialIsRejected(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags, agent: evoAgent("latency_ms=1", "--evolve-repeat", "300ms")})
	var results []ev
	waitFor(t, 60*time.Second, "two evolution results", func() bool {
		results = roleEvents(s, "evolution_result", "primary")
		return len(results) >= 2
	})
	// The second intent arrives 300 ms into a 2 s trial.
	if results[0].str("decision") != "rejected" || !strings.Contains(results[0].str("reason"), "another evolution") {
		t.Fatalf("first result %v, want the second intent rejected while the trial runs", results[0])
	}
	if n := len(roleEvents(s, "start", "shadow")); n == 0 {
		t.Fatal("no shadow ran")
	}
}

func TestEvolutionWithoutMetricsIsRejected(t *testing.T) {
	s := startSup(t, supOpts{flags: evoFlags, agent: evoAgent("latency_ms=1", "--metrics-interval", "0")})
	res := waitResult(t, s)
	if res.str("decision") != "rejected" || !strings.Contains(res.str("reason"), "not enough data") {
		t.Fatalf("result %v", res)
	}
}

// A supervisor killed (-9) during an evolution trial leaves the trial's
// backup pinned and its shadows' scratch stores behind. Nothing else would
// ever release them (the trial is gone), so the next start does: the pinned
// checkpoint is pruned again like any other, and shadow/ holds no dead
// trial's data.
func TestEvolutionTrialCutByASupervisorCrashIsReleased(t *testing.T) {
	s := startSup(t, supOpts{flags: append(append([]string{}, evoFlags...), "--shadow-duration", "120s"), agent: evoAgent("latency_ms=1")})
	dir := s.dataDir
	pins := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*.pin"))
		return m
	}
	scratch := func() []string {
		var names []string
		entries, _ := os.ReadDir(filepath.Join(dir, "shadow"))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	s.waitOutput("evolution trial started", 60*time.Second)
	if len(pins()) != 1 || len(scratch()) != 1 {
		t.Fatalf("during the trial: pins %v, scratch %v; want the backup pinned and one trial's scratch", pins(), scratch())
	}
	s.signal(syscall.SIGKILL)
	s.wait(30 * time.Second)

	// Started again with an agent that proposes nothing.
	s2 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--checkpoint-every", "20", "--wal-rate", "100"}})
	s2.waitOutput("agent is up", 30*time.Second)
	waitFor(t, 10*time.Second, "the dead trial's pin and scratch stores released", func() bool {
		return len(pins()) == 0 && len(scratch()) == 0
	})
}
