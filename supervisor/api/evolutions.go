package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// maxEvolutionsListed bounds the evolutions read from the audit log: the
// newest are kept.
const maxEvolutionsListed = 1000

// Evolution is one evolution decision as the audit log keeps it: every
// trial, and every intent rejected before a trial (SPEC §6.7).
type Evolution struct {
	// ID is the trial's id; for an intent rejected before a trial (no
	// checkpoint, a trial already running), the audit record's id.
	ID       string    `json:"id"`
	Time     time.Time `json:"time"` // when it was decided
	Target   string    `json:"target"`
	Decision string    `json:"decision"`
	Reason   string    `json:"reason"`
	// Samples is the number of pairs judged (0 without a trial).
	Samples int `json:"samples"`
	// Record is the whole evolution_decided record: hypothesis, timing,
	// pairs, the judge's evidence and the bounds' path over time, the
	// differing answers kept, the configuration. Left out of a list.
	Record map[string]any `json:"record,omitempty"`
}

// ReadEvolutions reads the evolutions recorded in the audit log at path,
// oldest first (at most the newest 1000), with their whole records when
// full. A missing log is no evolutions. skipped counts unreadable lines.
func ReadEvolutions(path string, full bool) (evs []Evolution, skipped int, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []Evolution{}, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("open the audit log: %w", err)
	}
	defer f.Close()
	evs = []Evolution{}
	skipped, err = observe.ReadAudit(f, time.Time{}, func(r observe.AuditRecord) error {
		if r.Kind != observe.AuditEvolution {
			return nil
		}
		e := Evolution{ID: r.ID, Time: r.Time}
		str := func(k string) string { s, _ := r.Fields[k].(string); return s }
		if id := str("trial"); id != "" {
			e.ID = id
		}
		e.Target, e.Decision, e.Reason = str("target"), str("decision"), str("reason")
		if m, ok := r.Fields["metrics"].(map[string]any); ok {
			if n, ok := m["samples"].(float64); ok {
				e.Samples = int(n)
			}
		}
		if full {
			e.Record = r.Fields
		}
		if len(evs) == maxEvolutionsListed {
			evs = append(evs[:0], evs[1:]...)
		}
		evs = append(evs, e)
		return nil
	})
	if err != nil {
		return nil, skipped, fmt.Errorf("read the audit log: %w", err)
	}
	return evs, skipped, nil
}

// ErrAmbiguousEvolution: the prefix given names more than one evolution.
var ErrAmbiguousEvolution = errors.New("the prefix matches more than one evolution")

// FindEvolution returns the evolution id (or a unique prefix of it, at
// least 8 characters) from the audit log at path, with its whole record.
// A prefix of several returns an error wrapping ErrAmbiguousEvolution that
// names them (trial ids begin with their time: trials a minute apart share
// their first 8 characters).
func FindEvolution(path, id string) (Evolution, bool, error) {
	evs, _, err := ReadEvolutions(path, true)
	if err != nil {
		return Evolution{}, false, err
	}
	var found []Evolution
	for _, e := range evs {
		if e.ID == id {
			return e, true, nil
		}
		if len(id) >= 8 && len(e.ID) > len(id) && e.ID[:len(id)] == id {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 0:
		return Evolution{}, false, nil
	case 1:
		return found[0], true, nil
	}
	ids := make([]string, 0, 4)
	for _, e := range found[:min(len(found), 4)] {
		ids = append(ids, clip.String(e.ID, 64))
	}
	more := ""
	if len(found) > 4 {
		more = fmt.Sprintf(" and %d more", len(found)-4)
	}
	return Evolution{}, false, fmt.Errorf("%w: %q matches %d (%s%s): give more of the id",
		ErrAmbiguousEvolution, clip.String(id, 64), len(found), strings.Join(ids, ", "), more)
}

// GET /v1/evolutions: every evolution recorded, oldest first, without
// their whole records.
func (s *Server) handleEvolutions(w http.ResponseWriter, _ *http.Request) {
	if s.opts.AuditPath == "" {
		writeJSON(w, http.StatusOK, map[string]any{"evolutions": []Evolution{}})
		return
	}
	evs, _, err := ReadEvolutions(s.opts.AuditPath, false)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"evolutions": evs})
}

// GET /v1/evolutions/{id}: one evolution with its whole record.
func (s *Server) handleEvolution(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	e, ok, err := FindEvolution(s.opts.AuditPath, id)
	if errors.Is(err, ErrAmbiguousEvolution) {
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error()})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	if !ok || s.opts.AuditPath == "" {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no evolution %q in the audit log (GET /v1/evolutions lists them)", clip.String(id, 64))})
		return
	}
	writeJSON(w, http.StatusOK, e)
}
