package wal

import (
	"fmt"
	"os"
	"slices"
	"time"
)

// fileOps is the write path's access to files; tests inject faults here.
type fileOps interface {
	writeAt(f *os.File, p []byte, off int64) (int, error)
	datasync(f *os.File) error
	truncate(f *os.File, size int64) error
}

type osOps struct{}

func (osOps) writeAt(f *os.File, p []byte, off int64) (int, error) { return f.WriteAt(p, off) }
func (osOps) datasync(f *os.File) error                            { return datasync(f) }
func (osOps) truncate(f *os.File, size int64) error                { return f.Truncate(size) }

// batchBuf holds encoded records on their way to the disk: Append fills one,
// the syncer writes it and keeps it until its records are durable, so a
// failed fsync can write them again.
type batchBuf struct {
	buf     []byte
	recs    []recMeta
	written int // records written to the file
	synced  int // records made durable
}

type recMeta struct {
	end         int // offset in buf just after the record
	first, last uint64
	count       int
}

func (b *batchBuf) add(entries []Entry) {
	b.buf = appendRecord(b.buf, entries)
	b.recs = append(b.recs, recMeta{end: len(b.buf), first: entries[0].Sequence, last: entries[len(entries)-1].Sequence, count: len(entries)})
}

// start is the offset in buf of record i.
func (b *batchBuf) start(i int) int {
	if i == 0 {
		return 0
	}
	return b.recs[i-1].end
}

func (l *Log) pendingBytes() int { return l.pendingN }

// batchBufSize is the capacity of a batch buffer. Append fills one and then
// starts the next rather than growing it: growing a buffer copies it into
// fresh memory, and each copy costs page faults, on the reader's goroutine.
// Full buffers go back to a free list, at most maxFreeBufs of them (the
// memory a flood leaves behind).
const (
	batchBufSize = 512 << 10
	maxFreeBufs  = 16
)

// addPendingLocked encodes entries as one record at the end of the pending
// buffers, starting a new buffer when the last one has no room for it.
func (l *Log) addPendingLocked(entries []Entry) {
	size := int(recordSize(entries))
	n := len(l.pending)
	if n == 0 || cap(l.pending[n-1].buf)-len(l.pending[n-1].buf) < size {
		l.pending = append(l.pending, l.newBatchLocked(size))
		n++
	}
	l.pending[n-1].add(entries)
	l.pendingN += size
}

// newBatchLocked returns an empty buffer with room for at least size bytes.
func (l *Log) newBatchLocked(size int) *batchBuf {
	if n := len(l.free); n > 0 && size <= batchBufSize {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	return &batchBuf{buf: make([]byte, 0, max(size, batchBufSize))}
}

// takePendingLocked hands the pending buffers over to the caller.
func (l *Log) takePendingLocked() []*batchBuf {
	bs := l.pending
	l.pending, l.pendingN = nil, 0
	return bs
}

// release returns fully written-and-synced (or dropped) buffers to the free list.
func (l *Log) release(bs ...*batchBuf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bs {
		// A buffer may be both queued and unsynced: keep it once.
		if cap(b.buf) != batchBufSize || len(l.free) >= maxFreeBufs || slices.Contains(l.free, b) {
			continue
		}
		b.buf, b.recs, b.written, b.synced = b.buf[:0], b.recs[:0], 0, 0
		l.free = append(l.free, b)
	}
}

func (l *Log) hasPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) > 0
}

// syncState is the writer's state: the active segment file and the data
// between Append and the disk. It belongs to whoever holds drainMu — the
// syncer goroutine, or a SyncIfIdle caller standing in for it.
type syncState struct {
	f                                     *os.File
	writeOff, durOff, allocSize, dirtyEnd int64
	// cur describes the active segment as written; syn as durable.
	cur, syn                segment
	lastWritten, lastSynced uint64
	queue                   []*batchBuf // accepted, not yet (fully) written, oldest first
	unsynced                []*batchBuf // written since the last fsync (not under SyncNone)
	unsyncedEntries         int
	unsyncedBytes           int
	unsyncedSince           time.Time
	firstUnsynced           uint64 // the first sequence written since the last fsync
	prepRequested           bool
	closeErr                error
}

