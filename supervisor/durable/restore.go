package durable

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
)

// Point selects what a restore starts from.
type Point struct {
	CheckpointID string // an operator's choice; "" = the newest good checkpoint
	NoWAL        bool   // the checkpoint alone (operator's --no-wal)
	// Recorded: read from the data directory's restore point file (set by
	// `supervisor restore` while no supervisor ran); cleared once acted on.
	Recorded bool
	// olderThan: the newest good checkpoint older than this id (the crash-loop
	// fallback); ignored when checkpointID is set.
	OlderThan string
	// Always builds a restore even when there is no state: an empty one
	// (no checkpoint, no entries) for an agent already told a restore is
	// coming (--spawn-during-recovery).
	Always bool
}

// Plan is an assembled restore, ready to send.
type Plan struct {
	// Frame is the encoded restore (one that cannot be encoded never
	// starts an agent) — its first bytes only when Tail is set: the WAL
	// entries beyond the first streamTailFrom bytes, checked and counted
	// but left in the log, follow it on the wire, streamed.
	Frame        []byte
	Tail         *WALTail
	CheckpointID string
	Created      time.Time
	Watermark    uint64
	Entries      int
	LastSequence uint64
	Compressed   bool
	Skipped      []checkpoint.Skipped
}

// unrestorable wraps ErrUnrestorable with what is missing and what to do;
// an error among args formatted with %w stays in the chain (wal.ErrCorrupt,
// say).
func (st *Stores) unrestorable(format string, args ...any) error {
	return fmt.Errorf("%w: %w. The agent is not started without its state. Inspect with `supervisor checkpoints list --data-dir %s` "+
		"and `supervisor wal dump --data-dir %s`; restore the data directory from a backup, or choose a checkpoint to roll back to "+
		"with `supervisor restore --data-dir %s --checkpoint ID --no-wal` (that discards the WAL entries after it)",
		ErrUnrestorable, fmt.Errorf(format, args...), st.dir, st.dir, st.dir)
}

