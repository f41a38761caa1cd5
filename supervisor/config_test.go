package supervisor

import (
	"errors"
	"fmt"
	"testing"
)

// --wal-sync is parsed by wal.ParseSyncPolicy alone: Validate accepts what
// the WAL is opened with, and a bad value reads the same wherever it is
// caught (Validate, or opening the WAL with a Config that skipped it).
func TestWALSyncParsedOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Command = t.TempDir(), []string{"/bin/true"}
	for _, name := range []string{"always", "batch", "none"} {
		cfg.WALSync = name
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate with --wal-sync %s: %v", name, err)
		}
		if p, err := cfg.walSyncPolicy(); err != nil || p.String() != name {
			t.Errorf("--wal-sync %s opens the WAL with %v, %v", name, p, err)
		}
	}
	for _, name := range []string{"", "Always", "fsync"} {
		cfg.WALSync = name
		want := fmt.Sprintf("configuration error: --wal-sync must be always, batch or none, got %q", name)
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || err.Error() != want {
			t.Errorf("Validate with --wal-sync %q = %v, want %q", name, err, want)
		}
		if _, err := cfg.walSyncPolicy(); !errors.Is(err, ErrConfig) || err.Error() != want {
			t.Errorf("opening the WAL with --wal-sync %q = %v, want %q", name, err, want)
		}
	}
}
