package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// TruncateBefore deletes the oldest segments whose entries all have
// sequences ≤ watermark (the oldest retained checkpoint's watermark), oldest
// first. It never deletes the active (newest) segment, so the log may keep
// entries at or below the watermark. It returns the number of segments
// deleted. A ReadAfter running meanwhile either finishes from the files it
// has open or returns ErrTruncated.
func (l *Log) TruncateBefore(watermark uint64) (removed int, err error) {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	for {
		l.segMu.Lock()
		if len(l.segs) < 2 || l.segs[0].lastSeq() > watermark {
			l.segMu.Unlock()
			break
		}
		seg := l.segs[0]
		l.segs = slices.Clone(l.segs[1:])
		l.segMu.Unlock()
		if err := os.Remove(segmentPath(l.dir, seg.index)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.segMu.Lock()
			l.segs = append([]segment{seg}, l.segs...)
			l.segMu.Unlock()
			return removed, fmt.Errorf("wal: delete segment %s: %w", seg.name(), err)
		}
		// One directory fsync per deletion keeps the remaining segments a
		// contiguous run whatever moment a crash interrupts this.
		if err := atomicfile.SyncDir(l.dir); err != nil {
			return removed + 1, fmt.Errorf("wal: fsync directory after deleting segment %s: %w", seg.name(), err)
		}
		removed++
	}
	if removed > 0 {
		l.log.Debug("WAL segments deleted below the watermark", "segments", removed, "watermark", watermark, "first_sequence", l.FirstSequence())
	}
	return removed, nil
}

// TruncateAfter removes every entry with a sequence above seq, so the log
// ends at or below seq and the next Append continues from there (used when
// an operator rolls back to a checkpoint without its WAL). Entries appended
// while it runs wait for it and are judged against the new last sequence.
// It returns the number of entries removed. Each step is crash-safe: after a
// crash the log holds either the old or the new tail, never a mixture.
func (l *Log) TruncateAfter(seq uint64) (removed int, err error) {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, ErrClosed
	}
	ch := make(chan struct{})
	l.truncating = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.truncating = nil
		close(ch)
		l.mu.Unlock()
	}()
	return l.callN(request{kind: reqTruncateAfter, seq: seq})
}

// truncateAfter runs on the syncer goroutine after everything queued was
// written and fsynced.
func (l *Log) truncateAfter(seq uint64) (removed int, err error) {
	l.segMu.RLock()
	segs := slices.Clone(l.segs)
	l.segMu.RUnlock()
	k := slices.IndexFunc(segs, func(s segment) bool { return s.lastSeq() > seq })
	if k < 0 {
		return 0, nil
	}
	defer func() {
		// Whatever happened, the newest remaining segment is the active one.
		if rerr := l.reopenActive(); rerr != nil && err == nil {
			err = rerr
		}
		l.mu.Lock()
		l.lastSeq, l.readable, l.durable = l.s.lastSynced, l.s.lastSynced, l.s.lastSynced
		l.publishLocked()
		l.mu.Unlock()
		// The log shrank: the mark must not point past its new end.
		if merr := l.mark.set(markPos{index: l.s.cur.index, offset: l.s.durOff, seq: l.s.lastSynced}); merr != nil {
			l.log.Warn("could not update the WAL's durable mark after removing entries", "err", merr)
		}
		if err == nil {
			l.log.Warn("WAL entries removed after a sequence", "after", seq, "entries", removed, "last_sequence", l.s.lastSynced)
		} else if isSyncFailure(err) {
			// A deletion, rename or cut whose fsync failed may be undone
			// by a power cut, taking the entries appended after it with
			// it (a rewritten segment's new inode loses its name; a cut
			// file gets its old size back). The log stops, as after any
			// failed fsync; Reopen fsyncs the directory and the segment
			// again from what is on disk.
			err = l.failed(err)
		}
	}()
	// Newest first, so a crash leaves a contiguous run of segments.
	for i := len(segs) - 1; i > k; i-- {
		if err := os.Remove(segmentPath(l.dir, segs[i].index)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("wal: delete segment %s: %w", segs[i].name(), err)
		}
		l.segMu.Lock()
		l.segs = l.segs[:i]
		l.segMu.Unlock()
		if err := atomicfile.SyncDir(l.dir); err != nil {
			return removed, syncFailure{fmt.Errorf("wal: fsync directory after deleting segment %s: %w", segs[i].name(), err)}
		}
		removed += segs[i].entries
	}
	n, seg, err := l.cutAfter(segs[k], seq)
	removed += n
	l.segMu.Lock()
	l.segs[k] = seg // describes the file as it is now, even after an error
	l.segMu.Unlock()
	return removed, err
}

