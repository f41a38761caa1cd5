package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// `requests cancel` with a --data-dir that does not exist (a typo) says so,
// as status, restore and requests list do — not "no supervisor is running
// ... start it, then cancel again", which sends the operator to start a
// supervisor on the mistyped path.
func TestRequestsCancelNamesAMissingDataDir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	code, _, errOut := runCLI(t, nil, "requests", "cancel", "01a22a60-e35d-7442-baf0-350fb29d3972", "--data-dir", missing)
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	if !strings.Contains(errOut, "no data directory at "+missing) || strings.Contains(errOut, "start it") {
		t.Errorf("stderr %q: want the missing data directory named, not advice to start a supervisor", errOut)
	}
}
