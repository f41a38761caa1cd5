package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"run", "--help"}, {"checkpoints", "--help"}, {"checkpoints", "list", "--help"},
		{"checkpoints", "show", "--help"}, {"restore", "--help"}, {"status", "--help"},
		{"wal", "--help"}, {"wal", "dump", "--help"}, {"audit", "--help"}, {"version"},
	} {
		code, out, errOut := runCLI(args...)
		if code != exitOK {
			t.Errorf("%v: exit %d, want 0 (%s)", args, code, errOut)
		}
		if out == "" && errOut == "" {
			t.Errorf("%v printed nothing", args)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage"},
		{[]string{"bogus"}, "unknown command"},
		{[]string{"run", "--no-such-flag"}, "no-such-flag"},
		{[]string{"run", "--log-format", "xml", "--", "true"}, "--log-format"},
		{[]string{"run", "--max-restarts", "-1", "--", "true"}, "--max-restarts"},
		{[]string{"run", "--evolution-max-latency-increase", "NaN", "--", "true"}, "threshold"},
		{[]string{"run", "--wal-segment-size", "10", "--", "true"}, "--wal-segment-size"},
		{[]string{"checkpoints"}, "Usage"},
		{[]string{"checkpoints", "show"}, "missing checkpoint ID"},
		{[]string{"checkpoints", "show", "../../etc/passwd"}, "not a checkpoint id"},
		{[]string{"restore"}, "--checkpoint ID is required"},
		{[]string{"restore", "--checkpoint", "x/../y"}, "not a checkpoint id"},
		{[]string{"wal"}, "Usage"},
	} {
		code, _, errOut := runCLI(c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

func TestRunFlagsFillConfig(t *testing.T) {
	cfg, format, err := parseRunFlags([]string{
		"--data-dir", "/d", "--http-addr", "", "--stdio=false", "--heartbeat-timeout", "2s", "--start-timeout", "3s",
		"--kill-timeout", "4s", "--restart", "on-failure", "--backoff-initial", "5ms", "--backoff-max", "6s",
		"--max-restarts", "0", "--restart-window", "7m", "--shutdown-timeout", "8s", "--wal-sync", "always",
		"--wal-sync-interval", "9ms", "--wal-operations", "a, b,,c", "--checkpoint-retain", "3",
		"--max-frame-size", "2048", "--shadow-duration", "1s", "--log-format", "json", "--", "agent", "--x", "y",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := supervisor.DefaultConfig()
	want.DataDir, want.HTTPAddr, want.Stdio = "/d", "", false
	want.HeartbeatTimeout, want.StartTimeout, want.KillTimeout = 2*time.Second, 3*time.Second, 4*time.Second
	want.Restart, want.BackoffInitial, want.BackoffMax = supervisor.RestartOnFailure, 5*time.Millisecond, 6*time.Second
	want.MaxRestarts, want.RestartWindow, want.ShutdownTimeout = 0, 7*time.Minute, 8*time.Second
	want.WALSync, want.WALSyncInterval = "always", 9*time.Millisecond
	want.CheckpointRetain, want.MaxFrameSize, want.ShadowDuration = 3, 2048, time.Second
	if cfg.DataDir != want.DataDir || cfg.HTTPAddr != want.HTTPAddr || cfg.Stdio != want.Stdio ||
		cfg.HeartbeatTimeout != want.HeartbeatTimeout || cfg.StartTimeout != want.StartTimeout || cfg.KillTimeout != want.KillTimeout ||
		cfg.Restart != want.Restart || cfg.BackoffInitial != want.BackoffInitial || cfg.BackoffMax != want.BackoffMax ||
		cfg.MaxRestarts != want.MaxRestarts || cfg.RestartWindow != want.RestartWindow || cfg.ShutdownTimeout != want.ShutdownTimeout ||
		cfg.WALSync != want.WALSync || cfg.WALSyncInterval != want.WALSyncInterval || cfg.CheckpointRetain != want.CheckpointRetain ||
		cfg.MaxFrameSize != want.MaxFrameSize || cfg.ShadowDuration != want.ShadowDuration {
		t.Fatalf("config %+v", cfg)
	}
	if strings.Join(cfg.WALOperations, "|") != "a|b|c" {
		t.Fatalf("wal operations %q", cfg.WALOperations)
	}
	if strings.Join(cfg.Command, " ") != "agent --x y" || format != "json" {
		t.Fatalf("command %q format %q", cfg.Command, format)
	}
}
