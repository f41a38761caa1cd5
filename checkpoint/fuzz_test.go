package checkpoint

import (
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"
)

var update = flag.Bool("update", false, "rewrite the seed corpora in testdata/fuzz")

// fuzzID is the id under which FuzzLoad stores its input.
var fuzzID = uuid.MustParse("01900000-0000-7000-8000-000000000001")

const fuzzMaxSize = 1 << 20

// fuzzLoadSeeds are FuzzLoad's seeds: whole checkpoint files.
func fuzzLoadSeeds() [][]byte {
	data := genCheckpoint(4<<10, 1)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		panic(err)
	}
	body := enc.EncodeAll(data, nil)
	crc := crc32.Checksum(data, castagnoli)
	valid := forge(fuzzID, uint64(len(data)), uint64(len(body)), crc, body)
	bomb := zstdRLEBomb(64<<20, false)
	empty := enc.EncodeAll(nil, nil)
	return [][]byte{
		valid,
		valid[:len(valid)-1],
		valid[:headerLen],
		valid[:headerLen-1],
		{},
		[]byte(magic),
		forge(fuzzID, 0, uint64(len(empty)), crc32.Checksum(nil, castagnoli), empty),
		forge(fuzzID, 1024, uint64(len(bomb)), 0, bomb),
		forge(fuzzID, fuzzMaxSize+1, uint64(len(body)), crc, body),
		forge(uuid.Nil, uint64(len(data)), uint64(len(body)), crc, body),
	}
}

// FuzzLoad: Load of arbitrary file bytes never panics, fails only with
// ErrCorrupt, and never returns data that does not match the header's size
// and checksum.
func FuzzLoad(f *testing.F) {
	for _, b := range fuzzLoadSeeds() {
		f.Add(b)
	}
	dir := f.TempDir()
	s, err := Open(dir, Options{MaxSize: fuzzMaxSize})
	if err != nil {
		f.Fatal(err)
	}
	id := fuzzID.String()
	path := filepath.Join(dir, fileName(id))
	f.Fuzz(func(t *testing.T, file []byte) {
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		m, data, err := s.Load(id)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Load: err = %v, want ErrCorrupt", err)
			}
			if data != nil {
				t.Fatalf("Load returned %d bytes with error %v", len(data), err)
			}
		} else {
			h := rawHeader(file)
			if uint64(len(data)) != h.size || m.Size != int64(len(data)) {
				t.Fatalf("Load returned %d bytes, header says %d, meta %d", len(data), h.size, m.Size)
			}
			if got := crc32.Checksum(data, castagnoli); got != h.crc || m.Checksum != fmt.Sprintf("crc32c:%08x", got) {
				t.Fatalf("Load returned data with crc32c %08x, header %08x, meta %s", got, h.crc, m.Checksum)
			}
		}
		st, serr := s.Stat(id)
		if serr != nil {
			t.Fatalf("Stat: %v", serr)
		}
		if err == nil && st.Bad {
			t.Fatalf("Stat says bad (%s) but Load succeeded", st.BadReason)
		}
		if _, _, _, err := s.Latest(); err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("Latest: %v", err)
		}
	})
}

// FuzzParseID: ParseID never panics, and what it accepts is a canonical
// UUID that names a plain file in the store.
func FuzzParseID(f *testing.F) {
	for _, s := range fuzzParseIDSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("ParseID(%q): err = %v, want ErrInvalidID", s, err)
			}
			return
		}
		if len(id) != 36 || strings.ContainsAny(id, "/\\.\x00 ") || id != strings.ToLower(id) {
			t.Fatalf("ParseID(%q) = %q, not canonical", s, id)
		}
		if again, err := ParseID(id); err != nil || again != id {
			t.Fatalf("ParseID(%q) = %q, %v; not idempotent", id, again, err)
		}
		if !strings.EqualFold(id, s) {
			t.Fatalf("ParseID(%q) = %q, not the same UUID", s, id)
		}
	})
}

var fuzzParseIDSeeds = []string{
	"0190a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b",
	"0190A0B4-5C6D-7E8F-9A0B-1C2D3E4F5A6B",
	"../90a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b",
	"{0190a0b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b}",
	"0190a0b45c6d7e8f9a0b1c2d3e4f5a6b",
	"",
}

// TestWriteFuzzCorpus rewrites testdata/fuzz from the seeds above when run
// with -update.
func TestWriteFuzzCorpus(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz")
	}
	write := func(target string, values []string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, v := range values {
			content := "go test fuzz v1\n" + v + "\n"
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var loads []string
	for _, b := range fuzzLoadSeeds() {
		loads = append(loads, "[]byte("+strconv.Quote(string(b))+")")
	}
	write("FuzzLoad", loads)
	var ids []string
	for _, s := range fuzzParseIDSeeds {
		ids = append(ids, "string("+strconv.Quote(s)+")")
	}
	write("FuzzParseID", ids)
}
