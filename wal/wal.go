package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Defaults for zero Options fields.
const (
	DefaultSegmentSize  = 64 << 20
	DefaultSyncInterval = 10 * time.Millisecond
	// MinSegmentSize is the smallest SegmentSize Open accepts.
	MinSegmentSize = 4096
)

const (
	// maxPendingBytes bounds the encoded entries waiting for the syncer;
	// Append blocks beyond it until the disk catches up.
	maxPendingBytes = 32 << 20
	// slowSync is the fsync duration above which a warning is logged.
	slowSync = time.Second
	// maxRetryDelay caps the back-off between retries after a failed write.
	maxRetryDelay = time.Second
)

// Options configure Open.
type Options struct {
	Dir          string        // directory holding the segments; created (0700) if missing
	SegmentSize  int64         // bytes per segment before a new one starts; default 64 MiB, at least MinSegmentSize
	Sync         SyncPolicy    // default SyncBatch
	SyncInterval time.Duration // SyncBatch: longest time written entries wait for an fsync under a flood; default 10ms
	Logger       *slog.Logger  // nil: discard
	// OnSync, when set, is called by the syncer after each successful fsync
	// with its duration and the entries and bytes it made durable. It must
	// not block and must not call the Log.
	OnSync func(d time.Duration, entries int, bytes int)
	// OnFailure, when set, is called by the syncer once when the log stops
	// after a failed fsync or write (see [FailedError]), right after the
	// failure became visible (Log.Failure returns it), so the owner can tell
	// the agent the failed range and call Reopen without waiting for the
	// next Append to fail. It must not block and must not call the Log.
	OnFailure func(*FailedError)
	// NoPreallocate turns off preallocation: by default every segment is
	// created at its full size filled with zeros (the next one in the
	// background), which makes each fsync cheaper (the filesystem does no
	// allocation work) and reports a full disk before it is hit mid-write.
	// Set it for tests and for filesystems where writing zeros is wasteful.
	NoPreallocate bool
	// CoveredThrough is the newest checkpoint's watermark: no restore needs
	// an entry at or below it. Damage found by Open in a segment whose
	// entries all lie at or below it costs nothing: that segment and the
	// ones before it are set aside (reported in [Recovery.Covered]) and the
	// intact segments after it are kept. Damage above it cuts the log at the
	// damage, as always. 0 means every entry may be needed.
	CoveredThrough uint64
	// StartAfter applies only when Open creates the log (the directory
	// holds no segment): the log starts after this sequence, as if the
	// entries up to it had been let go. Its Floor and LastSequence are
	// StartAfter, so the first entry may be StartAfter+1 without a gap. A
	// restore from a replica uses it to write a checkpoint's WAL tail whose
	// log honestly holds nothing at or below the watermark.
	StartAfter uint64

	ops        fileOps // tests inject faults here; nil means the real file system
	maxPending int     // tests shrink the back-pressure bound; 0 means maxPendingBytes
}

// Entry is one WAL entry: the agent's sequence number and its opaque bytes.
type Entry struct {
	Sequence uint64
	Data     []byte
}

// Gap is a jump in sequences: Next was appended right after After.
type Gap struct{ After, Next uint64 }

// AppendResult tells what an Append did.
type AppendResult struct {
	Appended   int    // entries written
	Duplicates int    // entries skipped because their sequence was not above the last appended one
	Gaps       []Gap  // gaps before appended entries
	Last       uint64 // last sequence in the log after this append
}

// Recovery reports what Open found and repaired.
type Recovery struct {
	Segments       int   // segments in the log after recovery
	Entries        int   // entries found (and kept)
	TruncatedBytes int64 // torn-tail bytes removed from the newest segment
	// Corruption is non-nil (a *CorruptionError) when Open found damage other
	// than a torn tail: the log was cut at the damage, keeping the good prefix,
	// and the damaged files were set aside (see CorruptionError.Moved).
	Corruption error
	// Covered lists damage Open found wholly at or below
	// Options.CoveredThrough: the damaged segments and those before them were
	// set aside (CorruptionError.Moved) and nothing a restore needs was lost.
	Covered []*CorruptionError
}

