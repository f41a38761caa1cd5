package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Fast timings so the tests run in seconds; slack is generous for a shared,
// noisy machine: assertions are about behaviour, never about speed.
var fastFlags = []string{"--backoff-initial", "20ms", "--backoff-max", "200ms", "--kill-timeout", "1s", "--shutdown-timeout", "10s"}

func agentPIDs(s *sup) []int {
	var pids []int
	for _, e := range s.eventsOf("start") {
		pids = append(pids, e.int("pid"))
	}
	return pids
}

func TestAgentExitNonZeroIsRestarted(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--max-restarts", "0"),
		agent: []string{"--heartbeat-interval", "50ms", "--crash-after", "300ms", "--crash-code", "7"}})
	s.waitEvents("start", 3, 30*time.Second)
	waitFor(t, 10*time.Second, "restart counter", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="crashed"`) >= 2
	})
	recs := auditRecords(t, s.dataDir)
	n := 0
	for _, r := range recs {
		if r["kind"] == "restart" {
			n++
		}
	}
	if n < 2 {
		t.Fatalf("want >= 2 restart audit records, got %d", n)
	}
	if !strings.Contains(s.out.String(), "exited with code 7") {
		t.Fatalf("log does not name the exit code")
	}
}

func TestAgentKill9IsRestarted(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	first := s.waitEvents("start", 1, 30*time.Second)[0].int("pid")
	waitFor(t, 10*time.Second, "readyz 200", func() bool { c, _ := s.get("/readyz"); return c == 200 })
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	starts := s.waitEvents("start", 2, 30*time.Second)
	if starts[1].int("pid") == first {
		t.Fatal("restarted agent has the same pid")
	}
	waitFor(t, 10*time.Second, "restart counted as killed", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="killed"`) == 1
	})
	waitFor(t, 10*time.Second, "readyz 200 again", func() bool { c, _ := s.get("/readyz"); return c == 200 })
}

func TestHungAgentIsKilledAndRestarted(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--heartbeat-timeout", "1s", "--max-restarts", "0"),
		agent: []string{"--heartbeat-interval", "50ms", "--hang-after", "500ms"}})
	start := time.Now()
	s.waitEvents("start", 2, 30*time.Second)
	t.Logf("hung agent replaced after %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, 10*time.Second, "restart counted as hung", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="hung"`) >= 1
	})
	if !strings.Contains(s.out.String(), "no heartbeat within --heartbeat-timeout") {
		t.Fatal("log does not say the agent was hung")
	}
}

// An agent that hangs in the middle of a streamed checkpoint frame (the
// first 1 MiB of 8 MiB sent, then nothing, alive) is hung like any other:
// replaced within its heartbeat timeout. The first build counted the whole
// read of a streamed frame as time blocked on our storage, so the agent's
// heartbeat never aged and it was never restarted.
func TestHungMidCheckpointAgentIsRestarted(t *testing.T) {
	buildBoundsTools(t)
	h := startHostile(t, binPath, "stallcheckpoint", append(slices.Clone(fastFlags), "--heartbeat-timeout", "2s", "--max-restarts", "0"), nil)
	waitFor(t, 30*time.Second, "the agent to stall mid-checkpoint", func() bool { return len(noted(h.notes, "stalled")) >= 1 })
	stalled := time.Now()
	waitFor(t, 30*time.Second, "the agent hung mid-checkpoint to be restarted as hung", func() bool {
		return h.metric("supervisor_agent_restarts_total", `reason="hung"`) >= 1 && len(noted(h.notes, "pid ")) >= 2
	})
	t.Logf("agent hung mid-checkpoint replaced %s after it stalled (--heartbeat-timeout 2s)", time.Since(stalled).Round(time.Millisecond))
	if !strings.Contains(h.out.String(), "no heartbeat within --heartbeat-timeout") {
		t.Fatal("log does not say the agent was hung")
	}
}

func TestAgentIgnoringSIGTERMIsKilled(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--heartbeat-timeout", "1s", "--kill-timeout", "500ms", "--max-restarts", "0"),
		agent: []string{"--heartbeat-interval", "50ms", "--hang-after", "300ms", "--ignore-sigterm"}})
	first := s.waitEvents("start", 1, 30*time.Second)[0].int("pid")
	s.waitEvents("start", 2, 30*time.Second)
	s.waitOutput("ignored SIGTERM; killed it with SIGKILL", 10*time.Second)
	if alive(first) {
		t.Fatalf("agent %d still alive", first)
	}
}

