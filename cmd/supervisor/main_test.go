package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/supervisor"
)

// runCLI runs the command line as main does (dispatch, report, exitCode)
// with the given environment, and returns what a user would see.
func runCLI(t *testing.T, environ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := env{stdout: &out, stderr: &errb, lookupEnv: func(k string) (string, bool) { v, ok := environ[k]; return v, ok }}
	err := dispatch(t.Context(), args, e)
	report(&errb, err)
	return exitCode(err), out.String(), errb.String()
}

// dataDirWithCheckpoint makes a data directory holding one checkpoint.
func dataDirWithCheckpoint(t *testing.T) (dir, id string) {
	t.Helper()
	dir = t.TempDir()
	st, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := msgpack.Marshal(map[string]any{"notes": []string{"a"}})
	m, err := st.Save(data, 0)
	if err != nil {
		t.Fatal(err)
	}
	return dir, m.ID
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"help"}, {"run", "--help"}, {"checkpoints", "--help"}, {"checkpoints", "list", "--help"},
		{"checkpoints", "show", "--help"}, {"restore", "--help"}, {"status", "--help"}, {"status", "-h"},
		{"wal", "--help"}, {"wal", "dump", "--help"}, {"audit", "--help"}, {"version", "--help"}, {"version"},
	} {
		code, out, errOut := runCLI(t, nil, args...)
		if code != exitOK || out == "" || errOut != "" {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want 0, help on stdout, nothing on stderr", args, code, len(out), errOut)
		}
	}
}

// The help names each flag's value and environment variable.
func TestRunHelpShowsFlagsAndTheirVariables(t *testing.T) {
	_, out, _ := runCLI(t, nil, "run", "--help")
	for _, want := range []string{"--heartbeat-timeout D  $SUPERVISOR_HEARTBEAT_TIMEOUT", "--data-dir DIR  $SUPERVISOR_DATA_DIR",
		"--http-addr ADDR  $SUPERVISOR_HTTP_ADDR", "--stdio  $SUPERVISOR_STDIO", "--max-frame-size BYTES", "(default 5s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("run --help lacks %q", want)
		}
	}
	if _, out, _ := runCLI(t, nil, "status", "--help"); !strings.Contains(out, "--data-dir DIR  $SUPERVISOR_DATA_DIR") || strings.Contains(out, "SUPERVISOR_JSON") {
		t.Errorf("status --help: only --data-dir comes from the environment:\n%s", out)
	}
}

