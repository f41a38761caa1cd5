// Package requests is the supervisor's durable request book: the request
// journal (an append-only, checksummed, group-committed log in
// DATA_DIR/requests/) and the state of every request accepted by
// POST /v1/requests — pending, delivered, answered, expired, cancelled or set
// aside as poison — rebuilt from the journal on start. It never imports the
// owner: the owner tells it when an agent starts and dies, and it delivers
// through the Agent it was given.
package requests

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Journal file layout: DATA_DIR/requests/journal, a sequence of records
//
//	[4 bytes little-endian payload length][4 bytes CRC-32C of the payload][payload: JSON]
//
// A record is one Record. Compaction rewrites the file (atomically: a
// temporary file fsynced, renamed, the directory fsynced) with one "state"
// record per request still retained.
const (
	DirName     = "requests"
	FileName    = "journal"
	headerSize  = 8
	maxRecord   = 16 << 20
	noFollowOpt = syscall.O_NOFOLLOW | syscall.O_CLOEXEC
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrDiskFull: the record could not be written for want of space (ENOSPC,
// EDQUOT): nothing was accepted.
var ErrDiskFull = errors.New("the request journal's disk is full")

// Record kinds.
const (
	KindAccepted  = "accepted"
	KindDelivered = "delivered"
	KindAnswered  = "answered"
	KindExpired   = "expired"
	KindCancelled = "cancelled"
	KindDeath     = "death"  // the agent died with the request in flight
	KindFailed    = "failed" // set aside as poison
	KindState     = "state"  // a compacted request: its whole state
	// KindDropped: an answer's data was dropped (MaxResultBytes). A
	// supervisor that predates it ignores it, as it does any kind it does
	// not know.
	KindDropped = "dropped"
)

// Record is one journal record.
type Record struct {
	Kind string `json:"k"`
	ID   string `json:"id"`
	// accepted
	Key      string          `json:"key,omitempty"`
	Digest   string          `json:"digest,omitempty"`
	Body     json.RawMessage `json:"body,omitempty"`
	At       int64           `json:"at,omitempty"` // unix nanos of the event
	Deadline int64           `json:"deadline,omitempty"`
	// delivered
	Attempt int `json:"attempt,omitempty"`
	// answered
	Data  json.RawMessage `json:"data,omitempty"`
	Error *ErrorBody      `json:"error,omitempty"`
	// death, failed
	Reason string `json:"reason,omitempty"`
	// state
	State *Request `json:"state,omitempty"`
	// Blob names the field stored after the JSON line ("body", "data").
	Blob string `json:"blob,omitempty"`
}

// ErrorBody is a request's error as GET shows it.
type ErrorBody struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

func encodeRecord(buf *bytes.Buffer, r *Record) (int, error) {
	start := buf.Len()
	var h [headerSize]byte
	buf.Write(h[:])
	// The payload is the record as one JSON line, then (blob) a request's
	// body or an answer's data as they are: a large body or answer is
	// neither re-encoded nor copied twice.
	var blob []byte
	switch {
	case r.Kind == KindAccepted && r.Body != nil:
		rr := *r
		blob, rr.Body, rr.Blob = r.Body, nil, "body"
		r = &rr
	case r.Kind == KindAnswered && r.Data != nil:
		rr := *r
		blob, rr.Data, rr.Blob = r.Data, nil, "data"
		r = &rr
	}
	if err := json.NewEncoder(buf).Encode(r); err != nil {
		buf.Truncate(start)
		return 0, err
	}
	buf.Write(blob)
	p := buf.Bytes()[start+headerSize:]
	if len(p) > maxRecord {
		buf.Truncate(start)
		return 0, fmt.Errorf("request journal record of %d bytes, limit %d", len(p), maxRecord)
	}
	hb := buf.Bytes()[start : start+headerSize]
	binary.LittleEndian.PutUint32(hb[0:4], uint32(len(p)))
	binary.LittleEndian.PutUint32(hb[4:8], crc32.Checksum(p, castagnoli))
	return headerSize + len(p), nil
}

// Ticket is an append's promise: Wait returns once the records it covers
// are on disk (nil), or could not be (the error).
type Ticket struct {
	j    *Journal
	done chan struct{}
	err  error
}

// Wait waits for the records' fsync. When no write is under way, the caller
// writes and fsyncs the queued records itself (it would only wait for the
// writer goroutine to wake up and do it); otherwise the write under way
// carries them, or the next one.
func (t *Ticket) Wait() error {
	if t.j != nil {
		t.j.lead(t)
	}
	<-t.done
	return t.err
}

// Done is closed once the records are on disk or failed.
func (t *Ticket) Done() <-chan struct{} { return t.done }

// succeeded reports whether the records are on disk (without waiting).
func (t *Ticket) succeeded() bool {
	select {
	case <-t.done:
		return t.err == nil
	default:
		return false
	}
}

// Journal is the request journal file with its group commit: Append queues
// records (never blocking on the disk); one writer at a time writes every
// queued record, fsyncs once, and completes their tickets. The writer is
// whoever needs the write first: a caller waiting for its ticket when no
// write is under way (Ticket.Wait: no hand-off to another goroutine and
// back, which costs as much as a fast disk's fsync on an idle machine), or
// the journal's own goroutine, which writes records nobody waits for (lazy
// ones, after lazyDelay), takes over what a waiter left queued, compacts,
// and writes the last records at Close. Safe for concurrent use.
//
// The file is grown in growStep steps of zeros ahead of the records
// (alloc): a record is written over blocks the file already has, so its
// fdatasync writes data only, not the file's size as well (about a third of
// an fsync on ext4). Replay reads zeros after the last record as the end.
type Journal struct {
	dir  string
	f    *os.File
	sync func(*os.File) error
	// alloc is the file's size: size plus the zeros grown ahead (writer only).
	alloc int64
	// dirUnsynced: the file is a compaction's whose rename is not known to
	// be durable (its directory fsync failed), so a power cut may bring the
	// old file back under the journal's name. No record is acknowledged
	// until a directory fsync succeeds (writer only).
	dirUnsynced bool

	mu      sync.Mutex
	pending [][]byte // encoded records waiting for the writer
	// lazyTimer wakes the writer for lazy records (AppendLazy).
	lazyTimer *time.Timer
	tickets   []*Ticket
	wake      chan struct{}
	closed    bool
	started   bool   // Start ran: waiters may write
	writing   bool   // a writer is writing (the goroutine or a waiter)
	size      int64  // bytes on disk (what was written and synced)
	version   uint64 // grows with each change of [0, size) (Version)
	queued    int64
	compact   func() []*Record // set by the Book: the records a compaction writes
	want      bool             // a compaction is asked for

	stopped chan struct{}
	onSync  func(bytes int64, err error)
}

// Replay is what Open found in the journal.
type Replay struct {
	Records        []*Record
	Size           int64
	TruncatedBytes int64  // a torn tail cut away
	Corruption     error  // a damaged record in the middle (replay resumed after it when it could)
	SkippedBytes   int64  // bytes skipped over damage
	SetAside       string // the damaged file kept for inspection
}

// Open opens (creating it durably when absent) DATA_DIR/requests/journal and
// reads it back. A torn last record is truncated away; a damaged record
// before intact ones is reported (Replay.Corruption), skipped, and the file
// kept aside as journal.damaged-N; replay goes on with the next intact
// record.
func Open(dataDir string) (*Journal, *Replay, error) {
	dir := filepath.Join(dataDir, DirName)
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create the request journal's directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|noFollowOpt, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open the request journal %s: %w", path, err)
	}
	if statErr != nil {
		if err := atomicfile.SyncDir(dir); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("fsync %s: %w", dir, err)
		}
	}
	rp, err := readAll(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read the request journal %s: %w", path, err)
	}
	if rp.TruncatedBytes > 0 && rp.Corruption == nil {
		if err := f.Truncate(rp.Size); err == nil {
			err = datasync(f)
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("truncate the request journal's torn tail: %w", err)
		}
	}
	alloc := rp.Size
	if fi, err := f.Stat(); err == nil && fi.Size() > alloc {
		alloc = fi.Size() // zeros grown ahead, kept for the next records
	}
	j := &Journal{dir: dir, f: f, sync: datasync, alloc: alloc, wake: make(chan struct{}, 1), stopped: make(chan struct{}), size: rp.Size, version: 1}
	if rp.Corruption != nil {
		// Keep the damaged file for inspection; the journal is rewritten
		// from what was read (the Book compacts at once).
		for n := 1; ; n++ {
			name := fmt.Sprintf("%s.damaged-%d", FileName, n)
			if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
				continue
			}
			if err := os.Link(path, filepath.Join(dir, name)); err == nil {
				_ = atomicfile.SyncDir(dir)
				rp.SetAside = filepath.Join(dir, name)
			}
			break
		}
		j.want = true
	}
	return j, rp, nil
}

