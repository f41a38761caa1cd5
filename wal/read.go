package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
)

// ReadAfter calls fn, in sequence order, for every entry with a sequence
// above after, streaming from the segment files (the log is never held in
// memory). It first waits until everything Append accepted before the call
// is written. Entry.Data is valid only during fn. It is safe concurrently
// with Append, TruncateBefore and TruncateAfter.
//
// It stops at fn's first error and returns it unchanged. It returns a
// *CorruptionError (after the entries before the damage) if a record no
// longer checks out, ErrTruncated if TruncateBefore removed entries it still
// had to serve, and the *FailedError of a stopped log (after the durable
// entries) until Reopen.
func (l *Log) ReadAfter(after uint64, fn func(Entry) error) error {
	l.reopenMu.RLock()
	defer l.reopenMu.RUnlock()
	stuck, err := l.waitReadable()
	if err != nil {
		return err
	}
	seen := after // every sequence ≤ seen has been served or skipped
	var prevIndex uint64
	started := false
	for {
		seg, f, ok, err := l.openNext(prevIndex, started, after)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if started && seg.prevLast > seen && seg.index != prevIndex+1 {
			f.Close()
			return fmt.Errorf("%w: segments before %s were deleted while entries after sequence %d were being read; read again",
				ErrTruncated, seg.name(), seen)
		}
		started, prevIndex = true, seg.index
		stop, err := l.readSegment(f, seg, after, &seen, fn)
		f.Close()
		if err != nil {
			return err
		}
		if stop {
			break
		}
	}
	if stuck != nil {
		return fmt.Errorf("wal: served the entries up to sequence %d; the log stopped and must be reopened: %w", seen, stuck)
	}
	return nil
}

// waitReadable waits until everything Append accepted before the call is
// written (readable). stuck is the failure of a stopped log: what is
// durable may be read, then it is the reason there is no more.
func (l *Log) waitReadable() (stuck, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	target := l.lastSeq
	err = l.waitLocked(context.Background(), func() (bool, error) {
		switch {
		case l.readable >= min(target, l.lastSeq):
			return true, nil
		case l.stopped:
			return true, ErrClosed
		}
		return false, nil
	})
	if l.failure != nil {
		stuck = l.failure
	}
	return stuck, err
}

// CountAfter returns how many entries the log holds above sequence after,
// the bytes of their data (Entry.Data) and the last one's sequence (after,
// when there are none), without reading them: it adds up the counts
// recovery verified and the syncer wrote, per segment, and reads only in
// the segment where after falls, from the count point before it: at most
// countEvery bytes of record headers (payloads skipped) and the payload of
// one record holding entries on both sides of after (verified). A
// ReadAfter(after) serves exactly those entries unless the log changed in
// between. It waits as ReadAfter does; it returns a *CorruptionError if the
// records it reads no longer check out, and the *FailedError of a stopped
// log until Reopen.
func (l *Log) CountAfter(after uint64) (n int, bytes int64, last uint64, err error) {
	l.reopenMu.RLock()
	defer l.reopenMu.RUnlock()
	stuck, err := l.waitReadable()
	if err == nil && stuck != nil {
		err = fmt.Errorf("wal: the log stopped and must be reopened: %w", stuck)
	}
	if err != nil {
		return 0, 0, 0, err
	}
	l.segMu.RLock()
	segs := slices.Clone(l.segs)
	l.segMu.RUnlock()
	last = after
	for i := range segs {
		seg := &segs[i]
		switch {
		case seg.last == 0 || seg.last <= after:
			continue
		case seg.prevLast >= after:
			n, bytes = n+seg.entries, bytes+seg.dataBytes
		default:
			below, belowBytes, err := l.countThrough(seg, after)
			if err != nil {
				return 0, 0, 0, err
			}
			n, bytes = n+seg.entries-below, bytes+seg.dataBytes-belowBytes
		}
		last = seg.last
	}
	return n, bytes, last, nil
}

