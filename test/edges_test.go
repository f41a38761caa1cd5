package test

// Issue 33, the edges: each case through the built binary, asserting on what
// an agent or an operator sees.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reportLines returns the lines of an agent's report file.
func reportLines(path string) []string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// An agent that sends keys and values that are not UTF-8 gets error replies
// that quote them; every frame it receives decodes with a strict decoder
// (Python's msgpack, raw=False, as the Python client reads), the bytes shown
// as \xNN escapes. Before, a reply quoting a key path carried the raw bytes
// in a str, and a strict agent crashed on it, in a loop.
func TestInvalidUTF8NeverReachesTheAgent(t *testing.T) {
	requirePythonMsgpack(t)
	report := filepath.Join(t.TempDir(), "report")
	agent, err := filepath.Abs("testdata/utf8_agent.py")
	if err != nil {
		t.Fatal(err)
	}
	s := startSup(t, supOpts{command: []string{python, agent}, env: []string{"AGENT_REPORT=" + report}})
	var sent int
	waitFor(t, 60*time.Second, "the hostile messages sent and each answered", func() bool {
		errs := 0
		for _, l := range reportLines(report) {
			if n, ok := strings.CutPrefix(l, "sent "); ok {
				sent, _ = strconv.Atoi(n)
			}
			if strings.HasPrefix(l, "frame error ") || strings.HasPrefix(l, "undecodable ") {
				errs++
			}
		}
		return sent > 0 && errs >= sent
	})
	var escaped bool
	for _, l := range reportLines(report) {
		if strings.HasPrefix(l, "undecodable ") {
			t.Errorf("a strict decoder refused a frame from the supervisor: %s", l)
		}
		if body, ok := strings.CutPrefix(l, "frame error "); ok {
			var e struct {
				Code, Message string
				Details       map[string]any
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			if e.Code != "INVALID_MESSAGE" {
				t.Errorf("reply %s, want INVALID_MESSAGE", body)
			}
			if strings.Contains(e.Message, `lat\xff\xfency`) && e.Details["field"] == `data.lat\xff\xfency` {
				escaped = true
			}
		}
	}
	if !escaped {
		t.Errorf("no reply names the field data.lat\\xff\\xfency with its bytes escaped; report:\n%s", strings.Join(reportLines(report), "\n"))
	}
	if r := s.metric("supervisor_agent_restarts_total"); r > 0 {
		t.Errorf("the agent was restarted %v times", r)
	}
}
