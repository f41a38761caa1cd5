package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRequestAPI(t *testing.T) {
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	waitFor(t, 30*time.Second, "ready", func() bool { c, _ := s.get("/readyz"); return c == 200 })

	code, body := s.post("/v1/requests", `{"message":"remember the milk","context":{"channel":"cli","n":3},"user_id":"u1"}`)
	if code != 202 {
		t.Fatalf("POST: %d %s", code, body)
	}
	var resp struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || resp.RequestID == "" {
		t.Fatalf("body %q", body)
	}
	waitFor(t, 10*time.Second, "agent handled the request", func() bool {
		for _, e := range s.eventsOf("request") {
			if e.str("request_id") == resp.RequestID {
				return true
			}
		}
		return false
	})

	bad := []struct {
		name, body string
		code       int
	}{
		{"not json", `{"message":`, 400},
		{"array", `["message"]`, 400},
		{"missing message", `{"user_id":"u1"}`, 400},
		{"message not a string", `{"message":42}`, 400},
		{"context not an object", `{"message":"x","context":"nope"}`, 400},
		{"trailing data", `{"message":"x"} {"message":"y"}`, 400},
		{"too large", `{"message":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
	}
	for _, c := range bad {
		code, body := s.post("/v1/requests", c.body)
		if code != c.code || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want %d with a JSON error", c.name, code, body, c.code)
		}
	}
	resp2, err := http.Get(s.url("/v1/requests"))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/requests: %d", resp2.StatusCode)
	}
	if v := s.metric("supervisor_http_requests_total", `code="400"`); v != 6 {
		t.Errorf("400s counted %v, want 6", v)
	}
}

func TestRequestAPIWhenAgentNotReady(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--shutdown-timeout", "500ms"), agent: []string{"--start-delay", "1h"}})
	waitFor(t, 10*time.Second, "listener", func() bool { c, _ := s.get("/healthz"); return c == 200 })
	// A request is journaled and waits for the agent (issue 29): 202, and
	// GET shows it pending, never delivered yet.
	code, body := s.post("/v1/requests", `{"message":"hi"}`)
	if code != 202 {
		t.Fatalf("%d %s, want 202: the request waits for the agent", code, body)
	}
	id := jsonField(t, body, "request_id")
	if code, body := s.get("/v1/requests/" + id); code != 200 || !strings.Contains(body, `"status":"pending"`) {
		t.Errorf("GET: %d %s, want pending", code, body)
	}
}

func TestMetricsMoveAndAuditRecords(t *testing.T) {
	s := startSup(t, supOpts{flags: append(fastFlags, "--max-restarts", "0"),
		agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "200", "--checkpoint-every", "50", "--garbage", "invalid", "--metrics-interval", "100ms"}})
	s.waitEvents("checkpoint_acked", 1, 30*time.Second)
	waitFor(t, 10*time.Second, "invalid counted by code and rule", func() bool {
		return s.metric("supervisor_invalid_frames_total", `code="INVALID_MESSAGE"`, `rule="unknown_type"`) >= 1
	})
	waitFor(t, 10*time.Second, "checkpoint metrics", func() bool {
		return s.metric("supervisor_checkpoints_total") >= 1 && s.metric("supervisor_checkpoint_stored_bytes") > 0 &&
			s.metric("supervisor_checkpoint_duration_seconds_count") >= 1
	})
	waitFor(t, 10*time.Second, "WAL metrics", func() bool {
		return s.metric("supervisor_wal_appends_total") >= 50 && s.metric("supervisor_wal_fsync_duration_seconds_count") >= 1 &&
			s.metric("supervisor_wal_last_sequence") >= 50
	})
	waitFor(t, 10*time.Second, "agent-reported metrics in base units", func() bool {
		v := s.metric("supervisor_agent_reported_latency_seconds", `stat="avg"`)
		return v > 0 && v < 1 // the reference agent reports ~5 ms
	})
	if s.metric("supervisor_agent_up", `role="primary"`) != 1 {
		t.Fatal("agent_up not 1")
	}
	pid := s.eventsOf("start")[0].int("pid")
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 10*time.Second, "restart counted with its reason", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="killed"`) == 1
	})
	waitFor(t, 10*time.Second, "restore counted", func() bool {
		return s.metric("supervisor_restores_total", `trigger="start"`) >= 1
	})

	kinds := map[string]int{}
	for _, r := range auditRecords(t, s.dataDir) {
		kinds[r["kind"].(string)]++
		if r["id"] == "" || r["time"] == "" {
			t.Fatalf("audit record without id/time: %v", r)
		}
	}
	for _, k := range []string{"supervisor_started", "restart", "restore", "checkpoint_stored", "invalid_message"} {
		if kinds[k] == 0 {
			t.Errorf("no %q audit record (have %v)", k, kinds)
		}
	}
	code, out, _ := cli(t, "audit", "--data-dir", s.dataDir, "--json", "--since", "1h")
	if code != 0 || !strings.Contains(out, `"kind":"restart"`) {
		t.Fatalf("supervisor audit: %d\n%s", code, out)
	}
	code, out, _ = cli(t, "audit", "--data-dir", s.dataDir, "--since", "1ns")
	if code != 0 || strings.Contains(out, "supervisor_started") {
		t.Fatalf("--since did not filter: %d\n%s", code, out)
	}
}

// TestPromtoolCheckMetrics runs Prometheus's own linter over a live scrape.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; .ci/run installs it (Debian package prometheus)")
		}
		t.Skip("promtool not installed (apt-get install prometheus)")
	}
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "100", "--checkpoint-every", "20", "--metrics-interval", "100ms"}})
	s.waitEvents("checkpoint_acked", 1, 30*time.Second)
	waitFor(t, 10*time.Second, "agent metrics", func() bool { return s.metric("supervisor_agent_reported_memory_bytes") > 0 })
	_, body := s.get("/metrics")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestPrometheusScrapes runs a real Prometheus server that scrapes the
// supervisor. Slow (Prometheus start-up and a scrape interval): behind
// PROMETHEUS_E2E=1. See docs/operations.md.
func TestPrometheusScrapes(t *testing.T) {
	if os.Getenv("PROMETHEUS_E2E") == "" {
		t.Skip("set PROMETHEUS_E2E=1 to scrape with a real Prometheus server (needs the prometheus binary)")
	}
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (apt-get install prometheus)")
	}
	s := startSup(t, supOpts{flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	waitFor(t, 30*time.Second, "ready", func() bool { c, _ := s.get("/readyz"); return c == 200 })
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: supervisor\n    static_configs:\n      - targets: [%q]\n", s.httpAddr())
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// Prometheus picks its own port too, and logs it:
	// msg="Listening on" ... address=127.0.0.1:PORT.
	cmd := exec.Command(prom, "--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "tsdb"),
		"--web.listen-address", "127.0.0.1:0")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	listening := regexp.MustCompile(`msg="Listening on".* address=(127\.0\.0\.1:[1-9][0-9]*)`)
	var promAddr string
	waitFor(t, 60*time.Second, "Prometheus to say where it listens", func() bool {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			promAddr = m[1]
		}
		return promAddr != ""
	})
	query := func(q string) string {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + q)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitFor(t, 90*time.Second, "Prometheus scraped the supervisor", func() bool {
		return strings.Contains(query(`supervisor_agent_up`), `"primary"`) && strings.Contains(query(`up`), `"1"]`)
	})
	if r := query(`supervisor_agent_up{role="primary"}`); !strings.Contains(r, `"1"]`) {
		t.Fatalf("agent_up as seen by Prometheus: %s", r)
	}
}