// BuildRestore assembles a restore from point plus the WAL after its
// checkpoint's watermark; nil when there is no state at all. It wraps
// ErrUnrestorable when the invariant cannot be met; other errors (a WAL that
// cannot be written right now, say) may pass.
func (st *Stores) BuildRestore(point Point) (*Plan, error) {
	plan := &Plan{}
	var (
		meta checkpoint.Meta
		data []byte
		err  error
	)
	// A v2 agent gets the stored zstd frame of a large snapshot as it is:
	// it is verified as a stream and never held decompressed. A frame that
	// does not declare its size (stored by an older supervisor) is loaded
	// whole instead.
	v2 := st.version.Load() >= 2
	var zdata []byte
	switch {
	case point.CheckpointID != "":
		meta, data, v2, err = st.pick(v2, func(c bool) (checkpoint.Meta, []byte, []checkpoint.Skipped, error) {
			m, d, err := st.load(c, point.CheckpointID)
			return m, d, nil, err
		})
		if err != nil {
			return nil, fmt.Errorf("load checkpoint %s: %w", point.CheckpointID, err)
		}
	default:
		meta, data, v2, err = st.pick(v2, func(c bool) (m checkpoint.Meta, d []byte, sk []checkpoint.Skipped, err error) {
			if point.OlderThan != "" {
				m, d, sk, err = st.previous(c, point.OlderThan)
			} else {
				m, d, sk, err = st.latest(c)
			}
			plan.Skipped = sk
			return m, d, sk, err
		})
		if errors.Is(err, checkpoint.ErrNotFound) && point.OlderThan == "" {
			err, meta = nil, checkpoint.Meta{}
		}
		if err != nil {
			return nil, fmt.Errorf("find a checkpoint to restore: %w", err)
		}
	}
	if v2 && meta.ID != "" {
		zdata, data = data, nil
		if meta.Size <= schema.CompressThreshold {
			// Small: sent uncompressed (Load verifies it again).
			zdata = nil
			if meta, data, err = st.ckpt.Load(meta.ID); err != nil {
				return nil, fmt.Errorf("load checkpoint %s: %w", meta.ID, err)
			}
		}
	}
	plan.CheckpointID, plan.Created, plan.Watermark = meta.ID, meta.Created, meta.Watermark
	lastSeq := max(st.wal.LastSequence(), meta.Watermark)
	if point.NoWAL {
		lastSeq = meta.Watermark
	} else if floor := st.wal.Floor(); floor > meta.Watermark {
		what := "no checkpoint"
		if meta.ID != "" {
			what = fmt.Sprintf("checkpoint %s (watermark %d)", meta.ID, meta.Watermark)
		}
		return nil, st.unrestorable("the restore would be %s plus the WAL after it, but the WAL no longer holds the entries up to sequence %d",
			what, floor)
	}
	// A large snapshot picked by header (streamable) is written to the pipe
	// as it decompresses, verified as it goes (WALTail.Stream), never held.
	streamed := meta.ID != "" && data == nil && zdata == nil
	plan.Compressed = zdata != nil || (st.version.Load() >= 2 && len(data) > schema.CompressThreshold)
	hint := len(data) + len(zdata) + restoreOverhead
	if !point.NoWAL {
		hint += int(min(st.appended.Load()-st.base.Load(), streamTailFrom))
	}
	var rb *schema.RestoreBuilder
	if streamed {
		rb, err = st.codec.NewRestoreStreamed(schema.Header{}, meta.ID, meta.Size, lastSeq, hint)
	} else {
		rb, err = st.codec.NewRestore(schema.Header{}, meta.ID, data, zdata, plan.Compressed, lastSeq, hint)
	}
	if err != nil {
		return nil, st.unrestorable("checkpoint %s cannot be sent: %w", meta.ID, err)
	}
	if int64(rb.Len()) > st.restoreLimit {
		return nil, st.unrestorable("checkpoint %s alone makes a restore of %d bytes, over the %d-byte limit (--max-frame-size)", meta.ID, rb.Len(), st.restoreLimit)
	}
	tail := &WALTail{st: st, after: meta.Watermark}
	if !point.NoWAL {
		err = st.readTail(rb, tail, meta.ID)
		switch {
		case errors.Is(err, wal.ErrCorrupt), errors.Is(err, ErrRestoreFull):
			return nil, st.unrestorable("%w", err)
		case err != nil:
			var ve *schema.ValidationError
			if errors.As(err, &ve) {
				return nil, st.unrestorable("a WAL entry after checkpoint %q cannot be sent: %w", meta.ID, err)
			}
			return nil, fmt.Errorf("read WAL after sequence %d: %w", meta.Watermark, err)
		}
	}
	if meta.ID == "" && rb.Entries() == 0 && !point.Always {
		return nil, nil
	}
	plan.Entries = rb.Entries()
	plan.LastSequence = lastSeq
	plan.Frame = rb.Frame()
	if tail.count > 0 {
		tail.size = rb.Streamed()
		plan.Tail = tail
	}
	if streamed {
		at := rb.SnapshotAt()
		tail.snap = &snapshotStream{st: st, id: meta.ID, size: meta.Size, middle: plan.Frame[at:]}
		plan.Frame = plan.Frame[:at]
		plan.Tail = tail
	}
	return plan, nil
}

// streamSnapshotFrom is the checkpoint size from which a restore streams
// its snapshot from the store (Store.WriteData) instead of holding it.
const streamSnapshotFrom = 1 << 20

// snapshotStream is a restore's snapshot written as it decompresses, and
// the restore's bytes between the snapshot and the streamed WAL entries.
type snapshotStream struct {
	st     *Stores
	id     string
	size   int64
	middle []byte
}

// noteCorrupt records that checkpoint id failed its verification while a
// restore streamed it: restores built from now on pass over it (as a
// checkpoint that fails its check when loaded is), falling back to an
// older one.
func (st *Stores) noteCorrupt(id string, err error) {
	st.corruptMu.Lock()
	defer st.corruptMu.Unlock()
	if st.corrupt == nil {
		st.corrupt = make(map[string]error)
	}
	st.corrupt[id] = err
}

