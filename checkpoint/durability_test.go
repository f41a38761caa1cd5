package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// failDirSyncs makes the next n directory fsyncs in dir fail with EIO-like
// err (n < 0: all), recording every directory fsynced.
type dirSyncs struct {
	mu     sync.Mutex
	dir    string
	err    error
	n      int
	synced []string
}

func (d *dirSyncs) hook(dir string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.synced = append(d.synced, dir)
	if d.err != nil && dir == d.dir && d.n != 0 {
		d.n--
		return d.err
	}
	return nil
}

// Open creates the store's directory durably: its parent is fsynced.
func TestOpenFsyncsTheParentOfANewStore(t *testing.T) {
	d := &dirSyncs{}
	defer atomicfile.SetSyncHook(d.hook)()
	parent := filepath.Join(t.TempDir(), "data")
	if _, err := Open(filepath.Join(parent, "checkpoints"), Options{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(d.synced, parent) || !slices.Contains(d.synced, filepath.Dir(parent)) {
		t.Fatalf("fsynced %v; want %s and its parent (both created)", d.synced, parent)
	}
}

// A Save whose directory fsync fails (after the rename) fails, and leaves no
// checkpoint a restore would pick up: the supervisor answers
// CHECKPOINT_FAILED, and nothing may later restore from it as if it had been
// acknowledged (SPEC §4).
func TestSaveWithAFailedDirectoryFsyncLeavesNothing(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "Save", true: "SaveStreamSized"}[stream], func(t *testing.T) {
			s := openStore(t, Options{})
			good := save(t, s, []byte("good"), 10)
			eio := errors.New("input/output error")
			d := &dirSyncs{dir: s.dir, err: eio, n: 1}
			defer atomicfile.SetSyncHook(d.hook)()

			var err error
			if stream {
				_, err = s.SaveStreamSized(20, 3, func(w io.Writer) error { _, err := w.Write([]byte("new")); return err })
			} else {
				_, err = s.Save([]byte("new"), 20)
			}
			if !errors.Is(err, eio) {
				t.Fatalf("save with a failing directory fsync = %v, want %v", err, eio)
			}
			m, data, _, err := s.Latest()
			if err != nil || m.ID != good.ID || !bytes.Equal(data, []byte("good")) {
				t.Fatalf("Latest after the failed save = %s %q %v, want the earlier checkpoint %s", m.ID, data, err, good.ID)
			}
			if ms, _ := s.List(); len(ms) != 1 {
				t.Fatalf("List after the failed save: %+v, want only the earlier checkpoint", ms)
			}
			// The next save works and is newer.
			if m := save(t, s, []byte("next"), 30); m.ID <= good.ID {
				t.Fatalf("next id %s not above %s", m.ID, good.ID)
			}
		})
	}
}

// The markers (pin, bad mark, restore point) fail when their directory
// fsync fails, so the operation is never reported as done.
func TestMarkersFailWithTheirFsync(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, []byte("x"), 1)
	eio := errors.New("input/output error")
	d := &dirSyncs{dir: s.dir, err: eio, n: -1}
	defer atomicfile.SetSyncHook(d.hook)()
	for name, op := range map[string]func() error{
		"Pin":             func() error { return s.Pin(m.ID) },
		"Unpin":           func() error { return s.Unpin(m.ID) },
		"MarkBad":         func() error { return s.MarkBad(m.ID, "test") },
		"SetRestorePoint": func() error { return s.SetRestorePoint(m.ID, false) },
	} {
		if err := op(); !errors.Is(err, eio) {
			t.Errorf("%s with a failing directory fsync = %v, want %v", name, err, eio)
		}
	}
	if _, err := os.Stat(s.dir); err != nil {
		t.Fatal(err)
	}
}

// A Save whose file fsync fails fails before the rename: nothing visible.
func TestSaveWithAFailedFileFsyncLeavesNothing(t *testing.T) {
	s := openStore(t, Options{})
	good := save(t, s, []byte("good"), 10)
	eio := errors.New("input/output error")
	defer atomicfile.SetSyncHook(func(path string) error {
		if filepath.Ext(path) == ckptSuffix {
			return eio
		}
		return nil
	})()
	if _, err := s.Save([]byte("new"), 20); !errors.Is(err, eio) {
		t.Fatalf("Save with a failing file fsync = %v, want %v", err, eio)
	}
	if m, _, _, err := s.Latest(); err != nil || m.ID != good.ID {
		t.Fatalf("Latest = %s, %v; want %s", m.ID, err, good.ID)
	}
	des, _ := os.ReadDir(s.dir)
	for _, de := range des {
		if de.Name() != fileName(good.ID) {
			t.Errorf("left behind: %s", de.Name())
		}
	}
}

// Prune's removals — a checkpoint retention lets go, a marker whose
// checkpoint is gone — are fsynced in their directory, and a failed fsync
// is Prune's error (the caller must not go on as if they were durable).
func TestPruneFsyncsItsRemovals(t *testing.T) {
	eio := errors.New("input/output error")
	orphan := "01000000-0000-7000-8000-000000000001"
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *Store) (wantRemoved int)
	}{
		{"a checkpoint", func(t *testing.T, s *Store) int {
			save(t, s, []byte("old"), 1)
			save(t, s, []byte("new"), 2)
			return 1
		}},
		{"an orphan marker", func(t *testing.T, s *Store) int {
			save(t, s, []byte("only"), 1)
			if err := os.WriteFile(filepath.Join(s.dir, badName(orphan)), []byte(`{"reason":"x"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			return 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, Options{Retain: 1})
			want := tc.setup(t, s)
			d := &dirSyncs{dir: s.dir, err: eio, n: -1}
			restore := atomicfile.SetSyncHook(d.hook)
			removed, err := s.Prune()
			restore()
			if !errors.Is(err, eio) || len(removed) != want {
				t.Fatalf("Prune with failing directory fsyncs: removed %v, err %v; want %d removed and %v", removed, err, want, eio)
			}
			if !slices.Contains(d.synced, s.dir) {
				t.Fatalf("directories fsynced: %v; want %s", d.synced, s.dir)
			}
			if _, err := os.Stat(filepath.Join(s.dir, badName(orphan))); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the orphan marker: %v, want it removed", err)
			}
		})
	}
}
