package crashfs

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// PageSize is the unit in which unsynced file data is tracked, torn and
// dropped.
const PageSize = 4096

// TornMode says which unsynced file data reaches the image at power-off.
type TornMode int

const (
	// TornNone: no unsynced data reaches the image (the default).
	TornNone TornMode = iota
	// TornPrefix: for each file, a random prefix, in the order they were
	// first written since the last fsync, of its unsynced pages.
	TornPrefix
	// TornSubset: for each file, a random subset of its unsynced pages, as
	// from a disk that reorders its volatile write cache.
	TornSubset
)

// String names the mode as the power-loss tests print it.
func (m TornMode) String() string {
	switch m {
	case TornNone:
		return "none"
	case TornPrefix:
		return "prefix"
	case TornSubset:
		return "subset"
	}
	return fmt.Sprintf("TornMode(%d)", int(m))
}

// Fsync describes one fsync or fdatasync the filesystem was asked for; it
// is what [Options.FailFsync] decides on and what [FS.Faults] lists.
type Fsync struct {
	// Path is the file's or directory's name relative to the mount point,
	// slash-separated ("" for the root): the name it was last created,
	// renamed or linked under through this mount.
	Path string
	// Dir is set for a directory.
	Dir bool
	// Datasync is set for fdatasync.
	Datasync bool
	// Count is how many fsyncs of the same file or directory came before
	// this one since the mount.
	Count int
	// Pages is how many unsynced pages the fsync covers (0 for a directory).
	Pages int
}

// Options configure a [Mount].
type Options struct {
	// Seed drives every random choice the filesystem makes (the torn pages
	// chosen at power-off): the same operations and the same seed give the
	// same image.
	Seed uint64
	// Torn selects what unsynced data reaches the image at power-off.
	Torn TornMode
	// FailFsync, if set, is asked before every fsync and fdatasync of a file
	// or directory; true makes that call fail with EIO. A failed file fsync
	// drops the file's unsynced pages (they never reach the image, even
	// torn); a later fsync succeeds and covers only what was written since.
	// A failed directory fsync leaves the directory's image as it was. It is
	// called with the filesystem's lock held: it must not use the mount.
	// [FailRandom] and [FailMatching] build common policies.
	FailFsync func(Fsync) bool
	// Debug logs every FUSE request to the standard log.
	Debug bool
}

// Stats counts what the filesystem did since the mount.
type Stats struct {
	Fsyncs       int // fsyncs and fdatasyncs of files that succeeded
	DirFsyncs    int // fsyncs of directories that succeeded
	FailedFsyncs int // fsyncs failed by Options.FailFsync
	DroppedPages int // unsynced pages dropped by failed fsyncs
	TornPages    int // unsynced pages written to the image at power-off
	LostPages    int // unsynced pages of files in the image not written at power-off
}

// Available reports why crashfs cannot mount here (nil: it can): it needs
// root (for DirectMount), /dev/fuse, and a mount that works — a container
// may open /dev/fuse and still refuse the mount. The probe mounts an empty
// directory once per process.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("crashfs needs root to mount FUSE without fusermount")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("crashfs needs /dev/fuse: %w", err)
	}
	f.Close()
	return probeOnce()
}

var probeOnce = sync.OnceValue(func() error {
	dir, err := os.MkdirTemp("", "crashfs-probe-")
	if err != nil {
		return fmt.Errorf("crashfs probe: %w", err)
	}
	defer os.RemoveAll(dir)
	mnt, back := filepath.Join(dir, "mnt"), filepath.Join(dir, "back")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return fmt.Errorf("crashfs probe: %w", err)
	}
	if err := os.Mkdir(back, 0o700); err != nil {
		return fmt.Errorf("crashfs probe: %w", err)
	}
	m, err := mount(mnt, back, Options{})
	if err != nil {
		return fmt.Errorf("crashfs cannot mount here: %w", err)
	}
	return m.Close()
})

