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