// Every trap an operator met in their first hour, by what they typed.
func TestCLITraps(t *testing.T) {
	dir, id := dataDirWithCheckpoint(t)
	missing := filepath.Join(t.TempDir(), "nowhere")
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want []string // in stderr (or stdout when code is 0)
		not  []string // absent from stderr
	}{
		// Flags and the positional argument in any order.
		{name: "show: flags before the ID", args: []string{"checkpoints", "show", "--data-dir", dir, id}, want: []string{"verified:     yes"}},
		{name: "show: flags after the ID", args: []string{"checkpoints", "show", id, "--data-dir", dir}, want: []string{"verified:     yes"}},
		{name: "show: flags around the ID", args: []string{"checkpoints", "show", "--json", id, "--data-dir=" + dir}, want: []string{`"verified": true`}},
		{name: "list: flags in any order", args: []string{"checkpoints", "list", "--json", "--data-dir", dir}, want: []string{id}},
		{name: "restore: the ID without --checkpoint", args: []string{"restore", "--data-dir", dir, id}, code: 2, want: []string{"give the checkpoint with --checkpoint " + id}},
		// Extra arguments are an error, not ignored.
		{name: "status: extra argument", args: []string{"status", "extra", "--data-dir", dir}, code: 2, want: []string{`unexpected argument "extra"`}},
		{name: "show: two IDs", args: []string{"checkpoints", "show", id, id, "--data-dir", dir}, code: 2, want: []string{"unexpected argument"}},
		{name: "wal dump: extra argument", args: []string{"wal", "dump", "--data-dir", dir, "5"}, code: 2, want: []string{`unexpected argument "5"`}},
		{name: "audit: extra argument", args: []string{"audit", "x"}, code: 2, want: []string{`unexpected argument "x"`}},
		{name: "version: extra argument", args: []string{"version", "x"}, code: 2, want: []string{`unexpected argument "x"`}},
		{name: "run: agent without --", args: []string{"run", "--data-dir", dir, "./my-agent", "--model", "small"}, code: 2,
			want: []string{`unexpected argument "./my-agent": the agent command goes after --`, "-- ./my-agent --model small"}},
		// The suggestion starts at the agent command, not at a flag's value
		// that reads the same.
		{name: "run: agent without --, a flag value equal to it", args: []string{"run", "--wal-operations", "python3", "python3", "agent.py"}, code: 2,
			want: []string{`unexpected argument "python3"`, "supervisor run [flags] -- python3 agent.py\n"}, not: []string{"-- python3 python3"}},
		// Unknown words are named.
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, want: []string{`unknown command "frobnicate"`, "supervisor --help"}},
		{name: "unknown checkpoints subcommand", args: []string{"checkpoints", "lst"}, code: 2, want: []string{`unknown subcommand "lst"`}},
		{name: "unknown wal subcommand", args: []string{"wal", "dmp"}, code: 2, want: []string{`unknown subcommand "dmp"`}},
		{name: "missing subcommand", args: []string{"checkpoints"}, code: 2, want: []string{"missing subcommand: list or show"}, not: []string{"Usage"}},
		// A bad flag: one line and a hint, not the whole usage.
		{name: "unknown flag", args: []string{"run", "--no-such-flag"}, code: 2,
			want: []string{"supervisor run: unknown flag --no-such-flag\nRun 'supervisor run --help' for usage.\n"}, not: []string{"--heartbeat-timeout", "Usage"}},
		{name: "unknown flag of a subcommand", args: []string{"checkpoints", "list", "--jsn"}, code: 2,
			want: []string{"supervisor checkpoints list: unknown flag --jsn\nRun 'supervisor checkpoints list --help' for usage.\n"}},
		{name: "flag without its value", args: []string{"wal", "dump", "--from"}, code: 2, want: []string{"--from needs a value"}},
		// Durations need units.
		{name: "duration without unit", args: []string{"run", "--heartbeat-timeout", "5", "--", "true"}, code: 2,
			want: []string{`invalid value "5" for --heartbeat-timeout`, "use a unit, e.g. 5s"}, not: []string{"---"}},
		{name: "duration nonsense", args: []string{"audit", "--since", "yesterday"}, code: 2, want: []string{"not a duration: use e.g. 500ms, 5s"}},
		{name: "duration from the environment without unit", args: []string{"run", "--", "true"}, env: map[string]string{"SUPERVISOR_KILL_TIMEOUT": "5"}, code: 2,
			want: []string{`environment variable SUPERVISOR_KILL_TIMEOUT="5" (for --kill-timeout)`, "use a unit, e.g. 5s"}},
		{name: "bad boolean from the environment", args: []string{"run", "--", "true"}, env: map[string]string{"SUPERVISOR_STDIO": "maybe"}, code: 2,
			want: []string{`SUPERVISOR_STDIO="maybe"`}},
		// run -- with nothing after it.
		{name: "run --", args: []string{"run", "--data-dir", missing, "--"}, code: 2, want: []string{"nothing after --"}},
		// Other usage errors.
		{name: "bad restart policy", args: []string{"run", "--restart", "sometimes", "--", "true"}, code: 2, want: []string{"restart policy"}},
		{name: "bad log format", args: []string{"run", "--log-format", "xml", "--", "true"}, code: 2, want: []string{"--log-format"}},
		{name: "negative max restarts", args: []string{"run", "--max-restarts", "-1", "--", "true"}, code: 2, want: []string{"--max-restarts"}},
		{name: "NaN threshold", args: []string{"run", "--evolution-max-latency-increase", "NaN", "--", "true"}, code: 2, want: []string{"--evolution-max-latency-increase is NaN"}},
		{name: "tiny segments", args: []string{"run", "--wal-segment-size", "10", "--", "true"}, code: 2, want: []string{"--wal-segment-size"}},
		{name: "show without ID", args: []string{"checkpoints", "show", "--data-dir", dir}, code: 2, want: []string{"missing checkpoint ID"}},
		{name: "show a path", args: []string{"checkpoints", "show", "../../etc/passwd"}, code: 2, want: []string{"not a checkpoint id"}},
		{name: "restore without ID", args: []string{"restore"}, code: 2, want: []string{"--checkpoint ID is required"}},
		{name: "no command", args: nil, code: 2, want: []string{"Usage"}},
		// Errors said once, with what to do.
		{name: "status of a missing data dir", args: []string{"status", "--data-dir", missing}, code: 1,
			want: []string{"supervisor status: no data directory at " + missing + " (has a supervisor run with this --data-dir?"}},
		{name: "wal dump of a missing data dir", args: []string{"wal", "dump", "--data-dir", missing}, code: 1,
			want: []string{"supervisor wal dump: no data directory at " + missing}},
		{name: "data dir from the environment", args: []string{"status"}, env: map[string]string{"SUPERVISOR_DATA_DIR": missing}, code: 1,
			want: []string{"no data directory at " + missing}},
		{name: "a flag beats the environment", args: []string{"checkpoints", "list", "--data-dir", dir}, env: map[string]string{"SUPERVISOR_DATA_DIR": missing},
			want: []string{id}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, c.env, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, out, errOut)
			}
			seen := errOut
			if c.code == 0 {
				seen = out
			}
			for _, w := range c.want {
				if !strings.Contains(seen, w) {
					t.Errorf("output lacks %q:\n%s", w, seen)
				}
			}
			for _, n := range c.not {
				if strings.Contains(errOut, n) {
					t.Errorf("stderr has %q:\n%s", n, errOut)
				}
			}
			if c.code != 0 && c.code != exitUsage && strings.Count(errOut, "\n") != 1 {
				t.Errorf("want the error on exactly one line:\n%s", errOut)
			}
		})
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("a command created the missing data directory")
	}
}