// readAll reads every record of f.
func readAll(f *os.File) (*Replay, error) {
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	rp := &Replay{}
	off := 0
	for off < len(b) {
		r, n, ok := parseAt(b, off)
		if ok {
			rp.Records = append(rp.Records, r)
			off += n
			rp.Size = int64(off)
			continue
		}
		if isZero(b[off:]) {
			// The zeros the journal grows ahead of its records: the end.
			if rp.Corruption == nil {
				rp.Size = int64(off)
			}
			return rp, nil
		}
		// Damage at off: a torn tail when no intact record follows,
		// corruption otherwise.
		next := -1
		for p := off + 1; p+headerSize <= len(b); p++ {
			if _, _, ok := parseAt(b, p); ok {
				next = p
				break
			}
		}
		if next < 0 {
			if rp.Corruption == nil {
				rp.TruncatedBytes = int64(len(b) - off)
			} else {
				rp.SkippedBytes += int64(len(b) - off)
			}
			break
		}
		if rp.Corruption == nil {
			rp.Corruption = fmt.Errorf("damaged record at byte %d of the request journal (bad length or checksum); %d bytes skipped to the next intact record at byte %d", off, next-off, next)
		}
		rp.SkippedBytes += int64(next - off)
		off = next
	}
	if rp.Corruption != nil {
		rp.Size = int64(len(b))
	}
	return rp, nil
}

