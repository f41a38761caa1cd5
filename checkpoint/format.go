package checkpoint

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/google/uuid"
)

// File format, version 1. All integers are big-endian.
//
//	offset size field
//	     0    8 magic "SUPVCKPT"
//	     8    2 format version (1)
//	    10    2 header length (68)
//	    12   16 checkpoint id (UUID, the same as the file name)
//	    28    8 created, Unix nanoseconds (signed)
//	    36    8 WAL watermark
//	    44    8 uncompressed size
//	    52    8 body length: bytes of zstd that follow the header
//	    60    4 CRC-32C (Castagnoli) of the uncompressed data
//	    64    4 CRC-32C of bytes 0..63 (the header itself)
//	    68    … body: one zstd frame, exactly body-length bytes, then end of file
const (
	magic         = "SUPVCKPT"
	formatVersion = 1
	headerLen     = 68
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is the fixed-size prefix of a checkpoint file.
type header struct {
	id        uuid.UUID
	created   time.Time
	watermark uint64
	size      uint64 // uncompressed
	bodyLen   uint64 // compressed
	crc       uint32 // of the uncompressed data
}

func (h *header) marshal() []byte {
	b := make([]byte, headerLen)
	copy(b[0:8], magic)
	binary.BigEndian.PutUint16(b[8:10], formatVersion)
	binary.BigEndian.PutUint16(b[10:12], headerLen)
	copy(b[12:28], h.id[:])
	binary.BigEndian.PutUint64(b[28:36], uint64(h.created.UnixNano()))
	binary.BigEndian.PutUint64(b[36:44], h.watermark)
	binary.BigEndian.PutUint64(b[44:52], h.size)
	binary.BigEndian.PutUint64(b[52:60], h.bodyLen)
	binary.BigEndian.PutUint32(b[60:64], h.crc)
	binary.BigEndian.PutUint32(b[64:68], crc32.Checksum(b[:64], castagnoli))
	return b
}

// unmarshalHeader parses and checks a header against what the file can hold:
// fileSize is the size of the whole file and maxSize the largest uncompressed
// size the store accepts. Every error wraps [ErrCorrupt].
func unmarshalHeader(b []byte, fileSize, maxSize int64) (header, error) {
	var h header
	if len(b) < headerLen || fileSize < headerLen {
		return h, fmt.Errorf("%w: file is %d bytes, shorter than the %d-byte header (truncated)", ErrCorrupt, fileSize, headerLen)
	}
	if string(b[0:8]) != magic {
		return h, fmt.Errorf("%w: bad magic %q, not a checkpoint file", ErrCorrupt, b[0:8])
	}
	if v := binary.BigEndian.Uint16(b[8:10]); v != formatVersion {
		return h, fmt.Errorf("%w: format version %d, this supervisor reads version %d (a newer supervisor wrote it?)", ErrCorrupt, v, formatVersion)
	}
	if n := binary.BigEndian.Uint16(b[10:12]); n != headerLen {
		return h, fmt.Errorf("%w: header length %d, want %d", ErrCorrupt, n, headerLen)
	}
	if want, got := binary.BigEndian.Uint32(b[64:68]), crc32.Checksum(b[:64], castagnoli); want != got {
		return h, fmt.Errorf("%w: header checksum mismatch: stored %08x, computed %08x", ErrCorrupt, want, got)
	}
	copy(h.id[:], b[12:28])
	h.created = time.Unix(0, int64(binary.BigEndian.Uint64(b[28:36]))).UTC()
	h.watermark = binary.BigEndian.Uint64(b[36:44])
	h.size = binary.BigEndian.Uint64(b[44:52])
	h.bodyLen = binary.BigEndian.Uint64(b[52:60])
	h.crc = binary.BigEndian.Uint32(b[60:64])
	if h.size > uint64(maxSize) {
		return h, fmt.Errorf("%w: %w: header claims %d uncompressed bytes, limit %d", ErrCorrupt, ErrTooLarge, h.size, maxSize)
	}
	if bound := maxBodyLen(h.size); h.bodyLen > bound {
		return h, fmt.Errorf("%w: body of %d bytes cannot hold %d uncompressed bytes (at most %d)", ErrCorrupt, h.bodyLen, h.size, bound)
	}
	if want := uint64(fileSize - headerLen); h.bodyLen != want {
		what := "truncated"
		if h.bodyLen < want {
			what = "trailing bytes"
		}
		return h, fmt.Errorf("%w: header says %d body bytes, file holds %d (%s)", ErrCorrupt, h.bodyLen, want, what)
	}
	return h, nil
}

// maxBodyLen is an upper bound on the zstd encoding of size bytes: stored
// (raw) blocks cost 3 bytes per block of at least 1 KiB, plus frame header
// and checksum. Anything longer is not a file this package wrote.
func maxBodyLen(size uint64) uint64 {
	return size + size/256 + 1024
}

func (h *header) checksum() string {
	return fmt.Sprintf("crc32c:%08x", h.crc)
}
