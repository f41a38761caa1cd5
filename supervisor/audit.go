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
	"time"

	"github.com/google/uuid"
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
	mu sync.Mutex
	f  *os.File
}

func openAudit(path string) (*auditLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	// A torn last line from a crash would glue onto the next record: end it.
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		if last, err := readLastByte(path); err == nil && last != '\n' {
			_, _ = f.Write([]byte("\n"))
		}
	}
	return &auditLog{f: f}, nil
}

func readLastByte(path string) (byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b := make([]byte, 1)
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	_, err = f.ReadAt(b, st.Size()-1)
	return b[0], err
}

// Record appends a record. Errors are returned for the caller to log; an
// audit failure never stops supervision.
func (a *auditLog) Record(kind string, fields map[string]any) error {
	if a == nil {
		return nil
	}
	rec := AuditRecord{ID: newUUID(), Time: time.Now().UTC(), Kind: kind, Fields: fields}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode audit record: %w", err)
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
