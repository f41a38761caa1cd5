//go:build unix

package wire

import (
	"syscall"
)

// findPipe records the destination's raw descriptor if it is a pipe (a
// FIFO) in non-blocking mode: the only kind TryWriteFrame writes to.
func (w *Writer) findPipe() {
	sc, ok := w.w.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	isPipe := false
	if err := rc.Control(func(fd uintptr) {
		var st syscall.Stat_t
		if syscall.Fstat(int(fd), &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			return
		}
		fl, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
		isPipe = errno == 0 && fl&syscall.O_NONBLOCK != 0
	}); err != nil || !isPipe {
		return
	}
	w.pipe = rc
}

// tryWrite makes one non-blocking write of frame (at most PIPE_BUF bytes, so
// all of it or nothing) and reports whether it was written.
func tryWrite(rc syscall.RawConn, frame []byte) bool {
	n := 0
	err := rc.Write(func(fd uintptr) bool {
		n, _ = syscall.Write(int(fd), frame)
		return true // never wait for the pipe: the caller writes it the usual way
	})
	if err != nil || n <= 0 {
		return false
	}
	for n < len(frame) {
		// POSIX makes a write of up to PIPE_BUF bytes to a pipe all or
		// nothing, so this does not happen; if it did, the rest must follow
		// at once, waiting for room, or the stream would be torn.
		var werr error
		err = rc.Write(func(fd uintptr) bool {
			var m int
			m, werr = syscall.Write(int(fd), frame[n:])
			if werr == syscall.EAGAIN {
				return false // wait for room
			}
			if m > 0 {
				n += m
			}
			return true
		})
		if err != nil || (werr != nil && werr != syscall.EINTR) {
			return true // the pipe is broken; the writer's next write reports it
		}
	}
	return true
}
