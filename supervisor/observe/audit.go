package observe

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
	"github.com/agent-sidecar/supervisor/logging"
)

// Audit record kinds.
const (
	AuditRestart          = "restart"
	AuditGaveUp           = "gave_up"
	AuditRestore          = "restore"
	AuditCheckpoint       = "checkpoint_stored"
	AuditCheckpointError  = "checkpoint_failed"
	AuditCheckpointBad    = "checkpoint_marked_bad"
	AuditCheckpointSkip   = "checkpoint_skipped"
	AuditRollback         = "history_rolled_back"
	AuditInvalid          = "invalid_message"
	AuditFraming          = "framing_error"
	AuditWALError         = "wal_error"
	AuditSequenceConflict = "sequence_conflict"
	AuditFallback         = "crash_loop_fallback"
	AuditRestoreRefused   = "restore_refused"
	AuditEvolution        = "evolution_decided"
	AuditStart            = "supervisor_started"
	AuditStop             = "supervisor_stopped"
)

// AuditRecord is one line of DATA_DIR/audit.jsonl.
type AuditRecord struct {
	ID     string         `json:"id"`
	Time   time.Time      `json:"time"`
	Kind   string         `json:"kind"`
	Fields map[string]any `json:"fields,omitempty"`
}

// AuditLog appends one JSON object per decision, in the order recorded.
// Record never waits on the disk: it encodes the record and queues it, and
// the log's own writer goroutine appends what is queued with one write and
// one fsync (a crash can at worst leave a torn last line, which readers
// skip; earlier lines are never touched). While the disk is stuck the queue
// is bounded (auditQueueRecords, auditQueueBytes): a record that does not
// fit is dropped and counted, and an "audit_records_dropped" record says how
// many were lost once writing resumes.
type AuditLog struct {
	mu   sync.Mutex // guards f (Reopen swaps it)
	f    *os.File
	path string

	qmu      sync.Mutex
	queue    [][]byte
	qbytes   int
	queued   uint64 // records accepted so far
	written  uint64 // records the writer has written (or failed to)
	dropped  int    // since the last drop note
	closed   bool
	progress *sync.Cond // on qmu: written advanced, or closed
	wake     chan struct{}
	done     chan struct{} // the writer has exited
	onDrop   func()        // counts a dropped record (Metrics); may be nil
	onError  func(error)   // reports a failed write (logs); may be nil

	recent recentAudit // the newest records, for the status page
}

// Bounds of the audit queue while the disk does not keep up.
const (
	auditQueueRecords = 4096
	auditQueueBytes   = 4 << 20
)

// AuditDropped is the kind of the record that counts records lost while the
// audit queue was full.
const AuditDropped = "audit_records_dropped"

// Audit records are bounded: string values the agent can influence (error
// texts, keys, reasons) are cut at maxAuditValue bytes, and a record still
// larger than maxAuditRecord has its largest fields cut (strings to
// maxAuditShort bytes) or dropped until it fits (shrinkAudit).
const (
	maxAuditValue  = 1 << 10
	maxAuditShort  = 256
	maxAuditRecord = 16 << 10
)

// OpenAudit opens the audit log and starts its writer; Close stops it.
// onDrop counts a record dropped while the queue was full, onError reports
// a failed write; either may be nil.
func OpenAudit(path string, onDrop func(), onError func(error)) (*AuditLog, error) {
	f, err := openAuditFile(path)
	if err != nil {
		return nil, err
	}
	a := &AuditLog{f: f, path: path, wake: make(chan struct{}, 1), done: make(chan struct{}), onDrop: onDrop, onError: onError}
	a.progress = sync.NewCond(&a.qmu)
	go a.writer()
	return a, nil
}

// openAuditFile opens (creating) the audit log for appending, without
// following a symlink: a link planted in the data directory must not make
// us append to its target.
func openAuditFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log %s: %w%s", path, err, SymlinkHint(err))
	}
	// The file's directory entry must outlive a power cut too: the records
	// the writer fsyncs are in a file that is there after it.
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, fmt.Errorf("make audit log %s durable in its directory: %w", path, err)
	}
	// A torn last line from a crash would glue onto the next record: end it.
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		if last, err := readLastByte(path, st.Size()); err == nil && last != '\n' {
			_, _ = f.Write([]byte("\n"))
		}
	}
	return f, nil
}

