package observe

import (
	"bytes"
	"encoding/json"
	"sync"
)

// auditRingSize is how many of the newest audit records an AuditLog keeps
// in memory for the status page (Recorder.Recent).
const auditRingSize = 64

// recentAudit keeps the newest audit records, as their encoded lines, and
// the newest of each kind: the status page reads them from memory, never
// the file. Bounded: auditRingSize lines plus one per kind (a fixed set),
// each at most maxAuditRecord bytes.
type recentAudit struct {
	mu     sync.Mutex
	ring   [][]byte // the newest records, oldest overwritten first
	next   int      // where the next record goes in ring
	byKind map[string][]byte
	added  uint64 // records added so far

	// The last newest() answer, decoded once and handed out again while
	// no record came (a status page asks every 2 s).
	cacheAt  uint64
	cacheN   int
	cacheOut AuditRecords
	lastAt   uint64 // likewise for last
	lastKind string
	lastRec  AuditRecord
	lastOK   bool
}

// AuditRecords are audit records that encode as a JSON array. Those that
// Recorder.Recent returns carry their encoding (the audit log's lines), so
// encoding them again costs a copy, not a walk of every record's fields.
type AuditRecords struct {
	Records []AuditRecord
	raw     []byte // the JSON array of Records; nil: encode them
}

// MarshalJSON encodes the records as a JSON array.
func (a AuditRecords) MarshalJSON() ([]byte, error) {
	if a.raw != nil {
		return a.raw, nil
	}
	if a.Records == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(a.Records)
}

// UnmarshalJSON decodes a JSON array of records.
func (a *AuditRecords) UnmarshalJSON(b []byte) error {
	a.raw = nil
	return json.Unmarshal(b, &a.Records)
}

// IsZero: no records (omitzero omits the field).
func (a AuditRecords) IsZero() bool { return len(a.Records) == 0 }

// add remembers one encoded record line. The line is never changed after.
func (r *recentAudit) add(kind string, line []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) < auditRingSize {
		r.ring = append(r.ring, line)
	} else {
		r.ring[r.next] = line
	}
	r.next = (r.next + 1) % auditRingSize
	r.added++
	if r.byKind == nil {
		r.byKind = map[string][]byte{}
	}
	r.byKind[kind] = line
}

// newest returns up to n records, newest first. The slice is shared:
// callers must not change it.
func (r *recentAudit) newest(n int) AuditRecords {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cacheOut.raw != nil && r.cacheAt == r.added && r.cacheN == n {
		return r.cacheOut
	}
	lines := make([][]byte, 0, min(n, len(r.ring)))
	for i := 1; i <= len(r.ring) && len(lines) < n; i++ {
		lines = append(lines, r.ring[(r.next-i+len(r.ring))%len(r.ring)])
	}
	out := AuditRecords{Records: make([]AuditRecord, 0, len(lines)), raw: []byte{'['}}
	for _, l := range lines {
		var rec AuditRecord
		if json.Unmarshal(l, &rec) == nil {
			if len(out.Records) > 0 {
				out.raw = append(out.raw, ',')
			}
			out.Records = append(out.Records, rec)
			out.raw = append(out.raw, bytes.TrimSpace(l)...)
		}
	}
	out.raw = append(out.raw, ']')
	r.cacheAt, r.cacheN, r.cacheOut = r.added, n, out
	return out
}

// last returns the newest record of kind.
// The record is shared: callers must not change it.
func (r *recentAudit) last(kind string) (AuditRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastAt == r.added && r.lastKind == kind {
		return r.lastRec, r.lastOK
	}
	var rec AuditRecord
	l := r.byKind[kind]
	ok := l != nil && json.Unmarshal(l, &rec) == nil
	r.lastAt, r.lastKind, r.lastRec, r.lastOK = r.added, kind, rec, ok
	return rec, ok
}

// Recent returns up to n of the newest audit records, newest first (at
// most 64 are kept), from memory. Nil before the audit log is attached.
// The slice may be shared with other callers: do not change it.
func (r *Recorder) Recent(n int) AuditRecords {
	a := r.audit.Load()
	if a == nil {
		return AuditRecords{}
	}
	return a.recent.newest(n)
}

// Last returns the newest audit record of kind written by this process,
// however many other records came after it.
func (r *Recorder) Last(kind string) (AuditRecord, bool) {
	a := r.audit.Load()
	if a == nil {
		return AuditRecord{}, false
	}
	return a.recent.last(kind)
}
