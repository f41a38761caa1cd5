// Package prometheus_test checks the shipped alert rules: promtool accepts
// them, each fires (and stays quiet) as its test case says, and every rule
// has a severity and a runbook section in docs/operations.md.
package prometheus_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// promtool returns the promtool binary. It skips the test when promtool is
// missing, except in CI (CI=true), where that is a failure.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed; CI must install it (Debian package prometheus; .ci/run does)")
		}
		t.Skip("promtool not installed (apt-get install prometheus; required when CI=true)")
	}
	return p
}

func TestPromtoolChecksRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", "alerts.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules alerts.yml: %v\n%s", err, out)
	}
}

func TestPromtoolTestsRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", "alerts_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules alerts_test.yml: %v\n%s", err, out)
	}
}

// rule is what this test needs of one alerting rule.
type rule struct {
	name, severity, anchor string
}

// readRules scans alerts.yml (one rule per "- alert:" line; labels and
// annotations follow it).
func readRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules []rule
	alert := regexp.MustCompile(`^\s*- alert: (\S+)$`)
	severity := regexp.MustCompile(`^\s*severity: (\S+)$`)
	runbook := regexp.MustCompile(`^\s*runbook_url: "https://github\.com/agent-sidecar/supervisor/blob/main/docs/operations\.md#([a-z0-9-]+)"$`)
	for _, line := range strings.Split(string(b), "\n") {
		if m := alert.FindStringSubmatch(line); m != nil {
			rules = append(rules, rule{name: m[1]})
			continue
		}
		if len(rules) == 0 {
			continue
		}
		r := &rules[len(rules)-1]
		if m := severity.FindStringSubmatch(line); m != nil {
			r.severity = m[1]
		}
		if m := runbook.FindStringSubmatch(line); m != nil {
			r.anchor = m[1]
		}
	}
	return rules
}

// The rules file and docs/operations.md describe the same alerts: each
// rule has a severity, a runbook_url to its own section of the document,
// and a test case; each alert the document lists is in the file.
func TestRulesAndDocsAgree(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules := readRules(t)
	if len(rules) < 9 {
		t.Fatalf("%d rules in alerts.yml, want at least the 9 the operations guide describes", len(rules))
	}
	inFile := map[string]bool{}
	for _, r := range rules {
		inFile[r.name] = true
		switch r.severity {
		case "critical", "warning", "info":
		default:
			t.Errorf("%s: severity %q, want critical, warning or info", r.name, r.severity)
		}
		if r.anchor != strings.ToLower(r.name) {
			t.Errorf("%s: runbook_url anchor %q, want #%s", r.name, r.anchor, strings.ToLower(r.name))
		}
		if !strings.Contains(string(doc), "\n### "+r.name+"\n") {
			t.Errorf("%s: docs/operations.md has no section \"### %s\" for its runbook_url", r.name, r.name)
		}
		if !strings.Contains(string(tests), "alertname: "+r.name+"\n") {
			t.Errorf("%s: no test case in alerts_test.yml", r.name)
		}
	}
	// The guide's alert table: | [`Name`](#name) | severity | ...
	row := regexp.MustCompile("(?m)^\\| \\[`([A-Za-z]+)`\\]\\(#([a-z]+)\\) \\| (\\w+) \\|")
	listed := row.FindAllStringSubmatch(string(doc), -1)
	if len(listed) != len(rules) {
		t.Errorf("docs/operations.md lists %d alerts, alerts.yml has %d", len(listed), len(rules))
	}
	for _, m := range listed {
		if !inFile[m[1]] {
			t.Errorf("docs/operations.md lists %s, which alerts.yml does not have", m[1])
		}
		for _, r := range rules {
			if r.name == m[1] && r.severity != m[3] {
				t.Errorf("%s: severity %s in the guide, %s in alerts.yml", r.name, m[3], r.severity)
			}
		}
	}
}