// isZero reports whether b holds only zero bytes.
func isZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func parseAt(b []byte, off int) (*Record, int, bool) {
	if off+headerSize > len(b) {
		return nil, 0, false
	}
	n := int(binary.LittleEndian.Uint32(b[off : off+4]))
	if n == 0 || n > maxRecord || off+headerSize+n > len(b) {
		return nil, 0, false
	}
	p := b[off+headerSize : off+headerSize+n]
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[off+4:off+8]) {
		return nil, 0, false
	}
	line, blob, _ := bytes.Cut(p, []byte{'\n'})
	var r Record
	if err := json.Unmarshal(line, &r); err != nil || r.Kind == "" {
		return nil, 0, false
	}
	switch r.Blob {
	case "body":
		r.Body = bytes.Clone(blob)
	case "data":
		r.Data = bytes.Clone(blob)
	}
	r.Blob = ""
	return &r, headerSize + n, true
}

// Start runs the writer until Close. compact returns the records of a
// compacted journal (called by the writer when a compaction is asked for).
func (j *Journal) Start(compact func() []*Record, onSync func(bytes int64, err error)) {
	j.mu.Lock()
	j.compact = compact
	j.onSync = onSync
	j.started = true
	j.mu.Unlock()
	go j.run()
	if j.want {
		j.kick()
	}
}

// lazyDelay is how long records nobody waits for (AppendLazy) may wait for
// a write that carries them.
const lazyDelay = 10 * time.Millisecond

// Append queues records and wakes the writer; the ticket completes at their
// fsync.
func (j *Journal) Append(recs ...*Record) *Ticket { return j.append(true, recs) }

// AppendLazy queues records nobody waits for (a delivery, an answer, an
// expiry: losing them to a crash means at most a redelivery). They go out
// with the next write, or within lazyDelay: they do not cost an fsync of
// their own while requests are being accepted.
func (j *Journal) AppendLazy(recs ...*Record) *Ticket { return j.append(false, recs) }

func (j *Journal) append(urgent bool, recs []*Record) *Ticket {
	t := &Ticket{j: j, done: make(chan struct{})}
	hint := 0
	for _, r := range recs {
		hint += len(r.Body) + len(r.Data) + 512
	}
	buf := bytes.NewBuffer(make([]byte, 0, hint))
	for _, r := range recs {
		if _, err := encodeRecord(buf, r); err != nil {
			t.err = err
			close(t.done)
			return t
		}
	}
	chunk := buf.Bytes()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		t.err = errors.New("the request journal is closed (the supervisor is stopping)")
		close(t.done)
		return t
	}
	j.pending = append(j.pending, chunk)
	j.queued += int64(len(chunk))
	j.tickets = append(j.tickets, t)
	switch {
	case urgent:
		j.kickLocked()
	case j.lazyTimer == nil:
		j.lazyTimer = time.AfterFunc(lazyDelay, func() {
			j.mu.Lock()
			j.lazyTimer = nil
			j.kickLocked()
			j.mu.Unlock()
		})
	}
	return t
}