func TestRunFlagsFillConfig(t *testing.T) {
	cfg, format, err := parseRun(env{}, []string{
		"--data-dir", "/d", "--http-addr", "", "--stdio=false", "--heartbeat-timeout", "2s", "--start-timeout", "3s",
		"--kill-timeout", "4s", "--restart", "on-failure", "--backoff-initial", "5ms", "--backoff-max", "6s",
		"--max-restarts", "0", "--restart-window", "7m", "--shutdown-timeout", "8s", "--wal-sync", "always",
		"--wal-sync-interval", "9ms", "--wal-operations", "a, b,,c", "--checkpoint-retain", "3",
		"--max-frame-size", "2048", "--shadow-duration", "1s", "--log-format", "json", "--", "agent", "--x", "y",
	})
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

// Every flag of run can come from SUPERVISOR_<FLAG>; the command line wins;
// an empty variable is a value (SUPERVISOR_HTTP_ADDR= disables HTTP).
func TestRunFlagsFromTheEnvironment(t *testing.T) {
	environ := map[string]string{
		"SUPERVISOR_DATA_DIR": "/from-env", "SUPERVISOR_HEARTBEAT_TIMEOUT": "2s", "SUPERVISOR_KILL_TIMEOUT": "9s",
		"SUPERVISOR_HTTP_ADDR": "", "SUPERVISOR_STDIO": "false", "SUPERVISOR_RESTART": "never",
		"SUPERVISOR_WAL_OPERATIONS": "x,y", "SUPERVISOR_LOG_FORMAT": "json", "SUPERVISOR_MAX_RESTARTS": "0",
	}
	e := env{lookupEnv: func(k string) (string, bool) { v, ok := environ[k]; return v, ok }}
	cfg, format, err := parseRun(e, []string{"--kill-timeout", "1s", "--", "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/from-env" || cfg.HeartbeatTimeout != 2*time.Second || cfg.HTTPAddr != "" || cfg.Stdio ||
		cfg.Restart != supervisor.RestartNever || strings.Join(cfg.WALOperations, ",") != "x,y" || format != "json" || cfg.MaxRestarts != 0 {
		t.Fatalf("environment not applied: %+v format %q", cfg, format)
	}
	if cfg.KillTimeout != time.Second {
		t.Fatalf("--kill-timeout %s: the command line must beat SUPERVISOR_KILL_TIMEOUT", cfg.KillTimeout)
	}
	// Every run flag has its variable.
	f, _, _, _ := runFlags(e, &cfg)
	for _, name := range []string{"heartbeat-timeout", "wal-sync-interval", "evolution-min-reports", "log-format", "stdio"} {
		if f.Lookup(name) == nil || !f.fromEnv(name) {
			t.Errorf("--%s cannot come from %s", name, envName(name))
		}
	}
}

func TestWithoutAgentCommandRunsTheDemo(t *testing.T) {
	cfg, _, err := parseRun(env{}, []string{"--data-dir", "d"})
	if err != nil || len(cfg.Command) != 0 {
		t.Fatalf("run without --: command %q, err %v; want none (the demo agent)", cfg.Command, err)
	}
}

// The run command itself: a failed start says why, exits 2, logs its end
// and leaves no data directory.
func TestRunFailedStartLeavesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	var out, errb bytes.Buffer
	c := &runCmd{env: env{stdout: &out, stderr: &errb}}
	err := c.Run(context.Background(), []string{"--data-dir", dir, "--http-addr", "", "--", "/nonexistent/agent"})
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), `cannot run the agent command "/nonexistent/agent"`) {
		t.Fatalf("err %v (exit %d), want a configuration error naming the agent", err, exitCode(err))
	}
	if !strings.Contains(errb.String(), `msg="supervisor stopped" exit_code=2`) {
		t.Errorf("no final log line with the exit code:\n%s", errb.String())
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("the failed start created the data directory")
	}
}
