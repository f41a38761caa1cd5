package main

import (
	"strings"
	"testing"
	"time"
)

// --replica and its companions come from SUPERVISOR_REPLICA… like every run
// flag; a bad URL or a companion without --replica is a usage error (exit 2)
// before anything is created.
func TestReplicaFlags(t *testing.T) {
	environ := map[string]string{
		"SUPERVISOR_REPLICA": "s3://bucket/agents/a", "SUPERVISOR_REPLICA_ENDPOINT": "http://127.0.0.1:9000",
		"SUPERVISOR_REPLICA_REGION": "eu-west-1", "SUPERVISOR_REPLICA_SYNC_INTERVAL": "250ms",
	}
	e := env{lookupEnv: func(k string) (string, bool) { v, ok := environ[k]; return v, ok }}
	cfg, _, err := parseRun(e, []string{"--", "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replica != "s3://bucket/agents/a" || cfg.ReplicaEndpoint != "http://127.0.0.1:9000" || cfg.ReplicaRegion != "eu-west-1" ||
		cfg.ReplicaSyncInterval != 250*time.Millisecond {
		t.Fatalf("replica flags from the environment: %+v", cfg)
	}
	dir := t.TempDir() + "/data"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replica", "http://bucket/x"}, "not s3://BUCKET/PREFIX"},
		{[]string{"--replica-endpoint", "http://127.0.0.1:9000"}, "need --replica"},
		{[]string{"--replica", "s3://b/p", "--replica-endpoint", "ftp://x"}, "--replica-endpoint"},
		{[]string{"--replica", "s3://b/p", "--replica-sync-interval", "0s"}, "--replica-sync-interval"},
	} {
		args := append([]string{"run", "--data-dir", dir, "--http-addr", ""}, tc.args...)
		code, _, errOut := runCLI(t, nil, append(args, "--", "/bin/true")...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	for _, args := range [][]string{{"replica", "--help"}, {"replica", "restore", "--help"}, {"replica", "list", "--help"}} {
		if code, out, _ := runCLI(t, nil, args...); code != exitOK || !strings.Contains(out, "--replica") {
			t.Errorf("%v: exit %d\n%s", args, code, out)
		}
	}
	if code, _, errOut := runCLI(t, nil, "replica", "list"); code != exitUsage || !strings.Contains(errOut, "--replica s3://BUCKET/PREFIX is required") {
		t.Errorf("replica list without --replica: exit %d %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, nil, "replica", "restore", "--replica", "s3://b/p", "--to-sequence", "5", "--to-time", "2026-01-01T00:00:00Z"); code != exitUsage || !strings.Contains(errOut, "exclusive") {
		t.Errorf("both points: exit %d %q", code, errOut)
	}
}