// segment is the in-memory description of one segment file.
type segment struct {
	index    uint64
	prevLast uint64
	tally          // its records, counted
	size     int64 // bytes readers may read (the end of the readable records)
}

// tally counts a segment's records as they are verified (recovery) or
// written (the syncer): its sequences, entries and the bytes of their data,
// with a point every countEvery bytes of records, so CountAfter counts the
// entries above a sequence without reading them.
type tally struct {
	first, last uint64 // 0 when the segment holds no entries
	entries     int
	dataBytes   int64 // the entries' Entry.Data bytes
	// points ascend by offset. Copies of a segment (the syncer's, the
	// published one readers clone) share the array: it is only appended
	// to, and a copy that goes back to fewer points than were published
	// is clipped first (rewind, reopenActive), so no element a reader may
	// hold is written again.
	points []countPoint
}

// countPoint is a tally at a record boundary.
type countPoint struct {
	off       int64  // file offset just after a record
	last      uint64 // sequence of the record's last entry
	entries   int    // the segment's entries before off
	dataBytes int64  // and their data bytes
}

// countEvery is the spacing of count points: CountAfter reads at most this
// many bytes of record headers (skipping payloads) beyond one.
const countEvery = 256 << 10

// add counts a record with header h ending at file offset end.
func (t *tally) add(h recordHeader, end int64) {
	if t.first == 0 {
		t.first = h.first
	}
	t.last = h.last
	t.entries += int(h.count)
	t.dataBytes += int64(h.plen) - int64(h.count)*entryHeaderSize
	at := int64(segmentHeaderSize)
	if n := len(t.points); n > 0 {
		at = t.points[n-1].off
	}
	if end-at >= countEvery {
		t.points = append(t.points, countPoint{off: end, last: h.last, entries: t.entries, dataBytes: t.dataBytes})
	}
}

func (s *segment) name() string { return segmentName(s.index) }

// lastSeq is the last sequence in the log up to and including this segment.
func (s *segment) lastSeq() uint64 {
	if s.last != 0 {
		return s.last
	}
	return s.prevLast
}