// countThrough counts the entries of seg with a sequence ≤ after, and
// their data bytes, from the last count point at or below after.
func (l *Log) countThrough(seg *segment, after uint64) (n int, bytes int64, err error) {
	from, prev := int64(segmentHeaderSize), seg.prevLast
	for _, p := range seg.points {
		if p.last > after || p.off > seg.size {
			break
		}
		from, prev, n, bytes = p.off, p.last, p.entries, p.dataBytes
	}
	f, err := openRead(segmentPath(l.dir, seg.index))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, fmt.Errorf("%w: segment %s was deleted while its entries were being counted; count again", ErrTruncated, seg.name())
		}
		return 0, 0, fmt.Errorf("wal: open segment %s: %w", seg.name(), err)
	}
	defer f.Close()
	rr := newRecordReader(f, from, seg.size)
	defer func() { // after trapFaults
		if errors.Is(err, errMapFault) && l.shrunk(seg.index, from) {
			n, bytes, err = 0, 0, fmt.Errorf("%w: segment %s was cut while its entries were being counted; count again", ErrTruncated, seg.name())
		}
	}()
	defer rr.close()
	defer trapFaults(seg.name())(&err)
	for {
		h, p, err := rr.next(prev, after, true)
		if errors.Is(err, io.EOF) {
			return n, bytes, nil
		}
		if err != nil {
			bad := asBad(err)
			if bad == nil {
				return 0, 0, fmt.Errorf("wal: read segment %s: %w", seg.name(), err)
			}
			if l.shrunk(seg.index, rr.off) {
				return 0, 0, fmt.Errorf("%w: segment %s was cut while its entries were being counted; count again", ErrTruncated, seg.name())
			}
			ce := &CorruptionError{Segment: seg.name(), Offset: bad.off, Reason: bad.reason}
			l.log.Error("WAL corruption found while counting entries; entries after it are not served", "err", ce)
			return 0, 0, ce
		}
		prev = h.last
		if h.last <= after {
			n, bytes = n+int(h.count), bytes+int64(h.plen)-int64(h.count)*entryHeaderSize
			continue
		}
		if h.first <= after {
			_ = forEachEntry(p, func(e Entry) error {
				if e.Sequence <= after {
					n, bytes = n+1, bytes+int64(len(e.Data))
				}
				return nil
			})
		}
		return n, bytes, nil
	}
}

// openNext opens the first segment after prevIndex (any, when !started) that
// may hold entries above after. Opening under the read lock means
// TruncateBefore cannot delete the file between the lookup and the open.
func (l *Log) openNext(prevIndex uint64, started bool, after uint64) (segment, *os.File, bool, error) {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	for _, s := range l.segs {
		if started && s.index <= prevIndex {
			continue
		}
		if s.last == 0 || s.last <= after {
			continue
		}
		f, err := openRead(segmentPath(l.dir, s.index))
		if err != nil {
			return s, nil, false, fmt.Errorf("wal: open segment %s: %w", s.name(), err)
		}
		return s, f, true, nil
	}
	return segment{}, nil, false, nil
}

// readSegment serves the entries above after from one segment, up to the
// size readers may see. stop reports that the segment shrank under us
// (TruncateAfter), so nothing after it is valid either.
func (l *Log) readSegment(f *os.File, seg segment, after uint64, seen *uint64, fn func(Entry) error) (stop bool, err error) {
	rr := newRecordReader(f, segmentHeaderSize, seg.size)
	defer func() { // after trapFaults
		// A fault is a read past the file's end: cut, as a short read is.
		if errors.Is(err, errMapFault) && l.shrunk(seg.index, rr.off) {
			stop, err = true, nil
		}
	}()
	defer rr.close()
	defer trapFaults(seg.name())(&err)
	last := seg.prevLast
	for {
		h, p, err := rr.next(last, after, true)
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			bad := asBad(err)
			if l.shrunk(seg.index, rr.off) {
				return true, nil
			}
			if bad == nil {
				return false, fmt.Errorf("wal: read segment %s: %w", seg.name(), err)
			}
			ce := &CorruptionError{Segment: seg.name(), Offset: bad.off, Reason: bad.reason}
			l.log.Error("WAL corruption found while reading; entries after it are not served", "err", ce)
			return false, ce
		}
		last = h.last
		if p != nil {
			if err := forEachEntry(p, func(e Entry) error {
				if e.Sequence <= after {
					return nil
				}
				*seen = e.Sequence
				return fn(e)
			}); err != nil {
				return false, err
			}
		}
		*seen = max(*seen, h.last)
	}
}

// shrunk reports whether segment index is gone or now ends at or before off.
func (l *Log) shrunk(index uint64, off int64) bool {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	for _, s := range l.segs {
		if s.index == index {
			return s.size <= off
		}
	}
	return true
}

