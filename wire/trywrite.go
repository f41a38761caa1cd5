package wire

// PipeAtomicMax is the largest frame (header included) TryWriteFrame
// writes: POSIX's PIPE_BUF, up to which a write to a pipe is all or nothing.
const PipeAtomicMax = 4096

// TryWriteFrame writes payload as one frame at once if that cannot block:
// the Writer's destination is a pipe, the frame (header included) is at most
// PipeAtomicMax bytes, the pipe has room for it, and no other write is under
// way. It reports whether the frame was written; false leaves the stream as
// it was (nothing of the frame was written), and the caller writes it the
// usual way. A frame written here never interleaves with another: it takes
// the Writer's lock, without waiting for it.
//
// It lets a goroutine that must not block (the WAL's syncer answering with
// a wal_ack) write a small frame itself instead of handing it to a writer
// goroutine, which costs a wake-up (issue 31).
func (w *Writer) TryWriteFrame(payload []byte) bool {
	if len(payload) == 0 || len(payload)+HeaderSize > PipeAtomicMax {
		return false
	}
	if !w.mu.TryLock() {
		return false
	}
	defer w.mu.Unlock()
	if w.err != nil {
		return false
	}
	w.directOnce.Do(w.findPipe)
	if w.pipe == nil {
		return false
	}
	var buf [PipeAtomicMax]byte
	frame := AppendFrame(buf[:0], payload)
	return tryWrite(w.pipe, frame)
}
