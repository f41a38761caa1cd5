package wal

import (
	"bytes"
	"context"
	"testing"
)

// Append fills fixed-size buffers instead of growing one (growing copies it
// into fresh memory on the appender's goroutine), and a flood leaves at most
// maxFreeBufs of them behind; every entry still reads back.
func TestAppendBuffersStayBounded(t *testing.T) {
	l, err := Open(Options{Dir: t.TempDir(), Sync: SyncBatch, NoPreallocate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	data := bytes.Repeat([]byte{0xab}, 1000)
	const n = 20000 // ~20 MiB: many buffers' worth
	for seq := uint64(1); seq <= n; seq++ {
		if _, err := l.Append(Entry{Sequence: seq, Data: data}); err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		for i, b := range l.pending {
			if cap(b.buf) != batchBufSize {
				t.Fatalf("pending buffer %d has capacity %d, want %d", i, cap(b.buf), batchBufSize)
			}
		}
		l.mu.Unlock()
	}
	if err := l.WaitDurable(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	free := len(l.free)
	l.mu.Unlock()
	if free > maxFreeBufs {
		t.Fatalf("%d free buffers kept after the flood, want at most %d", free, maxFreeBufs)
	}
	got := 0
	if err := l.ReadAfter(0, func(e Entry) error {
		got++
		if !bytes.Equal(e.Data, data) {
			t.Fatalf("entry %d reads back different bytes", e.Sequence)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("read back %d entries, want %d", got, n)
	}
}

// A record larger than a buffer gets a buffer of its own, which is not kept.
func TestAppendRecordLargerThanABuffer(t *testing.T) {
	l, err := Open(Options{Dir: t.TempDir(), Sync: SyncAlways, NoPreallocate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	big := bytes.Repeat([]byte{1}, 2*batchBufSize)
	if _, err := l.Append(Entry{Sequence: 1, Data: []byte("small")}, Entry{Sequence: 2, Data: big}); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	for _, b := range l.free {
		if cap(b.buf) != batchBufSize {
			t.Errorf("a buffer of %d bytes was kept for reuse", cap(b.buf))
		}
	}
	l.mu.Unlock()
	var sizes []int
	if err := l.ReadAfter(0, func(e Entry) error { sizes = append(sizes, len(e.Data)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 2 || sizes[1] != len(big) {
		t.Fatalf("read back sizes %v", sizes)
	}
}
