package crashfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is the FUSE side of an inode: go-fuse's loopback, with every call
// that changes the namespace or a file's content also applied to the model
// under FS.mu, and fsync answered from the model. Files are served through
// handle (never passthrough, so every write is seen).
type node struct {
	fs.LoopbackNode
	fsys *FS
	m    *inode
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
)

func (f *FS) newNode(m *inode) *node {
	return &node{LoopbackNode: fs.LoopbackNode{RootData: f.rootData}, fsys: f, m: m}
}

// backingPath is n's path in the backing directory (ENOENT once it is in
// no directory).
func (n *node) backingPath() (string, syscall.Errno) {
	root := n.fsys.rootData.RootNode.EmbeddedInode()
	if n.EmbeddedInode() == root {
		return n.fsys.backing, 0
	}
	rel := n.Path(root)
	if rel == "" {
		return "", syscall.ENOENT
	}
	return filepath.Join(n.fsys.backing, rel), 0
}

// child is the backing path of name in directory n, with the checks every
// change makes: the power is on and n is modelled. Called with FS.mu held.
func (n *node) child(name string, change bool) (string, syscall.Errno) {
	if change && n.fsys.cut {
		return "", syscall.EIO
	}
	if n.m == nil || !n.m.isDir() {
		return "", syscall.EIO
	}
	dir, errno := n.backingPath()
	if errno != 0 {
		return "", errno
	}
	return filepath.Join(dir, name), 0
}

// stat returns what the kernel is told about the backing file at p and its
// identity: inode number and birth time, so a reused inode number is a new
// node.
func (f *FS) stat(p string) (syscall.Stat_t, fs.StableAttr, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return st, fs.StableAttr{}, fs.ToErrno(err)
	}
	gen := uint64(1)
	var x unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &x) == nil && x.Mask&unix.STATX_BTIME != 0 {
		gen = uint64(x.Btime.Sec)*1e9 + uint64(x.Btime.Nsec)
	}
	swapped := (uint64(st.Dev) << 32) | (uint64(st.Dev) >> 32)
	rootDev := (f.rootData.Dev << 32) | (f.rootData.Dev >> 32)
	return st, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Gen: gen, Ino: (swapped ^ rootDev) ^ st.Ino}, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, false)
	if errno != 0 {
		return nil, errno
	}
	c := n.m.live[name]
	if c == nil {
		return nil, syscall.ENOENT
	}
	st, id, errno := f.stat(p)
	if errno != 0 {
		return nil, errno
	}
	out.Attr.FromStat(&st)
	return n.NewInode(ctx, f.newNode(c), id), 0
}

// added models a new entry name → the backing file at p, fills out and
// returns the kernel's inode. Called with FS.mu held.
func (n *node) added(ctx context.Context, name, p string, c *inode, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	st, id, errno := f.stat(p)
	if errno != 0 {
		return nil, errno
	}
	if c == nil {
		c = f.newInode(st.Mode, path(n.m.path, name))
		c.rdev = uint64(st.Rdev)
	}
	n.m.live[name] = c
	out.Attr.FromStat(&st)
	return n.NewInode(ctx, f.newNode(c), id), 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	c := n.m.live[name]
	if c != nil && c.isFile() && flags&syscall.O_TRUNC != 0 {
		if err := f.materialize(c); err != nil {
			return nil, nil, 0, fs.ToErrno(err)
		}
	}
	file, err := os.OpenFile(p, int(flags&^syscall.O_APPEND)|os.O_CREATE|syscall.O_NOFOLLOW, os.FileMode(mode&0o777))
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	if c == nil {
		st, _, errno := f.stat(p)
		if errno != 0 {
			file.Close()
			return nil, nil, 0, errno
		}
		c = f.newInode(st.Mode, path(n.m.path, name))
		if c.rd, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0); err == nil {
			err = f.materialize(c)
		}
		if err != nil {
			file.Close()
			return nil, nil, 0, fs.ToErrno(err)
		}
	} else if flags&syscall.O_TRUNC != 0 && c.isFile() {
		c.truncated(0)
	}
	ch, errno := n.added(ctx, name, p, c, out)
	if errno != 0 {
		file.Close()
		return nil, nil, 0, errno
	}
	c.open++
	return ch, &handle{lf: fs.NewLoopbackFileFromOS(file), n: c, fsys: f}, 0, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	if n.m == nil {
		return nil, 0, syscall.EIO
	}
	trunc := flags&syscall.O_TRUNC != 0 && n.m.isFile()
	if trunc {
		if f.cut {
			return nil, 0, syscall.EIO
		}
		if err := f.materialize(n.m); err != nil {
			return nil, 0, fs.ToErrno(err)
		}
	}
	p, errno := n.backingPath()
	if errno != 0 {
		return nil, 0, errno
	}
	file, err := os.OpenFile(p, int(flags&^(syscall.O_APPEND|fuse.FMODE_EXEC))|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	if trunc {
		n.m.truncated(0)
	}
	n.m.open++
	return &handle{lf: fs.NewLoopbackFileFromOS(file), n: n.m, fsys: f}, 0, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return nil, errno
	}
	if err := syscall.Mkdir(p, mode&0o7777); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.added(ctx, name, p, nil, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return nil, errno
	}
	if mode&syscall.S_IFMT == syscall.S_IFREG {
		return nil, syscall.EOPNOTSUPP // regular files come through Create
	}
	if err := syscall.Mknod(p, mode, int(rdev)); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.added(ctx, name, p, nil, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return nil, errno
	}
	if err := syscall.Symlink(target, p); err != nil {
		return nil, fs.ToErrno(err)
	}
	ch, errno := n.added(ctx, name, p, nil, out)
	if errno == 0 {
		n.m.live[name].link = target
	}
	return ch, errno
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	t, ok := target.(*node)
	if !ok || t.fsys != f {
		return nil, syscall.EXDEV
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return nil, errno
	}
	if t.m == nil {
		return nil, syscall.EIO
	}
	tp, errno := t.backingPath()
	if errno != 0 {
		return nil, errno
	}
	if err := syscall.Link(tp, p); err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.added(ctx, name, p, t.m, out)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := n.fsys
	np, ok := newParent.(*node)
	if !ok || np.fsys != f {
		return syscall.EXDEV
	}
	if flags&unix.RENAME_WHITEOUT != 0 {
		return syscall.EINVAL
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p1, errno := n.child(name, true)
	if errno != 0 {
		return errno
	}
	p2, errno := np.child(newName, true)
	if errno != 0 {
		return errno
	}
	if flags == 0 {
		if err := syscall.Rename(p1, p2); err != nil {
			return fs.ToErrno(err)
		}
	} else if err := unix.Renameat2(unix.AT_FDCWD, p1, unix.AT_FDCWD, p2, uint(flags)); err != nil {
		return fs.ToErrno(err)
	}
	src, dst := n.m.live[name], np.m.live[newName]
	if flags&unix.RENAME_EXCHANGE != 0 {
		n.m.live[name], np.m.live[newName] = dst, src
		setPaths(dst, path(n.m.path, name), 0)
	} else {
		delete(n.m.live, name)
		np.m.live[newName] = src
	}
	if src != nil {
		setPaths(src, path(np.m.path, newName), 0)
	}
	f.collect()
	return 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, syscall.Unlink)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(name, syscall.Rmdir)
}

