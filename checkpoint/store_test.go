package checkpoint

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

func TestSaveLoadRoundTrip(t *testing.T) {
	random := make([]byte, 5<<20) // incompressible, over the parallel threshold
	rand.NewChaCha8([32]byte{1}).Read(random)
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", []byte{}},
		{"one byte", []byte{0x80}},
		{"small map", []byte{0x81, 0xa1, 'a', 0x01}},
		{"1 MiB realistic", genCheckpoint(1<<20, 3)},
		{"6 MiB realistic, parallel", genCheckpoint(6<<20, 4)},
		{"5 MiB incompressible", random},
		{"at MaxSize", bytes.Repeat([]byte("x"), 8<<20)},
	}
	s := openStore(t, Options{MaxSize: 8 << 20})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wm := uint64(100 + i)
			saved := save(t, s, tt.data, wm)
			if saved.Size != int64(len(tt.data)) || saved.Watermark != wm {
				t.Errorf("Save meta = %+v, want size %d watermark %d", saved, len(tt.data), wm)
			}
			if want := "crc32c:"; !strings.HasPrefix(saved.Checksum, want) {
				t.Errorf("Checksum = %q, want prefix %q", saved.Checksum, want)
			}
			fi, err := os.Stat(ckptPath(s, saved.ID))
			if err != nil {
				t.Fatal(err)
			}
			if saved.StoredSize != fi.Size() {
				t.Errorf("StoredSize = %d, file is %d bytes", saved.StoredSize, fi.Size())
			}
			u, err := uuid.Parse(saved.ID)
			if err != nil || u.Version() != 7 || u.String() != saved.ID {
				t.Errorf("ID %q is not a canonical v7 UUID (%v)", saved.ID, err)
			}
			got, data, err := s.Load(saved.ID)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !bytes.Equal(data, tt.data) {
				t.Fatalf("Load returned %d bytes differing from the %d saved", len(data), len(tt.data))
			}
			if got != saved {
				t.Errorf("Load meta = %+v\nSave meta = %+v", got, saved)
			}
			st, err := s.Stat(strings.ToUpper(saved.ID))
			if err != nil || st != saved {
				t.Errorf("Stat = %+v, %v; want %+v", st, err, saved)
			}
		})
	}
}

func TestSaveTooLarge(t *testing.T) {
	s := openStore(t, Options{MaxSize: 1000})
	_, err := s.Save(make([]byte, 1001), 1)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Save over MaxSize: err = %v, want ErrTooLarge", err)
	}
	if ms, _ := s.List(); len(ms) != 0 {
		t.Fatalf("List after a refused Save = %v, want nothing", ms)
	}
}