func TestStartTimeout(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--start-timeout", "700ms", "--max-restarts", "0", "--shutdown-timeout", "500ms"),
		agent: []string{"--heartbeat-interval", "50ms", "--start-delay", "1h"}})
	// The delayed agent never connects, so it logs nothing: watch the supervisor.
	waitFor(t, 30*time.Second, "second start", func() bool { return strings.Count(s.out.String(), `msg="agent started"`) >= 2 })
	waitFor(t, 10*time.Second, "restart counted as start_timeout", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="start_timeout"`) >= 1
	})
}

func TestGrandchildrenDieWithTheGroup(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--fork-grandchild"}})
	st := s.waitEvents("start", 1, 30*time.Second)[0]
	gc := st.int("grandchild_pid")
	if gc == 0 || !alive(gc) {
		t.Fatalf("grandchild not running: %v", st)
	}
	// A crash of the agent takes its grandchild with it.
	if err := syscall.Kill(st.int("pid"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "grandchild gone after agent crash", func() bool { return !alive(gc) })
	// A graceful stop takes the new one too.
	st2 := s.waitEvents("start", 2, 30*time.Second)[1]
	gc2 := st2.int("grandchild_pid")
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if alive(gc2) || alive(st2.int("pid")) {
		t.Fatalf("agent %d or grandchild %d outlived the supervisor", st2.int("pid"), gc2)
	}
}

func TestCrashLoopGivesUp(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--max-restarts", "2", "--restart-window", "1m"),
		agent: []string{"--crash-after", "1ms"}})
	if code := s.wait(60 * time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	out := s.out.String()
	for _, want := range []string{"--max-restarts=2", "giving up", "supervisor audit"} {
		if !strings.Contains(out, want) {
			t.Fatalf("give-up message lacks %q", want)
		}
	}
	if n := len(s.eventsOf("start")); n != 3 {
		t.Fatalf("agent started %d times, want 3 (first + 2 restarts)", n)
	}
	found := false
	for _, r := range auditRecords(t, s.dataDir) {
		found = found || r["kind"] == "gave_up"
	}
	if !found {
		t.Fatal("no gave_up audit record")
	}
}

func TestRestartPolicies(t *testing.T) {
	t.Run("never+failure exits 1", func(t *testing.T) {
		s := startSup(t, supOpts{flags: append(fastFlags, "--restart", "never"), agent: []string{"--crash-after", "100ms"}})
		if code := s.wait(30 * time.Second); code != 1 {
			t.Fatalf("exit code %d, want 1", code)
		}
	})
	t.Run("on-failure+clean exit stops with 0", func(t *testing.T) {
		s := startSup(t, supOpts{flags: append(fastFlags, "--restart", "on-failure"), agent: []string{"--crash-after", "100ms", "--crash-code", "0"}})
		if code := s.wait(30 * time.Second); code != 0 {
			t.Fatalf("exit code %d, want 0", code)
		}
		if n := len(s.eventsOf("start")); n != 1 {
			t.Fatalf("started %d times", n)
		}
	})
	t.Run("on-failure+crash restarts", func(t *testing.T) {
		s := startSup(t, supOpts{flags: append(fastFlags, "--restart", "on-failure", "--max-restarts", "0"), agent: []string{"--crash-after", "100ms", "--crash-code", "3"}})
		s.waitEvents("start", 2, 30*time.Second)
	})
}

func TestGracefulStopOnSIGTERM(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "200"}})
	s.waitEvents("applied", 20, 30*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0\n", code)
	}
	if len(s.eventsOf("shutdown")) != 1 {
		t.Fatal("agent did not receive shutdown")
	}
	acks := s.eventsOf("checkpoint_acked")
	if len(acks) == 0 {
		t.Fatal("final checkpoint was not acknowledged")
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "supervisor.sock")); !os.IsNotExist(err) {
		t.Fatalf("control socket left behind: %v", err)
	}
	// The stored checkpoint is the one acknowledged.
	code, out, _ := cli(t, "checkpoints", "list", "--data-dir", s.dataDir)
	if code != 0 || !strings.Contains(out, acks[len(acks)-1].str("checkpoint_id")) {
		t.Fatalf("checkpoints list (%d):\n%s", code, out)
	}
}

func TestSupervisorKill9TakesAgentAlong(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--fork-grandchild", "--ignore-sigterm"}})
	st := s.waitEvents("start", 1, 30*time.Second)[0]
	// With the supervisor gone nobody kills the rest of the agent's group:
	// that is the service manager's (systemd's cgroup, the container's PID
	// namespace; docs/operations.md). The test cleans up after itself.
	if gc := st.int("grandchild_pid"); gc != 0 {
		t.Cleanup(func() { _ = syscall.Kill(gc, syscall.SIGKILL) })
	}
	s.signal(syscall.SIGKILL)
	s.wait(10 * time.Second)
	waitFor(t, 10*time.Second, "agent dead after supervisor kill -9 (Pdeathsig)", func() bool { return !alive(st.int("pid")) })
}

func TestFramingErrorsRestartTheAgent(t *testing.T) {
	for _, kind := range []string{"bytes", "oversize", "zero"} {
		t.Run(kind, func(t *testing.T) {
			s := startSup(t, supOpts{flags: append(fastFlags, "--max-restarts", "0"),
				agent: []string{"--heartbeat-interval", "50ms", "--garbage", kind}})
			s.waitEvents("start", 2, 30*time.Second)
			waitFor(t, 10*time.Second, "framing error counted", func() bool {
				return s.metric("supervisor_invalid_frames_total", `code="FRAMING_ERROR"`) >= 1
			})
			waitFor(t, 10*time.Second, "restart reason framing_error", func() bool {
				return s.metric("supervisor_agent_restarts_total", `reason="framing_error"`) >= 1
			})
			if c, _ := s.get("/healthz"); c != 200 {
				t.Fatalf("healthz %d", c)
			}
		})
	}
}

func TestInvalidMessagesGetErrorReplyAndAgentIsKept(t *testing.T) {
	for _, kind := range []string{"invalid", "notmap"} {
		t.Run(kind, func(t *testing.T) {
			s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--garbage", kind}})
			errs := s.waitEvents("error", 1, 30*time.Second)
			if errs[0].str("code") != "INVALID_MESSAGE" {
				t.Fatalf("error event %v", errs[0])
			}
			waitFor(t, 10*time.Second, "invalid counted", func() bool {
				return s.metric("supervisor_invalid_frames_total", `code="INVALID_MESSAGE"`) >= 1
			})
			time.Sleep(500 * time.Millisecond)
			if n := len(s.eventsOf("start")); n != 1 {
				t.Fatalf("agent restarted (%d starts) after a payload error", n)
			}
			if s.metric("supervisor_agent_restarts_total") > 0 {
				t.Fatal("restart counted")
			}
		})
	}
}

func TestFDTransport(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--stdio=false"), agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "100"}})
	s.waitEvents("applied", 5, 30*time.Second)
	waitFor(t, 10*time.Second, "readyz 200", func() bool { c, _ := s.get("/readyz"); return c == 200 })
	if st := s.eventsOf("start")[0]; st.str("transport") != "fd" {
		t.Fatalf("agent saw transport %q, want fd (--stdio=false)", st.str("transport"))
	}
}

func TestHealthAndReadiness(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--backoff-initial", "2s", "--backoff-max", "2s"),
		agent: []string{"--heartbeat-interval", "50ms"}})
	waitFor(t, 30*time.Second, "readyz 200", func() bool { c, _ := s.get("/readyz"); return c == 200 })
	pid := s.waitEvents("start", 1, 10*time.Second)[0].int("pid")
	_ = syscall.Kill(pid, syscall.SIGKILL)
	// During the 1–2 s back-off: not ready, but alive.
	waitFor(t, 5*time.Second, "readyz 503 while restarting", func() bool {
		c, body := s.get("/readyz")
		return c == 503 && strings.Contains(body, "reason")
	})
	if c, _ := s.get("/healthz"); c != 200 {
		t.Fatalf("healthz %d while restarting; a liveness probe would kill the pod", c)
	}
	waitFor(t, 30*time.Second, "ready again", func() bool { c, _ := s.get("/readyz"); return c == 200 })
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--restart", "sometimes", "--", "true"}, "restart policy"},
		{[]string{"run", "--heartbeat-timeout", "-1s", "--", "true"}, "--heartbeat-timeout"},
		{[]string{"run", "--wal-sync", "maybe", "--", "true"}, "--wal-sync"},
		{[]string{"run", "--data-dir", "DIR", "--http-addr", "", "--", "/nonexistent/agent"}, "nonexistent"},
		{[]string{"frobnicate"}, "unknown command"},
	}
	for _, c := range cases {
		dir := t.TempDir()
		args := c.args
		for i, a := range args {
			if a == "DIR" {
				args[i] = filepath.Join(dir, "d")
			}
		}
		code, _, stderr := cli(t, args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

func TestDataDirLock(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	s.waitEvents("start", 1, 30*time.Second)
	code, _, stderr := cli(t, "run", "--data-dir", s.dataDir, "--http-addr", "", "--", testAgentPath)
	if code != 2 || !strings.Contains(stderr, "locked") {
		t.Fatalf("second supervisor on the same dir: exit %d, %s", code, stderr)
	}
}

func TestSecondSignalSkipsGracefulWait(t *testing.T) {
	// The agent stops reading its input, so it never sees shutdown; the
	// graceful wait would last the full minute.
	s := startSup(t, supOpts{flags: append(fastFlags, "--shutdown-timeout", "1m", "--heartbeat-timeout", "1m"),
		agent: []string{"--heartbeat-interval", "50ms", "--hang-after", "200ms"}})
	s.waitEvents("hang", 1, 30*time.Second)
	pid := s.eventsOf("start")[0].int("pid")
	s.signal(syscall.SIGTERM)
	s.waitOutput("stopping: asking the agent to shut down", 10*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d after a second SIGTERM, want 0", code)
	}
	if !strings.Contains(s.out.String(), "second stop signal") {
		t.Fatal("the forced stop was not logged")
	}
	if alive(pid) {
		t.Fatal("agent outlived the forced stop")
	}
}