// Log is an open write-ahead log. All methods are safe for concurrent use.
type Log struct {
	dir      string
	opts     Options
	log      *slog.Logger
	ops      fileOps
	lock     *os.File
	mark     *marker  // the durable mark (mark.go)
	recovery Recovery // what the last Open or Reopen found (l.mu)
	scan     Recovery // what the running recovery finds (the syncer's, or Open's)

	// drainMu is held by whoever writes and fsyncs (drain, serve): the
	// syncer goroutine, or a SyncIfIdle caller; it guards s.
	drainMu sync.Mutex
	// kickHeld: Append leaves waking the syncer to the appender
	// (HoldKick); kickOwed: an Append did.
	kickHeld, kickOwed atomic.Bool
	lastSyncNanos      atomic.Int64 // how long the last fsync of a segment took

	mu         sync.Mutex
	pending    []*batchBuf  // encoded records not yet taken by the syncer, oldest first
	pendingN   int          // bytes in pending
	free       []*batchBuf  // empty buffers of batchBufSize, for reuse
	lastSeq    uint64       // last sequence accepted by Append
	readable   uint64       // last sequence ReadAfter can serve
	durable    uint64       // last sequence on disk (SyncNone: handed to the OS)
	err        error        // the last write error (SyncAlways), cleared by the next successful write
	failure    *FailedError // the log stopped (sticky until Reopen)
	abortGen   uint64       // bumped when SyncAlways drops entries whose Appends then fail
	notify     chan struct{}
	waiters    int
	wanted     uint64        // the highest sequence a watcher asked to be durable soon (Hurry)
	closed     bool          // Close was called: no more Appends
	stopped    bool          // the syncer has exited
	truncating chan struct{} // non-nil while TruncateAfter runs; Appends wait for it

	segMu sync.RWMutex
	segs  []segment // oldest first; the last one is the active segment

	// watchMu is held by the syncer while it calls the watchers (watch.go).
	watchMu  sync.Mutex
	watchers []*watcher  // copied on change
	watched  atomic.Bool // len(watchers) > 0

	truncMu sync.Mutex // serializes TruncateBefore, TruncateAfter and Reopen
	// reopenMu keeps ReadAfter (read-locked for its whole run) and Reopen
	// (locked) apart: Reopen replaces the segments under a reader's feet.
	reopenMu sync.RWMutex

	kick chan struct{}
	reqs chan request
	stop chan struct{}
	done chan struct{}
	s    syncState // owned by the syncer goroutine
	prep *preparer

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the log in opts.Dir and recovers it: a torn
// tail is truncated (and logged), corruption cuts the log at the damage and
// is reported in [Log.Recovery] rather than as an error. Open fails for bad
// options, I/O errors, a directory another Log holds ([ErrLocked]), and
// segments of another format version.
func Open(opts Options) (*Log, error) {
	if opts.Dir == "" {
		return nil, errors.New("wal: Options.Dir is empty")
	}
	if opts.SegmentSize == 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.SegmentSize < MinSegmentSize {
		return nil, fmt.Errorf("wal: segment size %d is below the minimum %d", opts.SegmentSize, MinSegmentSize)
	}
	if opts.SyncInterval == 0 {
		opts.SyncInterval = DefaultSyncInterval
	}
	if opts.SyncInterval < 0 {
		return nil, fmt.Errorf("wal: negative sync interval %v", opts.SyncInterval)
	}
	if opts.Sync < SyncBatch || opts.Sync > SyncNone {
		return nil, fmt.Errorf("wal: unknown sync policy %v", opts.Sync)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ops == nil {
		opts.ops = osOps{}
	}
	if opts.maxPending == 0 {
		opts.maxPending = maxPendingBytes
	}
	l := &Log{
		dir:    opts.Dir,
		opts:   opts,
		log:    opts.Logger,
		ops:    opts.ops,
		notify: make(chan struct{}),
		kick:   make(chan struct{}, 1),
		reqs:   make(chan request),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if err := atomicfile.MkdirAll(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("wal: create directory %s: %w", l.dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(l.dir, lockName), os.O_RDWR|os.O_CREATE|noFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("wal: open lock file in %s: %w", l.dir, err)
	}
	if err := lockFile(lock); err != nil {
		lock.Close()
		if errors.Is(err, ErrLocked) {
			return nil, fmt.Errorf("%w: %s (stop the other supervisor using it first)", ErrLocked, l.dir)
		}
		return nil, fmt.Errorf("wal: lock %s: %w", l.dir, err)
	}
	l.lock = lock
	if l.mark, err = openMarker(l.dir, osOps{}, func(err error) {
		l.log.Warn("could not update the WAL's durable mark; it trails further behind (a power cut may then be reported as corruption)", "err", err)
	}); err != nil {
		l.closeFiles()
		return nil, err
	}
	l.newPreparer()
	if err := l.recover(); err != nil {
		l.prep.close()
		l.closeFiles()
		return nil, err
	}
	l.mark.start()
	if !opts.NoPreallocate {
		l.prep.start()
		if l.s.writeOff > opts.SegmentSize/2 {
			l.prep.request()
			l.s.prepRequested = true
		}
	}
	go l.run()
	return l, nil
}

// newPreparer starts l.prep afresh, holding the segment a previous run
// prepared (none with NoPreallocate: one left is removed).
func (l *Log) newPreparer() {
	l.prep = newPreparer(l.dir, l.opts.SegmentSize, l.ops, l.log)
	if l.opts.NoPreallocate {
		_ = os.Remove(filepath.Join(l.dir, preparedName))
		return
	}
	l.prep.adopt()
}

func (l *Log) closeFiles() {
	if l.s.f != nil {
		l.s.f.Close()
		l.s.f = nil
	}
	if l.mark != nil {
		l.mark.close()
		l.mark = nil
	}
	if l.lock != nil {
		l.lock.Close()
		l.lock = nil
	}
}

// Recovery reports what Open, or the last Reopen, found and repaired.
func (l *Log) Recovery() Recovery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recovery
}

// Failure returns the *FailedError the log stopped with, or nil while it
// works. It stays set until Reopen succeeds.
func (l *Log) Failure() *FailedError {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failure
}

// Reopen brings a stopped log (see [FailedError]) back from what is on the
// disk, in place: every holder of l keeps using it. It first clears again
// whatever a failed write may have left after the last durable record (the
// page cache may still hold records whose fsync failed, and they must never
// be read back), then runs Open's recovery on the directory (torn tails,
// corruption, an fsync of the directory) and accepts appends again. It
// returns the last sequence in the log, which is also durable: every entry
// of the failed range is above it and absent. On error the log stays
// stopped (the FailedError unchanged) and Reopen may be called again.
//
// Reopen on a log that did not fail makes what was accepted durable first
// (as Sync; if that fails, the log stops and Reopen goes on from the disk)
// and then reopens it the same way. It waits for running ReadAfter calls
// and TruncateBefore/TruncateAfter; Appends that arrive meanwhile wait for
// it and are judged against the reopened log.
func (l *Log) Reopen() (last uint64, err error) {
	l.truncMu.Lock()
	defer l.truncMu.Unlock()
	l.reopenMu.Lock()
	defer l.reopenMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, ErrClosed
	}
	ch := make(chan struct{})
	l.truncating = ch // Appends wait (admitLocked)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.truncating = nil
		close(ch)
		l.mu.Unlock()
	}()
	rep := l.callReply(request{kind: reqReopen})
	return rep.seq, rep.err
}

// LastSequence is the last sequence accepted by Append (durable or not), or
// the last one in the log after Open; 0 for a log that never held entries.
func (l *Log) LastSequence() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastSeq
}