// FS is one mounted crash-simulating filesystem.
type FS struct {
	mnt, backing string
	opts         Options
	server       *fuse.Server
	rootData     *fs.LoopbackRoot

	mu        sync.Mutex
	root      *inode
	inodes    map[*inode]struct{} // every modelled inode, for collect
	nextID    uint64
	order     uint64 // write order of dirty pages
	scratch   string // the durable copies of files, one per inode
	cut       bool
	cutAfter  int           // writes left before an armed cut (CutAfterWrites)
	cutDone   chan struct{} // closed by the armed cut
	unmounted bool
	faults    []Fsync
	stats     Stats
}

// inode is the model of one file, directory, symlink or special file: its
// live state is the backing directory's, its durable state is kept here.
type inode struct {
	id   uint64
	mode uint32 // S_IFMT bits and permissions
	rdev uint64
	link string // a symlink's target
	path string // last name given through the mount, for Fsync.Path

	// Directories: the entries as they are and as of the last fsync.
	live, durable map[string]*inode

	// Regular files.
	rd       *os.File         // read-only on the backing file (outlives its unlink)
	pristine bool             // the backing file still holds the durable content: no copy yet
	copy     *os.File         // the durable content (when !pristine), exactly its size
	minSize  int64            // the smallest live size since the last fsync
	dirty    map[int64]uint64 // unsynced page → write order
	open     int              // open handles
	syncs    int
}

func (n *inode) isDir() bool  { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n *inode) isFile() bool { return n.mode&syscall.S_IFMT == syscall.S_IFREG }

func (f *FS) newInode(mode uint32, path string) *inode {
	f.nextID++
	n := &inode{id: f.nextID, mode: mode, path: path}
	if n.isDir() {
		n.live, n.durable = map[string]*inode{}, map[string]*inode{}
	}
	if n.isFile() {
		n.dirty = map[int64]uint64{}
	}
	f.inodes[n] = struct{}{}
	return n
}

// Mount mounts a crash-simulating filesystem at mountpoint (an existing,
// empty directory) over backing, a directory whose content is the image the
// machine boots with: all of it counts as durable. The live files are kept
// in backing itself (do not touch it while mounted); durable copies go to a
// scratch directory beside it, removed by [FS.PowerOff] and [FS.Close].
func Mount(mountpoint, backing string, opts Options) (*FS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	return mount(mountpoint, backing, opts)
}

func mount(mountpoint, backing string, opts Options) (*FS, error) {
	mnt, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, err
	}
	back, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(back, &st); err != nil {
		return nil, fmt.Errorf("crashfs: backing directory: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, fmt.Errorf("crashfs: backing %s is not a directory", back)
	}
	scratch, err := os.MkdirTemp(filepath.Dir(back), "."+filepath.Base(back)+".crashfs-")
	if err != nil {
		return nil, fmt.Errorf("crashfs: scratch directory: %w", err)
	}
	f := &FS{mnt: mnt, backing: back, opts: opts, scratch: scratch, inodes: map[*inode]struct{}{}}
	f.root = f.newInode(st.Mode, "")
	if err := f.scan(f.root, back, "", map[[2]uint64]*inode{}); err != nil {
		f.releaseAll()
		return nil, err
	}
	f.rootData = &fs.LoopbackRoot{Path: back, Dev: uint64(st.Dev)}
	rootNode := &node{LoopbackNode: fs.LoopbackNode{RootData: f.rootData}, fsys: f, m: f.root}
	f.rootData.RootNode = rootNode
	f.rootData.NewNode = func(rd *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		// Only reached by LoopbackNode methods node does not override
		// (none create nodes); a node without a model refuses changes.
		return &node{LoopbackNode: fs.LoopbackNode{RootData: rd}, fsys: f}
	}
	sec := time.Second
	server, err := fs.Mount(mnt, rootNode, &fs.Options{
		MountOptions: fuse.MountOptions{
			DirectMount: true,
			FsName:      "crashfs:" + back,
			Name:        "crashfs",
			Debug:       opts.Debug,
		},
		EntryTimeout:    &sec,
		AttrTimeout:     &sec,
		NegativeTimeout: &sec,
	})
	if err != nil {
		f.releaseAll()
		return nil, fmt.Errorf("crashfs: mounting at %s: %w", mnt, err)
	}
	f.server = server
	return f, nil
}