func TestSaveFailureLeavesNothing(t *testing.T) {
	s := openStore(t, Options{})
	boom := errors.New("disk full")
	_, err := s.SaveStream(1, func(w io.Writer) error {
		w.Write([]byte("partial"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("SaveStream err = %v, want %v", err, boom)
	}
	if des, _ := os.ReadDir(s.dir); len(des) != 0 {
		t.Fatalf("directory holds %v after a failed write, want nothing", des)
	}
}

// TestOpenSweepsStaleTemp: a temporary file left by a crashed writer is
// removed by Open and never listed; one a live writer holds is kept.
func TestOpenSweepsStaleTemp(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, []byte{0x80}, 1)
	stale := filepath.Join(s.dir, fileName(uuid.NewString())+".123.tmp")
	if err := os.WriteFile(stale, []byte("SUPVCKPT half a checkpoint"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A Save in progress: its fill waits until the sweep is done.
	filling, release := make(chan struct{}), make(chan struct{})
	saved := make(chan error, 1)
	go func() {
		_, err := s.SaveStream(2, func(w io.Writer) error {
			w.Write([]byte{0x80})
			close(filling)
			<-release
			return nil
		})
		saved <- err
	}()
	<-filling
	live, _ := filepath.Glob(filepath.Join(s.dir, "*"+atomicfile.TempSuffix))
	if len(live) != 2 {
		t.Fatalf("temporary files %v, want the stale one and the live one", live)
	}
	if ms, err := s.List(); err != nil || len(ms) != 1 || ms[0].ID != m.ID {
		t.Fatalf("List with temporary files = %v, %v; want only %s", ms, err, m.ID)
	}

	if _, err := Open(s.dir, Options{Logger: testLogger(t)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temporary file survived Open: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(s.dir, "*"+atomicfile.TempSuffix))
	if len(left) != 1 || left[0] == stale {
		t.Errorf("temporary files after Open = %v, want the live writer's", left)
	}
	close(release)
	if err := <-saved; err != nil {
		t.Fatalf("the Save an Open swept beside failed: %v", err)
	}
	if ms, err := s.List(); err != nil || len(ms) != 2 {
		t.Fatalf("List after the Save = %v, %v; want 2 checkpoints", ms, err)
	}
}

// TestOpenWhileSaving: opening the store elsewhere (what `supervisor
// checkpoints list` does while the supervisor runs) never breaks a Save.
func TestOpenWhileSaving(t *testing.T) {
	s := openStore(t, Options{Retain: 2})
	data := cheapData(2 << 20)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := Open(s.dir, Options{}); err != nil {
				t.Errorf("Open: %v", err)
				return
			}
			if _, err := s.List(); err != nil {
				t.Errorf("List: %v", err)
				return
			}
		}
	})
	for range 10 {
		save(t, s, data, 1)
		if _, err := s.Prune(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestListOrder(t *testing.T) {
	s := openStore(t, Options{})
	var ids []string
	for i := range 5 {
		ids = append(ids, save(t, s, []byte{0x80}, uint64(i)).ID)
	}
	ms, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.ID)
	}
	slices.Reverse(ids)
	if !slices.Equal(got, ids) {
		t.Fatalf("List order = %v, want newest first %v", got, ids)
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].Created.After(ms[i-1].Created) {
			t.Errorf("List[%d] created %v after List[%d] %v", i, ms[i].Created, i-1, ms[i-1].Created)
		}
	}
}

// TestListIgnoresForeignFiles: files that are not ours are not listed, and
// survive Prune.
func TestListIgnoresForeignFiles(t *testing.T) {
	s := openStore(t, Options{Retain: 1})
	save(t, s, []byte{0x80}, 1)
	m := save(t, s, []byte{0x80}, 2)
	foreign := []string{"README", "x.ckpt", strings.ToUpper(m.ID) + ".ckpt", "../evil.ckpt.bak"}
	for _, name := range foreign[:3] {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte("hello"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(s.dir, uuid.NewString()+".ckpt"), 0o700); err != nil {
		t.Fatal(err)
	}
	ms, err := s.List()
	if err != nil || len(ms) != 2 {
		t.Fatalf("List = %v, %v; want the 2 checkpoints", ms, err)
	}
	if _, err := s.Prune(); err != nil {
		t.Fatal(err)
	}
	for _, name := range foreign[:3] {
		if _, err := os.Stat(filepath.Join(s.dir, name)); err != nil {
			t.Errorf("Prune removed foreign file %s: %v", name, err)
		}
	}
}

func TestStatReadsHeaderOnly(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, genCheckpoint(64<<10, 1), 9)
	editFile(t, ckptPath(s, m.ID), func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b })
	st, err := s.Stat(m.ID)
	if err != nil || st != m {
		t.Fatalf("Stat after body damage = %+v, %v; want %+v (header only)", st, err, m)
	}
	if _, _, err := s.Load(m.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load after body damage: err = %v, want ErrCorrupt", err)
	}
}

func TestNotFoundAndInvalidID(t *testing.T) {
	s := openStore(t, Options{})
	save(t, s, []byte{0x80}, 1)
	missing := uuid.NewString()
	ops := map[string]func(id string) error{
		"Stat":            func(id string) error { _, err := s.Stat(id); return err },
		"Load":            func(id string) error { _, _, err := s.Load(id); return err },
		"Previous":        func(id string) error { _, _, _, err := s.Previous(id); return err },
		"Pin":             s.Pin,
		"Unpin":           s.Unpin,
		"MarkBad":         func(id string) error { return s.MarkBad(id, "test") },
		"SetRestorePoint": func(id string) error { return s.SetRestorePoint(id, false) },
	}
	for name, op := range ops {
		if err := op(missing); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s(unknown id): err = %v, want ErrNotFound", name, err)
		}
		for _, bad := range []string{"", "../" + missing[3:], "/etc/passwd"} {
			if err := op(bad); !errors.Is(err, ErrInvalidID) {
				t.Errorf("%s(%q): err = %v, want ErrInvalidID", name, bad, err)
			}
		}
	}
}