// DurableSequence is the last sequence known to be on disk. Under SyncNone it
// is the last one handed to the OS.
func (l *Log) DurableSequence() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

// FirstSequence is the sequence of the oldest entry the log holds, 0 if it
// holds none.
func (l *Log) FirstSequence() uint64 {
	l.segMu.RLock()
	for _, s := range l.segs {
		if s.first != 0 {
			l.segMu.RUnlock()
			return s.first
		}
	}
	l.segMu.RUnlock()
	// Nothing readable yet: the oldest entry, if any, is still queued.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastSeq > l.readable {
		return l.readable + 1 // a lower bound: the queued entries start above readable
	}
	return 0
}

// MaxSequence is the largest sequence Append accepts: 2^62 − 1, below the
// ceiling of 2^62 (SPEC §4). Sequences run from 1 up to it, and a gap of
// any size below it is allowed and reported (agents may number by Unix
// nanoseconds, about 2^60.6 today, or by snowflake ids); an entry above it
// is refused, so an entry numbered near 2^64 by mistake cannot wrap.
const MaxSequence = 1<<62 - 1

// Append appends entries as one atomic unit: after a crash either all of
// the appended ones are in the log or none. An entry whose sequence is not
// above the last appended one is a replay when the log holds the very same
// bytes at that sequence: it is skipped and counted in Duplicates (also a
// repeat inside entries). Jumps are reported as gaps. Data is copied.
//
// Under SyncAlways, Append returns once the entries are durable; otherwise
// once they are queued for the syncer (use WaitDurable).
//
// Errors: a *SequenceConflictError (wrapping ErrSequenceConflict) when an
// entry at or below the last sequence is not a byte-identical replay of what
// the log holds there, or is above MaxSequence;
// ErrOutOfOrder when a sequence is below its predecessor in entries,
// ErrTooLarge, ErrClosed, and ErrNoSpace / ErrWriteFailed while the disk
// fails. On any error nothing of entries was appended and LastSequence is
// unchanged, so the same entries can be appended again.
func (l *Log) Append(entries ...Entry) (AppendResult, error) {
	for i := 1; i < len(entries); i++ {
		if entries[i].Sequence < entries[i-1].Sequence {
			return AppendResult{}, fmt.Errorf("%w: sequence %d follows %d", ErrOutOfOrder, entries[i].Sequence, entries[i-1].Sequence)
		}
		if entries[i].Sequence == entries[i-1].Sequence && !bytes.Equal(entries[i].Data, entries[i-1].Data) {
			return AppendResult{}, &SequenceConflictError{Sequence: entries[i].Sequence, LastSequence: l.LastSequence(),
				Reason: "the same sequence appears twice in one batch with different contents"}
		}
	}
	upper := recordSize(entries) // the record is at most this large
	if upper-recordHeaderSize > maxRecordPayload {
		return AppendResult{}, fmt.Errorf("%w: %d bytes, limit %d; append fewer entries at a time", ErrTooLarge, upper, maxRecordPayload)
	}
	var verified uint64 // replays at or below this were checked against the log
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if err := l.admitLocked(upper); err != nil {
			return AppendResult{Last: l.lastSeq}, err
		}
		// Replays are compared with what the log holds, outside the lock
		// (reading waits for the syncer); then everything is judged again.
		last := l.lastSeq
		if len(entries) == 0 || entries[0].Sequence > last || verified == last {
			break // no replays, or all of them checked against this last sequence
		}
		l.mu.Unlock()
		err := l.verifyReplay(entries, last)
		l.mu.Lock()
		if err != nil {
			return AppendResult{Last: l.lastSeq}, err
		}
		verified = last
	}
	// Keep the entries above the last sequence, in order.
	res := AppendResult{}
	prev := l.lastSeq
	for _, e := range entries {
		if e.Sequence <= prev {
			res.Duplicates++
			continue
		}
		if e.Sequence > MaxSequence {
			return AppendResult{Last: l.lastSeq}, &SequenceConflictError{Sequence: e.Sequence, LastSequence: l.lastSeq,
				Reason: fmt.Sprintf("the sequence is above the ceiling: sequences run from 1 to %d; number entries above restore.last_sequence", uint64(MaxSequence))}
		}
		if e.Sequence > prev+1 {
			res.Gaps = append(res.Gaps, Gap{After: prev, Next: e.Sequence})
		}
		prev = e.Sequence
	}
	kept := entries
	if res.Duplicates > 0 {
		kept = make([]Entry, 0, len(entries)-res.Duplicates)
		prev = l.lastSeq
		for _, e := range entries {
			if e.Sequence > prev {
				kept = append(kept, e)
				prev = e.Sequence
			}
		}
	}
	res.Appended = len(kept)
	if len(kept) == 0 {
		res.Last = l.lastSeq
		return res, nil
	}
	l.addPendingLocked(kept)
	l.lastSeq = kept[len(kept)-1].Sequence
	res.Last = l.lastSeq
	gen := l.abortGen
	if l.kickHeld.Load() {
		l.kickOwed.Store(true) // HoldKick: the appender syncs itself or kicks at ReleaseKick
	} else {
		l.kickSyncer()
	}
	if l.opts.Sync != SyncAlways {
		return res, nil
	}
	last := res.Last
	err := l.waitLocked(context.Background(), func() (bool, error) {
		switch {
		case l.durable >= last:
			return true, nil
		case l.abortGen != gen:
			return true, l.err
		case l.stopped:
			return true, ErrClosed
		}
		return false, nil
	})
	if err != nil {
		return AppendResult{Last: l.lastSeq}, err
	}
	return res, nil
}