type reqKind int

const (
	reqSync reqKind = iota
	reqTruncateAfter
	reqReopen
)

type request struct {
	kind  reqKind
	seq   uint64
	reply chan reply
}

type reply struct {
	n   int
	seq uint64 // reqReopen: the last sequence
	err error
}

// call runs a request on the syncer goroutine.
func (l *Log) call(r request) error {
	_, err := l.callN(r)
	return err
}

func (l *Log) callN(r request) (int, error) {
	rep := l.callReply(r)
	return rep.n, rep.err
}

func (l *Log) callReply(r request) reply {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return reply{err: ErrClosed}
	}
	r.reply = make(chan reply, 1)
	select {
	case l.reqs <- r:
	case <-l.done:
		return reply{err: ErrClosed}
	}
	return <-r.reply
}

// run is the syncer goroutine. It owns the active segment, writes what
// Append queued, fsyncs per the policy, serves Sync and TruncateAfter, and
// exits after a final flush when Close closes l.stop.
func (l *Log) run() {
	defer close(l.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		var timerC <-chan time.Time
		if armed {
			timerC = timer.C
		}
		select {
		case <-l.stop:
			l.drainMu.Lock()
			defer l.drainMu.Unlock()
			if err := l.drain(true, true); err != nil {
				l.s.closeErr = fmt.Errorf("wal: close: entries accepted after sequence %d could not be made durable: %w", l.s.lastSynced, err)
			} else if l.s.f != nil {
				// A clean close leaves the mark at the end of the log.
				l.mark.halt()
				_ = l.mark.set(markPos{index: l.s.cur.index, offset: l.s.durOff, seq: l.s.lastSynced})
			}
			l.mu.Lock()
			l.stopped = true
			l.publishLocked()
			l.mu.Unlock()
			timer.Stop()
			return
		case r := <-l.reqs:
			l.drainMu.Lock()
			rep := l.serve(r)
			l.drainMu.Unlock()
			r.reply <- rep
		case <-l.kick:
		case <-timerC:
			armed = false
		}
		l.drainMu.Lock()
		_ = l.drain(false, false)
		l.drainMu.Unlock()
	}
}

// SyncIfIdle makes the entries up to seq durable on the caller's goroutine
// when the syncer is not at work: it writes what is queued and fsyncs, as
// the syncer would (the watchers run here, right after the fsync). It
// reports false, doing nothing, when the syncer (or another caller) is
// writing: that write or the next, which Hurry asks for, covers seq. For a
// caller that would otherwise only wait — one entry in flight, nothing else
// to read — it saves the hand-off to the syncer goroutine and the thread
// wake-up that costs on an idle machine. The caller blocks for the fsync:
// on a frozen disk, until it thaws.
func (l *Log) SyncIfIdle(seq uint64) bool {
	if time.Duration(l.lastSyncNanos.Load()) >= inlineSyncMax {
		// The disk was slow last time (or froze): the syncer waits for
		// it, the caller goes on reading.
		return false
	}
	if !l.drainMu.TryLock() {
		return false
	}
	defer l.drainMu.Unlock()
	l.mu.Lock()
	if l.stopped || l.closed || l.failure != nil {
		l.mu.Unlock()
		return false
	}
	if seq > l.wanted {
		l.wanted = seq
	}
	done := l.durable >= seq
	l.mu.Unlock()
	if !done {
		_ = l.drain(false, false)
	}
	if !l.hasPending() {
		l.kickOwed.Store(false) // written here: nothing for the syncer
	}
	return true
}

// inlineSyncMax: an fsync this slow makes SyncIfIdle leave the next ones
// to the syncer (a slow or freezing disk must not hold up the caller).
const inlineSyncMax = 20 * time.Millisecond

// HoldKick makes Append leave the syncer asleep until ReleaseKick, for an
// appender that will make its entries durable itself (SyncIfIdle) when the
// syncer is idle: waking it for nothing costs a thread wake-up on the path
// to the ack. The log's only appender calls both, around one append.
func (l *Log) HoldKick() { l.kickHeld.Store(true) }

// ReleaseKick ends HoldKick, waking the syncer if an Append meanwhile left
// anything for it.
func (l *Log) ReleaseKick() {
	l.kickHeld.Store(false)
	if l.kickOwed.Swap(false) {
		l.kickSyncer()
	}
}

