package evolution

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Ledger errors. Callers branch on them with errors.Is.
var (
	// ErrCorruptLedger: the ledger file exists but cannot be read as one.
	ErrCorruptLedger = errors.New("evolution: promotion ledger is corrupt")
	// ErrInvalidPromotion: Record was given a promotion it cannot store.
	ErrInvalidPromotion = errors.New("evolution: invalid promotion")
	// ErrLedgerFull: recording would make the ledger larger than MaxLedgerSize.
	ErrLedgerFull = errors.New("evolution: promotion ledger is full")
)

const (
	// ledgerVersion is the file format written and the only one read.
	ledgerVersion = 1
	// MaxLedgerSize bounds the ledger file, read or written. Each module's
	// newest promotion keeps its code (at most 1 MiB from one
	// evolution_intent), so this holds hundreds of modules.
	MaxLedgerSize = 256 << 20
	// defaultMaxHistory is how many promotions the ledger keeps; beyond it the
	// oldest superseded ones are dropped (the audit log keeps every decision).
	defaultMaxHistory = 1000
)

// Promotion is one promoted evolution: the code that was hot-reloaded into the
// primary and what justified it.
type Promotion struct {
	ID                 string             `json:"id"`                   // UUID; Record assigns a v7 when empty
	Module             string             `json:"module"`               // hot_reload.module
	Code               string             `json:"code"`                 // hot_reload.code; "" once superseded, see Ledger
	Target             string             `json:"target"`               // the hypothesis's target
	Reason             string             `json:"reason"`               // the decision's reason
	BackupCheckpointID string             `json:"backup_checkpoint_id"` // the pinned backup the trial started from
	At                 time.Time          `json:"at"`                   // when it was promoted; Record uses now when zero
	Metrics            map[string]float64 `json:"metrics,omitempty"`    // the decision's figures
}

// Ledger is the durable record of promotions, a JSON file (by convention
// DATA_DIR/evolution.json) rewritten atomically on every Record. It exists so
// a promotion survives a crash: after a restore from a checkpoint older than a
// promotion, the supervisor asks [Ledger.Since] what to re-send with
// hot_reload.
//
// Only the newest promotion of each module (the last recorded) is live; it
// keeps its code. Older promotions of that module are kept for history with
// their code dropped, and once the ledger holds more than 1000 promotions the
// oldest of those are removed. The audit log has every decision in full.
//
// A Ledger is safe for concurrent use. It holds no open files, so it needs no
// Close. One process at a time may use a ledger file (the supervisor's data
// directory lock ensures that).
type Ledger struct {
	path       string
	dir, name  string // path split
	maxHistory int    // promotions kept, see prune
	maxSize    int    // bytes of the file, read or written

	mu     sync.Mutex
	promos []Promotion // record order: oldest first
}

// ledgerFile is the on-disk form.
type ledgerFile struct {
	Version    int         `json:"version"`
	Promotions []Promotion `json:"promotions"`
}

// OpenLedger reads the ledger at path. A missing file is an empty ledger; the
// directory is created (0700) if needed. Temporary files left by a crash in
// the middle of a Record are removed. A file that cannot be parsed gives an
// error wrapping [ErrCorruptLedger] that names the file: the supervisor
// should refuse to start rather than forget promoted code.
func OpenLedger(path string) (*Ledger, error) {
	return openLedger(path, defaultMaxHistory, MaxLedgerSize)
}

func openLedger(path string, maxHistory, maxSize int) (*Ledger, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	l := &Ledger{path: path, dir: dir, name: name, maxHistory: maxHistory, maxSize: maxSize}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("evolution: create the ledger's directory: %w", err)
	}
	// Temporary files left by a crash in the middle of a Record. A leftover
	// is harmless, so failing to remove one is not an error.
	_, _ = atomicfile.Sweep(dir, name)

	// Not through a symlink: a link planted in the data directory must not
	// decide what code is re-sent to the agent.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("evolution: open promotion ledger: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(maxSize)+1))
	if err != nil {
		return nil, fmt.Errorf("evolution: read promotion ledger %s: %w", path, err)
	}
	if len(b) > maxSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes; move it aside to start with no promotions (promoted code will then not be re-sent after a restore)",
			ErrCorruptLedger, path, maxSize)
	}
	promos, err := parseLedger(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v; restore it from a backup or move it aside to start with no promotions (promoted code will then not be re-sent after a restore)",
			ErrCorruptLedger, path, err)
	}
	l.promos = promos
	return l, nil
}

// parseLedger decodes and checks a ledger file's bytes. Errors do not wrap
// ErrCorruptLedger; OpenLedger adds it with the path.
func parseLedger(b []byte) ([]Promotion, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, errors.New("not a ledger: the file is empty")
	}
	var lf ledgerFile
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&lf); err != nil {
		return nil, fmt.Errorf("not a ledger: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not a ledger: data after the JSON object")
	}
	if lf.Version != ledgerVersion {
		return nil, fmt.Errorf("format version %d, this supervisor reads version %d", lf.Version, ledgerVersion)
	}
	seen := make(map[string]bool, len(lf.Promotions))
	for i := range lf.Promotions {
		p := &lf.Promotions[i]
		p.At = p.At.UTC() // before check: an offset can move the year out of range
		if err := p.check(); err != nil {
			return nil, fmt.Errorf("promotion %d: %w", i, err)
		}
		if seen[p.ID] {
			return nil, fmt.Errorf("promotion %d: id %q appears twice", i, p.ID)
		}
		seen[p.ID] = true
		if len(p.Metrics) == 0 {
			p.Metrics = nil
		}
	}
	if len(lf.Promotions) == 0 {
		return nil, nil
	}
	return lf.Promotions, nil
}