func readLastByte(path string, size int64) (byte, error) {
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	b := make([]byte, 1)
	_, err = r.ReadAt(b, size-1)
	return b[0], err
}

// Reopen closes the audit log and opens its path again: after logrotate
// moved it away, records go to a new file.
func (a *AuditLog) Reopen() error {
	if a == nil {
		return nil
	}
	f, err := openAuditFile(a.path)
	if err != nil {
		return err
	}
	a.mu.Lock()
	old := a.f
	if old == nil { // closed meanwhile
		a.mu.Unlock()
		return f.Close()
	}
	a.f = f
	a.mu.Unlock()
	return old.Close()
}

// boundFields returns fields with every long string cut (recursively through
// maps and slices of any). It copies only what it changes.
func boundFields(v any) any {
	switch x := v.(type) {
	case string:
		if len(x) > maxAuditValue {
			return logging.Clip(x, maxAuditValue)
		}
	case error:
		return boundFields(x.Error())
	case map[string]any:
		if x == nil {
			return x
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[logging.Clip(k, 128)] = boundFields(e)
		}
		return out
	case []string:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = logging.Clip(e, maxAuditValue)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = boundFields(e)
		}
		return out
	}
	return v
}

// Record queues a record for appending and returns at once. An error means
// it could not be encoded, or the log is closed; an audit failure never
// stops supervision.
func (a *AuditLog) Record(kind string, fields map[string]any) error {
	if a == nil {
		return nil
	}
	b, err := encodeAudit(kind, fields)
	if err != nil {
		return err
	}
	a.recent.add(kind, b)
	a.qmu.Lock()
	defer a.qmu.Unlock()
	if a.closed {
		return errors.New("audit log closed")
	}
	if len(a.queue) >= auditQueueRecords || a.qbytes+len(b) > auditQueueBytes {
		a.dropped++
		if a.onDrop != nil {
			a.onDrop()
		}
		return nil
	}
	a.queue = append(a.queue, b)
	a.qbytes += len(b)
	a.queued++
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

// encodeAudit renders one bounded record line.
func encodeAudit(kind string, fields map[string]any) ([]byte, error) {
	bounded, _ := boundFields(fields).(map[string]any)
	rec := AuditRecord{ID: NewUUID(), Time: time.Now().UTC(), Kind: kind, Fields: bounded}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode audit record: %w", err)
	}
	if len(b) > maxAuditRecord {
		if b, err = shrinkAudit(rec, len(b)); err != nil {
			return nil, fmt.Errorf("encode audit record: %w", err)
		}
	}
	return append(b, '\n'), nil
}

// shrinkAudit encodes rec, whose encoding is size bytes, over
// maxAuditRecord, cut down to fit: its fields, largest first, have their
// strings cut at maxAuditShort bytes, then, if that is not enough, are
// dropped (named in "truncated_fields"), until the record fits. So the
// small fields that say what was decided (an evolution's trial, decision
// and reason) survive a large one beside them: bounding each value is not
// enough, since a string takes up to six times its bytes in JSON ('<' is
// \u003c). Each field is encoded once to size it, and the record once
// more at the end.
func shrinkAudit(rec AuditRecord, size int) ([]byte, error) {
	type field struct {
		k string
		n int // bytes in the record: "k":v,
	}
	sizeOf := func(k string, v any) int {
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(v)
		if err != nil {
			return 0
		}
		return len(kb) + len(vb) + 2
	}
	fields := make(map[string]any, len(rec.Fields)+3)
	order := make([]field, 0, len(rec.Fields))
	for k, v := range rec.Fields {
		fields[k] = v
		order = append(order, field{k, sizeOf(k, v)})
	}
	slices.SortFunc(order, func(a, b field) int { return cmp.Or(b.n-a.n, strings.Compare(a.k, b.k)) })
	fields["truncated"], fields["record_bytes"] = true, size
	rec.Fields = fields
	// An estimate of the encoding's size, kept as fields change, with room
	// for the note and the names of dropped fields.
	est := size + 64
	for _, f := range order {
		if est <= maxAuditRecord {
			break
		}
		if s, ok := fields[f.k].(string); ok && len(s) > maxAuditShort {
			fields[f.k] = logging.Clip(s, maxAuditShort)
			n := sizeOf(f.k, fields[f.k])
			est -= f.n - n
		}
	}
	var dropped []string
	for _, f := range order {
		if est <= maxAuditRecord {
			break
		}
		est -= sizeOf(f.k, fields[f.k]) - len(f.k) - 3 // its name stays, in truncated_fields
		delete(fields, f.k)
		dropped = append(dropped, f.k)
	}
	if len(dropped) > 0 {
		fields["truncated_fields"] = dropped
	}
	b, err := json.Marshal(rec)
	if err == nil && len(b) > maxAuditRecord {
		rec.Fields = map[string]any{"truncated": true, "record_bytes": size}
		b, err = json.Marshal(rec)
	}
	return b, err
}

