package logging

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// blockingWriter blocks every Write until released.
type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func TestStalledOutputNeverBlocks(t *testing.T) {
	out := &blockingWriter{release: make(chan struct{})}
	log, a := New(out, Options{BufferBytes: 4 << 10})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 10_000 {
			log.Info("record", "i", i)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("logging blocked on a stalled output")
	}
	if a.Dropped() == 0 {
		t.Fatal("nothing dropped with a stalled output")
	}
	if a.Buffered() > 4<<10 {
		t.Fatalf("%d bytes buffered, cap 4 KiB", a.Buffered())
	}
	close(out.release)
	if !a.Close(5 * time.Second) {
		t.Fatal("buffered records not written after the output resumed")
	}
	if !strings.Contains(out.buf.String(), "record") {
		t.Fatal("nothing written")
	}
}

func TestLongValuesClipped(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(&buf, Options{MaxValue: 100}))
	log.Info("x", "key", strings.Repeat("k", 1<<20), "err", os.ErrNotExist)
	if buf.Len() > 400 {
		t.Fatalf("record of %d bytes", buf.Len())
	}
	if !strings.Contains(buf.String(), "1048576 bytes") {
		t.Fatalf("cut value does not say its length: %s", buf.String())
	}
}

func TestCloseWithStalledOutputReturns(t *testing.T) {
	out := &blockingWriter{release: make(chan struct{})}
	log, a := New(out, Options{})
	log.Info("stuck")
	if a.Close(50 * time.Millisecond) {
		t.Fatal("Close reported the record written")
	}
	close(out.release)
}
