package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

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

// auditLog appends one JSON object per decision. Each record is written with a
// single write on an O_APPEND file and fsynced, so a crash can at worst leave a
// torn last line, which readers skip; earlier lines are never touched.
type auditLog struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

// Audit records are bounded: string values the agent can influence (error
// texts, keys, reasons) are cut at maxAuditValue bytes, and a record still
// larger than maxAuditRecord keeps only its kind and a note.
const (
	maxAuditValue  = 1 << 10
	maxAuditRecord = 16 << 10
)

func openAudit(path string) (*auditLog, error) {
	f, err := openAuditFile(path)
	if err != nil {
		return nil, err
	}
	return &auditLog{f: f, path: path}, nil
}

// openAuditFile opens (creating) the audit log for appending, without
// following a symlink: a link planted in the data directory must not make
// us append to its target.
func openAuditFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log %s: %w (a symlink there is refused; remove it)", path, err)
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
func (a *auditLog) Reopen() error {
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

// Record appends a record. Errors are returned for the caller to log; an
// audit failure never stops supervision.
func (a *auditLog) Record(kind string, fields map[string]any) error {
	if a == nil {
		return nil
	}
	bounded, _ := boundFields(fields).(map[string]any)
	rec := AuditRecord{ID: newUUID(), Time: time.Now().UTC(), Kind: kind, Fields: bounded}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode audit record: %w", err)
	}
	if len(b) > maxAuditRecord {
		rec.Fields = map[string]any{"truncated": true, "record_bytes": len(b)}
		if b, err = json.Marshal(rec); err != nil {
			return fmt.Errorf("encode audit record: %w", err)
		}
	}
	b = append(b, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return errors.New("audit log closed")
	}
	if _, err := a.f.Write(b); err != nil {
		return fmt.Errorf("append audit record: %w", err)
	}
	return a.f.Sync()
}

func (a *auditLog) Close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

func newUUID() string {
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

// ReopenAudit reopens DATA_DIR/audit.jsonl, for log rotation (SIGHUP): the
// old file is closed, and records go to a file at the same path, created if
// it was moved away. Safe from any goroutine; before Run has opened the data
// directory it does nothing.
func (s *Supervisor) ReopenAudit() error {
	a := s.auditPtr.Load()
	if a == nil {
		return nil
	}
	if err := a.Reopen(); err != nil {
		s.log.Error("cannot reopen the audit log; records go to the old file until the next SIGHUP", "err", err)
		return fmt.Errorf("reopen audit log: %w", err)
	}
	s.log.Info("audit log reopened", "path", a.path)
	return nil
}
