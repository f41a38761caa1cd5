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
// (Worker), one step at a time: a restore never sees a half-applied
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

	// tailSuspect: a streamed WAL entry failed its check (streamEntries):
	// the next restore reads and checks every entry before sending any.
	tailSuspect atomic.Bool
	// corrupt: checkpoints a streamed restore found damaged (noteCorrupt).
	corruptMu sync.Mutex
	corrupt   map[string]error

	version atomic.Int32 // highest protocol version the agent has spoken (persisted)
	infoMu  sync.Mutex   // serialises writes of agent.json
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
	// OnWALFailure hears, once per failure, that the WAL stopped after a
	// failed fsync or write (wal.FailedError): its owner must tell the
	// agent and restart it from the log once reopened (ReopenWAL). Called on
	// the WAL's syncer goroutine: it must not block. May be nil.
	OnWALFailure func(*wal.FailedError)
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
		OnSync: o.OnSync, CoveredThrough: covered, OnFailure: o.OnWALFailure,
	})
	if err != nil {
		return nil, fmt.Errorf("open WAL in %s: %w", filepath.Join(dir, "wal"), err)
	}
	st.wal = w
	st.loadInfo()
	if m := st.newest.Load(); m != nil {
		st.snapCost.Store(st.snapshotCost(*m))
	}
	// The bytes already above the newest checkpoint are appended's start,
	// counted from the WAL's counts, not read.
	tail, err := st.tailBytes(covered)
	if err != nil {
		w.Close()
		return nil, err
	}
	st.appended.Store(tail)
	return st, nil
}

// tailBytes is the bytes of the WAL entries above sequence after, from the
// log's counts (wal.CountAfter); where they no longer check out, those
// before the damage, read.
func (st *Stores) tailBytes(after uint64) (int64, error) {
	_, tail, _, err := st.wal.CountAfter(after)
	if errors.Is(err, wal.ErrCorrupt) {
		tail = 0
		err = st.wal.ReadAfter(after, func(e wal.Entry) error { tail += int64(len(e.Data)); return nil })
		if errors.Is(err, wal.ErrCorrupt) {
			err = nil
		}
	}
	if err != nil {
		return 0, fmt.Errorf("count the WAL entries after sequence %d: %w", after, err)
	}
	return tail, nil
}

// setAppended restarts the accounting at tail (ReopenWAL, Rewind).
func (st *Stores) setAppended(tail int64) { st.appended.Store(tail) }

// Close closes the WAL (syncing what it holds).
func (st *Stores) Close() error { return st.wal.Close() }

// ReopenWAL brings the WAL back after it stopped on a failed fsync or
// write (wal.Log.Reopen): it holds what the disk holds, every entry of the
// failed range absent. The restorability accounting restarts from the
// reopened tail, as at Open. Store worker only. It returns the log's last
// sequence.
func (st *Stores) ReopenWAL() (uint64, error) {
	last, err := st.wal.Reopen()
	if err != nil {
		return 0, fmt.Errorf("reopen the WAL after its failure: %w", err)
	}
	var covered uint64
	if m := st.newest.Load(); m != nil {
		covered = m.Watermark
	}
	tail, err := st.tailBytes(covered)
	if err != nil {
		return 0, err
	}
	st.setAppended(tail)
	st.base.Store(0)
	return last, nil
}

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
	pruned, segs = st.afterSave(meta, watermark, at)
	return meta, pruned, segs, nil, nil
}

// CommitCheckpoint stores a checkpoint staged as it arrived (Stage; its
// WAL entries are already durable) and does what SaveCheckpoint does after
// a save. Nothing is stored on an error.
func (st *Stores) CommitCheckpoint(staged *checkpoint.Staged, watermark uint64, at int64) (meta checkpoint.Meta, pruned []string, segs int, err error) {
	if meta, err = staged.Commit(watermark); err != nil {
		return meta, nil, 0, err
	}
	pruned, segs = st.afterSave(meta, watermark, at)
	return meta, pruned, segs, nil
}

// afterSave applies retention to the checkpoints and the WAL once meta is
// stored, and moves the restorability accounting to it.
func (st *Stores) afterSave(meta checkpoint.Meta, watermark uint64, at int64) (pruned []string, segs int) {
	var err error
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
	return pruned, segs
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

// zstdLevel is --checkpoint-level n: klauspost's encoder levels, 1
// SpeedFastest … 4 SpeedBestCompression (not zstd's numeric levels, which
// EncoderLevelFromZstd maps 1 and 2 to SpeedFastest and 3 and 4 to
// SpeedDefault).
func zstdLevel(n int) zstd.EncoderLevel {
	return zstd.EncoderLevel(n)
}
