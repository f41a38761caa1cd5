package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
)

// Format constants; doc.go describes the layout.
const (
	segmentHeaderSize = 32
	recordHeaderSize  = 40
	entryHeaderSize   = 12
	formatVersion     = 1
	kindEntries       = 1
	// maxRecordPayload bounds one record (one Append). Decoders reject larger
	// lengths before allocating anything.
	maxRecordPayload = 1 << 30

	segmentSuffix = ".wal"
	tmpSuffix     = ".tmp"
	lockName      = "LOCK"
)

var segmentMagic = [8]byte{'S', 'V', 'W', 'A', 'L', '\r', '\n', 0x1a}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segmentName is a segment's file name: its index in fixed-width hex, so
// lexical order is log order.
func segmentName(index uint64) string { return fmt.Sprintf("%016x%s", index, segmentSuffix) }

// parseSegmentName returns the index of a segment file name, rejecting
// anything segmentName could not have produced.
func parseSegmentName(name string) (uint64, bool) {
	if len(name) != 16+len(segmentSuffix) || !strings.HasSuffix(name, segmentSuffix) {
		return 0, false
	}
	for _, c := range name[:16] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(name[:16], 16, 64)
	return v, err == nil
}

// segmentHeader opens every segment file.
type segmentHeader struct {
	index    uint64 // must match the file name
	prevLast uint64 // last sequence in the log before this segment
}

