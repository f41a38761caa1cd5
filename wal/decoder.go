package wal

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// badKind classifies an invalid record; recovery uses it to tell a torn tail
// from corruption.
type badKind int

const (
	badIncomplete badKind = iota + 1 // header or payload runs past the end of the data
	badZero                          // an all-zero header: preallocated space, the end of the data
	badHeader                        // the header fails its checksum or field checks
	badPayload                       // the header is sound, the payload fails its checksum
	badEntries                       // checksums match but the layout or the sequence order is wrong
)

// badRecord is an invalid record at a known offset. It wraps
// io.ErrUnexpectedEOF when the record is incomplete and ErrCorrupt otherwise,
// so the chain keeps the distinction.
type badRecord struct {
	off    int64
	kind   badKind
	reason string
}

// asBad returns the *badRecord in err's chain, or nil. (A helper, so that
// only a failed read pays for the pointer errors.As moves to the heap.)
func asBad(err error) *badRecord {
	var bad *badRecord
	if errors.As(err, &bad) {
		return bad
	}
	return nil
}

func (e *badRecord) Error() string { return fmt.Sprintf("record at offset %d: %s", e.off, e.reason) }

func (e *badRecord) Unwrap() error {
	if e.kind == badIncomplete || e.kind == badZero {
		return io.ErrUnexpectedEOF
	}
	return ErrCorrupt
}

// recordReader reads the records of one segment sequentially, verifying each.
// It reads a file through a mapping (segMap), falling back to pread into a
// buffer where the file cannot be mapped; a caller must run under
// trapFaults and close it.
type recordReader struct {
	f     io.ReaderAt
	m     *segMap       // nil when reading with pread
	views bool          // payloads as views of the mapping, not copies: only for a reader that hands no entry on (recovery's scan)
	br    *bufio.Reader // the pread path, from the first read that could not map
	off   int64         // file offset of the next record
	limit int64         // bytes of the file that may be read
	hdr   [recordHeaderSize]byte
	buf   []byte
}

func newRecordReader(f io.ReaderAt, off, limit int64) *recordReader {
	r := &recordReader{f: f, off: off, limit: limit}
	if of, ok := f.(*os.File); ok {
		r.m = &segMap{f: of, limit: limit}
	}
	return r
}

// close releases the mapping.
func (r *recordReader) close() {
	if r.m != nil {
		r.m.close()
	}
}

// read returns the n bytes at file offset at, which must follow the bytes
// read (or skipped) before: a view of the mapping, or (pread) the record
// header's array when hdr is set and the payload buffer otherwise; valid
// until the next call. It is short, with the error
// io.ReadFull gives, where the file ends first on the pread path (on the
// mapped path a file that ends before limit faults: trapFaults).
func (r *recordReader) read(at int64, n int, hdr bool) ([]byte, error) {
	if r.m != nil {
		v, err := r.m.view(at, n)
		if err == nil {
			if hdr || r.views {
				return v, nil
			}
			// A payload whose entries go to a caller is copied out of
			// the mapping: the bytes the caller sees are the ones whose
			// checksum was checked, even if the file is cut and written
			// again in place meanwhile (TruncateAfter), as with pread.
			if cap(r.buf) < n {
				r.buf = make([]byte, n)
			}
			return append(r.buf[:0], v...), nil
		}
		r.m = nil // not mappable: pread from here on
	}
	if r.br == nil {
		r.br = bufio.NewReaderSize(io.NewSectionReader(r.f, at, r.limit-at), 256<<10)
	}
	var dst []byte
	if hdr {
		dst = r.hdr[:n]
	} else {
		if cap(r.buf) < n {
			r.buf = make([]byte, n)
		}
		dst = r.buf[:n]
	}
	got, err := io.ReadFull(r.br, dst)
	return dst[:got], err
}

// skip passes over n bytes after the ones read.
func (r *recordReader) skip(n int) error {
	if r.br == nil {
		return nil // mapped: the next read maps where it needs
	}
	_, err := r.br.Discard(n)
	return err
}