func TestParseID(t *testing.T) {
	const canon = "0190a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b"
	tests := []struct {
		name, in, want string
	}{
		{"canonical", canon, canon},
		{"upper case is canonicalised", strings.ToUpper(canon), canon},
		{"nil UUID", "00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000000"},
		{"empty", "", ""},
		{"parent traversal", "../../../../etc/passwd", ""},
		{"traversal of UUID length", "../90a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b", ""},
		{"absolute path of UUID length", "/tmp/a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b", ""},
		{"slash inside", "0190a0b4-5c6d-7e8f-9a0b/1c2d3e4f5a6b", ""},
		{"braces", "{" + canon + "}", ""},
		{"urn", "urn:uuid:" + canon, ""},
		{"no hyphens", strings.ReplaceAll(canon, "-", ""), ""},
		{"trailing space", canon[:35] + " ", ""},
		{"leading space", " " + canon[1:], ""},
		{"NUL byte", canon[:35] + "\x00", ""},
		{"non-hex", "0190a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6g", ""},
		{"hyphen misplaced", "0190a0b45-c6d-7e8f-9a0b-1c2d3e4f5a6b", ""},
		{"with file suffix", canon + ".ckpt", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseID(tt.in)
			if tt.want == "" {
				if !errors.Is(err, ErrInvalidID) {
					t.Fatalf("ParseID(%q) = %q, %v; want ErrInvalidID", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseID(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestRetention(t *testing.T) {
	// Each case saves len(marks) checkpoints, oldest first, and marks them:
	// "g" good, "b" bad, "p" pinned, "pb" pinned and bad, "c" corrupt
	// header. keep lists which survive Prune (by index, oldest first).
	tests := []struct {
		name   string
		retain int
		marks  []string
		keep   []int
	}{
		{"fewer than retain", 3, []string{"g", "g"}, []int{0, 1}},
		{"exactly retain", 3, []string{"g", "g", "g"}, []int{0, 1, 2}},
		{"oldest go", 2, []string{"g", "g", "g", "g"}, []int{2, 3}},
		{"pinned old one kept", 2, []string{"p", "g", "g", "g"}, []int{0, 2, 3}},
		{"pinned counts toward retain", 2, []string{"g", "g", "p", "g"}, []int{2, 3}},
		{"bad not counted, kept while newer", 2, []string{"g", "g", "g", "b", "g"}, []int{2, 3, 4}},
		{"bad newest kept", 2, []string{"g", "g", "g", "b"}, []int{1, 2, 3}},
		{"bad older than Nth good pruned", 2, []string{"b", "g", "b", "g", "g"}, []int{3, 4}},
		{"bad kept while too few good", 3, []string{"b", "g", "b", "g"}, []int{0, 1, 2, 3}},
		{"pinned bad kept", 1, []string{"pb", "g", "g"}, []int{0, 2}},
		{"corrupt header counts as bad", 1, []string{"g", "c", "g", "c"}, []int{2, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, Options{Retain: tt.retain})
			var ids []string
			for i, mk := range tt.marks {
				id := save(t, s, []byte{0x81, 0xa1, 'i', byte(i)}, uint64(10*(i+1))).ID
				ids = append(ids, id)
				if strings.Contains(mk, "p") {
					if err := s.Pin(id); err != nil {
						t.Fatal(err)
					}
				}
				if strings.Contains(mk, "b") {
					if err := s.MarkBad(id, "poison"); err != nil {
						t.Fatal(err)
					}
				}
				if mk == "c" {
					editFile(t, ckptPath(s, id), func(b []byte) []byte { b[30] ^= 1; return b })
				}
			}
			removed, err := s.Prune()
			if err != nil {
				t.Fatalf("Prune: %v", err)
			}
			var want, wantRemoved []string
			for i, id := range ids {
				if slices.Contains(tt.keep, i) {
					want = append(want, id)
				} else {
					wantRemoved = append(wantRemoved, id)
				}
			}
			slices.Reverse(want)
			slices.Reverse(wantRemoved)
			ms, err := s.List()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range ms {
				got = append(got, m.ID)
			}
			if !slices.Equal(got, want) {
				t.Errorf("kept %v\nwant %v", got, want)
			}
			if !slices.Equal(removed, wantRemoved) {
				t.Errorf("Prune reported %v\nwant %v", removed, wantRemoved)
			}
			for _, id := range wantRemoved {
				for _, name := range []string{fileName(id), pinName(id), badName(id)} {
					if _, err := os.Stat(filepath.Join(s.dir, name)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s survived Prune of its checkpoint", name)
					}
				}
			}
			// Pruning again changes nothing.
			if again, err := s.Prune(); err != nil || len(again) != 0 {
				t.Errorf("second Prune removed %v, %v", again, err)
			}
		})
	}
}

func TestOldestRetainedWatermark(t *testing.T) {
	s := openStore(t, Options{Retain: 2})
	if _, ok := s.OldestRetainedWatermark(); ok {
		t.Fatal("OldestRetainedWatermark of an empty store: ok, want none")
	}
	a := save(t, s, []byte{0x80}, 10).ID
	b := save(t, s, []byte{0x80}, 20).ID
	c := save(t, s, []byte{0x80}, 30).ID
	check := func(want uint64) {
		t.Helper()
		if got, ok := s.OldestRetainedWatermark(); !ok || got != want {
			t.Errorf("OldestRetainedWatermark = %d, %v; want %d", got, ok, want)
		}
	}
	check(20) // a falls outside retention
	if err := s.Pin(a); err != nil {
		t.Fatal(err)
	}
	check(10)
	if err := s.Unpin(a); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkBad(b, "poison"); err != nil {
		t.Fatal(err)
	}
	check(10) // b no longer counts: a is the second good one
	if err := s.MarkBad(a, "poison"); err != nil {
		t.Fatal(err)
	}
	check(30)
	if err := s.MarkBad(c, "poison"); err != nil {
		t.Fatal(err)
	}
	if wm, ok := s.OldestRetainedWatermark(); ok {
		t.Errorf("OldestRetainedWatermark with only bad checkpoints = %d, want none", wm)
	}
}

func TestPinAndBadMarkDurable(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, []byte{0x80}, 1)
	if err := s.Pin(m.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Pin(m.ID); err != nil {
		t.Fatalf("second Pin: %v", err)
	}
	long := strings.Repeat("r", 10000)
	if err := s.MarkBad(m.ID, long); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(s.dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s2.Stat(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Pinned || !st.Bad || st.BadReason != long[:maxBadReason] {
		t.Fatalf("after reopen: pinned %v bad %v reason %d bytes; want pinned, bad, reason cut to %d", st.Pinned, st.Bad, len(st.BadReason), maxBadReason)
	}
	if err := s2.Unpin(m.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.Unpin(m.ID); err != nil {
		t.Fatalf("second Unpin: %v", err)
	}
	if st, _ := s2.Stat(m.ID); st.Pinned {
		t.Fatal("still pinned after Unpin")
	}
	// Load still returns a bad checkpoint's data: the operator may ask.
	if _, _, err := s2.Load(m.ID); err != nil {
		t.Fatalf("Load of a bad-marked checkpoint: %v", err)
	}
}

func TestLatestAndPrevious(t *testing.T) {
	s := openStore(t, Options{})
	if _, _, _, err := s.Latest(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Latest of an empty store: err = %v, want ErrNotFound", err)
	}
	var ms []Meta
	for i := range 4 {
		ms = append(ms, save(t, s, []byte{0x81, 0xa1, 'i', byte(i)}, uint64(i)))
	}
	m, data, skipped, err := s.Latest()
	if err != nil || m.ID != ms[3].ID || data[3] != 3 || len(skipped) != 0 {
		t.Fatalf("Latest = %s, %v, %v; want %s, nothing skipped", m.ID, skipped, err, ms[3].ID)
	}

	// The newest is damaged, the next marked bad: Latest takes the third and
	// says why it passed over each.
	editFile(t, ckptPath(s, ms[3].ID), func(b []byte) []byte { b[len(b)-1] ^= 0x10; return b })
	if err := s.MarkBad(ms[2].ID, "poison: died twice after restore"); err != nil {
		t.Fatal(err)
	}
	m, data, skipped, err = s.Latest()
	if err != nil || m.ID != ms[1].ID || data[3] != 1 {
		t.Fatalf("Latest = %s, %v; want %s", m.ID, err, ms[1].ID)
	}
	if len(skipped) != 2 || skipped[0].ID != ms[3].ID || !errors.Is(skipped[0].Err, ErrCorrupt) ||
		skipped[1].ID != ms[2].ID || !errors.Is(skipped[1].Err, ErrMarkedBad) || !strings.Contains(skipped[1].Err.Error(), "poison") {
		t.Fatalf("Latest skipped %v; want [%s corrupt, %s marked bad]", skipped, ms[3].ID, ms[2].ID)
	}

	m, _, skipped, err = s.Previous(ms[1].ID)
	if err != nil || m.ID != ms[0].ID || len(skipped) != 0 {
		t.Fatalf("Previous(%s) = %s, %v, %v; want %s", ms[1].ID, m.ID, skipped, err, ms[0].ID)
	}
	m, _, skipped, err = s.Previous(ms[3].ID)
	if err != nil || m.ID != ms[1].ID || len(skipped) != 1 || skipped[0].ID != ms[2].ID {
		t.Fatalf("Previous(%s) = %s, %v, %v; want %s after skipping %s", ms[3].ID, m.ID, skipped, err, ms[1].ID, ms[2].ID)
	}
	if _, _, _, err := s.Previous(ms[0].ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Previous(oldest): err = %v, want ErrNotFound", err)
	}
	for _, m := range ms[:2] {
		if err := s.MarkBad(m.ID, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, skipped, err := s.Latest(); !errors.Is(err, ErrNotFound) || len(skipped) != 4 {
		t.Fatalf("Latest with none loadable: skipped %d, err = %v; want 4 and ErrNotFound", len(skipped), err)
	}
}

// TestLoadDamaged: every kind of damage or forgery is ErrCorrupt, for Load
// and for WriteData (a restore's streamed snapshot), which return no data
// with it. Where the header's own checksum is valid (forged, or written by
// another build), want is what the error must name: the check that caught
// it, not a later one that happens to.
func TestLoadDamaged(t *testing.T) {
	data := genCheckpoint(256<<10, 11)
	crc := crc32.Checksum(data, castagnoli)
	tests := []struct {
		name string
		edit func(id uuid.UUID, b []byte) []byte
		want string
	}{
		{"empty file", func(_ uuid.UUID, b []byte) []byte { return nil }, ""},
		{"truncated in magic", func(_ uuid.UUID, b []byte) []byte { return b[:5] }, ""},
		{"truncated in header", func(_ uuid.UUID, b []byte) []byte { return b[:headerLen-1] }, ""},
		{"header only", func(_ uuid.UUID, b []byte) []byte { return b[:headerLen] }, ""},
		{"truncated body", func(_ uuid.UUID, b []byte) []byte { return b[:len(b)/2] }, "(truncated)"},
		{"last byte missing", func(_ uuid.UUID, b []byte) []byte { return b[:len(b)-1] }, "(truncated)"},
		{"trailing garbage", func(_ uuid.UUID, b []byte) []byte { return append(b, 0) }, "(trailing bytes)"},
		{"bad magic", func(_ uuid.UUID, b []byte) []byte { b[0] = 'X'; return b }, ""},
		{"future version", func(_ uuid.UUID, b []byte) []byte { b[9] = 2; return b }, ""},
		{"other magic, header checksum valid", func(_ uuid.UUID, b []byte) []byte { copy(b, "SUPVWAL!"); return reseal(b) }, "bad magic"},
		{"newer format version, header checksum valid", func(_ uuid.UUID, b []byte) []byte { b[9] = 2; return reseal(b) }, "format version 2"},
		{"other header length, header checksum valid", func(_ uuid.UUID, b []byte) []byte { b[11] = 72; return reseal(b) }, "header length 72"},
		{"body longer than its size allows", func(id uuid.UUID, b []byte) []byte {
			body := bytes.Repeat([]byte{0x42}, 4096)
			return forge(id, 100, uint64(len(body)), crc, body)
		}, "cannot hold 100 uncompressed bytes"},
		{"another checkpoint's body", func(id uuid.UUID, b []byte) []byte {
			// A valid zstd frame of the right size and another content:
			// only the data checksum tells.
			other := bytes.Clone(data)
			other[len(other)/2] ^= 1
			body := zstdFrame(t, other)
			h := rawHeader(b)
			return forge(id, h.size, uint64(len(body)), h.crc, body)
		}, "checksum mismatch"},
		{"header bit flip", func(_ uuid.UUID, b []byte) []byte { b[40] ^= 4; return b }, ""},
		{"body bit flip", func(_ uuid.UUID, b []byte) []byte { b[headerLen+len(b)/3] ^= 4; return b }, ""},
		{"data checksum bit flip", func(_ uuid.UUID, b []byte) []byte { b[61] ^= 4; return b }, ""},
		{"zstd checksum flip", func(_ uuid.UUID, b []byte) []byte { b[len(b)-2] ^= 1; return b }, ""},
		{"wrong id in header", func(_ uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(uuid.Must(uuid.NewV7()), h.size, h.bodyLen, h.crc, b[headerLen:])
		}, ""},
		{"data checksum lies", func(id uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(id, h.size, h.bodyLen, h.crc+1, b[headerLen:])
		}, ""},
		{"header size smaller than body", func(id uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(id, h.size-1, h.bodyLen, h.crc, b[headerLen:])
		}, "more than"},
		{"header size larger than body", func(id uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(id, h.size+1000, h.bodyLen, h.crc, b[headerLen:])
		}, ""},
		{"header size over MaxSize", func(id uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(id, 1<<40, h.bodyLen, h.crc, b[headerLen:])
		}, ""},
		{"body length lies", func(id uuid.UUID, b []byte) []byte {
			h := rawHeader(b)
			return forge(id, h.size, h.bodyLen+1, h.crc, b[headerLen:])
		}, ""},
		{"body not zstd", func(id uuid.UUID, b []byte) []byte {
			body := bytes.Repeat([]byte{0x42}, 1000)
			return forge(id, uint64(len(data)), uint64(len(body)), crc, body)
		}, ""},
		{"zstd bomb, no content size", func(id uuid.UUID, b []byte) []byte {
			body := zstdRLEBomb(1<<30, false)
			return forge(id, uint64(len(data)), uint64(len(body)), crc, body)
		}, ""},
		{"zstd bomb, declared content size", func(id uuid.UUID, b []byte) []byte {
			body := zstdRLEBomb(1<<30, true)
			return forge(id, uint64(len(data)), uint64(len(body)), crc, body)
		}, ""},
		{"zstd window over the cap", func(id uuid.UUID, b []byte) []byte {
			body := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0x01, 0, 0} // window 2^41
			return forge(id, uint64(len(data)), uint64(len(body)), crc, body)
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, Options{MaxSize: 1 << 20})
			m := save(t, s, data, 1)
			editFile(t, ckptPath(s, m.ID), func(b []byte) []byte { return tt.edit(uuid.MustParse(m.ID), b) })
			_, got, err := s.Load(m.ID)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load: err = %v, want ErrCorrupt", err)
			}
			if tooLarge := tt.name == "header size over MaxSize"; tooLarge != errors.Is(err, ErrTooLarge) {
				t.Errorf("Load: err = %v, ErrTooLarge %v, want %v", err, !tooLarge, tooLarge)
			}
			if got != nil {
				t.Errorf("Load returned %d bytes with its error", len(got))
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load: err = %v, want it to name %q", err, tt.want)
			}
			t.Logf("error: %v", err)
			_, err = s.WriteData(m.ID, io.Discard)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteData: err = %v, want ErrCorrupt naming %q", err, tt.want)
			}
			// List still lists it, and Latest passes over it.
			if ms, err := s.List(); err != nil || len(ms) != 1 {
				t.Errorf("List = %v, %v; want the damaged checkpoint", ms, err)
			}
			if _, _, skipped, err := s.Latest(); !errors.Is(err, ErrNotFound) || len(skipped) != 1 || !errors.Is(skipped[0].Err, ErrCorrupt) {
				t.Errorf("Latest = %v, %v; want ErrNotFound having skipped one corrupt", skipped, err)
			}
		})
	}
}

func TestRestorePoint(t *testing.T) {
	s := openStore(t, Options{})
	m := save(t, s, []byte{0x80}, 1)
	if _, _, ok, err := s.TakeRestorePoint(); ok || err != nil {
		t.Fatalf("TakeRestorePoint with none set: ok %v, err %v", ok, err)
	}
	for _, noWAL := range []bool{false, true} {
		if err := s.SetRestorePoint(strings.ToUpper(m.ID), noWAL); err != nil {
			t.Fatal(err)
		}
		s2, err := Open(s.dir, Options{}) // a later process
		if err != nil {
			t.Fatal(err)
		}
		if id, nw, ok, err := s2.PeekRestorePoint(); !ok || err != nil || id != m.ID || nw != noWAL {
			t.Fatalf("PeekRestorePoint = %q, %v, %v, %v; want %q, %v", id, nw, ok, err, m.ID, noWAL)
		}
		if id, nw, ok, err := s2.TakeRestorePoint(); !ok || err != nil || id != m.ID || nw != noWAL {
			t.Fatalf("TakeRestorePoint = %q, %v, %v, %v; want %q, %v", id, nw, ok, err, m.ID, noWAL)
		}
		if _, _, ok, err := s2.TakeRestorePoint(); ok || err != nil {
			t.Fatalf("second TakeRestorePoint: ok %v, err %v; want none", ok, err)
		}
	}
	// A damaged record is reported once and cleared.
	for _, content := range []string{"{not json", `{"checkpoint_id":"../../etc/passwd"}`, strings.Repeat(" ", maxMarker+1)} {
		if err := os.WriteFile(filepath.Join(s.dir, restorePointName), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, ok, err := s.TakeRestorePoint(); ok || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("TakeRestorePoint of %.20q: ok %v, err %v; want ErrCorrupt", content, ok, err)
		}
		if _, _, ok, err := s.TakeRestorePoint(); ok || err != nil {
			t.Fatalf("TakeRestorePoint after a damaged one: ok %v, err %v; want none", ok, err)
		}
	}
}

// TestConcurrentUse exercises every method at once under the race detector.
func TestConcurrentUse(t *testing.T) {
	s := openStore(t, Options{Retain: 3})
	first := save(t, s, genCheckpoint(64<<10, 1), 1)
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			data := genCheckpoint(32<<10, uint64(w))
			for i := range 10 {
				m, err := s.Save(data, uint64(i))
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					s.MarkBad(m.ID, "x")
				}
				if _, err := s.Prune(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 30 {
			if _, _, _, err := s.Latest(); err != nil && !errors.Is(err, ErrNotFound) {
				t.Error(err)
			}
			s.OldestRetainedWatermark()
			if _, err := s.List(); err != nil {
				t.Error(err)
			}
			s.Pin(first.ID)
			s.Unpin(first.ID)
		}
	})
	wg.Wait()
}

// failingWriter accepts n bytes, then fails like a full disk.
type failingWriter struct{ n int }

var errDiskFull = errors.New("no space left on device (fake)")

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		n := w.n
		w.n = 0
		return n, errDiskFull
	}
	w.n -= len(p)
	return len(p), nil
}

// TestCompressWriteFails: a write error during compression, in the serial
// and the parallel path, comes back wrapped and stops every goroutine the
// encoder started.
func TestCompressWriteFails(t *testing.T) {
	s := openStore(t, Options{})
	before := runtime.NumGoroutine()
	for _, size := range []int{1 << 20, 6 << 20} {
		data := cheapData(size)
		for _, after := range []int{0, 100, 256 << 10} {
			err := s.compress(&failingWriter{n: after}, data)
			if !errors.Is(err, errDiskFull) {
				t.Errorf("compress %d bytes, failing after %d: err = %v, want %v", size, after, err, errDiskFull)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after the failed compressions, %d before", n, before)
	}
}

// TestWriteDataReaderGone: the writer failing under WriteData (a restore's
// pipe whose agent died) is that error, as it is — not ErrCorrupt, which
// would set a sound checkpoint aside for every later restore.
func TestWriteDataReaderGone(t *testing.T) {
	s := openStore(t, Options{})
	data := genCheckpoint(256<<10, 12)
	m := save(t, s, data, 1)
	_, err := s.WriteData(m.ID, &failingWriter{n: 100 << 10})
	if !errors.Is(err, errDiskFull) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("WriteData into a failing writer: %v; want the writer's error, not ErrCorrupt", err)
	}
	var buf bytes.Buffer
	if _, err := s.WriteData(m.ID, &buf); err != nil || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("WriteData after: %v, %d bytes equal %v", err, buf.Len(), bytes.Equal(buf.Bytes(), data))
	}
}

// TestBadMarkReasons: what List says of a checkpoint's bad mark. A mark
// that does not read still marks it bad, saying so; a damaged checkpoint
// that is marked bad gives the mark's reason and its damage; a damaged one
// that is not marked is bad for its damage alone (no mark is invented).
func TestBadMarkReasons(t *testing.T) {
	s := openStore(t, Options{})
	unreadable := save(t, s, []byte{0x80}, 1)
	damagedMarked := save(t, s, []byte{0x80}, 2)
	damaged := save(t, s, []byte{0x80}, 3)
	if err := os.WriteFile(filepath.Join(s.dir, badName(unreadable.ID)), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkBad(damagedMarked.ID, "crashed after its restore"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{damagedMarked.ID, damaged.ID} {
		editFile(t, ckptPath(s, id), func(b []byte) []byte { b[40] ^= 1; return b })
	}
	metas, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Meta{}
	for _, m := range metas {
		got[m.ID] = m
	}
	if m := got[unreadable.ID]; !m.Bad || !strings.Contains(m.BadReason, "mark unreadable") {
		t.Errorf("unreadable mark: bad %v, reason %q; want bad, saying the mark is unreadable", m.Bad, m.BadReason)
	}
	if m := got[damagedMarked.ID]; !m.Bad || !strings.Contains(m.BadReason, "crashed after its restore") || !strings.Contains(m.BadReason, "checksum") {
		t.Errorf("damaged and marked: bad %v, reason %q; want the mark's reason and the damage", m.Bad, m.BadReason)
	}
	if m := got[damaged.ID]; !m.Bad || !strings.Contains(m.BadReason, "checksum") || strings.Contains(m.BadReason, "mark") {
		t.Errorf("damaged, never marked: bad %v, reason %q; want bad for the damage alone", m.Bad, m.BadReason)
	}
}