func (h segmentHeader) marshal() []byte {
	b := make([]byte, segmentHeaderSize)
	copy(b, segmentMagic[:])
	binary.BigEndian.PutUint16(b[8:], formatVersion)
	binary.BigEndian.PutUint16(b[10:], segmentHeaderSize)
	binary.BigEndian.PutUint64(b[12:], h.index)
	binary.BigEndian.PutUint64(b[20:], h.prevLast)
	binary.BigEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// headerVersionError is a segment written by another format version: not
// corruption, and never repaired or moved aside.
type headerVersionError struct{ version uint16 }

func (e *headerVersionError) Error() string {
	return fmt.Sprintf("segment has WAL format version %d, this build reads version %d; run a supervisor build that supports it", e.version, formatVersion)
}

// parseSegmentHeader checks a segment header. It returns a non-empty reason
// when the header is damaged, and a *headerVersionError for another version.
func parseSegmentHeader(b []byte) (segmentHeader, string, error) {
	if len(b) < segmentHeaderSize {
		return segmentHeader{}, "segment header is incomplete", nil
	}
	if !bytes.Equal(b[:8], segmentMagic[:]) {
		return segmentHeader{}, "not a WAL segment (bad magic)", nil
	}
	if v := binary.BigEndian.Uint16(b[8:]); v != formatVersion {
		return segmentHeader{}, "", &headerVersionError{version: v}
	}
	if n := binary.BigEndian.Uint16(b[10:]); n != segmentHeaderSize {
		return segmentHeader{}, fmt.Sprintf("segment header size %d, want %d", n, segmentHeaderSize), nil
	}
	if got, want := crc32.Checksum(b[:28], castagnoli), binary.BigEndian.Uint32(b[28:]); got != want {
		return segmentHeader{}, fmt.Sprintf("segment header checksum mismatch: stored %08x, computed %08x", want, got), nil
	}
	return segmentHeader{index: binary.BigEndian.Uint64(b[12:]), prevLast: binary.BigEndian.Uint64(b[20:])}, "", nil
}

// recordHeader is the fixed part of a record.
type recordHeader struct {
	count       uint32 // entries in the payload, ≥ 1
	plen        uint32 // payload bytes
	pcrc        uint32 // CRC32C of the payload
	first, last uint64 // sequences of the first and last entry
}

func (h recordHeader) size() int64 { return recordHeaderSize + int64(h.plen) }

func putRecordHeader(b []byte, h recordHeader) {
	b[4] = kindEntries
	b[5], b[6], b[7] = 0, 0, 0
	binary.BigEndian.PutUint32(b[8:], h.count)
	binary.BigEndian.PutUint32(b[12:], h.plen)
	binary.BigEndian.PutUint32(b[16:], h.pcrc)
	binary.BigEndian.PutUint32(b[20:], 0)
	binary.BigEndian.PutUint64(b[24:], h.first)
	binary.BigEndian.PutUint64(b[32:], h.last)
	binary.BigEndian.PutUint32(b[0:], crc32.Checksum(b[4:recordHeaderSize], castagnoli))
}

// isZero reports whether b holds only zero bytes.
func isZero(b []byte) bool {
	for len(b) >= len(zeroPage) {
		if !bytes.Equal(b[:len(zeroPage)], zeroPage[:]) {
			return false
		}
		b = b[len(zeroPage):]
	}
	return bytes.Equal(b, zeroPage[:len(b)])
}

var zeroPage [4096]byte

// parseRecordHeader checks a record header. zero reports an all-zero header
// (preallocated space: the end of the data); otherwise a non-empty reason
// says what is wrong.
func parseRecordHeader(b []byte) (h recordHeader, zero bool, reason string) {
	if isZero(b[:recordHeaderSize]) {
		return h, true, "zero record header"
	}
	if got, want := crc32.Checksum(b[4:recordHeaderSize], castagnoli), binary.BigEndian.Uint32(b); got != want {
		return h, false, fmt.Sprintf("record header checksum mismatch: stored %08x, computed %08x", want, got)
	}
	if b[4] != kindEntries || b[5]|b[6]|b[7] != 0 || binary.BigEndian.Uint32(b[20:]) != 0 {
		return h, false, fmt.Sprintf("unknown record kind %d", b[4])
	}
	h = recordHeader{
		count: binary.BigEndian.Uint32(b[8:]),
		plen:  binary.BigEndian.Uint32(b[12:]),
		pcrc:  binary.BigEndian.Uint32(b[16:]),
		first: binary.BigEndian.Uint64(b[24:]),
		last:  binary.BigEndian.Uint64(b[32:]),
	}
	switch {
	case h.count == 0:
		return h, false, "record holds no entries"
	case uint64(h.plen) < uint64(h.count)*entryHeaderSize || h.plen > maxRecordPayload:
		return h, false, fmt.Sprintf("record payload length %d impossible for %d entries", h.plen, h.count)
	case h.first == 0 || h.first > h.last:
		return h, false, fmt.Sprintf("record sequence range %d..%d invalid", h.first, h.last)
	}
	return h, false, ""
}

// checkPayload verifies the entry layout of a payload whose CRC matched.
func checkPayload(h recordHeader, p []byte) string {
	off := 0
	var prev uint64
	for i := uint32(0); i < h.count; i++ {
		if len(p)-off < entryHeaderSize {
			return "entry header runs past the payload"
		}
		seq := binary.BigEndian.Uint64(p[off:])
		n := binary.BigEndian.Uint32(p[off+8:])
		off += entryHeaderSize
		if uint64(n) > uint64(len(p)-off) {
			return "entry data runs past the payload"
		}
		if (i == 0 && seq != h.first) || (i > 0 && seq <= prev) {
			return fmt.Sprintf("entry sequence %d out of order in record %d..%d", seq, h.first, h.last)
		}
		prev = seq
		off += int(n)
	}
	if off != len(p) {
		return "payload has bytes after its last entry"
	}
	if prev != h.last {
		return fmt.Sprintf("last entry sequence %d does not match the record header's %d", prev, h.last)
	}
	return ""
}

// forEachEntry calls fn for each entry of a payload checkPayload accepted.
func forEachEntry(p []byte, fn func(Entry) error) error {
	for off := 0; off < len(p); {
		seq := binary.BigEndian.Uint64(p[off:])
		n := int(binary.BigEndian.Uint32(p[off+8:]))
		off += entryHeaderSize
		if err := fn(Entry{Sequence: seq, Data: p[off : off+n : off+n]}); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// recordSize is the encoded size of one record holding entries.
func recordSize(entries []Entry) int64 {
	n := int64(recordHeaderSize)
	for _, e := range entries {
		n += entryHeaderSize + int64(len(e.Data))
	}
	return n
}

// appendRecord encodes entries (non-empty, strictly increasing sequences,
// already size-checked) as one record at the end of dst.
func appendRecord(dst []byte, entries []Entry) []byte {
	size := int(recordSize(entries))
	start := len(dst)
	dst = slices.Grow(dst, size)[:start+size]
	rec := dst[start:]
	p := rec[recordHeaderSize:]
	off := 0
	for _, e := range entries {
		binary.BigEndian.PutUint64(p[off:], e.Sequence)
		binary.BigEndian.PutUint32(p[off+8:], uint32(len(e.Data)))
		off += entryHeaderSize
		off += copy(p[off:], e.Data)
	}
	putRecordHeader(rec, recordHeader{
		count: uint32(len(entries)),
		plen:  uint32(len(p)),
		pcrc:  crc32.Checksum(p, castagnoli),
		first: entries[0].Sequence,
		last:  entries[len(entries)-1].Sequence,
	})
	return dst
}