func (st *Stores) corruptErr(id string) error {
	st.corruptMu.Lock()
	defer st.corruptMu.Unlock()
	return st.corrupt[id]
}

// streamable returns the newest checkpoint (older than olderThan, when
// set) a restore can use, as Latest and Previous do — but a large one is
// chosen by its header and not read: its data is nil, and the restore
// streams and verifies it as it is sent (snapshotStream). Small ones are
// loaded and verified here. Checkpoints marked bad, whose header does not
// read, or found corrupt by an earlier streamed restore are skipped.
func (st *Stores) streamable(olderThan string) (checkpoint.Meta, []byte, []checkpoint.Skipped, error) {
	metas, skipped, err := st.ckpt.Candidates(olderThan)
	if err != nil {
		return checkpoint.Meta{}, nil, nil, err
	}
	for _, m := range metas {
		if cerr := st.corruptErr(m.ID); cerr != nil {
			skipped = append(skipped, checkpoint.Skipped{ID: m.ID, Err: cerr})
			continue
		}
		// A v2 agent gets a large snapshot compressed: one whose stored
		// frame does not declare its size (a staged checkpoint's) is loaded
		// and compressed whole, as before.
		if m.Size > streamSnapshotFrom && st.version.Load() < 2 {
			return m, nil, skipped, nil
		}
		lm, data, err := st.ckpt.Load(m.ID)
		if err != nil {
			skipped = append(skipped, checkpoint.Skipped{ID: m.ID, Err: err})
			continue
		}
		if lm.Bad { // marked bad since we listed
			skipped = append(skipped, checkpoint.Skipped{ID: m.ID, Err: fmt.Errorf("%w: %s", checkpoint.ErrMarkedBad, lm.BadReason)})
			continue
		}
		return lm, data, skipped, nil
	}
	return checkpoint.Meta{}, nil, skipped, fmt.Errorf("%w: no loadable checkpoint in %s (%d skipped)", checkpoint.ErrNotFound, st.ckpt.Dir(), len(skipped))
}

// streamTailFrom is how many bytes of WAL entries a restore holds in
// memory; the entries after them are streamed from the log as the restore
// is written to the agent (WALTail). A restore of a long tail — up to
// --max-frame-size, 128 MiB — so costs the supervisor about this much.
const streamTailFrom = 1 << 20

// WALTail is the end of a restore too large to hold: the WAL entries after
// sequence after, up to last, which BuildRestore checked and counted. The
// frame writer streams them from the log behind the restore's first bytes
// (conn.Tail).
type WALTail struct {
	st          *Stores
	after, last uint64
	count       int
	size        int64
	// counted: the entries were counted from the log's counts, not read
	// and checked; streamEntries checks each as it sends it.
	counted bool
	// snap, when set, comes first: the snapshot, streamed from the store,
	// and the restore's bytes up to the entries.
	snap *snapshotStream
}

// Size is the bytes Stream writes.
func (t *WALTail) Size() int64 {
	if t.snap != nil {
		return t.snap.size + int64(len(t.snap.middle)) + t.size
	}
	return t.size
}

// Stream writes the tail's bytes to w: the snapshot when streamed, then the
// entries. A snapshot that fails its verification (checksum, size, a body
// that does not decompress) stops it before the bytes after the snapshot:
// the frame is cut short, never complete with wrong content, and the
// checkpoint is passed over by the next restore.
func (t *WALTail) Stream(w io.Writer) error {
	if s := t.snap; s != nil {
		if _, err := s.st.ckpt.WriteData(s.id, w); err != nil {
			if errors.Is(err, checkpoint.ErrCorrupt) {
				s.st.noteCorrupt(s.id, err)
			}
			return fmt.Errorf("stream the restore's snapshot (checkpoint %s): %w", s.id, err)
		}
		if _, err := w.Write(s.middle); err != nil {
			return err
		}
	}
	if t.count == 0 {
		return nil
	}
	return t.streamEntries(w)
}

