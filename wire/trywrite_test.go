//go:build unix

package wire

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

// TestTryWriteFrame: into a pipe with room a small frame is written whole
// and reads back; into a full pipe nothing is written and the stream stays
// whole; big frames, non-pipes and a Writer busy with another frame are
// refused (the caller writes those the usual way).
func TestTryWriteFrame(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fw := NewWriter(w, 0)
	if !fw.TryWriteFrame([]byte("ack-1")) {
		t.Fatal("a small frame into an empty pipe was not written")
	}
	fr := NewReader(r, 0)
	if got, err := fr.ReadFrame(); err != nil || string(got) != "ack-1" {
		t.Fatalf("read %q, %v", got, err)
	}
	if fw.TryWriteFrame(bytes.Repeat([]byte{'x'}, PipeAtomicMax)) {
		t.Fatal("a frame over PIPE_BUF was written by TryWriteFrame")
	}

	// Fill the pipe to the last byte, then try: refused, nothing written.
	fill := bytes.Repeat([]byte{'f'}, 1<<10)
	filled := 0
	for {
		n, err := syscall.Write(int(fdOf(t, w)), fill)
		if err == syscall.EAGAIN {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		filled += n
	}
	if fw.TryWriteFrame([]byte("ack-2")) {
		t.Fatal("TryWriteFrame reported a write into a full pipe")
	}
	drained := make([]byte, filled)
	if n, err := ioReadFull(r, drained); err != nil || n != filled {
		t.Fatalf("drained %d of %d: %v", n, filled, err)
	}
	// Nothing of the refused frame is in the pipe: the next frame is next.
	if !fw.TryWriteFrame([]byte("ack-3")) {
		t.Fatal("refused into an empty pipe")
	}
	if got, err := fr.ReadFrame(); err != nil || string(got) != "ack-3" {
		t.Fatalf("after a refused try, read %q, %v (a torn frame?)", got, err)
	}

	// Busy: another write holds the Writer.
	fw.mu.Lock()
	ok := fw.TryWriteFrame([]byte("ack-4"))
	fw.mu.Unlock()
	if ok {
		t.Fatal("written while another frame was being written")
	}

	// Not a pipe.
	if NewWriter(&bytes.Buffer{}, 0).TryWriteFrame([]byte("x")) {
		t.Fatal("written to a bytes.Buffer")
	}
	f, err := os.Create(t.TempDir() + "/file")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if NewWriter(f, 0).TryWriteFrame([]byte("x")) {
		t.Fatal("written to a regular file")
	}
}

func fdOf(t *testing.T, f *os.File) uintptr {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := rc.Control(func(x uintptr) { fd = x }); err != nil {
		t.Fatal(err)
	}
	return fd
}

func ioReadFull(r *os.File, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
