package supervisor

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func startSleep(t testing.TB, script string) *process {
	t.Helper()
	p, err := startProcess(procSpec{Path: "/bin/sh", Args: []string{"-c", script}, Env: os.Environ(), Stdio: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProcessExitIsSeenWithoutReaping(t *testing.T) {
	p := startSleep(t, "exit 3")
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("exit not noticed")
	}
	// The leader is a zombie until reap: its pid cannot be reused meanwhile.
	b, err := os.ReadFile("/proc/" + itoa(p.pid) + "/stat")
	if err != nil || !strings.Contains(string(b), ") Z ") {
		t.Fatalf("leader should be an unreaped zombie: %q %v", b, err)
	}
	st := p.reap()
	if !st.known || st.code != 3 {
		t.Fatalf("exit status %v", st)
	}
	if err := p.signalGroup(syscall.SIGKILL); err != nil {
		t.Fatalf("signal after reap must be a no-op: %v", err)
	}
	if isManaged(p.pid) {
		t.Fatal("still registered as managed after reap")
	}
}

func TestStopGroupKillsDescendantsAndEscalates(t *testing.T) {
	// The shell ignores SIGTERM and has a child in its group.
	p := startSleep(t, "trap '' TERM; sleep 3600 & echo $! >&2; wait")
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if killed := p.stopGroup(300 * time.Millisecond); !killed {
		t.Fatal("a leader ignoring SIGTERM must be SIGKILLed")
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("SIGKILL sent before the kill timeout")
	}
	p.reap()
	out, _ := os.ReadFile("/proc/" + itoa(p.pid) + "/stat")
	if len(out) != 0 {
		t.Fatalf("leader still present: %s", out)
	}
}

func TestSpawnFailureIsReported(t *testing.T) {
	_, err := startProcess(procSpec{Path: "/nonexistent/agent", Env: os.Environ(), Stdio: true})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/agent") {
		t.Fatalf("err = %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// BenchmarkDeathDetection measures the time from a SIGKILL of a running agent
// process to the supervisor noticing its exit (SPEC §8: under 10 ms).
func BenchmarkDeathDetection(b *testing.B) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		p := startSleep(b, "exec sleep 3600")
		b.StartTimer()
		start := time.Now()
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.exited
		total += time.Since(start)
		b.StopTimer()
		p.reap()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-to-detect")
}