// ReadDir calls fn, in order, for every entry with a sequence above after in
// the log in dir, without opening it as a Log: it takes no lock, changes
// nothing, and is safe while a supervisor runs (for `supervisor wal dump`
// and `status`). Entry.Data is valid only during fn.
//
// It stops quietly at a torn tail (as Open would truncate it) and returns a
// *CorruptionError, after the entries before it, for damage or a missing
// segment. Segments whose entries all lie at or below after are skipped
// unread, so damage there goes unreported. fn's errors are returned
// unchanged.
func ReadDir(dir string, after uint64, fn func(Entry) error) error {
	if fn == nil {
		return errors.New("wal: ReadDir needs a function to call")
	}
	return walkDir(dir, after, fn, nil)
}

// SegmentInfo describes one segment file.
type SegmentInfo struct {
	Name        string
	Size        int64  // file size (preallocated segments are full size)
	DataSize    int64  // bytes of valid records, header included
	First, Last uint64 // 0 when the segment holds no entries
	Entries     int
}

// DirInfo summarizes a log directory.
type DirInfo struct {
	Segments    []SegmentInfo
	Entries     int
	First, Last uint64
	// TornBytes is a torn tail Open would truncate.
	TornBytes int64
	// Corruption (a *CorruptionError) is the damage the scan stopped at;
	// Segments, Entries and Last describe the good prefix.
	Corruption error
}

// Inspect verifies every record of the log in dir, read-only like ReadDir,
// and summarizes it. Damage is reported in DirInfo.Corruption; the error is
// for unreadable directories and files.
func Inspect(dir string) (DirInfo, error) {
	var info DirInfo
	err := walkDir(dir, 0, nil, func(sc *segmentScan) {
		info.Segments = append(info.Segments, SegmentInfo{Name: sc.name, Size: sc.size, DataSize: sc.end,
			First: sc.first, Last: sc.last, Entries: sc.entries})
		info.Entries += sc.entries
		if info.First == 0 {
			info.First = sc.first
		}
		info.Last = sc.lastSeq()
		if sc.tornEnd > sc.end {
			info.TornBytes += sc.tornEnd - sc.end
		}
		if sc.headerTorn {
			info.TornBytes += sc.size
		}
	})
	var ce *CorruptionError
	if errors.As(err, &ce) {
		info.Corruption = ce
		return info, nil
	}
	return info, err
}

// walkDir scans the segments of dir read-only, passing entries above after
// to fn (when set) and each scanned segment to visit (when set).
func walkDir(dir string, after uint64, fn func(Entry) error, visit func(*segmentScan)) error {
	idx, err := listSegments(dir)
	if err != nil {
		return fmt.Errorf("wal: list segments in %s: %w", dir, err)
	}
	mark, markOK := readMark(dir)
	var (
		prev     uint64
		havePrev bool
		opened   bool
	)
	for i, index := range idx {
		name := segmentName(index)
		if i > 0 && index != idx[i-1]+1 {
			return &CorruptionError{Segment: segmentName(idx[i-1] + 1),
				Reason: fmt.Sprintf("segment missing: %s is followed by %s", segmentName(idx[i-1]), name)}
		}
		isLast := i == len(idx)-1
		if fn != nil && after > 0 && !isLast {
			// The next segment's header says where this one ends.
			if h, ok := peekHeader(dir, idx[i+1]); ok && h.prevLast <= after {
				havePrev = false
				continue
			}
		}
		f, err := openRead(segmentPath(dir, index))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && !opened {
				havePrev = false // deleted by a running supervisor's truncation
				continue
			}
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: segment %s disappeared while reading (a running supervisor removed it); run the command again", ErrTruncated, name)
			}
			return fmt.Errorf("wal: open segment %s: %w", name, err)
		}
		opened = true
		sc, err := scanSegment(f, name, index, scanOpts{isLast: isLast, prev: prev, havePrev: havePrev, after: after, fn: fn,
			durableEnd: markOffset(mark, markOK, index)})
		f.Close()
		if err != nil {
			return err
		}
		if visit != nil {
			visit(&sc)
		}
		if sc.corrupt != nil {
			return sc.corrupt
		}
		prev, havePrev = sc.lastSeq(), true
	}
	return nil
}

// peekHeader reads and checks the header of segment index.
func peekHeader(dir string, index uint64) (segmentHeader, bool) {
	f, err := openRead(segmentPath(dir, index))
	if err != nil {
		return segmentHeader{}, false
	}
	defer f.Close()
	b := make([]byte, segmentHeaderSize)
	if _, err := io.ReadFull(f, b); err != nil {
		return segmentHeader{}, false
	}
	h, reason, err := parseSegmentHeader(b)
	return h, reason == "" && err == nil && h.index == index
}