// scan models what is in dir (the backing path of n) as durable.
func (f *FS) scan(n *inode, dir, rel string, seen map[[2]uint64]*inode) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("crashfs: reading %s: %w", dir, err)
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return fmt.Errorf("crashfs: %s: %w", p, err)
		}
		key := [2]uint64{uint64(st.Dev), st.Ino}
		c := seen[key]
		if c == nil {
			c = f.newInode(st.Mode, path(rel, de.Name()))
			c.rdev = uint64(st.Rdev)
			switch st.Mode & syscall.S_IFMT {
			case syscall.S_IFDIR:
				if err := f.scan(c, p, c.path, seen); err != nil {
					return err
				}
			case syscall.S_IFREG:
				if c.rd, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0); err != nil {
					return fmt.Errorf("crashfs: %w", err)
				}
				c.pristine = true
				seen[key] = c
			case syscall.S_IFLNK:
				if c.link, err = os.Readlink(p); err != nil {
					return fmt.Errorf("crashfs: %w", err)
				}
			}
		}
		n.live[de.Name()] = c
		n.durable[de.Name()] = c
	}
	return nil
}

func path(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Dir is the mount point.
func (f *FS) Dir() string { return f.mnt }

// Cut cuts the power: the image is what it is now. Every later change and
// fsync through the mount fails with EIO, so nothing done after the cut can
// be acknowledged as durable. Kill the processes using the mount after Cut
// and before [FS.PowerOff] to end them at the instant of the cut.
func (f *FS) Cut() {
	f.mu.Lock()
	f.cutNow()
	f.mu.Unlock()
}

// CutAfterWrites arms a cut right after the n-th write (or allocation)
// from now, so the power goes while written data is not yet synced; the
// returned channel is closed at the cut. [FS.Cut] also closes it.
func (f *FS) CutAfterWrites(n int) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutDone == nil {
		f.cutDone = make(chan struct{})
	}
	if f.cut {
		return f.cutDone
	}
	f.cutAfter = max(n, 1)
	return f.cutDone
}

// cutNow cuts the power. Called with f.mu held.
func (f *FS) cutNow() {
	if f.cut {
		return
	}
	f.cut = true
	f.cutAfter = 0
	if f.cutDone != nil {
		close(f.cutDone)
	}
}

// wrote counts a write towards an armed cut. Called with f.mu held.
func (f *FS) wrote() {
	if f.cutAfter > 0 {
		f.cutAfter--
		if f.cutAfter == 0 {
			f.cutNow()
		}
	}
}

// Faults lists the fsyncs Options.FailFsync failed, in order.
func (f *FS) Faults() []Fsync {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.faults)
}

// Stats returns the counts so far.
func (f *FS) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// PowerOff cuts the power (if [FS.Cut] has not), unmounts and writes the
// image to dst, a directory that must not exist or be empty; dst may be the
// backing directory, which is then replaced. Otherwise the backing directory
// is left holding the live view at the cut (what was written, synced or
// not), for a look when a test fails. The processes using the mount must be
// gone: PowerOff waits up to 10 s for the mount to be free, then detaches it.
func (f *FS) PowerOff(dst string) error {
	f.Cut()
	uerr := f.unmount()
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.releaseAll()
	dst, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	out := dst
	if dst == f.backing {
		out = f.scratch + ".image"
	} else if des, err := os.ReadDir(dst); err == nil && len(des) > 0 {
		return fmt.Errorf("crashfs: power-off image %s: directory not empty", dst)
	}
	if err := os.Mkdir(out, os.FileMode(f.root.mode&0o7777)); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("crashfs: power-off image: %w", err)
	}
	rng := rand.New(rand.NewPCG(f.opts.Seed, f.opts.Seed^0x9e3779b97f4a7c15))
	w := &imageWriter{f: f, rng: rng, written: map[*inode]string{}}
	if err := w.dir(f.root, out); err != nil {
		return fmt.Errorf("crashfs: writing the power-off image: %w", err)
	}
	if out != dst {
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("crashfs: replacing the backing directory: %w", err)
		}
		if err := os.Rename(out, dst); err != nil {
			return fmt.Errorf("crashfs: replacing the backing directory: %w", err)
		}
	}
	if uerr != nil {
		return uerr
	}
	return nil
}

