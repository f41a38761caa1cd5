package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Retention. Checkpoints are taken newest first (List order). The newest
// Options.Retain good ones are kept, and every pinned one. A bad one — marked
// with MarkBad, or whose header cannot be read — does not count toward
// Retain and is kept for forensics while it is newer than the Retain-th
// newest good one; once older, it goes like any other. While fewer than
// Retain good checkpoints exist, nothing is removed.

// retained reports, for each entry of es (newest first), whether retention
// keeps it.
func retained(es []entry, retain int) []bool {
	keep := make([]bool, len(es))
	good := 0
	for i, e := range es {
		switch {
		case e.Pinned:
			keep[i] = true
		case !e.Bad && good < retain:
			keep[i] = true
		case e.Bad && good < retain:
			keep[i] = true // newer than the Retain-th good one
		}
		if !e.Bad {
			good++
		}
	}
	return keep
}

// Prune removes the checkpoints retention does not keep (see the package
// documentation), then any marker file whose checkpoint is gone, and
// returns the ids removed, oldest last. The removals are fsynced. On error
// it still returns what it removed before it.
func (s *Store) Prune() (removed []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	es, err := s.list()
	if err != nil {
		return nil, err
	}
	keep := retained(es, s.opts.Retain)
	var errs []error
	for i, e := range es {
		if keep[i] {
			continue
		}
		// The checkpoint first, its markers after: a crash in between
		// leaves an orphan marker, never an unmarked bad checkpoint.
		if err := os.Remove(filepath.Join(s.dir, fileName(e.ID))); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.ID)
		s.log.Info("pruned checkpoint", "checkpoint_id", e.ID, "created", e.Created, "watermark", e.Watermark, "bad", e.Bad)
	}
	if len(removed) > 0 {
		if err := atomicfile.SyncDir(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.removeOrphanMarkers(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("checkpoint: prune %s: %w", s.dir, err)
	}
	return removed, nil
}

// removeOrphanMarkers removes pin and bad marks whose checkpoint is gone.
func (s *Store) removeOrphanMarkers() error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	have := make(map[string]bool)
	for _, de := range des {
		if name, ok := strings.CutSuffix(de.Name(), ckptSuffix); ok {
			have[name] = true
		}
	}
	var errs []error
	n := 0
	for _, de := range des {
		name := de.Name()
		stem, ok := strings.CutSuffix(name, pinSuffix)
		if !ok {
			stem, ok = strings.CutSuffix(name, badSuffix)
		}
		if !ok || have[stem] {
			continue
		}
		if id, err := ParseID(stem); err != nil || id != stem {
			continue // not ours
		}
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if n > 0 {
		if err := atomicfile.SyncDir(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OldestRetainedWatermark returns the smallest WAL watermark among the
// checkpoints retention keeps that a restore may use (good or pinned, with a
// readable header): WAL entries at or below it are no longer needed by any
// of them. It returns false when there is no such checkpoint, or when the
// store cannot be read (logged) — in both cases keep the whole WAL.
func (s *Store) OldestRetainedWatermark() (uint64, bool) {
	es, err := s.list()
	if err != nil {
		s.log.Warn("cannot compute the oldest retained watermark; keeping the WAL", "err", err)
		return 0, false
	}
	keep := retained(es, s.opts.Retain)
	var wm uint64
	found := false
	for i, e := range es {
		if !keep[i] || e.err != nil || (e.Bad && !e.Pinned) {
			continue
		}
		if !found || e.Watermark < wm {
			wm, found = e.Watermark, true
		}
	}
	return wm, found
}
