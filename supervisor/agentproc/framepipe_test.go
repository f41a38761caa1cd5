package agentproc

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestFramePipeReadsUntilEOF: what the agent writes is read in order, in
// reads that wait for it; the last write end closing is io.EOF.
func TestFramePipeReadsUntilEOF(t *testing.T) {
	before := openFDs(t)
	p, w, err := newFramePipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for _, s := range []string{"one ", "two ", "three"} {
			time.Sleep(5 * time.Millisecond) // the reader waits in poll
			w.Write([]byte(s))
		}
		w.Close()
	}()
	got, err := io.ReadAll(p)
	if err != nil || string(got) != "one two three" {
		t.Fatalf("read %q, %v; want \"one two three\", nil (EOF)", got, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v, want os.ErrClosed", err)
	}
	if n := openFDs(t); n != before {
		t.Fatalf("%d descriptors open after close, %d before: the pipe or its eventfd leaked", n, before)
	}
}

// TestFramePipeCloseWakesABlockedRead: with the write end held open (an
// escaped grandchild keeps it), Close ends a Read waiting for data — the
// reader is never left behind — and both descriptors and the eventfd are
// released once it has returned.
func TestFramePipeCloseWakesABlockedRead(t *testing.T) {
	before := openFDs(t)
	p, w, err := newFramePipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan error, 1)
	go func() {
		_, err := p.Read(make([]byte, 64))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it block (the test holds either way)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("blocked read ended with %v, want os.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the blocked Read")
	}
	w.Close()
	if n := openFDs(t); n != before {
		t.Fatalf("%d descriptors open after close, %d before", n, before)
	}
}

// TestFramePipeCloseRacesRead: Close at any point of a Read in progress
// ends it, data or not, and leaks nothing (run with -race).
func TestFramePipeCloseRacesRead(t *testing.T) {
	before := openFDs(t)
	for i := range 200 {
		p, w, err := newFramePipe()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			b := make([]byte, 8)
			for {
				if _, err := p.Read(b); err != nil {
					return
				}
			}
		}()
		if i%2 == 0 {
			w.Write([]byte("x"))
		}
		if i%3 == 0 {
			time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
		}
		p.Close()
		<-done
		w.Close()
	}
	if n := openFDs(t); n != before {
		t.Fatalf("%d descriptors open after 200 pipes, %d before", n, before)
	}
}