// Close unmounts without a power cut, as after a clean shutdown: the backing
// directory keeps the live view, synced or not. The processes using the
// mount must be gone. Close after PowerOff does nothing.
func (f *FS) Close() error {
	f.Cut()
	err := f.unmount()
	f.mu.Lock()
	f.releaseAll()
	f.mu.Unlock()
	return err
}

// unmount unmounts once, waiting up to 10 s for busy files to be released
// before detaching the mount lazily.
func (f *FS) unmount() error {
	f.mu.Lock()
	if f.unmounted || f.server == nil {
		f.mu.Unlock()
		return nil
	}
	f.unmounted = true
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f.server.Unmount()
		if err == nil {
			f.server.Wait()
			return nil
		}
		if time.Now().After(deadline) {
			if derr := syscall.Unmount(f.mnt, syscall.MNT_DETACH); derr != nil {
				return fmt.Errorf("crashfs: unmounting %s: %v; detaching: %w", f.mnt, err, derr)
			}
			return fmt.Errorf("crashfs: %s was still busy after 10 s (%v); detached it", f.mnt, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// releaseAll closes every file and removes the scratch directory. Called
// with f.mu held (or before the mount).
func (f *FS) releaseAll() {
	for n := range f.inodes {
		n.release()
	}
	f.inodes = map[*inode]struct{}{}
	os.RemoveAll(f.scratch)
	os.RemoveAll(f.scratch + ".image")
}

func (n *inode) release() {
	if n.rd != nil {
		n.rd.Close()
		n.rd = nil
	}
	if n.copy != nil {
		n.copy.Close()
		os.Remove(n.copy.Name())
		n.copy = nil
	}
}

// materialize gives n its own durable copy before its backing file first
// changes. Called with f.mu held.
func (f *FS) materialize(n *inode) error {
	if !n.isFile() || n.copy != nil {
		return nil
	}
	c, err := os.OpenFile(filepath.Join(f.scratch, fmt.Sprint(n.id)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if n.pristine && n.rd != nil {
		if _, err := io.Copy(c, io.NewSectionReader(n.rd, 0, 1<<62)); err != nil {
			c.Close()
			return err
		}
	}
	st, err := c.Stat()
	if err != nil {
		c.Close()
		return err
	}
	n.copy, n.pristine, n.minSize = c, false, st.Size()
	return nil
}

// markDirty records that [off, off+size) of n changed.
func (f *FS) markDirty(n *inode, off, size int64) {
	for p := off / PageSize; p*PageSize < off+size; p++ {
		if _, ok := n.dirty[p]; !ok {
			f.order++
			n.dirty[p] = f.order
		}
	}
}

// truncated records that n's live size became size.
func (n *inode) truncated(size int64) {
	n.minSize = min(n.minSize, size)
}

// liveSize is the size of n's backing file now.
func (n *inode) liveSize() (int64, error) {
	st, err := n.rd.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// copyPage copies page p of n's backing file (what of it is below size) to
// its durable copy.
func (n *inode) copyPage(p, size int64, buf []byte) error {
	off := p * PageSize
	if off >= size {
		return nil
	}
	b := buf[:min(PageSize, size-off)]
	if _, err := n.rd.ReadAt(b, off); err != nil && err != io.EOF {
		return err
	}
	_, err := n.copy.WriteAt(b, off)
	return err
}

// fsyncFile is fsync/fdatasync of a file: its unsynced pages and its size
// reach the image, or, when the fault policy says so, the pages are dropped
// and the call fails with EIO.
func (f *FS) fsyncFile(n *inode, datasync bool) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return syscall.EIO
	}
	call := Fsync{Path: n.path, Datasync: datasync, Count: n.syncs, Pages: len(n.dirty)}
	n.syncs++
	if f.opts.FailFsync != nil && f.opts.FailFsync(call) {
		f.faults = append(f.faults, call)
		f.stats.FailedFsyncs++
		f.stats.DroppedPages += len(n.dirty)
		clear(n.dirty)
		return syscall.EIO
	}
	f.stats.Fsyncs++
	if n.copy == nil || n.rd == nil { // pristine: nothing changed since the mount
		return 0
	}
	size, err := n.liveSize()
	if err != nil {
		return fs.ToErrno(err)
	}
	if err := n.copy.Truncate(min(n.minSize, size)); err != nil {
		return fs.ToErrno(err)
	}
	if err := n.copy.Truncate(size); err != nil {
		return fs.ToErrno(err)
	}
	buf := make([]byte, PageSize)
	for p := range n.dirty {
		if err := n.copyPage(p, size, buf); err != nil {
			return fs.ToErrno(err)
		}
	}
	clear(n.dirty)
	n.minSize = size
	return 0
}

// fsyncDir is fsync of a directory: its entries as they are now reach the
// image, or, when the fault policy says so, nothing changes and the call
// fails with EIO.
func (f *FS) fsyncDir(n *inode) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return syscall.EIO
	}
	call := Fsync{Path: n.path, Dir: true, Count: n.syncs}
	n.syncs++
	if f.opts.FailFsync != nil && f.opts.FailFsync(call) {
		f.faults = append(f.faults, call)
		f.stats.FailedFsyncs++
		return syscall.EIO
	}
	f.stats.DirFsyncs++
	n.durable = maps.Clone(n.live)
	f.collect()
	return 0
}

// collect forgets the inodes no directory names, live or durable, and no
// handle holds open. Called with f.mu held.
func (f *FS) collect() {
	reach := map[*inode]bool{}
	var walk func(n *inode)
	walk = func(n *inode) {
		if reach[n] {
			return
		}
		reach[n] = true
		for _, c := range n.live {
			walk(c)
		}
		for _, c := range n.durable {
			walk(c)
		}
	}
	walk(f.root)
	for n := range f.inodes {
		if n.open > 0 {
			walk(n)
		}
	}
	for n := range f.inodes {
		if !reach[n] {
			n.release()
			delete(f.inodes, n)
		}
	}
}

// setPaths renames n (and what a directory holds) to p, for Fsync.Path.
func setPaths(n *inode, p string, depth int) {
	n.path = p
	if depth > 64 {
		return
	}
	for name, c := range n.live {
		setPaths(c, path(p, name), depth+1)
	}
}

// imageWriter writes the durable tree out at power-off.
type imageWriter struct {
	f       *FS
	rng     *rand.Rand
	written map[*inode]string // files already written: a second name links
}

func (w *imageWriter) dir(n *inode, out string) error {
	names := make([]string, 0, len(n.durable))
	for name := range n.durable {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := n.durable[name]
		p := filepath.Join(out, name)
		if prev, ok := w.written[c]; ok {
			if c.isDir() {
				continue // a directory renamed without fsyncing the old parent: keep the first
			}
			if err := os.Link(prev, p); err != nil {
				return err
			}
			continue
		}
		w.written[c] = p
		perm := c.mode & 0o7777
		switch c.mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if err := os.Mkdir(p, os.FileMode(perm)); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(perm)|modeBits(perm)); err != nil {
				return err
			}
			if err := w.dir(c, p); err != nil {
				return err
			}
		case syscall.S_IFREG:
			if err := w.file(c, p); err != nil {
				return err
			}
		case syscall.S_IFLNK:
			if err := os.Symlink(c.link, p); err != nil {
				return err
			}
		default:
			if err := unix.Mknod(p, c.mode, int(c.rdev)); err != nil {
				return err
			}
		}
	}
	return nil
}

