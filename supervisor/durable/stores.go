package durable

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/atomicfile"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
)

// # The restore invariant (SPEC §5)
//
// Every restore the supervisor sends is one acknowledged checkpoint (or none)
// plus every WAL entry above its watermark, with no gap. This file is the
// only code that builds a restore, and it enforces the invariant in four
// places:
//
//  1. buildRestore refuses (ErrUnrestorable) when the WAL no longer holds
//     every entry above the chosen checkpoint's watermark (wal.Log.Floor), or
//     when reading that tail fails on damage. It never sends a partial
//     restore; the owner then stops without starting the agent.
//  2. saveCheckpoint deletes WAL segments only below the watermark of the
//     oldest checkpoint a restore could still use (retained, not marked bad),
//     so retention can never open a gap under a checkpoint it keeps.
//  3. append refuses entries (WAL_FULL, "checkpoint first") before the tail
//     above the newest checkpoint would make the restore larger than the
//     agent can be sent: every entry the supervisor accepts can be restored.
//  4. Nothing here marks a checkpoint bad on its own: a crash loop gives up
//     with the state intact (the old "poison checkpoint" rule is gone), and
//     the opt-in fallback (--fallback-on-crash-loop) only restores from an
//     older checkpoint whose whole WAL tail is held.
//
// Only an operator rolls history back (`supervisor restore --no-wal`), and
// that is audited (rewind).

// ErrUnrestorable: no restore satisfying the restore invariant can be built
// from the data directory (the WAL lost entries a restore needs, or they
// are damaged). The agent is not started; the operator must act (exit code
// 3).
var ErrUnrestorable = errors.New("the agent's state cannot be restored completely")

// errRestoreFull: appending would make the restore larger than the agent can
// be sent. Answered WAL_FULL ("checkpoint first").
var ErrRestoreFull = errors.New("the WAL tail after the newest checkpoint is as large as a restore may be")

// restoreOverhead is what a restore frame takes besides the snapshot and the
// entries (header fields, checkpoint id, array header), with room to spare.
const restoreOverhead = 512

// agentFile records, in the data directory, what the supervisor learned
// about its agent that must outlive a supervisor restart.
const agentFile = "agent.json"

type agentInfo struct {
	// ProtocolVersion is the highest version the agent has spoken. A v2
	// agent gets compressed restores from the first start after a
	// supervisor restart too.
	ProtocolVersion int32 `json:"protocol_version"`
}

// Stores owns the primary agent's durable state: the WAL, the checkpoint
// store and what is known about the agent's protocol. The primary's frame
// reader appends (append, checkpointArrived, noteVersion); everything else —
// saves, retention, restores, rollbacks, pins — runs on the store worker
// (storework.go), one step at a time: a restore never sees a half-applied
// retention step, without a lock.
type Stores struct {
	dir   string
	wal   *wal.Log
	ckpt  *checkpoint.Store
	codec *schema.Codec
	log   *slog.Logger
	// restoreLimit is the largest restore payload the agent may be sent.
	restoreLimit int64

	// Restorability accounting (append's guard). appended counts the bytes
	// of every entry appended since Open, starting from the bytes already
	// above the newest checkpoint's watermark; base is its value when the
	// newest stored checkpoint arrived (so the tail is appended − base), and
	// snapCost what that checkpoint's snapshot takes in a restore.
	appended atomic.Int64
	base     atomic.Int64
	snapCost atomic.Int64
	newest   atomic.Pointer[checkpoint.Meta] // newest good checkpoint, nil: none

	// trunc is held (read) by the replicator while it reads the WAL
	// (HoldTruncation), so no truncation moves the floor under it; written
	// around TruncateBefore and TruncateAfter. onRewind, when set, hears of
	// a rollback.
	trunc    sync.RWMutex
	onRewind func()

	version atomic.Int32 // highest protocol version the agent has spoken (persisted)
	infoMu  sync.Mutex   // serialises writes of agent.json
}