// admitLocked waits, with l.mu held, until an append of upper bytes may be
// queued: no TruncateAfter running, no retained write error, room under the
// back-pressure bound. Every wait releases l.mu.
func (l *Log) admitLocked(upper int64) error {
	for {
		if l.truncating != nil && !l.closed {
			ch := l.truncating
			l.mu.Unlock()
			<-ch
			l.mu.Lock()
			continue
		}
		if l.closed {
			return ErrClosed
		}
		if l.failure != nil {
			return l.failure
		}
		if n := l.pendingBytes(); n == 0 || n+int(upper) <= l.opts.maxPending {
			return nil
		}
		// Back-pressure: the syncer is far behind.
		if err := l.waitLocked(context.Background(), func() (bool, error) {
			n := l.pendingBytes()
			return l.closed || l.truncating != nil || l.failure != nil || n == 0 || n+int(upper) <= l.opts.maxPending, nil
		}); err != nil {
			return err
		}
	}
}

// errReplayChecked stops verifyReplay's read once it is past the replays.
var errReplayChecked = errors.New("replays checked")

// verifyReplay checks that every entry of entries at or below last is held
// by the log with the same bytes. It is called without l.mu.
func (l *Log) verifyReplay(entries []Entry, last uint64) error {
	var want []Entry
	for _, e := range entries {
		if e.Sequence > last {
			break
		}
		if len(want) == 0 || want[len(want)-1].Sequence != e.Sequence {
			want = append(want, e)
		}
	}
	conflict := func(e Entry, why string) error {
		return &SequenceConflictError{Sequence: e.Sequence, LastSequence: last, Reason: why}
	}
	if floor := l.Floor(); want[0].Sequence <= floor {
		return conflict(want[0], fmt.Sprintf("it is at or below %d, the oldest sequence the log still holds, so it cannot be a replay; number entries above restore.last_sequence", floor))
	}
	i := 0
	err := l.ReadAfter(want[0].Sequence-1, func(e Entry) error {
		if i < len(want) && want[i].Sequence < e.Sequence {
			return conflict(want[i], "the log holds no entry with this sequence (it falls in a gap); number entries above restore.last_sequence")
		}
		if i == len(want) {
			return errReplayChecked
		}
		if !bytes.Equal(e.Data, want[i].Data) {
			return conflict(want[i], "the log holds different contents at this sequence; number new entries above restore.last_sequence")
		}
		i++
		if i == len(want) {
			return errReplayChecked
		}
		return nil
	})
	if err != nil && !errors.Is(err, errReplayChecked) {
		return err
	}
	if i < len(want) {
		return conflict(want[i], "the log holds no entry with this sequence; number entries above restore.last_sequence")
	}
	return nil
}

