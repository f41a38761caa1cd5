package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// restorePointName is the file holding the restore point, in the store's
// directory, written atomically.
const restorePointName = "restore-point.json"

type restorePoint struct {
	CheckpointID string    `json:"checkpoint_id"`
	NoWAL        bool      `json:"no_wal"`
	SetAt        time.Time `json:"set_at"`
}

// SetRestorePoint records, durably, that the next supervisor to start should
// restore the agent from checkpoint id (without the WAL after it when noWAL).
// It replaces any earlier restore point. Errors wrap ErrInvalidID or
// ErrNotFound.
func (s *Store) SetRestorePoint(id string, noWAL bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, err := s.existing(id)
	if err != nil {
		return err
	}
	b, err := json.Marshal(restorePoint{CheckpointID: id, NoWAL: noWAL, SetAt: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("checkpoint: set restore point: %w", err)
	}
	if err := atomicfile.WriteFile(s.dir, restorePointName, b); err != nil {
		return fmt.Errorf("checkpoint: set restore point: %w", err)
	}
	return nil
}

// PeekRestorePoint returns the recorded restore point without clearing it;
// ok is false when there is none. A damaged record returns an error
// wrapping ErrCorrupt.
func (s *Store) PeekRestorePoint() (id string, noWAL bool, ok bool, err error) {
	return s.readRestorePoint()
}

// TakeRestorePoint returns the recorded restore point and clears it, so it
// is acted on once; ok is false when there is none. A damaged record is
// cleared too (so it cannot block every start) and returned as an error
// wrapping ErrCorrupt. The checkpoint it names may have been pruned or
// damaged since: the caller loads it and handles that.
func (s *Store) TakeRestorePoint() (id string, noWAL bool, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, noWAL, ok, err = s.readRestorePoint()
	if !ok && !errors.Is(err, ErrCorrupt) {
		return "", false, false, err // none, or unreadable for now: leave it
	}
	if rerr := atomicfile.Remove(s.dir, restorePointName); rerr != nil {
		return "", false, false, fmt.Errorf("checkpoint: clear restore point: %w", rerr)
	}
	return id, noWAL, ok, err
}

func (s *Store) readRestorePoint() (string, bool, bool, error) {
	b, err := readLimited(filepath.Join(s.dir, restorePointName), maxMarker)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, false, nil
	}
	if err != nil {
		return "", false, false, fmt.Errorf("checkpoint: read restore point: %w", err)
	}
	var rp restorePoint
	if err := json.Unmarshal(b, &rp); err != nil {
		return "", false, false, fmt.Errorf("checkpoint: restore point %s: %w: %w", restorePointName, ErrCorrupt, err)
	}
	id, err := ParseID(rp.CheckpointID)
	if err != nil {
		return "", false, false, fmt.Errorf("checkpoint: restore point %s: %w: %w", restorePointName, ErrCorrupt, err)
	}
	return id, rp.NoWAL, true, nil
}