// next returns the next record. Its payload is verified and returned unless
// the record's last sequence is ≤ skipTo and skip is set, in which case the
// payload is skipped unread (and nil). minFirst is the last sequence before
// the record: its first must be above it. next returns io.EOF at the limit,
// a *badRecord for an invalid record, and other errors for failed reads.
// The payload is valid until the next call.
func (r *recordReader) next(minFirst, skipTo uint64, skip bool) (recordHeader, []byte, error) {
	rem := r.limit - r.off
	if rem == 0 {
		return recordHeader{}, nil, io.EOF
	}
	if rem < recordHeaderSize {
		b, err := r.read(r.off, int(rem), true)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return recordHeader{}, nil, fmt.Errorf("read record header at offset %d: %w", r.off, err)
		}
		if isZero(b) {
			return recordHeader{}, nil, &badRecord{off: r.off, kind: badZero, reason: "zero bytes at the end of the segment"}
		}
		return recordHeader{}, nil, &badRecord{off: r.off, kind: badIncomplete, reason: "record header cut short by the end of the segment"}
	}
	hb, err := r.read(r.off, recordHeaderSize, true)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return recordHeader{}, nil, &badRecord{off: r.off, kind: badIncomplete, reason: "record header cut short by the end of the file"}
		}
		return recordHeader{}, nil, fmt.Errorf("read record header at offset %d: %w", r.off, err)
	}
	h, zero, reason := parseRecordHeader(hb)
	switch {
	case zero:
		return h, nil, &badRecord{off: r.off, kind: badZero, reason: reason}
	case reason != "":
		return h, nil, &badRecord{off: r.off, kind: badHeader, reason: reason}
	case h.size() > rem:
		return h, nil, &badRecord{off: r.off, kind: badIncomplete,
			reason: fmt.Sprintf("record of %d bytes runs past the end of the segment data (%d bytes left)", h.size(), rem)}
	case h.first <= minFirst:
		return h, nil, &badRecord{off: r.off, kind: badEntries,
			reason: fmt.Sprintf("record starts at sequence %d, not after the previous sequence %d", h.first, minFirst)}
	}
	if skip && h.last <= skipTo {
		if err := r.skip(int(h.plen)); err != nil {
			return h, nil, &badRecord{off: r.off, kind: badIncomplete, reason: "record payload cut short by the end of the file"}
		}
		r.off += h.size()
		return h, nil, nil
	}
	p, err := r.read(r.off+recordHeaderSize, int(h.plen), false)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return h, nil, &badRecord{off: r.off, kind: badIncomplete, reason: "record payload cut short by the end of the file"}
		}
		return h, nil, fmt.Errorf("read record payload at offset %d: %w", r.off, err)
	}
	if got := crc32.Checksum(p, castagnoli); got != h.pcrc {
		return h, nil, &badRecord{off: r.off, kind: badPayload,
			reason: fmt.Sprintf("record payload checksum mismatch: stored %08x, computed %08x", h.pcrc, got)}
	}
	if reason := checkPayload(h, p); reason != "" {
		return h, nil, &badRecord{off: r.off, kind: badEntries, reason: reason}
	}
	r.off += h.size()
	return h, p, nil
}

// scanTail searches (from, size) for the start of a valid record and finds
// the end of the non-zero data in [from, size). validAt is -1 when no valid
// record starts there; dataEnd is from when everything there is zero.
func scanTail(f io.ReaderAt, from, size int64) (validAt, dataEnd int64, err error) {
	const chunk = 1 << 20
	buf := make([]byte, chunk+recordHeaderSize)
	dataEnd = from
	for pos := from; pos < size; pos += chunk {
		b := buf[:min(int64(len(buf)), size-pos)]
		if n, err := f.ReadAt(b, pos); err != nil && !(errors.Is(err, io.EOF) && n == len(b)) {
			if errors.Is(err, io.EOF) {
				b = b[:n] // the file shrank under us
			} else {
				return -1, 0, fmt.Errorf("read segment tail at offset %d: %w", pos, err)
			}
		}
		owned := b[:min(chunk, len(b))]
		if !isZero(owned) {
			i := len(owned) - 1
			for owned[i] == 0 {
				i--
			}
			dataEnd = pos + int64(i) + 1
		}
		// Candidate record starts p have the kind byte at p+4.
		for k := 4; k < len(b); {
			j := bytes.IndexByte(b[k:], kindEntries)
			if j < 0 {
				break
			}
			k += j
			p := k - 4
			k++
			abs := pos + int64(p)
			if p >= len(owned) || abs <= from || p+recordHeaderSize > len(b) {
				continue
			}
			ok, err := validRecordAt(f, b[p:p+recordHeaderSize], abs, size)
			if err != nil {
				return -1, 0, err
			}
			if ok {
				return abs, dataEnd, nil
			}
		}
	}
	return -1, dataEnd, nil
}