// Floor is the sequence at and below which the log may have let entries go
// (TruncateBefore, or damage set aside by Open): every entry above Floor
// that was appended, and not removed by TruncateAfter, is still held. It is
// 0 for a log that never deleted a segment. A restore from a checkpoint with
// watermark W is complete exactly when Floor() ≤ W.
func (l *Log) Floor() uint64 {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	if len(l.segs) == 0 {
		return 0
	}
	return l.segs[0].prevLast
}

// WaitDurable returns once every entry with sequence ≤ seq that was appended
// (that is, up to min(seq, LastSequence())) is durable; at once if there is
// nothing to wait for. Under SyncNone it waits until they are handed to the
// OS. It returns ctx's error, ErrClosed, or the *FailedError of a stopped log
// when seq is above its durable sequence (the entry may be in the failed
// range; it is not in the log).
func (l *Log) WaitDurable(ctx context.Context, seq uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waitLocked(ctx, func() (bool, error) {
		target := min(seq, l.lastSeq)
		switch {
		case l.failure != nil && seq > l.failure.Durable:
			return true, l.failure
		case target <= l.durable:
			return true, nil
		case l.stopped:
			return true, ErrClosed
		}
		return false, nil
	})
}

// waitLocked waits, with l.mu held on entry and exit, until cond reports done
// or ctx ends. cond runs with l.mu held.
func (l *Log) waitLocked(ctx context.Context, cond func() (bool, error)) error {
	for {
		if done, err := cond(); done {
			return err
		}
		ch := l.notify
		l.waiters++
		l.kickSyncer()
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		l.mu.Lock()
		l.waiters--
		if err := ctx.Err(); err != nil {
			if done, err := cond(); done {
				return err
			}
			return fmt.Errorf("wal: waiting for durability: %w", err)
		}
	}
}

// publishLocked wakes everyone waiting on the log's state. l.mu must be held.
func (l *Log) publishLocked() {
	if l.waiters > 0 {
		close(l.notify)
		l.notify = make(chan struct{})
	}
}

func (l *Log) kickSyncer() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Sync writes and fsyncs everything accepted so far, under every policy.
func (l *Log) Sync() error {
	return l.call(request{kind: reqSync})
}

// Close writes and fsyncs everything accepted, stops the syncer and the
// segment preparer, and releases the directory. It returns the error that
// kept accepted entries from the disk, if any. Calling it again returns nil.
func (l *Log) Close() error {
	first := false
	l.closeOnce.Do(func() {
		first = true
		l.mu.Lock()
		l.closed = true
		l.publishLocked()
		l.mu.Unlock()
		close(l.stop)
		<-l.done
		l.prep.close()
		l.closeErr = l.s.closeErr
		l.closeFiles()
	})
	if !first {
		return nil
	}
	return l.closeErr
}
