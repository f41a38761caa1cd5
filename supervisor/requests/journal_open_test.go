package requests

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The journal's replay of what a crash or a damaged disk leaves: the tests
// write the file as found, open it, and look at what Open reports and what
// it leaves on disk.

// rec is one record's bytes as the journal writes them.
func rec(t *testing.T, r *Record) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := encodeRecord(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// forged is a record whose header (length, checksum) is right for payload:
// what passes the journal's checksum and must still be refused.
func forged(payload string) []byte {
	b := make([]byte, headerSize+len(payload))
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:8], crc32.Checksum([]byte(payload), castagnoli))
	copy(b[headerSize:], payload)
	return b
}

func accepted(id string) *Record {
	return &Record{Kind: KindAccepted, ID: id, Body: []byte(`{"message":"` + id + `"}`)}
}

// journalFile writes dir's journal as parts, joined.
func journalFile(t *testing.T, dir string, parts ...[]byte) []byte {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, DirName), 0o700); err != nil {
		t.Fatal(err)
	}
	b := bytes.Join(parts, nil)
	if err := os.WriteFile(filepath.Join(dir, DirName, FileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

func recordIDs(rp *Replay) []string {
	var ids []string
	for _, r := range rp.Records {
		ids = append(ids, r.ID)
	}
	return ids
}

// openStarted opens dir's journal and starts its writer; compact is what a
// compaction writes (nil: nothing).
func openStarted(t *testing.T, dir string, compact func() []*Record) (*Journal, *Replay) {
	t.Helper()
	j, rp, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if compact == nil {
		compact = func() []*Record { return nil }
	}
	j.Start(compact, nil)
	t.Cleanup(func() { j.Close() })
	return j, rp
}

// replayOf reads dir's journal as Open would, without opening it.
func replayOf(t *testing.T, dir string) *Replay {
	t.Helper()
	rp, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rp
}

// wantReplay fails the test unless dir's journal replays as exactly the
// records ids, in order, neither damaged nor torn.
func wantReplay(t *testing.T, dir, what string, ids ...string) {
	t.Helper()
	rp := replayOf(t, dir)
	if got := recordIDs(rp); !slices.Equal(got, ids) || rp.Corruption != nil || rp.TruncatedBytes != 0 {
		t.Fatalf("%s: records %v (want %v), corruption %v, truncated %d", what, got, ids, rp.Corruption, rp.TruncatedBytes)
	}
}

// TestJournalTornTailCutAway: whatever a crash leaves after the last whole
// record — a few bytes of a header, a header without its payload, half a
// payload — is reported as a torn tail and cut from the file, so the next
// start reads a clean journal and the next records follow the last whole
// one. A tail shorter than a header must not be read as one.
func TestJournalTornTailCutAway(t *testing.T) {
	c := rec(t, accepted("c"))
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		{"three bytes", []byte("abc")},
		{"one byte", []byte{7}},
		{"seven bytes", []byte{1, 2, 3, 4, 5, 6, 7}},
		{"a header alone", c[:headerSize]},
		{"half a record", c[:len(c)/2]},
		{"a record whose last bytes are zeros", append(slices.Clone(c[:len(c)-3]), 0, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			whole := bytes.Join([][]byte{rec(t, accepted("a")), rec(t, accepted("b"))}, nil)
			journalFile(t, dir, whole, tc.tail)
			j, rp, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := recordIDs(rp); !slices.Equal(got, []string{"a", "b"}) || rp.Corruption != nil ||
				rp.TruncatedBytes != int64(len(tc.tail)) || rp.Size != int64(len(whole)) {
				t.Fatalf("replay: records %v, truncated %d (want %d), size %d (want %d), corruption %v",
					got, rp.TruncatedBytes, len(tc.tail), rp.Size, len(whole), rp.Corruption)
			}
			fi, err := os.Stat(filepath.Join(dir, DirName, FileName))
			if err != nil || fi.Size() != int64(len(whole)) {
				t.Fatalf("after Open the file has %d bytes, want the whole records' %d (the torn tail cut away): %v", fi.Size(), len(whole), err)
			}
			j.Start(func() []*Record { return nil }, nil)
			if err := j.Append(accepted("d")).Wait(); err != nil {
				t.Fatal(err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			wantReplay(t, dir, "reopened", "a", "b", "d")
		})
	}
}

// TestJournalDamageKeptAside: a record that fails its checks before intact
// ones is damage, not a torn tail: replay skips it and goes on with the next
// intact record (never dropping what follows), reports it, keeps the file as
// found beside the journal (journal.damaged-N, a new N each time) and
// rewrites the journal at once from what was read. A record whose checksum
// is right but whose payload is not a record is damage too.
func TestJournalDamageKeptAside(t *testing.T) {
	a, c := rec(t, accepted("a")), rec(t, accepted("c"))
	flipped := rec(t, accepted("b"))
	flipped[headerSize+5] ^= 0x20
	for _, tc := range []struct {
		name string
		bad  []byte
		tail []byte
	}{
		{"a flipped byte", flipped, nil},
		{"a damaged length", append([]byte{0xff, 0xff, 0xff, 0x7f}, rec(t, accepted("b"))[4:]...), nil},
		{"a checksummed payload that is not JSON", forged("not a record\n"), nil},
		{"a checksummed record without a kind", forged(`{"id":"b"}` + "\n"), nil},
		{"then zeros", flipped, make([]byte, 4096)},
		{"then a torn tail", flipped, []byte("torn")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			found := journalFile(t, dir, a, tc.bad, c, tc.tail)
			compacted := make(chan struct{})
			j, rp, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := recordIDs(rp); !slices.Equal(got, []string{"a", "c"}) || rp.Corruption == nil ||
				rp.SkippedBytes != int64(len(tc.bad)+len(tc.tail)-countZeros(tc.tail)) || rp.TruncatedBytes != 0 {
				t.Fatalf("replay: records %v, corruption %v, skipped %d (want %d), truncated %d",
					got, rp.Corruption, rp.SkippedBytes, len(tc.bad)+len(tc.tail)-countZeros(tc.tail), rp.TruncatedBytes)
			}
			if !strings.Contains(rp.Corruption.Error(), "damaged record at byte "+strconv.Itoa(len(a))) {
				t.Errorf("corruption %q does not name the damaged record's offset %d", rp.Corruption, len(a))
			}
			kept := filepath.Join(dir, DirName, FileName+".damaged-1")
			if rp.SetAside != kept {
				t.Fatalf("set aside %q, want %q", rp.SetAside, kept)
			}
			// A record appended before the compaction runs goes after
			// what was found: the file kept aside still starts with it.
			tk := j.Append(accepted("d"))
			j.Start(func() []*Record {
				defer close(compacted)
				return []*Record{accepted("a"), accepted("c"), accepted("d")}
			}, nil)
			if err := tk.Wait(); err != nil {
				t.Fatal(err)
			}
			// The compaction is asked for at Start, not left for a later
			// one: it runs with nothing else written.
			select {
			case <-compacted:
			case <-time.After(30 * time.Second):
				t.Fatal("no compaction after Start of a damaged journal")
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			// (Zeros after the records are not evidence: d goes over them.)
			found = found[:len(found)-countZeros(tc.tail)]
			if b, err := os.ReadFile(kept); err != nil || !bytes.HasPrefix(b, found) {
				t.Fatalf("%s does not hold the journal as found (%d bytes; %d read): %v", kept, len(found), len(b), err)
			}
			wantReplay(t, dir, "after the compaction", "a", "c", "d")

			// Damage again: kept as the next N, the first one untouched.
			first, _ := os.ReadFile(kept)
			journalFile(t, dir, a, tc.bad, c)
			again := make(chan struct{})
			_, rp = openStarted(t, dir, func() []*Record { close(again); return nil })
			select { // asked for at Start, nothing else written
			case <-again:
			case <-time.After(30 * time.Second):
				t.Fatal("no compaction after Start of a damaged journal, with nothing appended")
			}
			if want := filepath.Join(dir, DirName, FileName+".damaged-2"); rp.SetAside != want {
				t.Fatalf("second damage set aside as %q, want %q", rp.SetAside, want)
			}
			if b, _ := os.ReadFile(kept); !bytes.Equal(b, first) {
				t.Fatalf("%s changed by the second damage", kept)
			}
		})
	}
}

func countZeros(b []byte) int {
	if isZero(b) {
		return len(b)
	}
	return 0
}
