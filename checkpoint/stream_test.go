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

func TestLoadCompressed(t *testing.T) {
	s := openStore(t, Options{})
	data := append([]byte{0x81, 0xa1, 'a', 0xc6, 0, 1, 0, 0}, bytes.Repeat([]byte("state "), 1<<16/6+1)[:1<<16]...)
	sized, err := s.SaveStreamSized(3, int64(len(data)), func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatal(err)
	}
	m, z, err := s.LoadCompressed(sized.ID)
	if err != nil || m.ID != sized.ID {
		t.Fatalf("LoadCompressed: %v", err)
	}
	got, err := decompress(bytes.NewReader(z), uint64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the frame holds %x (%v), want %x", got, err, data)
	}
	// A wrong size is refused before anything is stored.
	if _, err := s.SaveStreamSized(3, 99, func(w io.Writer) error { _, err := w.Write(data); return err }); err == nil {
		t.Fatal("SaveStreamSized stored a checkpoint of the wrong size")
	}
	// A frame without its content size cannot be sent as is.
	unsized, err := s.SaveStream(4, func(w io.Writer) error { _, err := w.Write(data); return err })
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LoadCompressed(unsized.ID); !errors.Is(err, ErrNoContentSize) {
		t.Fatalf("unsized frame: %v", err)
	}
	if _, _, _, err := s.LatestCompressed(); !errors.Is(err, ErrNoContentSize) {
		t.Fatalf("LatestCompressed with an unsized newest: %v", err)
	}
	// What Save stores is sent as is too.
	saved := save(t, s, data, 5)
	if _, z, err := s.LoadCompressed(saved.ID); err != nil || len(z) == 0 {
		t.Fatalf("LoadCompressed of a Save: %v", err)
	}
	// A damaged body is corrupt, as with Load.
	editFile(t, ckptPath(s, sized.ID), func(b []byte) []byte { b[len(b)-6] ^= 0xff; return b })
	if _, _, err := s.LoadCompressed(sized.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged: %v", err)
	}
}