// writer appends queued records until Close, then what is left.
func (a *AuditLog) writer() {
	defer close(a.done)
	for {
		a.qmu.Lock()
		batch, dropped, closed := a.queue, a.dropped, a.closed
		a.queue, a.qbytes, a.dropped = nil, 0, 0
		a.qmu.Unlock()
		if dropped > 0 {
			if note, err := encodeAudit(AuditDropped, map[string]any{"dropped": dropped,
				"reason": "the audit log could not be written as fast as records came (a slow or stuck disk)"}); err == nil {
				batch = append(batch, note)
			}
		}
		if len(batch) > 0 {
			if err := a.write(batch); err != nil && a.onError != nil {
				a.onError(err)
			}
			a.qmu.Lock()
			a.written += uint64(len(batch))
			if dropped > 0 {
				a.written-- // the note was not queued
			}
			a.progress.Broadcast()
			a.qmu.Unlock()
			continue
		}
		if closed {
			return
		}
		<-a.wake
	}
}

// write appends records with one write and one fsync.
func (a *AuditLog) write(batch [][]byte) error {
	var b []byte
	if len(batch) == 1 {
		b = batch[0]
	} else {
		b = bytes.Join(batch, nil)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return errors.New("audit log closed")
	}
	if _, err := a.f.Write(b); err != nil {
		return fmt.Errorf("append audit record: %w", err)
	}
	if err := a.f.Sync(); err != nil {
		return fmt.Errorf("fsync audit log: %w", err)
	}
	return nil
}

// Sync waits until every record queued before it is written.
func (a *AuditLog) Sync() {
	if a == nil {
		return
	}
	a.qmu.Lock()
	defer a.qmu.Unlock()
	target := a.queued
	for a.written < target && !(a.closed && a.writerDone()) {
		a.progress.Wait()
	}
}

func (a *AuditLog) writerDone() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// Close writes what is queued and closes the file.
func (a *AuditLog) Close() error {
	if a == nil {
		return nil
	}
	a.qmu.Lock()
	if !a.closed {
		a.closed = true
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
	a.qmu.Unlock()
	<-a.done
	a.qmu.Lock()
	a.progress.Broadcast()
	a.qmu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

// NewUUID returns a time-ordered UUID (v7; v4 if the clock fails).
func NewUUID() string {
	if id, err := uuid.NewV7(); err == nil {
		return id.String()
	}
	return uuid.NewString()
}

// ReadAudit streams the records of an audit log written at or after since
// (zero: all). A torn or unparsable line is skipped and counted.
func ReadAudit(r io.Reader, since time.Time, fn func(AuditRecord) error) (skipped int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var rec AuditRecord
		if err := json.Unmarshal(line, &rec); err != nil || rec.Kind == "" {
			skipped++
			continue
		}
		if !since.IsZero() && rec.Time.Before(since) {
			continue
		}
		if err := fn(rec); err != nil {
			return skipped, err
		}
	}
	return skipped, sc.Err()
}

// Path is the audit log's file.
func (a *AuditLog) Path() string { return a.path }

// SymlinkHint explains an error from opening a data directory file without
// following symlinks: ELOOP means a symlink is there, refused on purpose.
// Other errors get no hint ("").
func SymlinkHint(err error) string {
	if errors.Is(err, syscall.ELOOP) {
		return " (a symlink there is refused; remove it)"
	}
	return ""
}