// Point selects what a restore starts from.
type Point struct {
	CheckpointID string // an operator's choice; "" = the newest good checkpoint
	NoWAL        bool   // the checkpoint alone (operator's --no-wal)
	// olderThan: the newest good checkpoint older than this id (the crash-loop
	// fallback); ignored when checkpointID is set.
	OlderThan string
}

// Plan is an assembled restore, ready to send.
type Plan struct {
	Frame        []byte // the encoded restore: one that cannot be encoded never starts an agent
	CheckpointID string
	Created      time.Time
	Watermark    uint64
	Entries      int
	LastSequence uint64
	Compressed   bool
	Skipped      []checkpoint.Skipped
}

// Options configure the stores; they are fixed at Open.
type Options struct {
	Dir   string // the data directory: wal/, checkpoints/, agent.json
	Codec *schema.Codec
	Log   *slog.Logger

	CheckpointRetain int // checkpoints kept (checkpoint.Options.Retain)
	CheckpointLevel  int // zstd level of stored checkpoints; 0: the store's default
	// MaxFrameSize bounds a restore with the codec's restore limit.
	MaxFrameSize int

	WALSegmentSize  int64
	WALSync         wal.SyncPolicy
	WALSyncInterval time.Duration
	OnSync          func(d time.Duration, entries, bytes int) // each WAL fsync, for metrics
	// OnRewind hears of an operator's rollback (Rewind): the replica's
	// history is no longer ours. May be nil.
	OnRewind func()
}

// Open opens the checkpoint store, then the WAL (told the newest
// checkpoint's watermark, so damage below it costs nothing), and the
// restorability accounting.
func Open(o Options) (*Stores, error) {
	dir, log, codec := o.Dir, o.Log, o.Codec
	opts := checkpoint.Options{Retain: o.CheckpointRetain, Logger: log.With("component", "checkpoint")}
	if o.CheckpointLevel > 0 {
		opts.Level = zstdLevel(o.CheckpointLevel)
	}
	ck, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), opts)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint store: %w", err)
	}
	st := &Stores{dir: dir, ckpt: ck, codec: codec, log: log, onRewind: o.OnRewind,
		restoreLimit: int64(min(o.MaxFrameSize, codec.Limits().Restore))}
	var covered uint64
	if m, ok := st.NewestGood(); ok {
		covered = m.Watermark
		st.newest.Store(&m)
	}
	w, err := wal.Open(wal.Options{
		Dir: filepath.Join(dir, "wal"), SegmentSize: o.WALSegmentSize, Sync: o.WALSync,
		SyncInterval: o.WALSyncInterval, Logger: log.With("component", "wal"),
		OnSync: o.OnSync, CoveredThrough: covered,
	})
	if err != nil {
		return nil, fmt.Errorf("open WAL in %s: %w", filepath.Join(dir, "wal"), err)
	}
	st.wal = w
	st.loadInfo()
	if m := st.newest.Load(); m != nil {
		st.snapCost.Store(st.snapshotCost(*m))
	}
	var tail int64
	err = w.ReadAfter(covered, func(e wal.Entry) error { tail += int64(len(e.Data)); return nil })
	if err != nil && !errors.Is(err, wal.ErrCorrupt) {
		w.Close()
		return nil, fmt.Errorf("read the WAL after sequence %d: %w", covered, err)
	}
	st.appended.Store(tail)
	return st, nil
}

// Close closes the WAL (syncing what it holds).
func (st *Stores) Close() error { return st.wal.Close() }

// WAL is the primary's log.
func (st *Stores) WAL() *wal.Log { return st.wal }

// Checkpoints is the primary's checkpoint store.
func (st *Stores) Checkpoints() *checkpoint.Store { return st.ckpt }

// Codec is the codec restores are encoded with.
func (st *Stores) Codec() *schema.Codec { return st.codec }