// Compact asks the writer to rewrite the journal.
func (j *Journal) Compact() {
	j.mu.Lock()
	j.want = true
	j.kickLocked()
	j.mu.Unlock()
}

// Size is the journal's bytes on disk plus those queued.
func (j *Journal) Size() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size + j.queued
}

func (j *Journal) kick() {
	j.mu.Lock()
	j.kickLocked()
	j.mu.Unlock()
}

func (j *Journal) kickLocked() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Close writes what is queued and stops the writer.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.kickLocked()
	started := j.compact != nil
	j.mu.Unlock()
	if started {
		<-j.stopped
	}
	return j.f.Close()
}

// run is the journal's own writer: it writes what is queued when kicked
// (records nobody waits for, a waiter's leftovers), compacts, and at Close
// writes the last records and exits.
func (j *Journal) run() {
	defer close(j.stopped)
	for range j.wake {
		j.mu.Lock()
		if j.writing {
			// A waiter is writing; it kicks again when it stops with
			// work left (records, a compaction, Close).
			j.mu.Unlock()
			continue
		}
		j.writing = true
		j.mu.Unlock()
		if j.writeQueued(nil) {
			return
		}
	}
}

// lead makes a waiter the writer when no write is under way, until its own
// ticket is done.
func (j *Journal) lead(t *Ticket) {
	select {
	case <-t.done:
		return
	default:
	}
	j.mu.Lock()
	if j.writing || !j.started || j.closed {
		// The write under way (or the goroutine, at Close) carries it.
		j.mu.Unlock()
		return
	}
	j.writing = true
	j.mu.Unlock()
	j.writeQueued(t)
}

// writeQueued writes queued records, one group commit after another, while
// the caller holds the writer's place (j.writing): for a waiter (own) until
// its ticket is done, leaving the rest to the goroutine; for the goroutine
// (own nil) until nothing is queued, compacting when asked. It reports
// whether the journal is closed and flushed (the goroutine exits).
func (j *Journal) writeQueued(own *Ticket) (closedDone bool) {
	for {
		j.mu.Lock()
		ownDone := false
		if own != nil {
			select {
			case <-own.done:
				ownDone = true
			default:
			}
		}
		if len(j.pending) == 0 || ownDone {
			if own != nil {
				j.writing = false
				if len(j.pending) > 0 || j.want || j.closed {
					j.kickLocked()
				}
				j.mu.Unlock()
				return false
			}
			want, closed := j.want, j.closed
			j.want = false
			j.mu.Unlock()
			if want {
				j.rewrite()
				continue
			}
			j.mu.Lock()
			j.writing = false
			j.mu.Unlock()
			return closed
		}
		data := j.pending
		j.pending = nil
		n := j.queued
		tickets := j.tickets
		j.tickets = nil
		j.queued = 0
		off := j.size
		j.mu.Unlock()

		err := j.write(off, data)
		j.mu.Lock()
		if err == nil {
			j.size = off + n
			j.version++
		}
		onSync := j.onSync
		j.mu.Unlock()
		for _, t := range tickets {
			t.err = err
			close(t.done)
		}
		if onSync != nil {
			onSync(n, err)
		}
	}
}

// joinLimit: queued chunks up to this many bytes in all are written as one.
const joinLimit = 256 << 10

// growStep is how far the file is grown with zeros ahead of its records.
const growStep = 1 << 20

var zeros [64 << 10]byte

