package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The durable mark: a small file (markName) recording a position in the log
// known to be on disk — a segment index and the offset just after a record
// that an fsync covered. It tells a power cut apart from damage:
//
//   - bytes of the newest segment below the mark were fsynced; anything
//     wrong with them is corruption (the disk lost or changed data it had
//     confirmed), reported as such even when it looks like a torn write;
//   - bytes above it may never have reached the disk: when a machine loses
//     power, the unsynced pages of the last writes reach the disk in any
//     order, so a record with zeroed sectors followed by intact records is
//     an ordinary torn tail there, truncated and logged as one.
//
// The mark trails the log: a goroutine of its own rewrites it (one 40-byte
// pwrite and an fdatasync of its own file) at most every markInterval after
// fsyncs moved the durable end, so the append path never waits for it.
// Damage between the mark and the true durable end (data fsynced in the
// last markInterval) is classified as a torn tail if it looks like one; a
// disk that loses a sector it confirmed that recently loses those entries
// either way — the log is cut at the damage in both cases.
//
// Format (big-endian): magic "SVWALMK1" (8), segment index (8), offset (8),
// last sequence (8), CRC32C of bytes 0..32 (4), zero (4). A missing or
// damaged mark means "no mark": recovery then judges damage as it always did.
const (
	markName     = "DURABLE"
	markSize     = 40
	markInterval = 100 * time.Millisecond
)

var markMagic = [8]byte{'S', 'V', 'W', 'A', 'L', 'M', 'K', '1'}

// markPos is a durable position.
type markPos struct {
	index  uint64 // segment
	offset int64  // just after the last record known durable in it
	seq    uint64 // the last sequence known durable
}

func (p markPos) marshal() []byte {
	b := make([]byte, markSize)
	copy(b, markMagic[:])
	binary.BigEndian.PutUint64(b[8:], p.index)
	binary.BigEndian.PutUint64(b[16:], uint64(p.offset))
	binary.BigEndian.PutUint64(b[24:], p.seq)
	binary.BigEndian.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	return b
}

func parseMark(b []byte) (markPos, bool) {
	if len(b) < markSize || !bytes.Equal(b[:8], markMagic[:]) ||
		crc32.Checksum(b[:32], castagnoli) != binary.BigEndian.Uint32(b[32:]) {
		return markPos{}, false
	}
	p := markPos{index: binary.BigEndian.Uint64(b[8:]), offset: int64(binary.BigEndian.Uint64(b[16:])), seq: binary.BigEndian.Uint64(b[24:])}
	return p, p.index > 0 && p.offset >= segmentHeaderSize
}

// readMark reads the durable mark of the log in dir; ok is false when there
// is none (or it is damaged).
func readMark(dir string) (markPos, bool) {
	f, err := openRead(filepath.Join(dir, markName))
	if err != nil {
		return markPos{}, false
	}
	defer f.Close()
	b := make([]byte, markSize)
	if _, err := io.ReadFull(f, b); err != nil {
		return markPos{}, false
	}
	return parseMark(b)
}

// markOffset is where, in segment index (the newest), the bytes not known to
// be durable begin: the mark's offset when the mark is in this segment, the
// end of the header when the mark is in an older segment (the whole segment
// came after it), -1 when there is no usable mark (no judgement).
func markOffset(m markPos, ok bool, index uint64) int64 {
	switch {
	case !ok || m.index > index:
		return -1
	case m.index < index:
		return segmentHeaderSize
	}
	return m.offset
}

// marker keeps the mark file up to date. The syncer publishes durable
// positions with advance; run writes the newest one at most every
// markInterval; set writes one at once (after the log shrank).
type marker struct {
	f   *os.File
	ops fileOps

	posMu   sync.Mutex
	pos     markPos // the newest durable position published
	written markPos // what the file holds (wmu)
	wmu     sync.Mutex
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	failed  bool // the last write failed (wmu): logged once
	logFail func(error)
}

func openMarker(dir string, ops fileOps, logFail func(error)) (*marker, error) {
	f, err := os.OpenFile(filepath.Join(dir, markName), os.O_RDWR|os.O_CREATE|noFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wal: open the durable mark in %s: %w", dir, err)
	}
	return &marker{f: f, ops: ops, logFail: logFail, kick: make(chan struct{}, 1)}, nil
}

// set makes p the mark now (pwrite and fdatasync), waiting for a write in
// progress. Used when the log's durable end moved back (Reopen,
// TruncateAfter, recovery), where a trailing mark could point past the data.
func (m *marker) set(p markPos) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.posMu.Lock()
	m.pos = p
	m.posMu.Unlock()
	return m.writeLocked(p)
}

func (m *marker) writeLocked(p markPos) error {
	if _, err := m.ops.writeAt(m.f, p.marshal(), 0); err != nil {
		m.written = markPos{}
		return fmt.Errorf("write the WAL's durable mark: %w", err)
	}
	if err := m.ops.datasync(m.f); err != nil {
		m.written = markPos{}
		return fmt.Errorf("fsync the WAL's durable mark: %w", err)
	}
	m.written = p
	return nil
}

// advance publishes a durable position (from the syncer, after an fsync).
func (m *marker) advance(p markPos) {
	m.posMu.Lock()
	m.pos = p
	m.posMu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// start runs the background writer until stop.
func (m *marker) start() {
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	go m.run()
}

func (m *marker) run() {
	defer close(m.done)
	var last time.Time
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
		}
		if d := markInterval - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-m.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		m.wmu.Lock()
		m.posMu.Lock()
		p := m.pos
		m.posMu.Unlock()
		if p != m.written {
			err := m.writeLocked(p)
			if err != nil && !m.failed && m.logFail != nil {
				m.logFail(err)
			}
			m.failed = err != nil
		}
		m.wmu.Unlock()
	}
}

// halt stops the background writer (it may be started again).
func (m *marker) halt() {
	if m.stop != nil {
		close(m.stop)
		<-m.done
		m.stop = nil
	}
}

func (m *marker) close() {
	m.halt()
	m.f.Close()
}
