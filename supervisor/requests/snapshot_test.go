package requests

import (
	"bytes"
	"testing"
	"time"
)

// TestJournalSnapshotFrom: the bytes after an offset of the same file are
// the durable bytes appended since (what the replica uploads as a delta);
// after a compaction replaced the file the identity differs and the whole
// new file is returned, from 0.
func TestJournalSnapshotFrom(t *testing.T) {
	j, _, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	keep := &Record{Kind: KindAccepted, ID: "a", Body: []byte(`{"message":"x"}`)}
	j.Start(func() []*Record { return []*Record{keep} }, nil)
	defer j.Close()
	if err := j.Append(keep).Wait(); err != nil {
		t.Fatal(err)
	}
	b1, from, _, id1, err := j.SnapshotFrom(nil, 0)
	if err != nil || from != 0 || len(b1) == 0 {
		t.Fatalf("first: %d bytes from %d, %v", len(b1), from, err)
	}
	if err := j.Append(&Record{Kind: KindAccepted, ID: "b", Body: []byte(`{}`)}).Wait(); err != nil {
		t.Fatal(err)
	}
	d, from, _, id2, err := j.SnapshotFrom(id1, int64(len(b1)))
	if err != nil || id2 != id1 || from != int64(len(b1)) || len(d) == 0 {
		t.Fatalf("after an append: %d bytes from %d (same file %v), %v", len(d), from, id2 == id1, err)
	}
	whole, _, _ := j.Snapshot()
	if !bytes.Equal(append(append([]byte{}, b1...), d...), whole) {
		t.Fatal("first read + delta differ from the durable bytes")
	}
	if b, from, _, _, _ := j.SnapshotFrom(id1, int64(len(whole))+1); from != 0 || !bytes.Equal(b, whole) {
		t.Fatalf("an offset past the durable size: from %d, %d bytes; want everything", from, len(b))
	}
	v := j.Version()
	j.Compact()
	for j.Version() <= v {
		time.Sleep(time.Millisecond)
	}
	c, from, _, id3, err := j.SnapshotFrom(id2, int64(len(whole)))
	if err != nil || id3 == id2 || from != 0 {
		t.Fatalf("after a compaction: from %d, new identity %v, %v", from, id3 != id2, err)
	}
	compacted, _, _ := j.Snapshot()
	if !bytes.Equal(c, compacted) {
		t.Fatal("after a compaction: not the compacted file")
	}
}