// errTailDone stops the log reader after the tail's last entry.
var errTailDone = errors.New("durable: restore tail written")

// Stream writes the entries' bytes to w, as BuildRestore counted them. A
// log that no longer holds exactly those entries (a rollback or a
// truncation since) is an error: the frame is then cut short, and the agent
// restarted with a restore built again.
func (t *WALTail) streamEntries(w io.Writer) error {
	var n int
	var written int64
	err := t.st.wal.ReadAfter(t.after, func(e wal.Entry) error {
		if e.Sequence > t.last {
			return errTailDone
		}
		if n++; n > t.count || written+int64(len(e.Data)) > t.size {
			return fmt.Errorf("the WAL after sequence %d no longer holds what the restore counted: more than %d entries of %d bytes", t.after, t.count, t.size)
		}
		if t.counted {
			if err := schema.CheckEntry(e.Data); err != nil {
				return fmt.Errorf("WAL entry %d cannot be sent: %w", e.Sequence, err)
			}
		}
		written += int64(len(e.Data))
		_, err := w.Write(e.Data)
		return err
	})
	if errors.Is(err, errTailDone) {
		err = nil
	}
	if err == nil && (n != t.count || written != t.size) {
		err = fmt.Errorf("the WAL after sequence %d no longer holds what the restore counted: %d entries of %d bytes, want %d of %d", t.after, n, written, t.count, t.size)
	}
	if err != nil {
		var ve *schema.ValidationError
		if errors.Is(err, wal.ErrCorrupt) || errors.As(err, &ve) {
			// An entry that cannot be sent, or a record that recovery
			// verified and that no longer reads back as written (the disk
			// changed it): the next restore reads and checks every entry
			// before it sends any, and is refused with the reason, instead
			// of being cut short at it again.
			t.st.tailSuspect.Store(true)
		}
		return fmt.Errorf("stream the restore's WAL entries %d to %d: %w", t.after+1, t.last, err)
	}
	return nil
}

// errInlineDone stops the read of the entries a restore holds.
var errInlineDone = errors.New("durable: the restore's held entries read")

// readTail adds the WAL entries above tail.after to rb: the first
// streamTailFrom bytes held in the frame, the rest counted for tail to
// stream. The rest is counted from the log's own counts (wal.CountAfter),
// not read: a restart on a long tail reads it once, to send it, and
// streamEntries checks each entry as it goes. After a streamed entry failed
// that check (tailSuspect), every entry is read and checked here instead,
// so the restore is refused with the reason.
func (st *Stores) readTail(rb *schema.RestoreBuilder, tail *WALTail, id string) error {
	verify := st.tailSuspect.Load()
	inline := 0 // bytes of the entries held in the frame
	err := st.wal.ReadAfter(tail.after, func(e wal.Entry) error {
		if int64(rb.Len()+len(e.Data)) > st.restoreLimit {
			return fmt.Errorf("%w: checkpoint %q plus the WAL after it is more than %d bytes (--max-frame-size); at sequence %d",
				ErrRestoreFull, id, st.restoreLimit, e.Sequence)
		}
		if tail.count == 0 && inline+len(e.Data) <= streamTailFrom {
			inline += len(e.Data)
			tail.after = e.Sequence
			return rb.Add(e.Data)
		}
		if !verify {
			return errInlineDone
		}
		if err := rb.Count(e.Data); err != nil {
			return err
		}
		tail.last = e.Sequence
		tail.count++
		return nil
	})
	if verify && err == nil {
		st.tailSuspect.Store(false) // every entry checked out
	}
	if !errors.Is(err, errInlineDone) {
		return err
	}
	n, size, last, err := st.wal.CountAfter(tail.after)
	if err != nil {
		return err
	}
	if total := int64(rb.Len()) + size; total > st.restoreLimit {
		return fmt.Errorf("%w: checkpoint %q plus the %d WAL entries after it (to sequence %d) make %d bytes, more than %d (--max-frame-size)",
			ErrRestoreFull, id, rb.Entries()+n, last, total, st.restoreLimit)
	}
	if err := rb.CountStreamed(n, size); err != nil {
		return err
	}
	tail.count, tail.last, tail.counted = n, last, true
	return nil
}

