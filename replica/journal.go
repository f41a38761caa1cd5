package replica

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The request journal in the replica (layout.go, JournalFile): a chain of a
// base — the whole durable prefix of one journal file — and deltas, each the
// bytes that file's durable prefix grew by. A change costs a delta of its
// own size; the chain is bounded:
//
//   - deltas are merged as a stack whose sizes at least halve from the
//     oldest to the newest: a new range is merged with the newest deltas
//     smaller than twice it (one object covering them all replaces them, and
//     they are deleted), so a chain holds about log2(bytes since the base)
//     deltas at most, and a byte is uploaded again only when the delta
//     holding it is merged into one at least half again as large;
//   - a new base is uploaded when the deltas would hold more than the base
//     (a restore downloads at most twice the journal), when a chain would
//     exceed maxJournalDeltas, and when the journal's file was replaced (a
//     compaction: the identity SnapshotFrom returns changed). The objects of
//     the chain it replaces are then deleted.
//
// After a restart the chain found in the bucket is adopted when the local
// journal starts with it (every object's SHA-256 compared with the local
// bytes it holds): a plain restart uploads nothing again.

// journalChain is the request journal's chain in the generation written.
type journalChain struct {
	base   object
	deltas []object // oldest first, contiguous from base.Size
	// file: the identity of the local journal file the chain is a prefix
	// of; nil until verified (a chain found in the bucket at a restart).
	file any
}

func (c *journalChain) size() int64 {
	if n := len(c.deltas); n > 0 {
		return c.deltas[n-1].To
	}
	return c.base.Size
}

func (c *journalChain) keys() []string {
	keys := []string{c.base.Key}
	for _, d := range c.deltas {
		keys = append(keys, d.Key)
	}
	return keys
}

// resumeJournal is the chain of generation g to continue: its newest base
// and the deltas after it, contiguous; every other journal object (older
// bases and their deltas, deltas a merge replaced) is garbage.
func resumeJournal(g *Generation) (*journalChain, []string) {
	bases := g.Files[JournalFile]
	var garbage []string
	if len(bases) == 0 {
		for _, d := range g.JournalDeltas {
			garbage = append(garbage, d.Key)
		}
		return nil, garbage
	}
	c := &journalChain{base: bases[len(bases)-1]}
	for _, b := range bases[:len(bases)-1] {
		garbage = append(garbage, b.Key)
	}
	for _, d := range g.JournalDeltas { // by base, From, the longest first
		if d.Base.Equal(c.base.Time) && d.From == c.size() && len(c.deltas) < maxJournalDeltas {
			c.deltas = append(c.deltas, d)
			continue
		}
		garbage = append(garbage, d.Key)
	}
	return c, garbage
}

// matches: b (the local journal from 0) starts with every byte of the chain.
func (c *journalChain) matches(b []byte) bool {
	if int64(len(b)) < c.size() || sum(b[:c.base.Size]) != c.base.SHA {
		return false
	}
	for _, d := range c.deltas {
		if sum(b[d.From:d.To]) != d.SHA {
			return false
		}
	}
	return true
}

// syncJournal uploads what the request journal's durable bytes grew by
// since the last upload (a delta), or a new base (see above), into the
// generation this run writes: a node never writes into another's
// generation.
func (r *Replicator) syncJournal(ctx context.Context) error {
	j := r.local.Journal
	if j == nil {
		return nil
	}
	r.mu.Lock()
	done := r.jUploaded
	r.mu.Unlock()
	c := r.jChain
	if c != nil && c.file != nil && j.Version() <= done {
		return nil // unchanged since its upload: not read again
	}
	var file any
	var off int64
	if c != nil && c.file != nil {
		file, off = c.file, c.size()
	}
	b, from, v, cur, err := j.SnapshotFrom(file, off)
	if err != nil {
		return fmt.Errorf("replica: read the request journal: %w", err)
	}
	if c != nil && c.file == nil && from == 0 && c.matches(b) {
		c.file, b, from = cur, b[c.size():], c.size() // the chain of the last run: continued
	}
	switch {
	case c != nil && c.file == cur && from == c.size():
		if len(b) == 0 {
			r.journalDone(v, c.size(), false)
			return nil
		}
		return r.journalDelta(ctx, c, b, from, v)
	case c == nil && len(b) == 0:
		r.journalDone(v, 0, false)
		return nil
	}
	return r.journalBase(ctx, b, v, cur)
}

