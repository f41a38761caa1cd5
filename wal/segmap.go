package wal

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// A segment is read through a read-only memory mapping of the file, a
// window of mapWindow bytes at a time, rather than with pread into a
// buffer and a copy out of it. Recovery's verified scan computes the
// records' checksums on the page cache itself, with no copy at all; a read
// whose entries go to a caller (a restore's frame writer, say) copies each
// payload out of the mapping once and checks the copy, so the caller sees
// exactly the bytes that were checked (recordReader.views). A window is
// unmapped when the reader moves past it, so the pages it holds count
// towards the process's resident memory only while they are read.
//
// A file cut shorter under a mapping (TruncateAfter, which may run while a
// restore streams; or a person with a shell) makes a read past its new end
// fault (SIGBUS) instead of returning short. Every function that reads
// through a mapping therefore runs under trapFaults, which turns such a
// fault into errMapFault for that goroutine, and the read ends as a short
// read would have: the caller asks whether the segment shrank.
const mapWindow = 4 << 20

// errMapFault: a mapped segment's bytes could not be read, because the file
// is now shorter than when it was mapped (or the disk failed under the page
// cache).
var errMapFault = errors.New("wal: a segment file's mapped bytes could not be read (the file was cut shorter while it was read, or the disk failed); read again, and if it repeats check the disk (dmesg) and the log (supervisor wal dump)")

var pageSize = int64(os.Getpagesize())

// mmap is unix.Mmap; tests make it fail to take the pread path.
var mmap = unix.Mmap

// segMap is the current window of a segment's mapping.
type segMap struct {
	f     *os.File
	limit int64  // bytes of the file that may be read
	off   int64  // file offset of win[0]
	win   []byte // the mapped window; nil before the first view
}

// view returns the n bytes at file offset off, valid until the next view
// or close. off+n must not pass limit. An error means the file cannot be
// mapped (a filesystem without mmap): the caller reads it with pread.
func (m *segMap) view(off int64, n int) ([]byte, error) {
	end := off + int64(n)
	if m.win != nil && off >= m.off && end <= m.off+int64(len(m.win)) {
		return m.win[off-m.off : end-m.off], nil
	}
	m.close()
	start := off &^ (pageSize - 1)
	length := min(max(mapWindow, end-start), m.limit-start)
	if length <= 0 || int64(int(length)) != length {
		return nil, fmt.Errorf("wal: cannot map %d bytes at offset %d", length, start)
	}
	win, err := mmap(int(m.f.Fd()), start, int(length), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("wal: map segment bytes at offset %d: %w", start, err)
	}
	// Read front to back: the kernel reads ahead of the faults when the
	// pages are not cached, and drops them behind.
	_ = unix.Madvise(win, unix.MADV_SEQUENTIAL)
	m.win, m.off = win, start
	return win[off-start : end-start], nil
}

// close unmaps the current window.
func (m *segMap) close() {
	if m.win != nil {
		_ = unix.Munmap(m.win)
		m.win = nil
	}
}

// trapFaults makes a memory fault of the calling goroutine, until the
// returned function runs, a panic it recovers as errMapFault (stored in
// *err) instead of a crash of the process. Use it as
//
//	defer trapFaults(name)(&err)
//
// in a function that reads through a segMap (the fault may come from the
// caller's callback too, touching an entry's bytes). Other panics go on.
func trapFaults(segment string) func(*error) {
	old := debug.SetPanicOnFault(true)
	return func(err *error) {
		r := recover()
		debug.SetPanicOnFault(old)
		if r == nil {
			return
		}
		if re, ok := r.(runtime.Error); ok {
			if fault, ok := re.(interface{ Addr() uintptr }); ok {
				*err = fmt.Errorf("%w: segment %s, fault at address %#x", errMapFault, segment, fault.Addr())
				return
			}
		}
		panic(r)
	}
}