func (l *Log) serve(r request) reply {
	if r.kind == reqReopen {
		// A healthy log first makes what it accepted durable; if that
		// fails, the log stops and is reopened from the disk all the same.
		_ = l.drain(true, true)
		seq, err := l.reopen()
		return reply{seq: seq, err: err}
	}
	if err := l.drain(true, true); err != nil {
		return reply{err: err}
	}
	if r.kind == reqTruncateAfter {
		n, err := l.truncateAfter(r.seq)
		return reply{n: n, err: err}
	}
	return reply{}
}

// drain writes everything queued and fsyncs per the policy: at once under
// SyncAlways or when someone waits, otherwise as soon as nothing more is
// queued, or after SyncInterval under a steady flood. force ignores the retry
// back-off; syncAll fsyncs whatever was written, under every policy.
func (l *Log) drain(force, syncAll bool) error {
	s := &l.s
	for {
		l.mu.Lock()
		if fe := l.failure; fe != nil {
			// Stopped: nothing is written or fsynced again until Reopen.
			drop := l.takePendingLocked()
			l.mu.Unlock()
			l.release(drop...)
			return fe
		}
		s.queue = append(s.queue, l.takePendingLocked()...)
		waiters := l.waiters > 0 || l.wanted > l.durable
		l.mu.Unlock()
		did := false
		if len(s.queue) > 0 {
			if err := l.writeQueue(); err != nil {
				return l.failed(err)
			}
			did = true
		}
		if s.writeOff != s.durOff && (l.opts.Sync != SyncNone || syncAll) {
			more := l.hasPending()
			if syncAll || !more || waiters || l.opts.Sync == SyncAlways || time.Since(s.unsyncedSince) >= l.opts.SyncInterval {
				if err := l.syncActive(); err != nil {
					return l.failed(err)
				}
				did = true
			}
		}
		if did {
			l.succeeded()
		}
		if !l.hasPending() {
			return nil
		}
	}
}

// writeQueue writes the queued records, rolling to a new segment when the
// next record does not fit.
func (l *Log) writeQueue() error {
	s := &l.s
	if s.f == nil {
		if err := l.reopenActive(); err != nil {
			return err
		}
	}
	if err := l.cleanDirty(); err != nil {
		return err
	}
	for len(s.queue) > 0 {
		b := s.queue[0]
		i := b.written
		start := b.start(i)
		if s.writeOff > segmentHeaderSize && s.writeOff+int64(b.recs[i].end-start) > l.opts.SegmentSize {
			if err := l.roll(); err != nil {
				return err
			}
		}
		j := i + 1
		for j < len(b.recs) && s.writeOff+int64(b.recs[j].end-start) <= l.opts.SegmentSize {
			j++
		}
		end := b.recs[j-1].end
		n, err := l.ops.writeAt(s.f, b.buf[start:end], s.writeOff)
		if err != nil {
			// Any of the bytes may have reached the file: os.File.WriteAt
			// reports 0 written when a pwrite wrote part of them and the
			// next one failed (ENOSPC). Clear the whole range.
			s.dirtyEnd = max(s.dirtyEnd, s.writeOff+int64(max(n, end-start)))
			return ioFailure(fmt.Sprintf("write %d bytes to segment %s at offset %d", end-start, s.cur.name(), s.writeOff), err)
		}
		entries := 0
		for k, off := i, s.writeOff; k < j; k++ {
			r := b.recs[k]
			size := int64(r.end - b.start(k))
			off += size
			s.cur.add(recordHeader{first: r.first, last: r.last, count: uint32(r.count), plen: uint32(size - recordHeaderSize)}, off)
			entries += r.count
		}
		if s.unsyncedBytes == 0 {
			s.unsyncedSince = time.Now()
			s.firstUnsynced = b.recs[i].first
		}
		s.unsyncedEntries += entries
		s.unsyncedBytes += end - start
		s.writeOff += int64(end - start)
		s.cur.size = s.writeOff
		s.lastWritten = s.cur.last
		b.written = j
		if j == len(b.recs) {
			s.queue[0] = nil
			s.queue = s.queue[1:]
		}
		if l.opts.Sync == SyncNone {
			if j == len(b.recs) {
				l.release(b)
			}
		} else if n := len(s.unsynced); n == 0 || s.unsynced[n-1] != b {
			s.unsynced = append(s.unsynced, b)
		}
		if l.opts.Sync != SyncAlways {
			l.publishMeta(s.cur, l.opts.Sync == SyncNone)
		}
	}
	if !l.opts.NoPreallocate && !s.prepRequested && s.writeOff > l.opts.SegmentSize/2 {
		l.prep.request()
		s.prepRequested = true
	}
	return nil
}

