package test

import (
	"encoding/json"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// `supervisor requests show` reads the journal the running supervisor
// writes: for a request delivered once and answered it must say attempts 1,
// as GET /v1/requests/ID does — during the run and after a restart.
func TestRequestsShowAttemptsMatchHTTP(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, nil)
	id := postRequest(t, s, "once")
	v := waitStatus(t, s, id, "answered", 30*time.Second)
	if v.Attempts != 1 {
		t.Fatalf("GET says attempts %d, want 1", v.Attempts)
	}
	show := func(when string) {
		var c reqView
		// The answer reaches the journal just after GET has it.
		waitFor(t, 10*time.Second, "the answer in the journal", func() bool {
			code, out, stderr := cli(t, "requests", "show", id, "--data-dir", dir, "--json")
			if err := json.Unmarshal([]byte(out), &c); code != 0 || err != nil {
				t.Fatalf("requests show: exit %d, %v, stderr %s", code, err, stderr)
			}
			return c.Status == "answered"
		})
		if c.Status != "answered" || c.Attempts != v.Attempts {
			t.Errorf("%s: requests show says %s with attempts %d; GET said %s with attempts %d", when, c.Status, c.Attempts, v.Status, v.Attempts)
		}
	}
	show("running")
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	show("stopped")
	s = reqSup(t, dir, log, nil)
	if _, g := getRequest(t, s, id); g.Attempts != 1 {
		t.Errorf("GET after a restart says attempts %d, want 1", g.Attempts)
	}
}