// HoldTruncation keeps the WAL's floor where it is until release is called:
// the replicator holds it while it reads the WAL. Truncation (retention,
// a rollback) waits meanwhile.
func (st *Stores) HoldTruncation() (release func()) {
	st.trunc.RLock()
	return st.trunc.RUnlock
}

// newestID is the id of the newest good checkpoint ("" = none).
func (st *Stores) NewestID() string {
	if m := st.newest.Load(); m != nil {
		return m.ID
	}
	return ""
}

// newestGood is the newest checkpoint not marked bad whose header reads,
// by the store's order (its body is verified when a restore loads it).
func (st *Stores) NewestGood() (checkpoint.Meta, bool) {
	metas, err := st.ckpt.List()
	if err != nil {
		st.log.Warn("cannot list checkpoints", "err", err)
		return checkpoint.Meta{}, false
	}
	for _, m := range metas {
		if !m.Bad {
			return m, true
		}
	}
	return checkpoint.Meta{}, false
}

// snapshotCost is the bytes a checkpoint's snapshot takes in a restore: its
// size, or for a v2 agent (compressed restores) about its stored size.
func (st *Stores) snapshotCost(m checkpoint.Meta) int64 {
	if st.version.Load() >= 2 {
		return min(m.Size, m.StoredSize+m.StoredSize/8+64<<10)
	}
	return m.Size
}

// append appends entries as one unit (wal.Log.Append's contract), refusing
// with ErrRestoreFull entries that would make the restore from the newest
// checkpoint larger than restoreLimit.
func (st *Stores) Append(entries []wal.Entry) (wal.AppendResult, error) {
	last := st.wal.LastSequence()
	var add int64
	for _, e := range entries {
		if e.Sequence > last {
			add += int64(len(e.Data))
		}
	}
	if add > 0 {
		size := restoreOverhead + st.snapCost.Load() + st.appended.Load() - st.base.Load() + add
		if size > st.restoreLimit {
			return wal.AppendResult{Last: last}, fmt.Errorf("%w: a restore would take %d bytes, over the %d-byte limit; "+
				"send a checkpoint first (it empties the tail), then send these entries again", ErrRestoreFull, size, st.restoreLimit)
		}
	}
	res, err := st.wal.Append(entries...)
	if err != nil {
		return res, err
	}
	// The primary's frame reader is the only appender, so the log's last
	// sequence did not move since it was read: Append appended exactly the
	// entries above it (the rest were verified replays), add bytes of them.
	st.appended.Add(add)
	return res, nil
}

// checkpointArrived is called by the frame reader when a checkpoint frame
// arrives, in frame order with the appends: everything appended before it is
// in the log, so the WAL's last sequence is its watermark, and appended is
// where its tail accounting restarts.
func (st *Stores) CheckpointArrived() (watermark uint64, at int64) {
	return st.wal.LastSequence(), st.appended.Load()
}

// saveCheckpoint Stores a checkpoint (its WAL entries are already durable),
// applies retention to the checkpoints and then the WAL, and moves the
// restorability accounting to it. at is checkpointArrived's value. A
// compressed checkpoint (zdata, the agent's zstd frame) is validated and
// stored as one stream: its decompressed body (up to 100 MiB) is never held.
// invalid is the payload error that aborted such a save (reply
// INVALID_MESSAGE; nothing was stored); err a storage failure.
func (st *Stores) SaveCheckpoint(data, zdata []byte, watermark uint64, at int64) (meta checkpoint.Meta, pruned []string, segs int, invalid, err error) {
	meta, invalid, err = SaveCheckpointTo(st.ckpt, st.codec, data, zdata, watermark)
	if invalid != nil || err != nil {
		return meta, nil, 0, invalid, err
	}
	if pruned, err = st.ckpt.Prune(); err != nil {
		st.log.Warn("checkpoint retention failed; old checkpoints kept", "err", err)
	}
	// The WAL keeps every entry above the oldest checkpoint a restore could
	// still use (retained and not marked bad; see the invariant above).
	if wm, ok := st.ckpt.OldestRetainedWatermark(); ok {
		st.trunc.Lock()
		n, terr := st.wal.TruncateBefore(min(wm, watermark))
		st.trunc.Unlock()
		if terr != nil {
			st.log.Warn("WAL truncation failed; old segments kept", "err", terr)
		}
		segs = n
	}
	if at > st.base.Load() {
		st.base.Store(at)
	}
	m := meta
	st.newest.Store(&m)
	st.snapCost.Store(st.snapshotCost(meta))
	return meta, pruned, segs, nil, nil
}

