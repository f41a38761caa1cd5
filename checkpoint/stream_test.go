package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestSaveStreamRoundTrip(t *testing.T) {
	s := openStore(t, Options{})
	data := bytes.Repeat([]byte("state of the agent "), 300_000) // 5.7 MB
	m, err := s.SaveStream(42, func(w io.Writer) error {
		for b := data; len(b) > 0; b = b[min(len(b), 4096):] {
			if _, err := w.Write(b[:min(len(b), 4096)]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, gotData, err := s.Load(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotData, data) || got.Size != int64(len(data)) || got.Watermark != 42 || got.Checksum != m.Checksum {
		t.Fatalf("loaded %+v (%d bytes), saved %+v", got, len(gotData), m)
	}
}

func TestSaveStreamAbortLeavesNothing(t *testing.T) {
	s := openStore(t, Options{MaxSize: 1 << 20})
	boom := errors.New("payload error")
	if _, err := s.SaveStream(1, func(w io.Writer) error {
		w.Write([]byte("partial"))
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the fill error", err)
	}
	if _, err := s.SaveStream(1, func(w io.Writer) error {
		_, err := w.Write(make([]byte, 2<<20))
		return err
	}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over MaxSize: got %v", err)
	}
	des, _ := os.ReadDir(s.dir)
	if len(des) != 0 {
		t.Fatalf("store holds %d files after aborted saves", len(des))
	}
}

// A checkpoint file that is a symlink is never read through.
func TestSymlinkedCheckpointRefused(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, []byte{0x80}, 1)
	elsewhere := filepath.Join(t.TempDir(), "planted")
	if err := os.Rename(ckptPath(s, m.ID), elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, ckptPath(s, m.ID)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(m.ID); err == nil {
		t.Fatal("a symlinked checkpoint was loaded")
	}
	if _, _, _, err := s.Latest(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Latest served a symlinked checkpoint: %v", err)
	}
}

// A checkpoint owned by another user is never served as the agent's state.
func TestForeignOwnedCheckpointRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file to another user")
	}
	s := openStore(t, Options{})
	good := save(t, s, []byte{0x81, 0xa1, 'a', 0x01}, 1)
	planted := save(t, s, []byte{0x81, 0xa1, 'a', 0x02}, 2)
	if err := os.Chown(ckptPath(s, planted.ID), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	m, _, skipped, err := s.Latest()
	if err != nil || m.ID != good.ID || len(skipped) != 1 || !errors.Is(skipped[0].Err, ErrCorrupt) {
		t.Fatalf("Latest = %s, skipped %v, err %v; want %s with the planted one skipped", m.ID, skipped, err, good.ID)
	}
}
