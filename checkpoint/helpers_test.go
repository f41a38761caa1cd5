package checkpoint

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"
)

func openStore(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := Open(filepath.Join(t.TempDir(), "checkpoints"), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func save(t testing.TB, s *Store, data []byte, wm uint64) Meta {
	t.Helper()
	m, err := s.Save(data, wm)
	if err != nil {
		t.Fatalf("Save(%d bytes, %d): %v", len(data), wm, err)
	}
	return m
}

// ckptPath is the file of checkpoint id in s.
func ckptPath(s *Store, id string) string { return filepath.Join(s.dir, fileName(id)) }

// editFile rewrites a file through edit.
func editFile(t testing.TB, path string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// rawHeader parses a header without any check, for tests that forge one.
func rawHeader(b []byte) header {
	var h header
	copy(h.id[:], b[12:28])
	h.watermark = binary.BigEndian.Uint64(b[36:44])
	h.size = binary.BigEndian.Uint64(b[44:52])
	h.bodyLen = binary.BigEndian.Uint64(b[52:60])
	h.crc = binary.BigEndian.Uint32(b[60:64])
	return h
}

// forge builds a checkpoint file for id with the given header fields and
// body, its header checksum valid: a lie only the body can reveal.
func forge(id uuid.UUID, size, bodyLen uint64, crc uint32, body []byte) []byte {
	h := header{id: id, size: size, bodyLen: bodyLen, crc: crc, watermark: 1}
	return append(h.marshal(), body...)
}

// reseal makes a checkpoint file's header checksum match its (edited)
// header again.
func reseal(b []byte) []byte {
	binary.BigEndian.PutUint32(b[64:68], crc32.Checksum(b[:64], castagnoli))
	return b
}

// zstdFrame compresses b as one zstd frame that declares its size.
func zstdFrame(t testing.TB, b []byte) []byte {
	t.Helper()
	e, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	return e.EncodeAll(b, nil)
}

// zstdRLEBomb returns a zstd frame of RLE blocks that decodes to total zero
// bytes (a multiple of 128 KiB) in about total/32 KiB of input; fcs, when
// true, declares the total in the frame header.
func zstdRLEBomb(total uint64, fcs bool) []byte {
	const block = 128 << 10
	b := []byte{0x28, 0xb5, 0x2f, 0xfd}
	if fcs {
		b = append(b, 0xc0, 0x50) // FCS field 8 bytes; window 1 MiB
		b = binary.LittleEndian.AppendUint64(b, total)
	} else {
		b = append(b, 0x00, 0x50) // no FCS; window 1 MiB
	}
	for n := total / block; n > 0; n-- {
		hdr := uint32(block<<3) | 1<<1 // RLE block
		if n == 1 {
			hdr |= 1 // last
		}
		b = append(b, byte(hdr), byte(hdr>>8), byte(hdr>>16), 0)
	}
	return b
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// cheapData is size bytes, half random and half repetitive text: quick to
// build (unlike genCheckpoint under the race detector) and compressible.
func cheapData(size int) []byte {
	b := make([]byte, size)
	rand.NewChaCha8([32]byte{9}).Read(b[:size/2])
	copy(b[size/2:], bytes.Repeat([]byte("memory block text, "), size/2/19+1))
	return b
}