// SaveCheckpointTo writes one checkpoint into store: data as it is, or the
// agent's zstd frame zdata validated and stored as one stream (its
// decompressed body, up to 100 MiB, is never held). invalid is the payload
// error that aborted such a save (nothing was stored); err a storage failure.
// The primary's Stores and a trial's scratch store share it.
func SaveCheckpointTo(store *checkpoint.Store, codec *schema.Codec, data, zdata []byte, watermark uint64) (meta checkpoint.Meta, invalid, err error) {
	if zdata == nil {
		meta, err = store.Save(data, watermark)
		return meta, nil, err
	}
	// The stored frame declares the data's size, so that a restore can send
	// it as it is: the agent's frame declares it (CheckpointData holds it to
	// that), or a first validating pass counts it.
	size := int64(-1)
	if zh := (zstd.Header{}); zh.Decode(zdata) == nil && zh.HasFCS {
		size = int64(zh.FrameContentSize)
	} else if _, n, verr := codec.CheckpointData(zdata, io.Discard); verr != nil {
		return meta, verr, nil
	} else {
		size = n
	}
	meta, err = store.SaveStreamSized(watermark, size, func(w io.Writer) error {
		_, _, err := codec.CheckpointData(zdata, w)
		if errors.Is(err, schema.ErrInvalidMessage) {
			invalid = err
		}
		return err
	})
	if invalid != nil {
		return checkpoint.Meta{}, invalid, nil
	}
	return meta, nil, err
}

// noteVersion records that the agent spoke protocol version v, persisting a
// rise so the next supervisor run knows it too.
func (st *Stores) NoteVersion(v int32) {
	for {
		cur := st.version.Load()
		if v <= cur {
			return
		}
		if st.version.CompareAndSwap(cur, v) {
			break
		}
	}
	if m := st.newest.Load(); m != nil {
		st.snapCost.Store(st.snapshotCost(*m))
	}
	st.infoMu.Lock()
	defer st.infoMu.Unlock()
	b, _ := json.Marshal(agentInfo{ProtocolVersion: st.version.Load()})
	_, _ = atomicfile.Sweep(st.dir, agentFile) // what a crash mid-write left
	if err := atomicfile.WriteFile(st.dir, agentFile, b); err != nil {
		st.log.Warn("cannot record the agent's protocol version; the first restore after a supervisor restart will not be compressed", "err", err)
	}
}

func (st *Stores) loadInfo() {
	b, err := os.ReadFile(filepath.Join(st.dir, agentFile))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			st.log.Warn("cannot read "+agentFile+"; assuming protocol version 1", "err", err)
		}
		return
	}
	var info agentInfo
	if err := json.Unmarshal(b, &info); err != nil || info.ProtocolVersion < 0 || info.ProtocolVersion > 2 {
		st.log.Warn(agentFile+" is damaged; assuming protocol version 1", "err", err)
		return
	}
	st.version.Store(info.ProtocolVersion)
}

