package wal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// An error from a segment names the segment, never the temporary file it
// was created as (which no longer exists).
func TestErrorsNameTheSegmentNotItsTempFile(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=512k"); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (%v)", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	o := testOptions(t, filepath.Join(mnt, "wal"))
	o.Sync, o.SegmentSize, o.NoPreallocate = SyncAlways, 64<<10, true
	l := mustOpen(t, o)
	defer l.Close()
	var err error
	for s := uint64(1); s < 10000 && err == nil; s++ {
		_, err = l.Append(Entry{Sequence: s, Data: append(payload(s), make([]byte, 2000)...)})
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append on a full disk = %v, want ErrNoSpace", err)
	}
	if strings.Contains(err.Error(), tmpSuffix) {
		t.Fatalf("error names a temporary file: %v", err)
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		if _, serr := os.Stat(pe.Path); serr != nil {
			t.Fatalf("error names %s, which does not exist: %v", pe.Path, err)
		}
	}
}

// A symlink planted as the WAL's LOCK is refused, not followed.
func TestSymlinkedLockRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, lockName)); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(testOptions(t, dir)); err == nil {
		l.Close()
		t.Fatal("opened a WAL whose LOCK is a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "precious" {
		t.Fatalf("the symlink's target was changed: %q", b)
	}
}
