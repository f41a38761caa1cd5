package requests

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// fileIdentity names one file of the journal: a compaction replaces the
// file (rename), and the new one has another identity. It holds the
// *os.File the journal wrote through: while a caller keeps the identity, no
// other file can be given the same one (the pointer is not reused, unlike an
// inode number once the file is deleted); dev and ino say which file it was.
type fileIdentity struct {
	f        *os.File
	dev, ino uint64
}

// SnapshotFrom returns the journal's durable bytes from off on — every
// record fsynced, never one being written — when file is the identity of
// the journal's current file (as an earlier SnapshotFrom returned it) and
// off is at most its durable size: then [0, off) is what the caller read
// before (between two compactions the durable prefix only grows). Otherwise
// (file nil, or the file was replaced by a compaction) it returns all of
// them, from 0. from is the offset of b; cur is the current file's identity
// (comparable with ==), v the version of the bytes.
//
// Like Snapshot it reads through a duplicate of the file's descriptor taken
// with the durable size, so a compaction meanwhile changes nothing read, and
// never reads beyond the durable size (the file may be longer).
func (j *Journal) SnapshotFrom(file any, off int64) (b []byte, from int64, v uint64, cur any, err error) {
	j.mu.Lock()
	fd, err := unix.Dup(int(j.f.Fd()))
	size, v, jf := j.size, j.version, j.f
	j.mu.Unlock()
	if err != nil {
		return nil, 0, 0, nil, fmt.Errorf("duplicate the request journal's descriptor: %w", err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(j.dir, FileName))
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, 0, nil, fmt.Errorf("stat the request journal: %w", err)
	}
	id := fileIdentity{f: jf, dev: uint64(st.Dev), ino: uint64(st.Ino)}
	if prev, ok := file.(fileIdentity); ok && prev == id && off >= 0 && off <= size {
		from = off
	}
	b = make([]byte, size-from)
	if _, err := f.ReadAt(b, from); err != nil {
		return nil, 0, 0, nil, fmt.Errorf("read the request journal: %w", err)
	}
	return b, from, v, id, nil
}
