package main

import (
	"strings"
	"testing"
)

// --request-timeout 0 (and retention, max attempts, journal bytes) said
// nothing and ran with the default (10m, 10m, 3, 64 MiB), although each
// one's error asks for a positive value: an operator who meant "no
// timeout" or "never retry" got neither. A 0 given on the command line or
// in the environment is now a usage error (exit 2) naming the flag.
func TestZeroRequestFlagsAreRefused(t *testing.T) {
	for _, c := range []struct{ flag, value, want string }{
		{"request-timeout", "0", "--request-timeout must be a positive duration, got 0s"},
		{"request-timeout", "0s", "--request-timeout must be a positive duration, got 0s"},
		{"request-retention", "0ms", "--request-retention must be a positive duration, got 0s"},
		{"request-max-attempts", "0", "--request-max-attempts must be at least 1, got 0"},
		{"request-journal-bytes", "0", "--request-journal-bytes must be at least 4096, got 0"},
	} {
		code, _, stderr := runCLI(t, nil, "run", "--data-dir", t.TempDir(), "--http-addr", "", "--restart", "never", "--"+c.flag, c.value, "--", "/bin/true")
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("--%s %s: exit %d, stderr %q; want exit %d saying %q", c.flag, c.value, code, stderr, exitUsage, c.want)
		}
		env := map[string]string{envName(c.flag): c.value}
		code, _, stderr = runCLI(t, env, "run", "--data-dir", t.TempDir(), "--http-addr", "", "--restart", "never", "--", "/bin/true")
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%s=%s: exit %d, stderr %q; want exit %d saying %q", envName(c.flag), c.value, code, stderr, exitUsage, c.want)
		}
	}
	// Left out, they are the defaults, and /bin/true runs.
	if code, _, stderr := runCLI(t, nil, "run", "--data-dir", t.TempDir(), "--http-addr", "", "--restart", "never", "--", "/bin/true"); code == exitUsage {
		t.Fatalf("run with the defaults: exit %d %s", code, stderr)
	}
}
