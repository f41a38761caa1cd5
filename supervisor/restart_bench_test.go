package supervisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/internal/testagent"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
)

// runRefAgentSupervisor runs a supervisor in-process over the reference
// agent (this test binary re-executed) and returns it once the agent is up.
func runRefAgentSupervisor(tb testing.TB, agentArgs ...string) *Supervisor {
	tb.Helper()
	return runTestSupervisor(tb, testagent.EnvRunAgent, "1", agentArgs...)
}

func runTestSupervisor(tb testing.TB, envKey, envVal string, agentArgs ...string) *Supervisor {
	tb.Helper()
	os.Setenv(envKey, envVal)
	tb.Cleanup(func() { os.Unsetenv(envKey) })
	return runCommandSupervisor(tb, append([]string{os.Args[0]}, agentArgs...))
}

// runCommandSupervisor runs a supervisor in-process over command and returns
// it once the agent has heartbeated.
func runCommandSupervisor(tb testing.TB, command []string) *Supervisor {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = filepath.Join(tb.TempDir(), "data")
	cfg.HTTPAddr = ""
	cfg.BackoffInitial, cfg.BackoffMax = time.Millisecond, time.Millisecond
	cfg.MaxRestarts = 0
	cfg.WALSegmentSize = 4 << 20
	cfg.Command = command
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	waitUp(tb, s, nil)
	return s
}

// waitUp waits for an agent instance other than prev to have heartbeated.
func waitUp(tb testing.TB, s *Supervisor, prev *conn.Instance) *conn.Instance {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if in := s.current().cur; in != nil && in != prev && !in.FirstHeartbeatAt().IsZero() {
			return in
		}
		time.Sleep(200 * time.Microsecond)
	}
	tb.Fatal("agent did not come up")
	return nil
}

// BenchmarkRestartLatency kills the agent with SIGKILL and measures, from the
// kill: the supervisor noticing the death, the restore (checkpoint + WAL
// tail) queued for the new process, and the new process's first heartbeat
// (which includes its own start-up). SPEC §8: death noticed within 10 ms;
// restored within 50 ms plus the agent's start-up.
func BenchmarkRestartLatency(b *testing.B) {
	s := runRefAgentSupervisor(b, "--heartbeat-interval", "20ms", "--wal-rate", "2000", "--wal-max", "500", "--checkpoint-every", "200")
	time.Sleep(500 * time.Millisecond) // state to restore: 2 checkpoints + WAL tail
	var detect, restore, heartbeat time.Duration
	in := s.current().cur
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := syscall.Kill(in.Proc().ID(), syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		next := waitUp(b, s, in)
		detect += in.Proc().(*agentproc.Process).ExitedAt().Sub(t0)
		restore += next.RestoreQueuedAt().Sub(t0)
		heartbeat += next.FirstHeartbeatAt().Sub(t0)
		if next.RestoreQueuedAt().IsZero() {
			b.Fatal("no restore was sent")
		}
		in = next
	}
	n := float64(b.N)
	b.ReportMetric(float64(detect.Microseconds())/n, "µs-detect")
	b.ReportMetric(float64(restore.Microseconds())/n, "µs-restore-queued")
	b.ReportMetric(float64(heartbeat.Microseconds())/n, "µs-first-heartbeat")
}

// BenchmarkWALFloodMinimalAgent: examples/floodagent (one heartbeat, then
// pre-encoded 1 KiB wal_entry frames as fast as the pipe takes them) in a real
// child process over a real pipe; one op is one entry appended by this
// in-process supervisor under the default sync policy (batch, 10ms). This is
// the supervisor's own capacity. SPEC §8: at least 100,000 entries/s.
func BenchmarkWALFloodMinimalAgent(b *testing.B) {
	n := b.N
	b.SetBytes(1024)
	start := time.Now()
	bin := filepath.Join(b.TempDir(), "floodagent")
	if out, err := exec.Command("go", "build", "-o", bin, "../examples/floodagent").CombinedOutput(); err != nil {
		b.Fatalf("build floodagent: %v\n%s", err, out)
	}
	s := runCommandSupervisor(b, []string{bin, "-n", strconv.Itoa(n)})
	deadline := time.Now().Add(10 * time.Minute)
	for s.st.WAL().DurableSequence() < uint64(n) {
		if time.Now().After(deadline) {
			b.Fatal("flood not appended in time")
		}
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "entries/s")
}

// BenchmarkWALFlood: the reference agent (a real child process) floods 1 KiB
// wal_entry frames over a real pipe; one op is one entry appended by this
// in-process supervisor under the default sync policy. Use it with
// -cpuprofile to see the supervisor's side of the end-to-end path.
func BenchmarkWALFlood(b *testing.B) {
	n := b.N
	b.SetBytes(1024)
	s := runRefAgentSupervisor(b, "--heartbeat-interval", "1s", "--wal-rate", "10000000", "--entry-size", "1024",
		"--wal-max", strconv.Itoa(n), "--memory-limit", "1000", "--checkpoint-interval", "0")
	start := time.Now()
	for s.st.WAL().LastSequence() < uint64(n) {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "entries/s")
}