// publishMeta makes seg (the active segment) visible to readers and, with
// durable, its last sequence durable.
func (l *Log) publishMeta(seg segment, durable bool) {
	l.segMu.Lock()
	l.segs[len(l.segs)-1] = seg
	l.segMu.Unlock()
	l.mu.Lock()
	l.readable = seg.lastSeq()
	if durable {
		l.durable = l.readable
	}
	if !durable || !l.watched.Load() {
		l.publishLocked()
		l.mu.Unlock()
		return
	}
	d := l.durable
	l.mu.Unlock()
	// The watchers first (an ack written from here, no hand-off), then the
	// waiters.
	l.callWatchers(d, nil)
	l.mu.Lock()
	l.publishLocked()
	l.mu.Unlock()
}

// syncActive fsyncs the active segment. A failed fsync stops the log (see
// failed): what it covered is never written or fsynced again.
func (l *Log) syncActive() error {
	s := &l.s
	if s.writeOff == s.durOff {
		return nil
	}
	t0 := time.Now()
	err := l.ops.datasync(s.f)
	d := time.Since(t0)
	l.lastSyncNanos.Store(int64(d))
	if err != nil {
		return fsyncFailure(fmt.Sprintf("fsync segment %s", s.cur.name()), err)
	}
	entries, bytes := s.unsyncedEntries, s.unsyncedBytes
	s.unsyncedEntries, s.unsyncedBytes = 0, 0
	s.durOff = s.writeOff
	s.syn = s.cur
	s.lastSynced = s.lastWritten
	var done []*batchBuf
	for _, b := range s.unsynced {
		b.synced = b.written
		if b.synced == len(b.recs) {
			done = append(done, b)
		}
	}
	clear(s.unsynced)
	s.unsynced = s.unsynced[:0]
	l.release(done...)
	l.publishMeta(s.syn, true)
	l.mark.advance(markPos{index: s.cur.index, offset: s.durOff, seq: s.lastSynced})
	if d > slowSync {
		l.log.Warn("slow WAL fsync; the disk is overloaded or failing", "seconds", d.Seconds(), "segment", s.cur.name(), "bytes", bytes)
	}
	if l.opts.OnSync != nil {
		l.opts.OnSync(d, entries, bytes)
	}
	return nil
}

// rewind forgets what was written since the last fsync: the file region is
// marked dirty (cleared before the next write) and readers stop at the last
// durable record.
func (l *Log) rewind() {
	s := &l.s
	if s.writeOff > s.durOff {
		s.dirtyEnd = max(s.dirtyEnd, s.writeOff)
	}
	s.writeOff = s.durOff
	s.cur = s.syn
	// Readers may hold the longer count points published before: the
	// next point goes to a new array, never over one they read.
	s.cur.points = slices.Clip(s.cur.points)
	s.lastWritten = s.lastSynced
	s.unsyncedEntries, s.unsyncedBytes = 0, 0
	l.publishMeta(s.cur, false)
}

