package wal

import (
	"testing"
)

// A log created with StartAfter holds nothing at or below it: its Floor says
// so (a restore from a checkpoint below it is refused), the first entry
// above it is no gap, and a reopen keeps both. An existing log ignores it.
func TestStartAfter(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir, NoPreallocate: true, StartAfter: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if f, last := l.Floor(), l.LastSequence(); f != 1000 || last != 1000 {
		t.Fatalf("new log: Floor %d, LastSequence %d; want 1000, 1000", f, last)
	}
	res, err := l.Append(Entry{Sequence: 1001, Data: []byte("a")}, Entry{Sequence: 1002, Data: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Gaps) != 0 {
		t.Fatalf("gaps %v: the first entry above StartAfter is no gap", res.Gaps)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(Options{Dir: dir, NoPreallocate: true, StartAfter: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if f, last := l.Floor(), l.LastSequence(); f != 1000 || last != 1002 {
		t.Fatalf("reopened: Floor %d, LastSequence %d; want 1000, 1002", f, last)
	}
	var got []uint64
	if err := l.ReadAfter(0, func(e Entry) error { got = append(got, e.Sequence); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 1001 {
		t.Fatalf("entries %v", got)
	}
}