// check validates what the file format needs: an id, a time JSON can carry,
// finite figures.
func (p *Promotion) check() error {
	if p.ID == "" {
		return errors.New("empty id")
	}
	if p.At.IsZero() {
		return errors.New("no time")
	}
	if y := p.At.Year(); y < 1 || y > 9999 {
		return fmt.Errorf("time %v out of range", p.At)
	}
	for k, v := range p.Metrics {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("metric %s is %v; figures must be finite", k, v)
		}
	}
	return nil
}

// Record appends p durably: the whole ledger is written to a temporary file
// beside it, fsynced, renamed over it, and the directory fsynced. An empty ID
// gets a UUIDv7, a zero At the current time. p becomes its module's live
// promotion, superseding the previous one (whose code is dropped).
//
// Errors wrap [ErrInvalidPromotion] (duplicate ID, non-finite metric, time
// out of range), [ErrLedgerFull], or the I/O error. On error nothing changed,
// on disk or in memory, and the caller should not promote: a promotion that is
// not durable would be lost on the next restore.
func (l *Ledger) Record(p Promotion) error {
	if p.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("evolution: generate a promotion id: %w", err)
		}
		p.ID = id.String()
	}
	if p.At.IsZero() {
		p.At = time.Now()
	}
	p.At = p.At.UTC() // also drops the monotonic reading, as the file does
	p.Metrics = copyMetrics(p.Metrics)
	if err := p.check(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidPromotion, err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	next := make([]Promotion, 0, len(l.promos)+1)
	for _, q := range l.promos {
		if q.ID == p.ID {
			return fmt.Errorf("%w: id %s is already recorded", ErrInvalidPromotion, p.ID)
		}
		if q.Module == p.Module {
			q.Code = ""
		}
		next = append(next, q)
	}
	next = prune(append(next, p), l.maxHistory)

	b, err := encodeLedger(next)
	if err != nil {
		return fmt.Errorf("evolution: encode promotion ledger: %w", err)
	}
	if len(b) > l.maxSize {
		return fmt.Errorf("%w: recording promotion %s would make %s %d bytes, over %d; it keeps the newest code of every module evolved, so the agent's promoted code is too large to keep",
			ErrLedgerFull, p.ID, l.path, len(b), l.maxSize)
	}
	if err := l.write(b); err != nil {
		if errors.Is(err, atomicfile.ErrNotDurable) {
			// The new file is in place but may not be durable: put the old
			// contents back so disk and memory agree that p was not recorded.
			l.rollback()
		}
		return fmt.Errorf("evolution: record promotion %s in %s: %w", p.ID, l.path, err)
	}
	l.promos = next
	return nil
}

// write replaces the ledger file by b (internal/atomicfile).
func (l *Ledger) write(b []byte) error { return atomicfile.WriteFile(l.dir, l.name, b) }

func encodeLedger(ps []Promotion) ([]byte, error) {
	b, err := json.MarshalIndent(ledgerFile{Version: ledgerVersion, Promotions: ps}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// rollback rewrites the file from l.promos, best effort: it runs only after a
// failed directory fsync, when the disk is already misbehaving.
func (l *Ledger) rollback() {
	if len(l.promos) == 0 {
		os.Remove(l.path)
		return
	}
	if b, err := encodeLedger(l.promos); err == nil {
		_ = l.write(b)
	}
}

// prune drops the oldest superseded promotions while there are more than max.
// Live ones (the last of each module) are never dropped.
func prune(ps []Promotion, max int) []Promotion {
	excess := len(ps) - max
	if excess <= 0 {
		return ps
	}
	live := liveIndexes(ps)
	out := ps[:0:0]
	for i, p := range ps {
		if excess > 0 && !live[i] {
			excess--
			continue
		}
		out = append(out, p)
	}
	return out
}

// liveIndexes marks the last promotion of each module.
func liveIndexes(ps []Promotion) map[int]bool {
	last := make(map[string]int, len(ps))
	for i, p := range ps {
		last[p.Module] = i
	}
	live := make(map[int]bool, len(last))
	for _, i := range last {
		live[i] = true
	}
	return live
}

// Promotions returns every promotion kept, oldest (first recorded) first.
// The slice and maps are copies.
func (l *Ledger) Promotions() []Promotion {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Promotion, len(l.promos))
	for i, p := range l.promos {
		p.Metrics = copyMetrics(p.Metrics)
		out[i] = p
	}
	return out
}

// Since returns the promotions that must be re-sent with hot_reload after a
// restore from a checkpoint created at checkpointCreated (zero time: no
// checkpoint, every live promotion): for each module its newest promotion,
// when that promotion was made at or after checkpointCreated. A module whose
// newest promotion predates the checkpoint needs nothing: the checkpoint was
// taken with that code running. The result is in record order, oldest first;
// copies.
//
// "Newest" is the last recorded, not the greatest At, so a clock stepped back
// between two promotions cannot resurrect superseded code.
func (l *Ledger) Since(checkpointCreated time.Time) []Promotion {
	l.mu.Lock()
	defer l.mu.Unlock()
	live := liveIndexes(l.promos)
	var out []Promotion
	for i, p := range l.promos {
		if !live[i] || p.At.Before(checkpointCreated) {
			continue
		}
		p.Metrics = copyMetrics(p.Metrics)
		out = append(out, p)
	}
	return out
}

func copyMetrics(m map[string]float64) map[string]float64 {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]float64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