// failed records a write-path failure. Every entry accepted and not yet
// durable is dropped: the bytes written for it are cleared from the segment
// (zeroed or truncated, and fsynced) before anyone is told, and its sequence
// is not consumed. Then:
//
//   - a failed fsync, under every policy, stops the log (SPEC §4: a failed
//     fsync is never retried as if the data were safe; Linux may already have
//     dropped the pages and marked them clean): l.failure is set, and
//     everything but Reopen and Close fails with it;
//   - a failed write under SyncBatch or SyncNone stops it too: the Appends of
//     the dropped entries have returned already, so only the FailedError can
//     tell their range;
//   - a failed write under SyncAlways fails the Appends waiting for it (they
//     learn it from their own call) and the log goes on with the next one,
//     so a full disk clears by itself once space is freed.
//
// If the bytes cannot be cleared, the log stops whatever the policy: a
// refused entry must not come back after a crash.
func (l *Log) failed(err error) error {
	s := &l.s
	sticky := isSyncFailure(err) || l.opts.Sync != SyncAlways
	// The lowest sequence that is not durable: written since the last fsync,
	// else the first not written.
	var first uint64
	switch {
	case s.unsyncedBytes > 0 || s.lastWritten > s.lastSynced:
		first = s.firstUnsynced
	case len(s.queue) > 0:
		first = s.queue[0].recs[s.queue[0].written].first
	}
	l.rewind()
	if s.f != nil {
		if cerr := l.cleanDirty(); cerr != nil {
			if !sticky {
				err = syncFailure{fmt.Errorf("%w; clearing its bytes failed too: %w", err, cerr)}
			}
			sticky = true
			l.log.Error("could not clear the bytes of a failed WAL write; Reopen clears them before the log is read again", "err", cerr)
		}
	}
	drop := slices.Clone(s.queue)
	for _, b := range s.unsynced {
		if !slices.Contains(drop, b) {
			drop = append(drop, b)
		}
	}
	s.queue, s.unsynced = nil, nil
	l.mu.Lock()
	pend := l.takePendingLocked()
	if first == 0 && len(pend) > 0 {
		first = pend[0].recs[0].first
	}
	drop = append(drop, pend...)
	accepted := l.lastSeq
	l.lastSeq, l.readable, l.durable = s.lastSynced, s.lastSynced, s.lastSynced
	if first > accepted {
		first = 0
	}
	var fe *FailedError
	if sticky {
		fe = &FailedError{First: first, Last: accepted, Durable: s.lastSynced, Err: err}
		if first == 0 {
			fe.Last = 0
		}
		l.failure, l.err = fe, fe
	} else {
		l.err = err
	}
	l.abortGen++
	l.publishLocked()
	l.mu.Unlock()
	l.release(drop...)
	if fe != nil {
		l.callWatchers(fe.Durable, fe)
		l.log.Error("WAL stopped after a failed write or fsync: the entries not yet durable are not in the log; reopen the log and restore the agent from it",
			"err", err, "first_failed_sequence", fe.First, "last_failed_sequence", fe.Last, "durable_sequence", fe.Durable)
		if l.opts.OnFailure != nil {
			l.opts.OnFailure(fe)
		}
		return fe
	}
	if accepted > s.lastSynced {
		l.log.Error("WAL write failed; the appends not yet durable were refused and their sequences not consumed",
			"err", err, "refused_through_sequence", accepted, "durable_sequence", s.lastSynced)
	}
	return err
}

// succeeded clears the error of a failed write (SyncAlways) after a write
// went through.
func (l *Log) succeeded() {
	l.mu.Lock()
	if l.err == nil || l.failure != nil {
		l.mu.Unlock()
		return
	}
	prev := l.err
	l.err = nil
	l.publishLocked()
	l.mu.Unlock()
	l.log.Info("WAL writes recovered", "previous_error", prev, "durable_sequence", l.s.lastSynced)
}

// cleanDirty clears bytes a failed write may have left after the last good
// record, so a crash cannot resurrect them, and makes that durable.
func (l *Log) cleanDirty() error {
	s := &l.s
	if s.dirtyEnd <= s.writeOff {
		s.dirtyEnd = 0
		return nil
	}
	name := s.cur.name()
	if s.dirtyEnd > s.allocSize {
		if err := l.ops.truncate(s.f, max(s.writeOff, s.allocSize)); err != nil {
			return ioFailure("truncate failed write in segment "+name, err)
		}
	}
	for off := s.writeOff; off < min(s.dirtyEnd, s.allocSize); {
		n := min(int64(len(zeroPage)), min(s.dirtyEnd, s.allocSize)-off)
		if _, err := l.ops.writeAt(s.f, zeroPage[:n], off); err != nil {
			return ioFailure("clear failed write in segment "+name, err)
		}
		off += n
	}
	if err := l.ops.datasync(s.f); err != nil {
		return fsyncFailure("fsync segment "+name+" after clearing a failed write", err)
	}
	s.dirtyEnd = 0
	return nil
}