func (n *node) remove(name string, rm func(string) error) syscall.Errno {
	f := n.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	p, errno := n.child(name, true)
	if errno != 0 {
		return errno
	}
	if err := rm(p); err != nil {
		return fs.ToErrno(err)
	}
	delete(n.m.live, name)
	f.collect()
	return 0
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f := n.fsys
	m := n.m
	var inner fs.FileHandle
	if h, ok := fh.(*handle); ok {
		m, inner = h.n, h.lf
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return syscall.EIO
	}
	size, hasSize := in.GetSize()
	file := hasSize && m != nil && m.isFile()
	if file {
		if err := f.materialize(m); err != nil {
			return fs.ToErrno(err)
		}
	}
	if errno := n.LoopbackNode.Setattr(ctx, inner, in, out); errno != 0 {
		return errno
	}
	if file {
		m.truncated(int64(size))
	}
	if mode, ok := in.GetMode(); ok && m != nil {
		m.mode = m.mode&syscall.S_IFMT | mode&0o7777
	}
	return 0
}

func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	m := n.m
	if h, ok := fh.(*handle); ok {
		m = h.n
	}
	switch {
	case m == nil:
		return syscall.EIO
	case m.isDir():
		return n.fsys.fsyncDir(m)
	case m.isFile():
		return n.fsys.fsyncFile(m, flags&1 != 0) // FUSE_FSYNC_FDATASYNC
	}
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p, errno := n.backingPath()
	if errno != 0 {
		return nil, 0, errno
	}
	ds, errno := fs.NewLoopbackDirStream(p)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{ds: ds}, 0, 0
}

// Tmpfile refuses O_TMPFILE: an unnamed file linked in later is not modelled.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// dirHandle reads a directory; it does not answer fsync itself, so FUSE
// sends directory fsyncs to node.Fsync.
type dirHandle struct{ ds fs.DirStream }

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
)

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if r, ok := d.ds.(fs.FileReaddirenter); ok {
		return r.Readdirent(ctx)
	}
	if !d.ds.HasNext() {
		return nil, 0
	}
	e, errno := d.ds.Next()
	return &e, errno
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.ds.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) { d.ds.Close() }

// handle is an open file: loopback I/O, with writes recorded as dirty pages
// and refused after the cut. It has no passthrough file descriptor, so the
// kernel sends every read and write here.
type handle struct {
	lf   *fs.LoopbackFile
	n    *inode
	fsys *FS
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileWritever  = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileStatxer   = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, buf, off)
}

// change applies do (a write or allocation at off) to the backing file and
// marks the pages it touched dirty.
func (h *handle) change(off int64, do func() (int64, syscall.Errno)) syscall.Errno {
	f := h.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return syscall.EIO
	}
	if err := f.materialize(h.n); err != nil {
		return fs.ToErrno(err)
	}
	n, errno := do()
	if n > 0 {
		f.markDirty(h.n, off, n)
		f.wrote()
	}
	return errno
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	var w uint32
	errno := h.change(off, func() (int64, syscall.Errno) {
		var errno syscall.Errno
		w, errno = h.lf.Write(ctx, data, off)
		return int64(w), errno
	})
	return w, errno
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var w uint32
	errno := h.change(off, func() (int64, syscall.Errno) {
		var errno syscall.Errno
		w, errno = h.lf.Writev(ctx, data, off)
		return int64(w), errno
	})
	return w, errno
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return h.change(int64(off), func() (int64, syscall.Errno) {
		if errno := h.lf.Allocate(ctx, off, size, mode); errno != 0 {
			return 0, errno
		}
		return int64(size), 0
	})
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.fsys.fsyncFile(h.n, flags&1 != 0)
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return h.lf.Flush(ctx) }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	errno := h.lf.Release(ctx)
	f := h.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	h.n.open--
	if h.n.open == 0 {
		f.collect()
	}
	return errno
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

func (h *handle) Statx(ctx context.Context, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return h.lf.Statx(ctx, flags, mask, out)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}
