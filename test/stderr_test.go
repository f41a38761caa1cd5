package test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStderrReaderGoneDoesNotKillSupervisor: the process reading the
// supervisor's stderr (a log shipper, `| head`) goes away. Go exits on
// SIGPIPE from a write to fd 2 by default, so the supervisor died at its
// next log line and left its agent to the reaper. Now the line is dropped:
// the supervisor keeps supervising, answers `status`, and stops cleanly.
func TestStderrReaderGoneDoesNotKillSupervisor(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// The built-in demo agent logs a note every 50 ms: the supervisor
	// writes an "agent output" line to stderr for each.
	cmd := exec.Command(binPath, "run", "--data-dir", dir, "--http-addr", "", "--",
		binPath, "demo-agent", "--note-every", "50ms")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan struct{}) // closed when the supervisor has exited
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })

	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("supervisor stderr ended before the agent logged: %v", err)
		}
		if strings.Contains(line, "agent output") {
			break
		}
	}
	r.Close() // the reader goes away; every later write to stderr gets EPIPE

	// Plenty of log lines are written meanwhile (20 a second).
	select {
	case <-exited:
		t.Fatalf("the supervisor died after its stderr reader went away: %v (%v)", waitErr, cmd.ProcessState)
	case <-time.After(3 * time.Second):
	}
	code, out, errOut := cli(t, "status", "--data-dir", dir, "--json")
	var st struct {
		State    string `json:"state"`
		Restarts int    `json:"restarts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State != "running" || st.Restarts != 0 {
		t.Fatalf("status after the reader went away: exit %d %s %s", code, out, errOut)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if c := cmd.ProcessState.ExitCode(); c != 0 {
			t.Fatalf("stopped with exit %d (%v), want 0", c, cmd.ProcessState)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the supervisor did not stop on SIGTERM")
	}
}
