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

// Pins and bad marks are small marker files beside the checkpoint:
// <id>.pin and <id>.bad, each a JSON object written atomically (temporary
// file, fsync, rename, fsync of the directory). A marker's presence is what
// counts; its content (when and why) is for the operator. A checkpoint file
// is always removed before its markers, so a crash in between leaves an
// orphan marker (removed by the next Prune), never an unmarked bad
// checkpoint.

type pinMark struct {
	PinnedAt time.Time `json:"pinned_at"`
}

type badMark struct {
	Reason   string    `json:"reason"`
	MarkedAt time.Time `json:"marked_at"`
}

// readMarkers sets e.Pinned, e.Bad and e.BadReason from id's marker files.
// markers, when not nil, is the set of marker names present; nil means look.
func (s *Store) readMarkers(e *entry, markers map[string]bool) {
	has := func(name string) bool {
		if markers != nil {
			return markers[name]
		}
		_, err := os.Lstat(filepath.Join(s.dir, name))
		return err == nil
	}
	e.Pinned = has(pinName(e.ID))
	if !has(badName(e.ID)) {
		return
	}
	e.Bad = true
	reason, err := s.readBadMark(e.ID)
	if errors.Is(err, os.ErrNotExist) && e.err == nil {
		e.Bad = false // unmarked since the directory was listed: cannot happen today, be exact anyway
		return
	}
	if err != nil {
		reason = "marked bad (mark unreadable: " + err.Error() + ")"
	}
	if e.err != nil {
		reason += "; " + e.err.Error()
	}
	e.BadReason = reason
}

func (s *Store) readBadMark(id string) (string, error) {
	b, err := readLimited(filepath.Join(s.dir, badName(id)), maxMarker)
	if err != nil {
		return "", err
	}
	var m badMark
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("%s: %w", badName(id), err)
	}
	return m.Reason, nil
}

// Pin keeps checkpoint id through Prune (an evolution's backup) until Unpin.
// Pinning a pinned checkpoint is harmless. Errors wrap ErrInvalidID or
// ErrNotFound.
func (s *Store) Pin(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, err := s.existing(id)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(pinMark{PinnedAt: time.Now().UTC()})
	if err := atomicfile.WriteFile(s.dir, pinName(id), b); err != nil {
		return fmt.Errorf("checkpoint: pin %s: %w", id, err)
	}
	return nil
}

// Unpin lets Prune remove checkpoint id again under the retention rule.
// Unpinning a checkpoint that is not pinned is harmless. Errors wrap
// ErrInvalidID or ErrNotFound.
func (s *Store) Unpin(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, err := s.existing(id)
	if err != nil {
		return err
	}
	if err := atomicfile.Remove(s.dir, pinName(id)); err != nil {
		return fmt.Errorf("checkpoint: unpin %s: %w", id, err)
	}
	return nil
}

// MarkBad marks checkpoint id bad (a poison checkpoint, say), durably:
// Latest and Previous pass over it from now on, and it no longer counts
// toward Options.Retain. Marking again replaces the reason, which is cut to
// 4 KiB. Errors wrap ErrInvalidID or ErrNotFound.
func (s *Store) MarkBad(id, reason string) error {
	if len(reason) > maxBadReason {
		reason = reason[:maxBadReason]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id, err := s.existing(id)
	if err != nil {
		return err
	}
	b, err := json.Marshal(badMark{Reason: reason, MarkedAt: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("checkpoint: mark %s bad: %w", id, err)
	}
	if err := atomicfile.WriteFile(s.dir, badName(id), b); err != nil {
		return fmt.Errorf("checkpoint: mark %s bad: %w", id, err)
	}
	return nil
}

// existing validates id and checks that its checkpoint file exists (its
// content is not checked: a corrupt checkpoint can be pinned or marked).
// Callers hold s.mu, so Prune cannot remove the file before they are done.
func (s *Store) existing(id string) (string, error) {
	id, err := ParseID(id)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(filepath.Join(s.dir, fileName(id))); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: checkpoint %s (see `supervisor checkpoints list`)", ErrNotFound, id)
		}
		return "", fmt.Errorf("checkpoint %s: %w", id, err)
	}
	return id, nil
}
