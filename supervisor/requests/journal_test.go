package requests

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestJournalSnapshot: a snapshot (what the replica uploads) is the durable
// bytes with their version; the version grows with each write and with a
// compaction, and a snapshot after a compaction is the compacted file —
// records only, readable as a journal.
func TestJournalSnapshot(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	keep := &Record{Kind: KindAccepted, ID: "a", Body: []byte(`{"message":"x"}`)}
	j.Start(func() []*Record { return []*Record{keep} }, nil)
	defer j.Close()
	b0, v0, err := j.Snapshot()
	if err != nil || len(b0) != 0 {
		t.Fatalf("empty journal: %d bytes, %v", len(b0), err)
	}
	if err := j.Append(keep, &Record{Kind: KindAccepted, ID: "b", Body: []byte(`{}`)}).Wait(); err != nil {
		t.Fatal(err)
	}
	b1, v1, err := j.Snapshot()
	if err != nil || v1 <= v0 {
		t.Fatalf("after a write: version %d → %d, %v", v0, v1, err)
	}
	onDisk, _ := os.ReadFile(filepath.Join(dir, DirName, FileName))
	if !bytes.Equal(b1, onDisk) {
		t.Fatalf("snapshot %d bytes, file %d", len(b1), len(onDisk))
	}
	j.Compact()
	var b2 []byte
	var v2 uint64
	for v2 <= v1 {
		b2, v2, _ = j.Snapshot()
	}
	rp, err := readAll(bytesFile(t, b2))
	if err != nil || len(rp.Records) != 1 || rp.Records[0].ID != "a" || rp.TruncatedBytes != 0 || rp.Corruption != nil {
		t.Fatalf("snapshot after compaction: %+v %v", rp, err)
	}
}

func bytesFile(t *testing.T, b []byte) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "j")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