// validRecordAt reports whether a complete, valid record starts at off, given
// its header bytes.
func validRecordAt(f io.ReaderAt, hdr []byte, off, size int64) (bool, error) {
	h, zero, reason := parseRecordHeader(hdr)
	if zero || reason != "" || off+h.size() > size {
		return false, nil
	}
	p := make([]byte, h.plen)
	if _, err := f.ReadAt(p, off+recordHeaderSize); err != nil {
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, fmt.Errorf("read record at offset %d: %w", off, err)
	}
	return crc32.Checksum(p, castagnoli) == h.pcrc && checkPayload(h, p) == "", nil
}

// looksTorn reports whether the invalid record at bad.off is what a crash in
// the middle of a write leaves behind (a record cut short, or with zeroed
// sectors where data never reached the disk) rather than damage to data that
// was once complete.
func looksTorn(f io.ReaderAt, bad *badRecord, size int64) (bool, error) {
	switch bad.kind {
	case badIncomplete, badZero:
		return true, nil
	case badEntries:
		return false, nil
	}
	var hdr [recordHeaderSize]byte
	if _, err := f.ReadAt(hdr[:], bad.off); err != nil {
		return false, fmt.Errorf("reread record header at offset %d: %w", bad.off, err)
	}
	plen := int64(binary.BigEndian.Uint32(hdr[12:]))
	start := bad.off + recordHeaderSize
	if plen < entryHeaderSize || plen > maxRecordPayload || start+plen > size {
		return true, nil
	}
	p := make([]byte, plen)
	if _, err := f.ReadAt(p, start); err != nil {
		return false, fmt.Errorf("reread record payload at offset %d: %w", bad.off, err)
	}
	if bad.kind == badHeader {
		// A damaged header over an intact payload is damage, not a torn write.
		return crc32.Checksum(p, castagnoli) != binary.BigEndian.Uint32(hdr[16:]), nil
	}
	// badPayload: a write cut short leaves the end of the record zero (the
	// file was preallocated with zeros); a lost sector leaves an aligned
	// 512-byte run of zeros. Either is torn; anything else is damage.
	if p[len(p)-1] == 0 {
		return true, nil
	}
	const sector = 512
	for s := (start + sector - 1) / sector * sector; s+sector <= start+plen; s += sector {
		if isZero(p[s-start : s-start+sector]) {
			return true, nil
		}
	}
	return false, nil
}

// segmentScan is what scanning one segment found.
type segmentScan struct {
	name       string
	index      uint64
	size       int64 // file size
	prevLast   uint64
	tally            // the good records, counted
	end        int64 // end of the last good record: appends continue here
	tornEnd    int64 // > end: [end, tornEnd) is a torn tail to clear
	reordered  bool  // the torn tail has intact records after its damage (writes reached the disk out of order)
	headerTorn bool  // last segment whose header never reached the disk
	corrupt    *CorruptionError
}

// lastSeq is the last sequence in the log up to and including this segment.
func (s *segmentScan) lastSeq() uint64 {
	if s.last != 0 {
		return s.last
	}
	return s.prevLast
}

type scanOpts struct {
	isLast   bool   // the newest segment: a damaged tail may be a torn write
	prev     uint64 // last sequence of the previous segment
	havePrev bool
	// durableEnd, for the newest segment, is where the bytes not known to be
	// durable begin (the durable mark, see mark.go); -1: unknown.
	durableEnd int64
	after      uint64            // with fn: entries ≤ after are not passed to fn
	fn         func(Entry) error // nil: verify only
}