// roll makes the active segment durable and starts the next one.
func (l *Log) roll() error {
	s := &l.s
	if err := l.syncActive(); err != nil {
		return err
	}
	next := s.cur.index + 1
	var pf *os.File
	var ppath string
	if !l.opts.NoPreallocate {
		pf, ppath = l.prep.take()
	}
	f, alloc, err := l.installSegment(next, s.lastSynced, pf, ppath)
	if err != nil {
		return err
	}
	s.f.Close()
	s.f = f
	s.writeOff, s.durOff, s.allocSize, s.dirtyEnd = segmentHeaderSize, segmentHeaderSize, alloc, 0
	s.prepRequested = false
	s.cur = segment{index: next, prevLast: s.lastSynced, size: segmentHeaderSize}
	s.syn = s.cur
	l.segMu.Lock()
	l.segs = append(l.segs, s.cur)
	l.segMu.Unlock()
	l.log.Debug("WAL segment started", "segment", s.cur.name(), "preallocated", pf != nil)
	return nil
}

// reopenActive makes the newest segment in l.segs the active one, after
// TruncateAfter rewrote it (or failed half-way).
func (l *Log) reopenActive() error {
	s := &l.s
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	l.segMu.RLock()
	seg := l.segs[len(l.segs)-1]
	l.segMu.RUnlock()
	f, err := os.OpenFile(segmentPath(l.dir, seg.index), os.O_RDWR|noFollow, 0)
	if err != nil {
		return ioFailure("reopen segment "+seg.name(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return ioFailure("stat segment "+seg.name(), err)
	}
	s.f = f
	s.writeOff, s.durOff, s.allocSize, s.dirtyEnd = seg.size, seg.size, fi.Size(), 0
	s.cur, s.syn = seg, seg
	s.cur.points = slices.Clip(s.cur.points) // as in rewind
	s.lastWritten, s.lastSynced = seg.lastSeq(), seg.lastSeq()
	s.prepRequested = false // writeQueue asks for the next segment when this one is half full
	return nil
}

// reopen runs on the syncer goroutine for Reopen: it clears what failed
// writes may have left after the last durable record, closes the active
// segment and the preparer, recovers the directory as Open does, and clears
// the failure. It returns the last sequence in the log.
func (l *Log) reopen() (uint64, error) {
	s := &l.s
	l.mu.Lock()
	fe := l.failure
	drop := l.takePendingLocked()
	l.mu.Unlock()
	l.release(drop...)
	if s.f != nil {
		// After a failed fsync the page cache may still hold the records it
		// covered, marked clean: recovery would read them back. Clear them
		// (again, if failed managed to) and make that durable first.
		if s.writeOff > s.durOff {
			s.dirtyEnd = max(s.dirtyEnd, s.writeOff)
			s.writeOff = s.durOff
		}
		if err := l.cleanDirty(); err != nil {
			return 0, fmt.Errorf("wal: reopen: clear the bytes after the last durable record: %w", err)
		}
		s.f.Close()
		s.f = nil
	}
	l.mark.halt()
	defer l.mark.start()
	l.prep.close()
	l.newPreparer()
	*s = syncState{}
	l.scan = Recovery{}
	l.segMu.Lock()
	l.segs = nil
	err := l.recover()
	l.segMu.Unlock()
	if err != nil {
		// Stay stopped: the next Reopen tries again from the directory.
		return 0, fmt.Errorf("wal: reopen: %w", err)
	}
	if !l.opts.NoPreallocate {
		l.prep.start()
		if s.writeOff > l.opts.SegmentSize/2 {
			l.prep.request()
			s.prepRequested = true
		}
	}
	l.mu.Lock()
	l.failure, l.err = nil, nil
	last := l.lastSeq
	l.publishLocked()
	l.mu.Unlock()
	if fe != nil {
		l.log.Warn("WAL reopened after a failure; the failed range is not in the log",
			"last_sequence", last, "first_failed_sequence", fe.First, "last_failed_sequence", fe.Last)
	}
	return last, nil
}