// fallbackCandidate returns the newest good checkpoint older than id whose
// whole WAL tail is still held: where --fallback-on-crash-loop may restore
// from. ok is false when there is none.
func (st *Stores) FallbackCandidate(id string) (checkpoint.Meta, bool) {
	metas, err := st.ckpt.List()
	if err != nil {
		return checkpoint.Meta{}, false
	}
	floor := st.wal.Floor()
	older := id == ""
	for _, m := range metas {
		if m.ID == id {
			older = true
			continue
		}
		if older && !m.Bad && m.Watermark >= floor {
			return m, true
		}
	}
	return checkpoint.Meta{}, false
}

// rewind makes an operator's --no-wal restore to cp stick: WAL entries after
// its watermark and checkpoints newer than it describe history the operator
// abandoned. The entries are removed (the agent's next sequences continue
// from the checkpoint) and the newer checkpoints are marked bad (a later
// crash must not restore the abandoned history). It returns what it did.
func (st *Stores) Rewind(cp checkpoint.Meta) (abandoned []string, removed int, prevLast uint64, err error) {
	metas, err := st.ckpt.List()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("list checkpoints: %w", err)
	}
	for _, m := range metas { // newest first: everything before cp is newer
		if m.ID == cp.ID {
			break
		}
		if m.Bad {
			continue
		}
		if err := st.ckpt.MarkBad(m.ID, "abandoned by a --no-wal restore to "+cp.ID); err != nil {
			return abandoned, 0, 0, fmt.Errorf("mark checkpoint %s abandoned: %w", m.ID, err)
		}
		abandoned = append(abandoned, m.ID)
	}
	prevLast = st.wal.LastSequence()
	st.trunc.Lock()
	removed, err = st.wal.TruncateAfter(cp.Watermark)
	st.trunc.Unlock()
	if st.onRewind != nil {
		st.onRewind() // the replica's history is no longer ours
	}
	if err != nil {
		return abandoned, removed, prevLast, fmt.Errorf("remove WAL entries after sequence %d: %w", cp.Watermark, err)
	}
	m := cp
	st.newest.Store(&m)
	st.snapCost.Store(st.snapshotCost(cp))
	st.setAppended(0)
	st.base.Store(0)
	return abandoned, removed, prevLast, nil
}

// pick reads a checkpoint with get, compressed (its stored zstd frame, for
// a v2 agent) when compressed is set; a frame that does not declare its
// size (stored by an older supervisor) is read again uncompressed. It
// returns whether the data is the compressed frame.
func (st *Stores) pick(compressed bool, get func(compressed bool) (checkpoint.Meta, []byte, []checkpoint.Skipped, error)) (checkpoint.Meta, []byte, bool, error) {
	m, d, _, err := get(compressed)
	if compressed && errors.Is(err, checkpoint.ErrNoContentSize) {
		compressed = false
		m, d, _, err = get(false)
	}
	return m, d, compressed, err
}

func (st *Stores) load(compressed bool, id string) (checkpoint.Meta, []byte, error) {
	if compressed {
		return st.ckpt.LoadCompressed(id)
	}
	return st.ckpt.Load(id)
}

func (st *Stores) latest(compressed bool) (checkpoint.Meta, []byte, []checkpoint.Skipped, error) {
	if compressed {
		return st.ckpt.LatestCompressed()
	}
	return st.streamable("")
}

func (st *Stores) previous(compressed bool, id string) (checkpoint.Meta, []byte, []checkpoint.Skipped, error) {
	if compressed {
		return st.ckpt.PreviousCompressed(id)
	}
	return st.streamable(id)
}