// modeBits turns setuid/setgid/sticky permission bits into os.FileMode's.
func modeBits(perm uint32) os.FileMode {
	var m os.FileMode
	if perm&syscall.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if perm&syscall.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if perm&syscall.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

// file writes n's durable content, with torn pages if asked for.
func (w *imageWriter) file(n *inode, p string) error {
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(n.mode&0o777))
	if err != nil {
		return err
	}
	defer out.Close()
	if n.copy == nil { // pristine
		if n.rd == nil {
			return nil
		}
		_, err := io.Copy(out, io.NewSectionReader(n.rd, 0, 1<<62))
		return err
	}
	if err := w.tear(n); err != nil {
		return err
	}
	_, err = io.Copy(out, io.NewSectionReader(n.copy, 0, 1<<62))
	return err
}

// tear lets some of n's unsynced pages reach its durable copy, per
// Options.Torn.
func (w *imageWriter) tear(n *inode) error {
	f := w.f
	if f.opts.Torn == TornNone || n.rd == nil {
		f.stats.LostPages += len(n.dirty)
		return nil
	}
	pages := make([]int64, 0, len(n.dirty))
	for p := range n.dirty {
		pages = append(pages, p)
	}
	sort.Slice(pages, func(i, j int) bool { return n.dirty[pages[i]] < n.dirty[pages[j]] })
	var chosen []int64
	switch f.opts.Torn {
	case TornPrefix:
		chosen = pages[:w.rng.IntN(len(pages)+1)]
	case TornSubset:
		for _, p := range pages {
			if w.rng.IntN(2) == 0 {
				chosen = append(chosen, p)
			}
		}
	}
	size, err := n.liveSize()
	if err != nil {
		return err
	}
	st, err := n.copy.Stat()
	if err != nil {
		return err
	}
	if n.minSize < st.Size() && w.rng.IntN(2) == 0 { // the truncation reached the disk
		if err := n.copy.Truncate(n.minSize); err != nil {
			return err
		}
	}
	buf := make([]byte, PageSize)
	for _, p := range chosen {
		if err := n.copyPage(p, size, buf); err != nil {
			return err
		}
	}
	if st, err = n.copy.Stat(); err != nil {
		return err
	}
	if size > st.Size() && w.rng.IntN(2) == 0 { // the new size reached the disk, not the data
		if err := n.copy.Truncate(size); err != nil {
			return err
		}
	}
	f.stats.TornPages += len(chosen)
	f.stats.LostPages += len(pages) - len(chosen)
	return nil
}