// cutAfter removes the entries above seq from one segment. A record holding
// entries on both sides of seq, or a header whose previous sequence is above
// seq, means rewriting the segment (temporary file and rename); otherwise it
// is truncated in place.
func (l *Log) cutAfter(seg segment, seq uint64) (removed int, out segment, err error) {
	path := segmentPath(l.dir, seg.index)
	f, err := openRead(path)
	if err != nil {
		return 0, seg, fmt.Errorf("wal: open segment %s: %w", seg.name(), err)
	}
	defer f.Close()
	out = seg
	out.tally = tally{} // counted again: the points may not be shared with seg's
	out.prevLast = min(seg.prevLast, seq)
	var (
		cut  int64 = -1
		kept []Entry
	)
	defer trapFaults(seg.name())(&err)
	rr := newRecordReader(f, segmentHeaderSize, seg.size)
	defer rr.close()
	last := seg.prevLast
	for {
		off := rr.off
		h, p, err := rr.next(last, 0, false)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return removed, seg, fmt.Errorf("wal: read segment %s to remove entries after %d: %w", seg.name(), seq, err)
		}
		last = h.last
		if cut < 0 && h.last <= seq {
			out.add(h, rr.off)
			continue
		}
		if cut < 0 {
			cut = off
			_ = forEachEntry(p, func(e Entry) error {
				if e.Sequence <= seq {
					kept = append(kept, Entry{Sequence: e.Sequence, Data: slices.Clone(e.Data)})
				} else {
					removed++
				}
				return nil
			})
			continue
		}
		removed += int(h.count)
	}
	if cut < 0 {
		cut = seg.size
	}
	if len(kept) > 0 {
		size := recordSize(kept)
		out.add(recordHeader{first: kept[0].Sequence, last: kept[len(kept)-1].Sequence, count: uint32(len(kept)),
			plen: uint32(size - recordHeaderSize)}, cut+size)
	}
	if len(kept) > 0 || out.prevLast != seg.prevLast {
		head := segmentHeader{index: seg.index, prevLast: out.prevLast}.marshal()
		body := io.NewSectionReader(f, segmentHeaderSize, cut-segmentHeaderSize)
		var rec []byte
		if len(kept) > 0 {
			rec = appendRecord(nil, kept)
		}
		if err := replaceFile(l.dir, seg.name(), bytes.NewReader(head), body, bytes.NewReader(rec)); err != nil {
			err = fmt.Errorf("wal: rewrite segment %s without the entries after %d: %w", seg.name(), seq, err)
			if errors.Is(err, atomicfile.ErrNotDurable) {
				// Renamed into place: the file is the rewritten one now,
				// whether or not the directory fsync succeeded. Describe
				// it as it is, as the in-place cut below does.
				out.size = cut + int64(len(rec))
				return removed, out, syncFailure{err}
			}
			return removed, seg, err
		}
		out.size = cut + int64(len(rec))
		return removed, out, nil
	}
	wf, err := os.OpenFile(path, os.O_RDWR|noFollow, 0)
	if err != nil {
		return removed, seg, fmt.Errorf("wal: open segment %s: %w", seg.name(), err)
	}
	defer wf.Close()
	if err := wf.Truncate(cut); err != nil {
		return removed, seg, fmt.Errorf("wal: truncate segment %s after sequence %d: %w", seg.name(), seq, err)
	}
	out.size = cut // the file is cut now, whether or not the fsync below succeeds
	if err := datasync(wf); err != nil {
		return removed, out, syncFailure{fmt.Errorf("wal: fsync segment %s: %w", seg.name(), err)}
	}
	return removed, out, nil
}
