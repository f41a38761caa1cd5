package crashfs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/crashfs"
)

// disk is one test's mount, with helpers that fail the test on error.
type disk struct {
	t       *testing.T
	fs      *crashfs.FS
	mnt     string
	backing string
}

func mount(t *testing.T, opts crashfs.Options) *disk {
	t.Helper()
	if err := crashfs.Available(); err != nil {
		t.Skip(err)
	}
	base := t.TempDir()
	d := &disk{t: t, mnt: filepath.Join(base, "mnt"), backing: filepath.Join(base, "disk")}
	for _, dir := range []string{d.mnt, d.backing} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d.remount(opts)
	return d
}

// remount mounts d.backing again (after a power-off into it).
func (d *disk) remount(opts crashfs.Options) {
	d.t.Helper()
	f, err := crashfs.Mount(d.mnt, d.backing, opts)
	if err != nil {
		d.t.Fatal(err)
	}
	d.fs = f
	d.t.Cleanup(func() { f.Close() })
}

func (d *disk) p(name string) string { return filepath.Join(d.mnt, name) }

func (d *disk) write(name, content string) {
	d.t.Helper()
	if err := os.WriteFile(d.p(name), []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

func (d *disk) fsync(name string) {
	d.t.Helper()
	if err := d.trySync(name); err != nil {
		d.t.Fatal(err)
	}
}

func (d *disk) trySync(name string) error {
	f, err := os.Open(d.p(name))
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func (d *disk) fdatasync(name string) {
	d.t.Helper()
	f, err := os.Open(d.p(name))
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		d.t.Fatal(err)
	}
}

// writeSynced writes a file and fsyncs it and its directory.
func (d *disk) writeSynced(name, content string) {
	d.t.Helper()
	d.write(name, content)
	d.fsync(name)
	d.fsync(filepath.Dir(name))
}

// powerOff cuts the power, writes the image over the backing directory and
// returns it: path → content ("<dir>" for a directory).
func (d *disk) powerOff() map[string]string {
	d.t.Helper()
	if err := d.fs.PowerOff(d.backing); err != nil {
		d.t.Fatal(err)
	}
	return image(d.t, d.backing)
}

func image(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case de.IsDir():
			out[rel] = "<dir>"
		case de.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			out[rel] = "-> " + target
			return err
		case de.Type().IsRegular():
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		default:
			out[rel] = "<special>"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func wantImage(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("image %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("image %q, want %q", got, want)
		}
	}
}

// TestLiveViewIsNormal: whatever is synced or not, the mount reads back
// what was written and supports what the supervisor uses.
func TestLiveViewIsNormal(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.write("a", "hello")
	if err := os.Mkdir(d.p("dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.write("dir/b", "world")
	if err := os.Rename(d.p("a"), d.p("dir/a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(d.p("dir/a"), d.p("dir/c")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", d.p("dir/s")); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(d.p("dir/b"), os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("!"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock: %v", err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, 3*crashfs.PageSize); err != nil {
		t.Fatalf("fallocate: %v", err)
	}
	if err := f.Truncate(6); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ln, err := net.Listen("unix", d.p("dir/sock"))
	if err != nil {
		t.Fatalf("a unix socket on the mount: %v", err)
	}
	c, err := net.Dial("unix", d.p("dir/sock"))
	if err != nil {
		t.Fatalf("connecting to it: %v", err)
	}
	c.Close()
	ln.Close()
	if err := os.Mkdir(d.p("gone"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(d.p("gone")); err != nil {
		t.Fatal(err)
	}
	got := image(t, d.mnt)
	wantImage(t, got, map[string]string{"dir": "<dir>", "dir/a": "hello", "dir/b": "world!", "dir/c": "hello", "dir/s": "-> a"})
	if err := d.fs.Close(); err != nil {
		t.Fatal(err)
	}
	wantImage(t, image(t, d.backing), got)
}

func TestUnsyncedWriteIsLost(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("a", "one")
	d.write("a", "two, longer")
	d.write("b", "never synced")
	wantImage(t, d.powerOff(), map[string]string{"a": "one"})
}

func TestSyncedWriteIsKept(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("a", "one")
	d.write("a", "two, longer")
	d.fdatasync("a")
	d.writeSynced("b", "three")
	wantImage(t, d.powerOff(), map[string]string{"a": "two, longer", "b": "three"})
}

// TestNewFileNeedsItsDirectoryFsynced: fsyncing a new file is not enough.
func TestNewFileNeedsItsDirectoryFsynced(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.write("a", "data")
	d.fsync("a")
	wantImage(t, d.powerOff(), map[string]string{})
}

// TestRenameWithoutDirFsyncIsUndone: the write-temporary-then-rename dance
// without the final directory fsync leaves the old file in place.
func TestRenameWithoutDirFsyncIsUndone(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("f", "old")
	d.writeSynced("f.tmp", "new")
	if err := os.Rename(d.p("f.tmp"), d.p("f")); err != nil {
		t.Fatal(err)
	}
	wantImage(t, d.powerOff(), map[string]string{"f": "old", "f.tmp": "new"})

	d.remount(crashfs.Options{})
	if err := os.Rename(d.p("f.tmp"), d.p("f")); err != nil {
		t.Fatal(err)
	}
	d.fsync(".")
	wantImage(t, d.powerOff(), map[string]string{"f": "new"})
}

func TestUnlinkWithoutDirFsyncIsUndone(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("a", "kept")
	d.writeSynced("b", "removed")
	for _, n := range []string{"a", "b"} {
		if err := os.Remove(d.p(n)); err != nil {
			t.Fatal(err)
		}
	}
	d.write("c", "x")
	if err := os.Remove(d.p("c")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(d.p("b"), d.p("b2")); err == nil {
		t.Fatal("linked a removed file")
	}
	wantImage(t, d.powerOff(), map[string]string{"a": "kept", "b": "removed"})
}

// TestMkdirWithoutParentFsyncIsLost: a directory, and all below it, exists
// on the disk only once its parent is fsynced.
func TestMkdirWithoutParentFsyncIsLost(t *testing.T) {
	d := mount(t, crashfs.Options{})
	if err := os.MkdirAll(d.p("top/sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.writeSynced("top/sub/x", "data") // fsyncs x and sub, not top or the root
	d.fsync("top")
	wantImage(t, d.powerOff(), map[string]string{})

	d.remount(crashfs.Options{})
	if err := os.MkdirAll(d.p("top/sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.writeSynced("top/sub/x", "data")
	d.fsync("top")
	d.fsync(".")
	wantImage(t, d.powerOff(), map[string]string{"top": "<dir>", "top/sub": "<dir>", "top/sub/x": "data"})
}

func TestRmdirAndHardLinks(t *testing.T) {
	d := mount(t, crashfs.Options{})
	if err := os.Mkdir(d.p("d"), 0o700); err != nil {
		t.Fatal(err)
	}
	d.writeSynced("d/a", "linked")
	if err := os.Link(d.p("d/a"), d.p("b")); err != nil {
		t.Fatal(err)
	}
	d.fsync(".")
	if err := os.Remove(d.p("d/a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(d.p("d")); err != nil {
		t.Fatal(err)
	}
	d.fsync(".") // the rmdir is durable; d/a's unlink went with d
	got := d.powerOff()
	wantImage(t, got, map[string]string{"b": "linked"})

	// Both names of a link are one file in the image.
	d.remount(crashfs.Options{})
	if err := os.Link(d.p("b"), d.p("c")); err != nil {
		t.Fatal(err)
	}
	d.fsync(".")
	wantImage(t, d.powerOff(), map[string]string{"b": "linked", "c": "linked"})
	var sb, sc syscall.Stat_t
	if syscall.Stat(filepath.Join(d.backing, "b"), &sb) != nil || syscall.Stat(filepath.Join(d.backing, "c"), &sc) != nil || sb.Ino != sc.Ino {
		t.Fatal("b and c are not one file in the image")
	}
}

// TestImageIsDurableOnTheNextMount: what an image holds stays durable
// without any fsync on the next run, and a truncation is undone unless
// synced.
func TestImageIsDurableOnTheNextMount(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("a", strings.Repeat("a", 3*crashfs.PageSize))
	d.writeSynced("b", "bee")
	d.powerOff()
	d.remount(crashfs.Options{})
	if err := os.Truncate(d.p("a"), 5); err != nil {
		t.Fatal(err)
	}
	d.write("b", "")
	wantImage(t, d.powerOff(), map[string]string{"a": strings.Repeat("a", 3*crashfs.PageSize), "b": "bee"})
	d.remount(crashfs.Options{})
	if err := os.Truncate(d.p("a"), 5); err != nil {
		t.Fatal(err)
	}
	d.fsync("a")
	wantImage(t, d.powerOff(), map[string]string{"a": "aaaaa", "b": "bee"})
}

// TestFsyncEIODropsPages: Linux semantics of a failed fsync — EIO once, the
// pages marked clean, the next fsync succeeds, the data is not on the disk
// although the live view shows it.
func TestFsyncEIODropsPages(t *testing.T) {
	policy := crashfs.FailMatching(func(c crashfs.Fsync) bool { return c.Path == "f" && !c.Dir }, 1)
	d := mount(t, crashfs.Options{FailFsync: policy})
	d.write("f", "")
	d.fsync(".")
	if err := d.trySync("f"); err == nil {
		t.Fatal("the first fsync of an empty f was not failed")
	}
	d.write("f", "acknowledged?")
	d.fsync("f") // the policy failed one fsync only
	d.write("f", "lost in the page cache")
	if err := d.trySync("f"); err != nil {
		t.Fatal(err)
	}
	// The failure that matters: one covering data.
	var armed atomic.Bool // read by the filesystem's goroutines
	d2 := mount(t, crashfs.Options{FailFsync: crashfs.FailMatching(func(c crashfs.Fsync) bool { return armed.Load() && c.Path == "g" }, 1)})
	d2.writeSynced("g", "old old old")
	armed.Store(true)
	f, err := os.OpenFile(d2.p("g"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("NEW"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after the write: %v, want EIO", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("the retried fsync: %v, want success (the pages were marked clean)", err)
	}
	f.Close()
	if b, _ := os.ReadFile(d2.p("g")); string(b) != "NEW old old" {
		t.Fatalf("live view %q: the data is still in the page cache", b)
	}
	faults := d2.fs.Faults()
	if len(faults) != 1 || faults[0].Path != "g" || faults[0].Pages != 1 {
		t.Fatalf("faults %+v", faults)
	}
	wantImage(t, d2.powerOff(), map[string]string{"g": "old old old"})
	if s := d2.fs.Stats(); s.FailedFsyncs != 1 || s.DroppedPages != 1 {
		t.Fatalf("stats %+v", s)
	}

	// A failed fsync of a new file's growth leaves its size to a later
	// fsync and its data to nobody: zeros.
	d3 := mount(t, crashfs.Options{FailFsync: crashfs.FailMatching(func(c crashfs.Fsync) bool { return c.Pages > 0 }, 1)})
	d3.write("h", "")
	d3.fsync(".")
	d3.write("h", "data")
	if err := d3.trySync("h"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync: %v, want EIO", err)
	}
	d3.fsync("h")
	wantImage(t, d3.powerOff(), map[string]string{"h": "\x00\x00\x00\x00"})

	// A failed directory fsync leaves the directory as it was on disk.
	d4 := mount(t, crashfs.Options{FailFsync: crashfs.FailMatching(func(c crashfs.Fsync) bool { return c.Dir }, 1)})
	d4.write("i", "x")
	d4.fsync("i")
	if err := d4.trySync("."); !errors.Is(err, syscall.EIO) {
		t.Fatalf("directory fsync: %v, want EIO", err)
	}
	wantImage(t, d4.powerOff(), map[string]string{})
}

// tornRun overwrites 64 durable pages of 'a' with 'b', page by page in a
// shuffled order, powers off with the mode and seed, and returns which
// pages are 'b' in the image, and the write order.
func tornRun(t *testing.T, mode crashfs.TornMode, seed uint64) (newPages []int, order []int) {
	t.Helper()
	const pages = 64
	d := mount(t, crashfs.Options{Torn: mode, Seed: seed})
	d.writeSynced("f", strings.Repeat("a", pages*crashfs.PageSize))
	f, err := os.OpenFile(d.p("f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	order = rand.New(rand.NewPCG(1, 2)).Perm(pages)
	b := bytes.Repeat([]byte("b"), crashfs.PageSize)
	for _, p := range order {
		if _, err := f.WriteAt(b, int64(p*crashfs.PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	img := d.powerOff()["f"]
	if len(img) != pages*crashfs.PageSize {
		t.Fatalf("torn file is %d bytes, want %d", len(img), pages*crashfs.PageSize)
	}
	for p := range pages {
		switch page := img[p*crashfs.PageSize : (p+1)*crashfs.PageSize]; page {
		case strings.Repeat("a", crashfs.PageSize):
		case strings.Repeat("b", crashfs.PageSize):
			newPages = append(newPages, p)
		default:
			t.Fatalf("page %d is neither old nor new: torn inside a page", p)
		}
	}
	if s := d.fs.Stats(); s.TornPages != len(newPages) || s.LostPages != pages-len(newPages) {
		t.Fatalf("stats %+v with %d new pages", s, len(newPages))
	}
	return newPages, order
}

// TestTornPagesSeededReproducibly: the unsynced pages that reach the disk
// are whole pages, chosen by the seed alone — the same seed gives the same
// image, different seeds differ — and TornPrefix keeps write order.
func TestTornPagesSeededReproducibly(t *testing.T) {
	outcomes := map[string]bool{}
	for seed := uint64(1); seed <= 4; seed++ {
		first, _ := tornRun(t, crashfs.TornSubset, seed)
		again, _ := tornRun(t, crashfs.TornSubset, seed)
		if !slices.Equal(first, again) {
			t.Fatalf("seed %d: pages %v, then %v", seed, first, again)
		}
		if len(first) == 0 || len(first) == 64 {
			t.Fatalf("seed %d: TornSubset kept %d of 64 pages", seed, len(first))
		}
		outcomes[fmt.Sprint(first)] = true
	}
	if len(outcomes) < 3 {
		t.Fatalf("4 seeds gave %d different images", len(outcomes))
	}
	kept := map[int]bool{}
	for seed := uint64(1); seed <= 6; seed++ {
		got, order := tornRun(t, crashfs.TornPrefix, seed)
		kept[len(got)] = true
		want := slices.Clone(order[:len(got)])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: TornPrefix kept pages %v, not the first %d written", seed, got, len(got))
		}
	}
	if len(kept) < 2 {
		t.Fatalf("6 seeds all kept the same prefix length")
	}
	if got, _ := tornRun(t, crashfs.TornNone, 1); len(got) != 0 {
		t.Fatalf("TornNone kept pages %v", got)
	}
}

// TestTornSizeExtension: a torn write past the end of a file leaves the
// pages not chosen as zeros (the size reached the disk, the data did not),
// never as data from elsewhere.
func TestTornSizeExtension(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		d := mount(t, crashfs.Options{Torn: crashfs.TornSubset, Seed: seed})
		d.writeSynced("f", "")
		d.write("f", strings.Repeat("x", 8*crashfs.PageSize))
		img := d.powerOff()["f"]
		if len(img)%crashfs.PageSize != 0 || strings.Trim(img, "x\x00") != "" {
			t.Fatalf("seed %d: a torn extension of %d bytes holds more than x and zeros", seed, len(img))
		}
	}
}

// TestCutRefusesChanges: after the cut, changes and fsyncs fail with EIO,
// so nothing can be acknowledged that the image does not hold.
func TestCutRefusesChanges(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("a", "before")
	f, err := os.OpenFile(d.p("a"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d.fs.Cut()
	if _, err := f.WriteAt([]byte("after"), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write after the cut: %v, want EIO", err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync after the cut: %v, want EIO", err)
	}
	if err := os.WriteFile(d.p("b"), nil, 0o600); !errors.Is(err, syscall.EIO) {
		t.Errorf("create after the cut: %v, want EIO", err)
	}
	if b, err := os.ReadFile(d.p("a")); err != nil || string(b) != "before" {
		t.Errorf("read after the cut: %q %v", b, err)
	}
	f.Close()
	wantImage(t, d.powerOff(), map[string]string{"a": "before"})
}

// TestFailRandomIsSeeded: the random policy fails the same calls for the
// same seed.
func TestFailRandomIsSeeded(t *testing.T) {
	draw := func(seed uint64) []bool {
		p := crashfs.FailRandom(seed, 0.3, true)
		var out []bool
		for i := range 200 {
			out = append(out, p(crashfs.Fsync{Path: "x", Count: i}))
		}
		if p(crashfs.Fsync{Dir: true}) {
			t.Fatal("filesOnly failed a directory")
		}
		return out
	}
	a, b, c := draw(7), draw(7), draw(8)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("FailRandom is not a function of its seed")
	}
	if n := strings.Count(fmt.Sprint(a), "true"); n < 30 || n > 90 {
		t.Fatalf("failed %d of 200 at p=0.3", n)
	}
}

// TestCutAfterWrites: an armed cut lands right after the n-th write, with
// that write in the live view and not on the disk; later writes fail.
func TestCutAfterWrites(t *testing.T) {
	d := mount(t, crashfs.Options{})
	d.writeSynced("f", "")
	f, err := os.OpenFile(d.p("f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cut := d.fs.CutAfterWrites(2)
	for i, want := range []error{nil, nil, syscall.EIO} {
		if _, err := f.WriteAt([]byte("x"), int64(i)); !errors.Is(err, want) && err != want {
			t.Fatalf("write %d: %v, want %v", i, err, want)
		}
		if i == 0 {
			select {
			case <-cut:
				t.Fatal("cut after one write")
			default:
			}
		}
	}
	<-cut
	f.Close()
	wantImage(t, d.powerOff(), map[string]string{"f": ""})
}