// scanSegment reads and verifies one segment, calling o.fn for its entries
// above o.after in order. Damage is reported in the result, never as an
// error; the error is for failed reads, another format version, and fn's own
// errors (returned as they are).
func scanSegment(f *os.File, name string, index uint64, o scanOpts) (_ segmentScan, err error) {
	defer trapFaults(name)(&err)
	sc := segmentScan{name: name, index: index}
	fi, err := f.Stat()
	if err != nil {
		return sc, fmt.Errorf("stat segment %s: %w", name, err)
	}
	sc.size = fi.Size()
	corrupt := func(off int64, reason string) (segmentScan, error) {
		sc.corrupt = &CorruptionError{Segment: name, Offset: off, Reason: reason}
		return sc, nil
	}
	hb := make([]byte, segmentHeaderSize)
	n, err := f.ReadAt(hb, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return sc, fmt.Errorf("read header of segment %s: %w", name, err)
	}
	if n < segmentHeaderSize || isZero(hb) {
		if !o.isLast {
			return corrupt(0, "segment header is missing")
		}
		validAt, dataEnd, err := scanTail(f, 0, sc.size)
		if err != nil {
			return sc, fmt.Errorf("segment %s: %w", name, err)
		}
		if validAt >= 0 || dataEnd > segmentHeaderSize {
			return corrupt(0, "segment header is missing but data follows it")
		}
		sc.headerTorn = true
		sc.prevLast = o.prev
		return sc, nil
	}
	h, reason, err := parseSegmentHeader(hb)
	if err != nil {
		return sc, fmt.Errorf("segment %s: %w", name, err)
	}
	switch {
	case reason != "":
		return corrupt(0, reason)
	case h.index != index:
		return corrupt(0, fmt.Sprintf("header says this is segment %d (file renamed or copied?)", h.index))
	case o.havePrev && h.prevLast != o.prev:
		return corrupt(0, fmt.Sprintf("header says the log continues after sequence %d, but the previous segment ends at %d: entries are missing",
			h.prevLast, o.prev))
	}
	sc.prevLast = h.prevLast
	sc.end = segmentHeaderSize
	last := h.prevLast
	rr := newRecordReader(f, segmentHeaderSize, sc.size)
	rr.views = o.fn == nil // verify only: no entry leaves the reader
	defer rr.close()
	for {
		rh, payload, err := rr.next(last, o.after, o.fn != nil)
		if errors.Is(err, io.EOF) {
			return sc, nil
		}
		if err != nil {
			if bad := asBad(err); bad != nil {
				return classify(f, sc, bad, o.isLast, o.durableEnd)
			}
			return sc, fmt.Errorf("segment %s: %w", name, err)
		}
		if payload != nil && o.fn != nil {
			err := forEachEntry(payload, func(e Entry) error {
				if e.Sequence <= o.after {
					return nil
				}
				return o.fn(e)
			})
			if err != nil {
				return sc, err
			}
		}
		sc.add(rh, rr.off)
		last = rh.last
		sc.end = rr.off
	}
}

// classify decides whether the invalid record ending a segment's good data
// is the clean end of the data, a torn tail, or corruption. durableEnd (the
// durable mark's offset in the newest segment, -1 when unknown) settles it
// where the bytes alone cannot: below it the data was fsynced, so anything
// wrong is corruption; above it a torn-looking record followed by intact
// ones is a power cut that wrote the last pages out of order.
func classify(f *os.File, sc segmentScan, bad *badRecord, isLast bool, durableEnd int64) (segmentScan, error) {
	corrupt := func(reason string) (segmentScan, error) {
		sc.corrupt = &CorruptionError{Segment: sc.name, Offset: bad.off, Reason: reason}
		return sc, nil
	}
	marked := isLast && durableEnd >= 0
	if marked && bad.off < durableEnd {
		return corrupt(fmt.Sprintf("%s, below the WAL's durable mark (offset %d): these bytes were fsynced, so this is damage to durable data, not a torn write",
			bad.reason, durableEnd))
	}
	if !isLast && bad.kind != badZero {
		return corrupt(bad.reason + " (in a segment that was complete: this is damage, not a torn write)")
	}
	validAt, dataEnd, err := scanTail(f, bad.off, sc.size)
	if err != nil {
		return sc, fmt.Errorf("segment %s: %w", sc.name, err)
	}
	if validAt >= 0 {
		if marked {
			torn, err := looksTorn(f, bad, sc.size)
			if err != nil {
				return sc, fmt.Errorf("segment %s: %w", sc.name, err)
			}
			if torn {
				// After the durable mark: unsynced writes that reached the
				// disk out of order. The intact records after the hole were
				// never confirmed durable either.
				sc.tornEnd, sc.reordered = max(dataEnd, bad.off+1), true
				return sc, nil
			}
		}
		return corrupt(fmt.Sprintf("%s; a valid record follows at offset %d, so this is damage in the middle of the log, not a torn write", bad.reason, validAt))
	}
	if bad.kind == badZero && dataEnd == bad.off {
		return sc, nil // preallocated zeros: the clean end of the data
	}
	if !isLast {
		return corrupt("non-zero bytes after the last record of a complete segment")
	}
	torn, err := looksTorn(f, bad, sc.size)
	if err != nil {
		return sc, fmt.Errorf("segment %s: %w", sc.name, err)
	}
	if !torn {
		return corrupt(bad.reason + " (the record is complete, so this is damage, not a torn write)")
	}
	sc.tornEnd = max(dataEnd, bad.off+1)
	return sc, nil
}
