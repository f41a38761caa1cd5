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
	// The file is the records, then the zeros it was grown by ahead of them.
	if len(onDisk) < len(b1) || !bytes.Equal(b1, onDisk[:len(b1)]) || !isZero(onDisk[len(b1):]) {
		t.Fatalf("snapshot %d bytes, file %d (not the snapshot followed by zeros)", len(b1), len(onDisk))
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

// TestJournalGrowsAheadWithZeros: the journal grows its file with zeros
// ahead of the records (so a record's fdatasync writes no file size);
// reopened, the zeros are its end — neither a torn tail nor damage — the
// next records go right after the last one, and a torn record before the
// zeros is still cut away.
func TestJournalGrowsAheadWithZeros(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DirName, FileName)
	open := func() (*Journal, *Replay) {
		t.Helper()
		j, rp, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		j.Start(func() []*Record { return nil }, nil)
		return j, rp
	}
	j, _ := open()
	if err := j.Append(&Record{Kind: KindAccepted, ID: "a", Body: []byte(`{"message":"1"}`)}).Wait(); err != nil {
		t.Fatal(err)
	}
	size := j.Size()
	j.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != growStep {
		t.Fatalf("file of %v bytes after one record, want %d (grown ahead): %v", fi.Size(), growStep, err)
	}

	j, rp := open()
	if len(rp.Records) != 1 || rp.Size != size || rp.TruncatedBytes != 0 || rp.Corruption != nil {
		t.Fatalf("reopened: %d records, size %d (want %d), truncated %d, %v", len(rp.Records), rp.Size, size, rp.TruncatedBytes, rp.Corruption)
	}
	if err := j.Append(&Record{Kind: KindAccepted, ID: "b", Body: []byte(`{"message":"2"}`)}).Wait(); err != nil {
		t.Fatal(err)
	}
	size2 := j.Size()
	j.Close()
	b, _ := os.ReadFile(path)
	rp, err = readAll(bytesFile(t, b))
	if err != nil || len(rp.Records) != 2 || rp.Records[1].ID != "b" || rp.Size != size2 {
		t.Fatalf("after a second record: %+v %v", rp, err)
	}

	// A torn second record (its last bytes never written), zeros after it.
	copy(b[size2-4:size2], []byte{0, 0, 0, 0})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	j, rp = open()
	defer j.Close()
	if len(rp.Records) != 1 || rp.TruncatedBytes == 0 || rp.Size != size || rp.Corruption != nil {
		t.Fatalf("torn record before the zeros: %d records, truncated %d, size %d (want %d), %v", len(rp.Records), rp.TruncatedBytes, rp.Size, size, rp.Corruption)
	}
}
