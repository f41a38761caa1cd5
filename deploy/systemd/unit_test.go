// Package systemd_test checks the example unit against the supervisor's own
// stop sequence: systemd must not SIGKILL the cgroup before the supervisor
// has had --shutdown-timeout for the agent's final checkpoint plus
// --kill-timeout for its group.
package systemd_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestUnitStopsGracefully(t *testing.T) {
	b, err := os.ReadFile("supervisor.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	get := func(key string) string {
		m := regexp.MustCompile(`(?m)^` + key + `=(.*)$`).FindStringSubmatch(unit)
		if m == nil {
			t.Fatalf("supervisor.service has no %s=", key)
		}
		return strings.TrimSpace(m[1])
	}
	for key, want := range map[string]string{"KillMode": "mixed", "Restart": "on-failure", "RestartPreventExitStatus": "2 3", "KillSignal": "SIGTERM"} {
		if got := get(key); got != want {
			t.Errorf("%s=%s, want %s", key, got, want)
		}
	}
	flag := func(name string, def time.Duration) time.Duration {
		m := regexp.MustCompile(`--` + name + `[ =](\S+)`).FindStringSubmatch(get("ExecStart"))
		if m == nil {
			return def
		}
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatalf("--%s %s: %v", name, m[1], err)
		}
		return d
	}
	stop, err := time.ParseDuration(get("TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	need := flag("shutdown-timeout", 10*time.Second) + flag("kill-timeout", 5*time.Second)
	if stop <= need {
		t.Errorf("TimeoutStopSec=%s, want more than --shutdown-timeout + --kill-timeout = %s", stop, need)
	}
	if !strings.Contains(get("ExecStart"), " run ") || !strings.Contains(get("ExecStart"), " -- ") {
		t.Errorf("ExecStart %q: want supervisor run [flags] -- AGENT", get("ExecStart"))
	}
}

// systemd-analyze, where installed, agrees the unit is well-formed.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	out, err := exec.Command(sa, "verify", "--man=no", "supervisor.service").CombinedOutput()
	// Missing binaries (/usr/local/bin/supervisor, the agent) and user are
	// expected on a test machine; syntax errors are not.
	if s := string(out); err != nil && (strings.Contains(s, "Unknown") || strings.Contains(s, "Invalid") || strings.Contains(s, "Failed to parse")) {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