// unrestorable wraps ErrUnrestorable with what is missing and what to do.
func (st *Stores) unrestorable(format string, args ...any) error {
	return fmt.Errorf("%w: %s. The agent is not started without its state. Inspect with `supervisor checkpoints list --data-dir %s` "+
		"and `supervisor wal dump --data-dir %s`; restore the data directory from a backup, or choose a checkpoint to roll back to "+
		"with `supervisor restore --data-dir %s --checkpoint ID --no-wal` (that discards the WAL entries after it)",
		ErrUnrestorable, fmt.Sprintf(format, args...), st.dir, st.dir, st.dir)
}

// buildRestore assembles a restore from point plus the WAL after its
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
	load, latest, previous := st.ckpt.Load, st.ckpt.Latest, st.ckpt.Previous
	if v2 {
		load, latest, previous = st.ckpt.LoadCompressed, st.ckpt.LatestCompressed, st.ckpt.PreviousCompressed
	}
	var zdata []byte
	switch {
	case point.CheckpointID != "":
		meta, data, err = load(point.CheckpointID)
		if errors.Is(err, checkpoint.ErrNoContentSize) {
			v2 = false
			meta, data, err = st.ckpt.Load(point.CheckpointID)
		}
		if err != nil {
			return nil, fmt.Errorf("load checkpoint %s: %w", point.CheckpointID, err)
		}
	default:
		if point.OlderThan != "" {
			meta, data, plan.Skipped, err = previous(point.OlderThan)
			if errors.Is(err, checkpoint.ErrNoContentSize) {
				v2 = false
				meta, data, plan.Skipped, err = st.ckpt.Previous(point.OlderThan)
			}
		} else {
			meta, data, plan.Skipped, err = latest()
			if errors.Is(err, checkpoint.ErrNoContentSize) {
				v2 = false
				meta, data, plan.Skipped, err = st.ckpt.Latest()
			}
		}
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
	plan.Compressed = zdata != nil || (st.version.Load() >= 2 && len(data) > schema.CompressThreshold)
	hint := len(data) + len(zdata) + restoreOverhead
	if !point.NoWAL {
		hint += int(min(st.appended.Load()-st.base.Load(), st.restoreLimit))
	}
	rb, err := st.codec.NewRestore(schema.Header{}, meta.ID, data, zdata, plan.Compressed, lastSeq, hint)
	if err != nil {
		return nil, st.unrestorable("checkpoint %s cannot be sent: %v", meta.ID, err)
	}
	if int64(rb.Len()) > st.restoreLimit {
		return nil, st.unrestorable("checkpoint %s alone makes a restore of %d bytes, over the %d-byte limit (--max-frame-size)", meta.ID, rb.Len(), st.restoreLimit)
	}
	if !point.NoWAL {
		err := st.wal.ReadAfter(meta.Watermark, func(e wal.Entry) error {
			if int64(rb.Len()+len(e.Data)) > st.restoreLimit {
				return fmt.Errorf("%w: checkpoint %q plus the WAL after it is more than %d bytes (--max-frame-size); at sequence %d",
					ErrRestoreFull, meta.ID, st.restoreLimit, e.Sequence)
			}
			return rb.Add(e.Data)
		})
		switch {
		case errors.Is(err, wal.ErrCorrupt), errors.Is(err, ErrRestoreFull):
			return nil, st.unrestorable("%v", err)
		case err != nil:
			var ve *schema.ValidationError
			if errors.As(err, &ve) {
				return nil, st.unrestorable("a WAL entry after checkpoint %q cannot be sent: %v", meta.ID, err)
			}
			return nil, fmt.Errorf("read WAL after sequence %d: %w", meta.Watermark, err)
		}
	}
	if meta.ID == "" && rb.Entries() == 0 {
		return nil, nil
	}
	plan.Entries = rb.Entries()
	plan.LastSequence = lastSeq
	plan.Frame = rb.Frame()
	return plan, nil
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
	st.appended.Store(0)
	st.base.Store(0)
	return abandoned, removed, prevLast, nil
}

func zstdLevel(n int) zstd.EncoderLevel {
	return zstd.EncoderLevelFromZstd(n)
}
