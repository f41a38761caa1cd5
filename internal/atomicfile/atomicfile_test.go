package atomicfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func readDirNames(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	for _, content := range []string{"old", "new and longer", "n"} {
		if err := WriteFile(dir, "f", []byte(content)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != content {
			t.Fatalf("file holds %q, %v; want %q", b, err, content)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if names := readDirNames(t, dir); !slices.Equal(names, []string{"f"}) {
		t.Errorf("directory holds %v, want only f", names)
	}
}

// Write hands the writer a file it may seek in, and returns the final size.
func TestWriteReturnsSize(t *testing.T) {
	dir := t.TempDir()
	size, err := Write(dir, "f", func(f *os.File) error {
		if _, err := f.WriteAt([]byte("head"), 0); err != nil {
			return err
		}
		_, err := f.WriteAt([]byte("tail"), 10)
		return err
	})
	if err != nil || size != 14 {
		t.Fatalf("Write = %d, %v; want 14", size, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); !bytes.Equal(b, []byte("head\x00\x00\x00\x00\x00\x00tail")) {
		t.Fatalf("file holds %q", b)
	}
}

// A failing writer leaves the target as it was and no temporary file, and
// its error comes back as it is.
func TestWriteFailureKeepsOldContent(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(dir, "f", []byte("old")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	_, err := Write(dir, "f", func(f *os.File) error {
		f.Write([]byte("partial"))
		return boom
	})
	if err != boom {
		t.Fatalf("Write = %v, want %v as it is", err, boom)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "old" {
		t.Fatalf("file holds %q after a failed write, want old", b)
	}
	if names := readDirNames(t, dir); !slices.Equal(names, []string{"f"}) {
		t.Errorf("directory holds %v after a failed write, want only f", names)
	}
}

// A symlink planted as the target is replaced, never written through.
func TestWriteReplacesASymlinkNotItsTarget(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(dir, "f", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the symlink's target was changed to %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dir, "f"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("f is %v, %v; want a regular file", fi, err)
	}
}

// A failed directory fsync comes after the rename: the new content is in
// place, the error says so through ErrNotDurable and reads as its cause.
func TestDirectoryFsyncFailureIsNotDurable(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(dir, "f", []byte("old")); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("input/output error")
	fsyncDir = func(*os.File) error { return eio }
	t.Cleanup(func() { fsyncDir = (*os.File).Sync })

	err := WriteFile(dir, "f", []byte("new"))
	if !errors.Is(err, ErrNotDurable) || !errors.Is(err, eio) {
		t.Fatalf("WriteFile = %v, want ErrNotDurable wrapping %v", err, eio)
	}
	if want := "fsync directory " + dir + ": input/output error"; err.Error() != want {
		t.Errorf("error reads %q, want %q", err, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "new" {
		t.Errorf("file holds %q, want new (renamed before the fsync failed)", b)
	}
	if names := readDirNames(t, dir); !slices.Equal(names, []string{"f"}) {
		t.Errorf("directory holds %v, want only f", names)
	}
	// An error before the rename is not ErrNotDurable.
	if _, err := Write(dir, "f", func(*os.File) error { return eio }); errors.Is(err, ErrNotDurable) {
		t.Errorf("a failed write is reported as ErrNotDurable: %v", err)
	}
}

func TestSyncDirNamesTheDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	if err := SyncDir(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("SyncDir(missing) = %v, want ErrNotExist", err)
	}
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(dir, "f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir, "f"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("f still there: %v", err)
	}
	if err := Remove(dir, "f"); err != nil {
		t.Fatalf("removing a file already gone = %v, want nil", err)
	}
}

// Sweep removes what a crash left, never a file a live writer holds, and
// only temporary files (of the target named, when one is).
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	plant := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plant("a.123.tmp")
	plant("b.456.tmp")
	plant("a")
	plant("notes.txt")
	if err := os.Mkdir(filepath.Join(dir, "d.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}

	// A writer in the middle of its write holds its temporary file.
	writing, release := make(chan string), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := Write(dir, "a", func(f *os.File) error {
			f.Write([]byte("new"))
			writing <- filepath.Base(f.Name())
			<-release
			return nil
		})
		done <- err
	}()
	live := <-writing

	removed, err := Sweep(dir, "a")
	if err != nil || !slices.Equal(removed, []string{"a.123.tmp"}) {
		t.Fatalf("Sweep(dir, a) = %v, %v; want [a.123.tmp]", removed, err)
	}
	removed, err = Sweep(dir, "")
	if err != nil || !slices.Equal(removed, []string{"b.456.tmp"}) {
		t.Fatalf("Sweep(dir, \"\") = %v, %v; want [b.456.tmp]", removed, err)
	}
	if _, err := os.Stat(filepath.Join(dir, live)); err != nil {
		t.Fatalf("Sweep removed %s, which a live writer holds: %v", live, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the write a sweep ran beside failed: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a")); string(b) != "new" {
		t.Fatalf("a holds %q, want new", b)
	}
	names := readDirNames(t, dir)
	if !slices.Equal(names, []string{"a", "d.tmp", "notes.txt"}) {
		t.Fatalf("directory holds %v, want a, d.tmp, notes.txt", names)
	}
	for _, n := range names {
		if strings.HasSuffix(n, TempSuffix) && n != "d.tmp" {
			t.Errorf("temporary file %s left", n)
		}
	}
}

func TestReadLimited(t *testing.T) {
	dir := t.TempDir()
	small, big, link := filepath.Join(dir, "small"), filepath.Join(dir, "big"), filepath.Join(dir, "link")
	if err := os.WriteFile(small, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, make([]byte, 11), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(small, link); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadLimited(small, 10); err != nil || string(b) != "0123456789" {
		t.Fatalf("a file of exactly the limit: %q, %v", b, err)
	}
	if _, err := ReadLimited(big, 10); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a file over the limit: %v, want ErrTooLarge", err)
	}
	if _, err := ReadLimited(link, 10); err == nil {
		t.Fatal("a symlink was read through")
	}
}

// MkdirAll fsyncs the parent of every directory it creates, and the leaf's
// parent even when the leaf existed: a new directory is durable only once
// its parent is fsynced (SPEC §4).
func TestMkdirAllFsyncsParents(t *testing.T) {
	base := t.TempDir()
	var synced []string
	defer SetSyncHook(func(dir string) error { synced = append(synced, dir); return nil })()

	leaf := filepath.Join(base, "a", "b", "c")
	if err := MkdirAll(leaf, 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(leaf); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("leaf: %v, %v", fi, err)
	}
	for _, p := range []string{base, filepath.Join(base, "a"), filepath.Join(base, "a", "b")} {
		if !slices.Contains(synced, p) {
			t.Errorf("parent %s not fsynced; fsynced: %v", p, synced)
		}
	}
	synced = nil
	if err := MkdirAll(leaf, 0o700); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(synced, []string{filepath.Join(base, "a", "b")}) {
		t.Errorf("existing leaf: fsynced %v, want only its parent", synced)
	}

	// A failed fsync fails MkdirAll (the directory exists but is not durable).
	eio := errors.New("input/output error")
	SetSyncHook(func(string) error { return eio })
	if err := MkdirAll(filepath.Join(base, "d"), 0o700); !errors.Is(err, eio) {
		t.Fatalf("MkdirAll with a failing fsync = %v, want %v", err, eio)
	}
	// A file in the way.
	SetSyncHook(func(string) error { return nil })
	if err := os.WriteFile(filepath.Join(base, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(filepath.Join(base, "f", "g"), 0o700); err == nil {
		t.Fatal("MkdirAll through a file succeeded")
	}
}

// Removing a file that is already gone still fsyncs the directory: an
// earlier Remove may have unlinked it and failed its fsync.
func TestRemoveOfAGoneFileStillFsyncs(t *testing.T) {
	dir := t.TempDir()
	eio := errors.New("input/output error")
	defer SetSyncHook(func(string) error { return eio })()
	if err := Remove(dir, "gone"); !errors.Is(err, eio) {
		t.Fatalf("Remove of a gone file with a failing directory fsync = %v, want %v", err, eio)
	}
}