// journalDelta uploads b, the journal's bytes [from, …) after chain c, as a
// delta merged with the newest deltas smaller than twice it, or a new base
// when the chain would be too long.
func (r *Replicator) journalDelta(ctx context.Context, c *journalChain, b []byte, from int64, v uint64) error {
	end := from + int64(len(b))
	k, start := len(c.deltas), from
	for k > 0 {
		top := c.deltas[k-1]
		if top.To-top.From >= 2*(end-start) {
			break
		}
		start, k = top.From, k-1
	}
	if end-c.base.Size > c.base.Size || k+1 > maxJournalDeltas {
		b, from, v, cur, err := r.local.Journal.SnapshotFrom(nil, 0)
		if err != nil {
			return fmt.Errorf("replica: read the request journal: %w", err)
		}
		_ = from // 0: the whole journal
		return r.journalBase(ctx, b, v, cur)
	}
	if start < from {
		// The merged delta starts in bytes already uploaded: read them
		// again (with what was added meanwhile).
		nb, nfrom, nv, cur, err := r.local.Journal.SnapshotFrom(c.file, start)
		if err != nil {
			return fmt.Errorf("replica: read the request journal: %w", err)
		}
		if cur != c.file || nfrom != start {
			return r.journalBase(ctx, nb, nv, cur) // compacted meanwhile: the whole new file
		}
		b, v, end = nb, nv, start+int64(len(nb))
	}
	now := time.Now()
	s := sum(b)
	obj := object{Key: journalDeltaKey(r.gen, c.base.Time, start, end, now, s), Kind: "journal-delta", Gen: r.gen, Name: JournalFile,
		SHA: s, Time: now, Base: c.base.Time, From: start, To: end, Size: int64(len(b))}
	if _, err := r.put(ctx, obj.Key, b); err != nil {
		if !errors.Is(err, errLost) {
			r.jGarbage = append(r.jGarbage, obj.Key) // it may have landed
		}
		return err
	}
	replaced := c.deltas[k:]
	c.deltas = append(c.deltas[:k:k], obj)
	var keys []string
	for _, d := range replaced {
		keys = append(keys, d.Key)
	}
	if err := r.journalRemove(ctx, keys); err != nil {
		return err
	}
	r.journalDone(v, end, true)
	return nil
}

// journalBase uploads b, the whole journal, as a new base; the chain it
// replaces is deleted.
func (r *Replicator) journalBase(ctx context.Context, b []byte, v uint64, cur any) error {
	now := time.Now()
	old := r.jChain
	if old != nil && !now.After(old.base.Time) {
		now = old.base.Time.Add(time.Nanosecond) // one base per version time
	}
	s := sum(b)
	key := fileKey(r.gen, JournalFile, now, s)
	if _, err := r.put(ctx, key, b); err != nil {
		if !errors.Is(err, errLost) {
			r.jGarbage = append(r.jGarbage, key)
		}
		return err
	}
	r.jChain = &journalChain{base: object{Key: key, Kind: "file", Gen: r.gen, Name: JournalFile, SHA: s,
		Time: time.Unix(0, now.UnixNano()).UTC(), Size: int64(len(b))}, file: cur}
	var keys []string
	if old != nil {
		keys = old.keys()
	}
	if err := r.journalRemove(ctx, keys); err != nil {
		return err
	}
	r.journalDone(v, int64(len(b)), true)
	return nil
}

// journalRemove deletes keys and the garbage left by earlier failures; a
// failed delete is kept for the next one (a restore never needs them).
func (r *Replicator) journalRemove(ctx context.Context, keys []string) error {
	keys = append(keys, r.jGarbage...)
	r.jGarbage = nil
	if len(keys) == 0 {
		return nil
	}
	err := r.remove(ctx, keys)
	if errors.Is(err, errLost) {
		return err
	}
	if err != nil {
		r.jGarbage = keys
		r.log.Warn("replica: could not delete request journal objects a newer one replaced (harmless; retried with the next upload)", "objects", len(keys), "err", err)
	}
	return nil
}

func (r *Replicator) journalDone(v uint64, size int64, uploaded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.jUploaded = max(r.jUploaded, v)
	r.jStatus.Bytes = size
	if uploaded {
		r.jStatus.LastUploaded = time.Now()
	}
}