// FailRandom returns an Options.FailFsync policy that fails each fsync with
// probability p, drawn from a generator seeded with seed. Directories fail
// too unless filesOnly.
func FailRandom(seed uint64, p float64, filesOnly bool) func(Fsync) bool {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	return func(c Fsync) bool {
		if filesOnly && c.Dir {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < p
	}
}

// FailMatching returns an Options.FailFsync policy that fails the first n
// fsyncs match accepts (every one when n <= 0).
func FailMatching(match func(Fsync) bool, n int) func(Fsync) bool {
	var mu sync.Mutex
	failed := 0
	return func(c Fsync) bool {
		if !match(c) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if n > 0 && failed >= n {
			return false
		}
		failed++
		return true
	}
}

// Describe renders the fsyncs a test injected failures into, for a failure
// message.
func Describe(faults []Fsync) string {
	if len(faults) == 0 {
		return "no injected fsync failures"
	}
	var b strings.Builder
	for i, c := range faults {
		if i > 0 {
			b.WriteString(", ")
		}
		kind := "fsync"
		if c.Datasync {
			kind = "fdatasync"
		}
		if c.Dir {
			kind = "dir fsync"
		}
		fmt.Fprintf(&b, "%s %q #%d (%d pages)", kind, "/"+c.Path, c.Count+1, c.Pages)
	}
	return b.String()
}
