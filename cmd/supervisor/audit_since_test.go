package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `audit --since -5m` (a sign typed by mistake) is a usage error, not
// silently the whole audit log as if no --since were given.
func TestAuditRefusesNegativeSince(t *testing.T) {
	dir := t.TempDir()
	rec := `{"id":"0c7f6a3e-8a5d-4a53-9a0f-3c2f9f5f2a10","time":"2020-01-01T00:00:00Z","kind":"supervisor_started","fields":{}}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "audit.jsonl"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, nil, "audit", "--data-dir", dir, "--since", "-5m")
	if code != exitUsage || strings.Contains(out, "supervisor_started") {
		t.Errorf("audit --since -5m: exit %d, printed %q (stderr %q); want exit 2 and nothing printed", code, out, errOut)
	}
}