// write writes the chunks at off and fsyncs; on failure it cuts the file back to
// off, so what was not acknowledged is not replayed.
func (j *Journal) write(off int64, data [][]byte) error {
	if len(data) > 1 {
		// Small chunks (a request beside the lazy records of earlier
		// ones) go out in one write: a write costs more than the copy.
		total := 0
		for _, c := range data {
			total += len(c)
		}
		if total <= joinLimit {
			data = [][]byte{bytes.Join(data, nil)}
		}
	}
	var err error
	at := off
	for _, c := range data {
		if _, err = j.f.WriteAt(c, at); err != nil {
			break
		}
		at += int64(len(c))
	}
	if err == nil && at > j.alloc {
		// Grow the file with zeros ahead of the records, in the same
		// fsync. A disk too full for the zeros is not too full for the
		// records: the zeros are then dropped.
		grow := (at + growStep - 1) / growStep * growStep
		p := at
		var zerr error
		for p < grow && zerr == nil {
			var w int
			w, zerr = j.f.WriteAt(zeros[:min(int64(len(zeros)), grow-p)], p)
			p += int64(w)
		}
		if zerr != nil {
			zerr = j.f.Truncate(at)
			grow = at
		}
		if zerr == nil {
			j.alloc = grow
		} else {
			err = zerr
		}
	}
	if err == nil {
		err = j.sync(j.f)
	}
	if err == nil && j.dirUnsynced {
		if err = atomicfile.SyncDir(j.dir); err == nil {
			j.dirUnsynced = false
		}
	}
	if err != nil {
		_ = j.f.Truncate(off)
		_ = j.sync(j.f)
		j.alloc = off
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return fmt.Errorf("%w: %w", ErrDiskFull, err)
		}
		return fmt.Errorf("write the request journal: %w", err)
	}
	return nil
}

// rewrite compacts: the Book's records written to a new file that replaces
// the journal atomically. Records queued meanwhile are appended after it
// (replay is idempotent, so one also reflected in the compacted state is
// harmless).
func (j *Journal) rewrite() {
	recs := j.compact()
	path := filepath.Join(j.dir, FileName)
	// Streamed one record at a time: a compaction costs one record's
	// memory, not the journal's.
	var size int64
	var nf *os.File // the new journal, open for the writer
	_, err := atomicfile.Write(j.dir, FileName, func(f *os.File) error {
		bw := bufio.NewWriterSize(f, 256<<10)
		var rb bytes.Buffer
		for _, r := range recs {
			rb.Reset()
			n, err := encodeRecord(&rb, r)
			if err != nil {
				return err
			}
			if _, err := bw.Write(rb.Bytes()); err != nil {
				return err
			}
			size += int64(n)
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		// Opened before the rename, which is the point of no return:
		// after it the old file is no longer the journal, and records
		// written to it would be lost. Nothing may fail between the
		// rename and the switch to the new file.
		var err error
		nf, err = openCompacted(f, path)
		return err
	})
	if err != nil && !errors.Is(err, atomicfile.ErrNotDurable) {
		if nf != nil {
			nf.Close()
		}
		return // the old journal stays; compaction is tried again later
	}
	// ErrNotDurable: renamed, the directory fsync failed. The new file is
	// the journal from now on; the next write fsyncs the directory before
	// it acknowledges anything (write).
	notDurable := err != nil
	j.mu.Lock()
	old := j.f
	j.f = nf
	j.size = size
	j.alloc = size
	j.dirUnsynced = notDurable
	j.version++
	j.mu.Unlock()
	old.Close()
}

// Version grows each time the journal's durable bytes change (a write
// fsynced, a compaction): the replica's lag is counted in versions.
func (j *Journal) Version() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.version
}

// Snapshot returns the journal's durable bytes — every record fsynced, never
// one being written — and their version, without holding up the writer: the
// file's descriptor is duplicated with its durable size, so a compaction
// that replaces (and closes) the file meanwhile does not change what is
// read.
func (j *Journal) Snapshot() ([]byte, uint64, error) {
	j.mu.Lock()
	fd, err := unix.Dup(int(j.f.Fd()))
	size, v := j.size, j.version
	j.mu.Unlock()
	if err != nil {
		return nil, 0, fmt.Errorf("duplicate the request journal's descriptor: %w", err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(j.dir, FileName))
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, 0, fmt.Errorf("read the request journal: %w", err)
	}
	return b, v, nil
}

func datasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// ReadDir reads a data directory's journal without opening it for writing
// (the CLI, with or without a supervisor running).
func ReadDir(dataDir string) (*Replay, error) {
	f, err := os.OpenFile(filepath.Join(dataDir, DirName, FileName), os.O_RDONLY|noFollowOpt, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAll(f)
}

// openCompacted opens a compaction's new file for the journal's writer,
// from its temporary file's descriptor (before the rename; path is the name
// it is about to have). A variable: the tests make it fail.
var openCompacted = func(tmp *os.File, path string) (*os.File, error) {
	// Close-on-exec from the start: an agent spawned meanwhile must not
	// inherit the journal.
	fd, err := unix.FcntlInt(tmp.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate the compacted request journal's descriptor: %w", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}
