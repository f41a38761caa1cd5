package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

func segmentPath(dir string, index uint64) string { return filepath.Join(dir, segmentName(index)) }

// listSegments returns the indexes of the segment files in dir, ascending.
func listSegments(dir string) ([]uint64, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var idx []uint64
	for _, de := range des {
		if i, ok := parseSegmentName(de.Name()); ok && de.Type().IsRegular() {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	return idx, nil
}

// recover scans the segments, repairs a torn tail, cuts the log at
// corruption, and leaves the syncer state pointing at the active segment.
func (l *Log) recover() error {
	des, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("wal: read directory %s: %w", l.dir, err)
	}
	for _, de := range des {
		if strings.HasSuffix(de.Name(), tmpSuffix) {
			if err := os.Remove(filepath.Join(l.dir, de.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("wal: remove leftover temporary file: %w", err)
			}
		}
	}
	idx, err := listSegments(l.dir)
	if err != nil {
		return fmt.Errorf("wal: list segments in %s: %w", l.dir, err)
	}
	mark, markOK := readMark(l.dir)
	ahead := startScanAhead(l.dir, idx, func(i int) scanOpts {
		return scanOpts{isLast: i == len(idx)-1, durableEnd: markOffset(mark, markOK, idx[i])}
	})
	defer ahead.close()
	var (
		scans   []segmentScan
		corrupt *CorruptionError
		prev    uint64 // last sequence of the previous segment
		start   int    // idx[start:] are the segments still in the log
	)
	for i := 0; i < len(idx); i++ {
		index := idx[i]
		name := segmentName(index)
		if i > start && index != idx[i-1]+1 {
			ce := &CorruptionError{Segment: segmentName(idx[i-1] + 1),
				Reason: fmt.Sprintf("segment missing: %s is followed by %s", segmentName(idx[i-1]), name)}
			dropped, err := l.dropCovered(idx[start:i], index, ce)
			if err != nil {
				return err
			}
			if dropped {
				scans, prev, start = nil, 0, i
				i--
				continue
			}
			corrupt = ce
			if err := l.quarantine(idx[i:], corrupt); err != nil {
				return err
			}
			break
		}
		sc, ok := ahead.take(i, prev, i > start)
		if !ok {
			f, err := openRead(segmentPath(l.dir, index))
			if err != nil {
				return fmt.Errorf("wal: open segment %s: %w (the log will not skip an unreadable segment: fix its permissions or restore it from a backup)", name, err)
			}
			sc, err = scanSegment(f, name, index, scanOpts{isLast: i == len(idx)-1, prev: prev, havePrev: i > start,
				durableEnd: markOffset(mark, markOK, index)})
			f.Close()
			if err != nil {
				return fmt.Errorf("wal: recover: %w", err)
			}
		}
		if sc.corrupt != nil {
			if i < len(idx)-1 {
				dropped, err := l.dropCovered(idx[start:i+1], idx[i+1], sc.corrupt)
				if err != nil {
					return err
				}
				if dropped {
					scans, prev, start = nil, 0, i+1
					continue
				}
			}
			corrupt = sc.corrupt
			if corrupt.Offset < segmentHeaderSize {
				// The segment itself is unusable: set it aside with the rest.
				if err := l.quarantine(idx[i:], corrupt); err != nil {
					return err
				}
				break
			}
			if err := l.quarantine(idx[i+1:], corrupt); err != nil {
				return err
			}
			if err := l.cutSegment(sc, corrupt); err != nil {
				return err
			}
			scans = append(scans, sc)
			break
		}
		scans = append(scans, sc)
		prev = sc.lastSeq()
	}
	if len(scans) == 0 {
		index := uint64(1)
		if len(idx) > 0 {
			index = idx[start] // everything was set aside: start again at the same place
		}
		var after uint64
		if len(idx) == 0 {
			after = l.opts.StartAfter // a new log: it starts where it is told
		}
		if err := l.createFirst(index, after); err != nil {
			return err
		}
		scans = append(scans, segmentScan{name: segmentName(index), index: index, prevLast: after, end: segmentHeaderSize})
	}
	last := &scans[len(scans)-1]
	if err := l.repairTail(last); err != nil {
		return err
	}
	f, err := os.OpenFile(segmentPath(l.dir, last.index), os.O_RDWR|noFollow, 0)
	if err != nil {
		return fmt.Errorf("wal: open active segment %s: %w", last.name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("wal: stat active segment %s: %w", last.name, err)
	}
	entries := 0
	for _, sc := range scans {
		entries += sc.entries
		l.segs = append(l.segs, segment{index: sc.index, prevLast: sc.prevLast, tally: sc.tally, size: sc.end})
	}
	// What recovery saw and changed (segments created, repaired, set aside,
	// temporary files removed) is made durable before anything is served:
	// the directory, and the active segment (after a crash of the process
	// alone, its last records may still be only in the page cache).
	if err := atomicfile.SyncDir(l.dir); err != nil {
		f.Close()
		return fmt.Errorf("wal: recover: %w", err)
	}
	if err := l.ops.datasync(f); err != nil {
		f.Close()
		return fmt.Errorf("wal: recover: %w", fsyncFailure("fsync active segment "+last.name, err))
	}
	active := l.segs[len(l.segs)-1]
	if err := l.mark.set(markPos{index: active.index, offset: active.size, seq: active.lastSeq()}); err != nil {
		l.log.Warn("could not update the WAL's durable mark; a power cut may be reported as corruption", "err", err)
	}
	s := &l.s
	s.f = f
	s.writeOff, s.durOff, s.allocSize = active.size, active.size, fi.Size()
	s.cur, s.syn = active, active
	s.lastWritten, s.lastSynced = active.lastSeq(), active.lastSeq()
	l.scan.Segments = len(l.segs)
	l.scan.Entries = entries
	for _, ce := range l.scan.Covered {
		l.log.Warn("WAL damage below the newest checkpoint's watermark: the damaged segment and those before it were set aside; no entry a restore needs was lost",
			"err", ce, "moved_aside", ce.Moved)
	}
	if corrupt != nil {
		l.scan.Corruption = corrupt
		l.log.Error("WAL corruption: the log was cut at the damage and continues from the good prefix; entries after it are not served",
			"err", corrupt, "last_good_sequence", active.lastSeq(), "moved_aside", corrupt.Moved)
	}
	l.mu.Lock()
	l.lastSeq, l.readable, l.durable = active.lastSeq(), active.lastSeq(), active.lastSeq()
	l.recovery = l.scan
	l.mu.Unlock()
	return nil
}

// repairTail fixes a torn tail (or a never-written header) of the newest segment.
func (l *Log) repairTail(sc *segmentScan) error {
	path := segmentPath(l.dir, sc.index)
	if sc.headerTorn {
		prev := sc.prevLast // the previous segment's last sequence, or 0
		if err := replaceFile(l.dir, sc.name, bytes.NewReader(segmentHeader{index: sc.index, prevLast: prev}.marshal())); err != nil {
			return fmt.Errorf("wal: rewrite the header of segment %s: %w", sc.name, err)
		}
		sc.prevLast, sc.end, sc.headerTorn = prev, segmentHeaderSize, false
		l.scan.TruncatedBytes += sc.size
		l.log.Warn("WAL segment without a header (crash while creating it) was reinitialized", "segment", sc.name, "bytes", sc.size)
		return nil
	}
	if sc.tornEnd <= sc.end {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|noFollow, 0)
	if err != nil {
		return fmt.Errorf("wal: open segment %s to truncate its torn tail: %w", sc.name, err)
	}
	defer f.Close()
	if sc.tornEnd >= sc.size {
		err = f.Truncate(sc.end)
	} else {
		// Preallocated: keep the size, zero the torn bytes.
		for off := sc.end; off < sc.tornEnd && err == nil; {
			n := min(int64(len(zeroPage)), sc.tornEnd-off)
			_, err = f.WriteAt(zeroPage[:n], off)
			off += n
		}
	}
	if err == nil {
		err = datasync(f)
	}
	if err != nil {
		return fmt.Errorf("wal: truncate the torn tail of segment %s: %w", sc.name, err)
	}
	l.scan.TruncatedBytes += sc.tornEnd - sc.end
	if sc.reordered {
		l.log.Warn("WAL torn tail truncated: after the last position known durable, a crash left the last unsynced writes partly on disk, out of order (a power cut, not corruption)",
			"segment", sc.name, "offset", sc.end, "bytes", sc.tornEnd-sc.end, "last_sequence", sc.lastSeq())
		return nil
	}
	l.log.Warn("WAL torn tail truncated (the last write before a crash was incomplete)",
		"segment", sc.name, "offset", sc.end, "bytes", sc.tornEnd-sc.end, "last_sequence", sc.lastSeq())
	return nil
}

// createFirst creates segment index as the log's only segment.
func (l *Log) createFirst(index, prevLast uint64) error {
	var pf *os.File
	var ppath string
	if !l.opts.NoPreallocate {
		pf, ppath = l.prep.take() // one a previous run prepared, if any
	}
	if !l.opts.NoPreallocate && pf == nil {
		var err error
		if pf, ppath, err = l.prep.prepare(); err != nil {
			l.log.Warn("could not preallocate the first WAL segment; it will grow as written", "err", err)
			pf = nil
		}
	}
	f, _, err := l.installSegment(index, prevLast, pf, ppath)
	if err != nil {
		return fmt.Errorf("wal: create the first segment: %w", err)
	}
	f.Close()
	return nil
}

// installSegment writes the header of segment index into pf (a prepared
// file at ppath) or a new file, fsyncs it and renames it into place. It
// returns the open file and its size.
func (l *Log) installSegment(index, prevLast uint64, pf *os.File, ppath string) (*os.File, int64, error) {
	name := segmentName(index)
	f, tmp := pf, ppath
	if f == nil {
		tmp = segmentPath(l.dir, index) + tmpSuffix
		var err error
		if f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|noFollow, 0o600); err != nil {
			return nil, 0, ioFailure("create segment "+name, err)
		}
	}
	fail := func(op string, err error) (*os.File, int64, error) {
		f.Close()
		os.Remove(tmp)
		// The temporary file is gone: report the errno, not its path.
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, 0, ioFailure(op+" "+name, err)
	}
	if _, err := l.ops.writeAt(f, segmentHeader{index: index, prevLast: prevLast}.marshal(), 0); err != nil {
		return fail("write header of segment", err)
	}
	if err := l.ops.datasync(f); err != nil {
		_, _, err := fail("fsync new segment", err)
		return nil, 0, syncFailure{err}
	}
	if err := os.Rename(tmp, segmentPath(l.dir, index)); err != nil {
		return fail("rename into place segment", err)
	}
	if err := atomicfile.SyncDir(l.dir); err != nil {
		// The segment is in place but its directory entry may not survive
		// a power cut: the log stops (Reopen fsyncs the directory again).
		f.Close()
		return nil, 0, fsyncFailure("fsync directory after creating segment "+name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, ioFailure("stat segment "+name, err)
	}
	// The handle was opened under the temporary name, and errors from it
	// would name a file that no longer exists: hold the segment under its
	// own name instead.
	final, err := os.OpenFile(segmentPath(l.dir, index), os.O_RDWR|noFollow, 0)
	if err != nil {
		f.Close()
		return nil, 0, ioFailure("reopen new segment "+name, err)
	}
	if ffi, err := final.Stat(); err != nil || !os.SameFile(fi, ffi) {
		final.Close()
		f.Close()
		return nil, 0, ioFailure("reopen new segment "+name, fmt.Errorf("%s was replaced while it was being created", segmentPath(l.dir, index)))
	}
	f.Close()
	return final, fi.Size(), nil
}

// dropCovered handles damage (ce) in the last segment of prefix when the
// segment after it, next, starts the log above sequences that the newest
// checkpoint covers (Options.CoveredThrough): nothing a restore needs is in
// prefix, so prefix is set aside whole, oldest first, and the log continues
// from next with every entry it holds intact. It reports false, changing
// nothing, when next's header cannot be read or the damage may hold entries
// a restore still needs.
func (l *Log) dropCovered(prefix []uint64, next uint64, ce *CorruptionError) (bool, error) {
	h, ok := peekHeader(l.dir, next)
	if !ok || h.index != next || h.prevLast > l.opts.CoveredThrough {
		return false, nil
	}
	for _, index := range prefix {
		name := segmentName(index)
		q := l.quarantineName(name)
		if err := os.Rename(filepath.Join(l.dir, name), filepath.Join(l.dir, q)); err != nil {
			return false, fmt.Errorf("wal: set aside segment %s after damage below the checkpoint watermark (%v): %w", name, ce, err)
		}
		if err := atomicfile.SyncDir(l.dir); err != nil {
			return false, fmt.Errorf("wal: fsync directory after setting aside %s: %w", name, err)
		}
		ce.Moved = append(ce.Moved, q)
	}
	ce.Reason += fmt.Sprintf("; every entry it could hold is at or below sequence %d, which the newest checkpoint covers, so the log continues intact from %s",
		h.prevLast, segmentName(next))
	ce.Covered = true
	l.scan.Covered = append(l.scan.Covered, ce)
	return true, nil
}

// quarantineName is the name a damaged file is set aside under.
func (l *Log) quarantineName(name string) string {
	base := name + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	q := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(filepath.Join(l.dir, q)); errors.Is(err, fs.ErrNotExist) {
			return q
		}
		q = fmt.Sprintf("%s-%d", base, i)
	}
}

// quarantine renames the segments idx aside, newest first, so the segments
// left are always a contiguous run whatever moment a crash interrupts it.
func (l *Log) quarantine(idx []uint64, ce *CorruptionError) error {
	for i := len(idx) - 1; i >= 0; i-- {
		name := segmentName(idx[i])
		q := l.quarantineName(name)
		if err := os.Rename(filepath.Join(l.dir, name), filepath.Join(l.dir, q)); err != nil {
			return fmt.Errorf("wal: set aside segment %s after corruption (%v): %w", name, ce, err)
		}
		if err := atomicfile.SyncDir(l.dir); err != nil {
			return fmt.Errorf("wal: fsync directory after setting aside %s: %w", name, err)
		}
		ce.Moved = append(ce.Moved, q)
	}
	return nil
}

// cutSegment keeps the original of a segment with a corrupt record under a
// quarantine name and replaces the segment by its good prefix.
func (l *Log) cutSegment(sc segmentScan, ce *CorruptionError) error {
	path := segmentPath(l.dir, sc.index)
	q := l.quarantineName(sc.name)
	src, err := openRead(path)
	if err != nil {
		return fmt.Errorf("wal: open corrupt segment %s: %w", sc.name, err)
	}
	defer src.Close()
	if err := os.Link(path, filepath.Join(l.dir, q)); err != nil {
		// No hard links here: keep a copy instead.
		if err := replaceFile(l.dir, q, io.NewSectionReader(src, 0, sc.size)); err != nil {
			return fmt.Errorf("wal: keep a copy of corrupt segment %s: %w", sc.name, err)
		}
	}
	if err := replaceFile(l.dir, sc.name, io.NewSectionReader(src, 0, sc.end)); err != nil {
		return fmt.Errorf("wal: cut corrupt segment %s to its good prefix: %w", sc.name, err)
	}
	ce.Moved = append(ce.Moved, q)
	return nil
}

// replaceFile makes dir/name hold the concatenation of parts, atomically
// (internal/atomicfile).
func replaceFile(dir, name string, parts ...io.Reader) error {
	_, err := atomicfile.Write(dir, name, func(f *os.File) error {
		_, err := io.Copy(f, io.MultiReader(parts...))
		return err
	})
	return err
}
