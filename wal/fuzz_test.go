package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// referenceEntries parses one segment file (index 1) the simplest possible
// way, independently of decoder.go: the entries of the valid records before
// the first invalid one. ok is false when the header is of another version.
func referenceEntries(b []byte) (entries []Entry, ok bool) {
	crc := func(p []byte) uint32 { return crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)) }
	be := binary.BigEndian
	if len(b) < 32 || !bytes.Equal(b[:8], []byte("SVWAL\r\n\x1a")) {
		return nil, true
	}
	if be.Uint16(b[8:]) != 1 {
		return nil, false
	}
	if be.Uint16(b[10:]) != 32 || crc(b[:28]) != be.Uint32(b[28:]) || be.Uint64(b[12:]) != 1 {
		return nil, true
	}
	prev := be.Uint64(b[20:])
	for off := 32; len(b)-off >= 40; {
		h := b[off : off+40]
		count, plen := be.Uint32(h[8:]), be.Uint32(h[12:])
		first, last := be.Uint64(h[24:]), be.Uint64(h[32:])
		if crc(h[4:40]) != be.Uint32(h) || h[4] != 1 || h[5]|h[6]|h[7] != 0 || be.Uint32(h[20:]) != 0 ||
			count == 0 || uint64(plen) < 12*uint64(count) || plen > 1<<30 || first == 0 || first > last || first <= prev ||
			uint64(len(b)-off-40) < uint64(plen) {
			return entries, true
		}
		p := b[off+40 : off+40+int(plen)]
		if crc(p) != be.Uint32(h[16:]) {
			return entries, true
		}
		var rec []Entry
		pos, s := 0, uint64(0)
		for i := uint32(0); i < count; i++ {
			if len(p)-pos < 12 {
				return entries, true
			}
			seq, n := be.Uint64(p[pos:]), int(be.Uint32(p[pos+8:]))
			pos += 12
			if n > len(p)-pos || (i == 0 && seq != first) || (i > 0 && seq <= s) {
				return entries, true
			}
			rec = append(rec, Entry{Sequence: seq, Data: p[pos : pos+n]})
			s = seq
			pos += n
		}
		if pos != len(p) || s != last {
			return entries, true
		}
		entries = append(entries, rec...)
		prev = last
		off += 40 + int(plen)
	}
	return entries, true
}

// fuzzSeeds are segment files worth starting from: valid, torn, damaged.
func fuzzSeeds() map[string][]byte {
	valid := segmentHeader{index: 1}.marshal()
	valid = appendRecord(valid, []Entry{{Sequence: 1, Data: []byte("\x81\xa9operation\xaamemory_add")}})
	valid = appendRecord(valid, []Entry{{Sequence: 2, Data: []byte("b")}, {Sequence: 3, Data: nil}, {Sequence: 7, Data: []byte{0, 0, 1}}})
	valid = appendRecord(valid, []Entry{{Sequence: 8, Data: bytes.Repeat([]byte("x"), 600)}})
	flip := func(off int) []byte {
		b := bytes.Clone(valid)
		b[off] ^= 0x04
		return b
	}
	rec2 := 32 + int(recordSize([]Entry{{Sequence: 1, Data: []byte("\x81\xa9operation\xaamemory_add")}}))
	prevLast := segmentHeader{index: 1, prevLast: 100}.marshal()
	prevLast = appendRecord(prevLast, []Entry{{Sequence: 100, Data: []byte("dup")}})
	return map[string][]byte{
		"valid":                   valid,
		"torn_mid_record":         valid[:len(valid)-300],
		"torn_mid_header":         valid[:rec2+20],
		"zero_tail":               append(bytes.Clone(valid), make([]byte, 4096)...),
		"flip_first_payload":      flip(32 + 45),
		"flip_middle_header":      flip(rec2 + 9),
		"flip_segment_header":     flip(13),
		"header_only":             segmentHeader{index: 1}.marshal(),
		"empty":                   {},
		"zeros":                   make([]byte, 100),
		"garbage_then_valid":      append(append(segmentHeader{index: 1}.marshal(), 0xde, 0xad, 0xbe, 0xef), valid[32:]...),
		"sequence_not_above_prev": prevLast,
		"huge_length":             append(segmentHeader{index: 1}.marshal(), hugeLengthHeader()...),
	}
}

// hugeLengthHeader is a valid record header claiming a 1 GiB payload.
func hugeLengthHeader() []byte {
	b := make([]byte, recordHeaderSize)
	putRecordHeader(b, recordHeader{count: 1, plen: maxRecordPayload, first: 1, last: 1})
	return b
}

// FuzzRecover writes arbitrary bytes as a segment and opens the log: Open
// never panics, serves exactly the valid records before the first bad one
// (never a record failing its checks), repairs the log so it reopens clean,
// and appends again. ReadDir agrees.
func FuzzRecover(f *testing.F) {
	for _, b := range fuzzSeeds() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := fuzzDir(t)
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), data, 0o600); err != nil {
			t.Fatal(err)
		}
		want, ok := referenceEntries(data)
		dumped, derr := readDirAll(dir, 0)
		if derr != nil && !errors.Is(derr, ErrCorrupt) && ok {
			t.Fatalf("ReadDir: %v", derr)
		}
		o := Options{Dir: dir, SegmentSize: MinSegmentSize, NoPreallocate: true, Logger: testLogger(t)}
		l, err := Open(o)
		if !ok {
			if err == nil {
				l.Close()
				t.Fatal("Open accepted a segment of another format version")
			}
			return
		}
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		sameEntries(t, "ReadDir", dumped, want)
		sameEntries(t, "Open", readAll(t, l, 0), want)
		last := l.LastSequence()
		if last != math.MaxUint64 {
			if _, err := l.Append(Entry{Sequence: last + 1, Data: []byte("next")}); err != nil {
				t.Fatalf("Append after recovery: %v", err)
			}
			want = append(want, Entry{Sequence: last + 1, Data: []byte("next")})
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l, err = Open(o)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer l.Close()
		if r := l.Recovery(); r.Corruption != nil || r.TruncatedBytes != 0 {
			t.Fatalf("reopen after repair: %+v", r)
		}
		sameEntries(t, "reopened", readAll(t, l, 0), want)
	})
}

// fuzzDir is a fresh directory, on tmpfs (/dev/shm) when there is one:
// fsync is free there, which makes fuzzing many times faster.
func fuzzDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "walfuzz-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzRecover from fuzzSeeds
// when WAL_WRITE_FUZZ_CORPUS=1.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("WAL_WRITE_FUZZ_CORPUS") != "1" {
		t.Skip("set WAL_WRITE_FUZZ_CORPUS=1 to regenerate testdata/fuzz/FuzzRecover")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzRecover")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range fuzzSeeds() {
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
