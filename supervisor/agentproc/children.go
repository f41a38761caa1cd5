package agentproc

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"golang.org/x/sys/unix"
)

// A childLister reads the process tree from /proc with buffers it keeps
// between calls. The reaper's sweep runs every reaperSweep for the
// supervisor's whole life, and an idle supervisor's heap is mostly what it
// allocated since the last collection: with filepath.Glob and os.ReadFile
// each sweep allocated some 45 KB (a directory buffer, a file and a read
// buffer per thread), half of an idle supervisor's allocations (issue 31:
// idle under 15 MiB). One lister is used by one goroutine at a time; the
// zero value is ready.
type childLister struct {
	dents []byte // getdents64 records of a task directory
	buf   []byte // one children or stat file
	queue []int  // descendants' breadth-first queue
	own   []int  // reapOrphans: this process's children
	tree  []int  // trackDescendants: an agent's descendants
}

// children appends to out the children of pid (0: this process): every
// thread's /proc/PID/task/TID/children. A process that is gone, or whose
// tree cannot be read, has none.
func (l *childLister) children(out []int, pid int) []int {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return out
	}
	defer unix.Close(fd)
	if l.dents == nil {
		l.dents = make([]byte, 4096)
	}
	for {
		n, err := unix.Getdents(fd, l.dents)
		if err != nil || n <= 0 {
			return out
		}
		// linux_dirent64: d_ino u64, d_off s64, d_reclen u16, d_type u8,
		// then the NUL-terminated name.
		for b := l.dents[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return out
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if isDigits(name) {
				if l.read(fd, string(name)+"/children") {
					out = parsePids(out, l.buf)
				}
			}
			b = b[reclen:]
		}
	}
}

// descendants appends to out the whole process tree below pid (not pid
// itself), breadth first, at most 1<<16 of them.
func (l *childLister) descendants(out []int, pid int) []int {
	start := len(out)
	l.queue = append(l.queue[:0], pid)
	for i := 0; i < len(l.queue) && len(out)-start < 1<<16; i++ {
		n := len(out)
		out = l.children(out, l.queue[i])
		l.queue = append(l.queue, out[n:]...)
	}
	return out
}

// startTime returns the start time of pid (clock ticks after boot, the
// 22nd field of /proc/PID/stat); ok false when it is gone.
func (l *childLister) startTime(pid int) (uint64, bool) {
	if !l.read(unix.AT_FDCWD, "/proc/"+strconv.Itoa(pid)+"/stat") {
		return 0, false
	}
	return parseStartTime(l.buf)
}

// read reads the file at path (relative to the directory dirfd) into
// l.buf, whole. (The path's string is the one allocation left: a few dozen
// bytes.)
func (l *childLister) read(dirfd int, path string) bool {
	fd, err := unix.Openat(dirfd, path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if l.buf == nil {
		l.buf = make([]byte, 0, 512) // a stat line; a long children file grows it
	}
	l.buf = l.buf[:0]
	for {
		if len(l.buf) == cap(l.buf) {
			l.buf = append(l.buf, 0)[:len(l.buf)]
		}
		n, err := unix.Read(fd, l.buf[len(l.buf):cap(l.buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		if n == 0 {
			return true
		}
		l.buf = l.buf[:len(l.buf)+n]
	}
}

func isDigits(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parsePids appends the space-separated pids of a children file to out.
func parsePids(out []int, b []byte) []int {
	for len(b) > 0 {
		i := bytes.IndexAny(b, " \n")
		if i < 0 {
			i = len(b)
		}
		if n, ok := parseUint(b[:i]); ok && n <= 1<<31 {
			out = append(out, int(n))
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}

// parseStartTime reads the start time (field 22) of a /proc/PID/stat line.
func parseStartTime(b []byte) (uint64, bool) { return parseUint(statField(b, 22)) }

// statField returns field n (numbered as in proc(5), from 3) of a
// /proc/PID/stat line, nil when it has fewer. The command (field 2) may
// hold spaces and parentheses, so fields are counted after its last ')'.
func statField(b []byte, n int) []byte {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || n < 3 {
		return nil
	}
	b = b[i+1:]
	for field := 3; ; field++ {
		for len(b) > 0 && b[0] == ' ' {
			b = b[1:]
		}
		end := bytes.IndexAny(b, " \n")
		if end < 0 {
			end = len(b)
		}
		if end == 0 {
			return nil
		}
		if field == n {
			return b[:end]
		}
		b = b[end:]
	}
}

// parseUint parses a decimal number without a string: strconv would need
// one made of the bytes.
func parseUint(b []byte) (uint64, bool) {
	if !isDigits(b) || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		n = n*10 + uint64(c-'0')
	}
	return n, true
}
