package replica

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/atomicfile"
	"github.com/agent-sidecar/supervisor/wal"
)

// Result says what a restore wrote.
type Result struct {
	Generation   string `json:"generation"`
	CheckpointID string `json:"checkpoint_id,omitempty"`
	Watermark    uint64 `json:"watermark"`
	Entries      int    `json:"wal_entries"`
	LastSequence uint64 `json:"last_sequence"`
	Bytes        int64  `json:"bytes_downloaded"`
	// Skipped lists checkpoints found corrupt and passed over (the restore
	// then came from an older one reaching as far).
	Skipped []string `json:"skipped,omitempty"`
	// SkippedGenerations: newer generations that hold nothing restorable,
	// passed over for this one (each also logged).
	SkippedGenerations []SkippedGeneration `json:"skipped_generations,omitempty"`
	// RequestsJournalBytes: the request journal restored into
	// DATA_DIR/requests/journal (0: the generation held none).
	RequestsJournalBytes int64 `json:"requests_journal_bytes"`
	// RequestsJournalError: the generation's request journal was found
	// damaged in the bucket and not restored (the rest was); its pending
	// requests are not delivered on this node.
	RequestsJournalError string `json:"requests_journal_error,omitempty"`
	// RequestsJournalIncomplete: a delta of the request journal was missing
	// or damaged; the journal was restored up to it (an earlier state of
	// the journal: RequestsJournalBytes), and this says what was left out.
	RequestsJournalIncomplete string `json:"requests_journal_incomplete,omitempty"`
	// RequestsJournalOnly: the replica held no agent state (no generation
	// holds a checkpoint or WAL: a stateless agent), only the request
	// journal, which was restored alone.
	RequestsJournalOnly bool `json:"requests_journal_only,omitempty"`
}

// stagingDir is where a restore is assembled inside the data directory
// before it is moved into place; one left by a crash is removed.
const stagingDir = ".replica-restore"

// IsEmptyDataDir reports whether dir holds nothing a supervisor wrote: it
// does not exist, or holds at most the LOCK file, a restore's staging
// directory left by a crash, and lost+found (a fresh ext4 volume mounted as
// the data directory has one).
func IsEmptyDataDir(dir string) (bool, error) {
	es, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	for _, e := range es {
		if e.Name() != "LOCK" && e.Name() != stagingDir && e.Name() != "lost+found" {
			return false, nil
		}
	}
	return true, nil
}

// Restore rebuilds dataDir (empty: see IsEmptyDataDir) from the replica: t
// selects the generation and the point. The checkpoint is verified (its
// SHA-256, then the checkpoint store's own checksum) and a corrupt one is
// passed over for an older one only when that reaches as far; a corrupt
// WAL chunk the restore needs fails it (ErrCorrupt naming the object) —
// never a restore with a gap. The data directory is assembled in a staging
// directory and moved into place, the WAL before the checkpoint: a crash
// part-way leaves a directory the supervisor refuses to start from, not a
// partial state.
func (c *Client) Restore(ctx context.Context, dataDir string, t Target, log *slog.Logger) (Result, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ok, err := IsEmptyDataDir(dataDir); err != nil {
		return Result{}, fmt.Errorf("replica restore: read %s: %w", dataDir, err)
	} else if !ok {
		return Result{}, fmt.Errorf("replica restore: %s is not empty; restore into a new directory (a restore never overwrites a data directory)", dataDir)
	}
	inv, err := c.List(ctx)
	if err != nil {
		return Result{}, err
	}
	plan, err := inv.Plan(t)
	for _, s := range plan.Skipped {
		if s.Parent != "" {
			log.Warn("replica: a generation is behind the restore it began from; its parent's history is restored up to that point, with its own request journal and files",
				"generation", s.ID, "parent", s.Parent, "reason", s.Reason)
			continue
		}
		log.Warn("replica: a generation holds nothing a restore can use; passed over for an older one",
			"generation", s.ID, "reason", s.Reason)
	}
	if err != nil {
		return Result{}, err
	}
	var g *Generation
	for _, x := range inv.Generations {
		if x.ID == plan.Generation {
			g = x
		}
	}
	if g.ForkAt != nil {
		log.Warn("the replica's generation was written by two supervisors (a copied data directory); only its history up to the fork is used",
			"generation", g.ID, "fork_after_sequence", *g.ForkAt, "objects", g.ForkObjects)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return Result{}, fmt.Errorf("replica restore: create %s: %w", dataDir, err)
	}
	stage := filepath.Join(dataDir, stagingDir)
	if err := os.RemoveAll(stage); err != nil {
		return Result{}, fmt.Errorf("replica restore: remove the staging directory left by an earlier attempt: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(stage, "checkpoints"), 0o700); err != nil {
		return Result{}, fmt.Errorf("replica restore: %w", err)
	}
	defer os.RemoveAll(stage)
	res := Result{Generation: g.ID, SkippedGenerations: plan.Skipped, RequestsJournalOnly: plan.JournalOnly}
	var moves []string
	if !plan.JournalOnly {
		if err := c.restoreState(ctx, g, plan.Target, plan, stage, &res, log); err != nil {
			return res, err
		}
		moves = []string{"wal", "checkpoints"}
	}
	for _, f := range plan.Files {
		if f.Name == JournalFile {
			ok, err := c.restoreJournal(ctx, f, plan.JournalDeltas, stage, &res, log)
			if err != nil {
				return res, err
			}
			if ok {
				moves = append(moves, filepath.Dir(JournalPath))
			}
			continue
		}
		moves = append(moves, f.Name)
		b, err := c.get(ctx, f, fileLimit(f.Name))
		res.Bytes += int64(len(b))
		if err != nil {
			return res, err
		}
		if err := atomicfile.WriteFile(stage, f.Name, b); err != nil {
			return res, fmt.Errorf("replica restore: write %s: %w", f.Name, err)
		}
	}
	// The generation the supervisor starts next records where its history
	// came from (GenerationInfo.Parent).
	sb, _ := json.Marshal(localState{Replica: c.loc.String(),
		Parent: &Position{Generation: g.ID, Sequence: res.LastSequence, CheckpointID: res.CheckpointID}})
	if err := atomicfile.WriteFile(stage, stateFile, sb); err != nil {
		return res, fmt.Errorf("replica restore: write %s: %w", stateFile, err)
	}
	// Into place: the WAL (whose floor is the watermark) before the
	// checkpoint that covers it, the small files last.
	for _, name := range append(moves, stateFile) {
		if err := os.Rename(filepath.Join(stage, name), filepath.Join(dataDir, name)); err != nil {
			return res, fmt.Errorf("replica restore: move %s into %s: %w", name, dataDir, err)
		}
		if err := atomicfile.SyncDir(dataDir); err != nil {
			return res, err
		}
	}
	return res, nil
}

// restoreState writes the checkpoint and the WAL of plan into stage.
func (c *Client) restoreState(ctx context.Context, g *Generation, t Target, plan Plan, stage string, res *Result, log *slog.Logger) error {
	want := plan.Last
	exclude := map[string]bool{}
	for plan.Checkpoint != nil {
		n, err := c.fetchCheckpoint(ctx, *plan.Checkpoint, filepath.Join(stage, "checkpoints"))
		res.Bytes += n
		if err == nil {
			break
		}
		if !errors.Is(err, ErrCorrupt) {
			return err
		}
		log.Error("checkpoint in the replica is corrupt; it is not used", "object", plan.Checkpoint.Key, "err", err)
		res.Skipped = append(res.Skipped, plan.Checkpoint.ID)
		exclude[plan.Checkpoint.Key] = true
		corrupt := err
		if plan, err = g.plan(t, exclude); err != nil || plan.Last < want {
			return fmt.Errorf("%w; no other checkpoint of generation %s reaches sequence %d without a gap "+
				"(restore an earlier point with --to-sequence, or another generation with --generation)", corrupt, g.ID, want)
		}
	}
	after := uint64(0)
	if cp := plan.Checkpoint; cp != nil {
		after, res.CheckpointID, res.Watermark = cp.Watermark, cp.ID, cp.Watermark
	}
	w, err := wal.Open(wal.Options{Dir: filepath.Join(stage, "wal"), Sync: wal.SyncNone, NoPreallocate: true, StartAfter: after})
	if err != nil {
		return fmt.Errorf("replica restore: create the WAL: %w", err)
	}
	last := after
	for _, ch := range plan.Chunks {
		b, err := c.get(ctx, ch, maxChunkRaw)
		res.Bytes += int64(len(b))
		if err != nil {
			w.Close()
			return err
		}
		err = decodeChunk(ch, b, func(e wal.Entry) error {
			if e.Sequence <= last || e.Sequence > plan.Last {
				return nil
			}
			if _, err := w.Append(e); err != nil {
				return fmt.Errorf("replica restore: append sequence %d: %w", e.Sequence, err)
			}
			last = e.Sequence
			res.Entries++
			return nil
		})
		if err != nil {
			w.Close()
			return err
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("replica restore: write the WAL: %w", err)
	}
	res.LastSequence = max(last, after)
	if res.CheckpointID == "" && res.Entries == 0 {
		return fmt.Errorf("%w: generation %s: the restore would hold no checkpoint and no WAL entry; nothing restored", ErrNoTarget, g.ID)
	}
	return nil
}

// restoreJournal downloads the request journal — its base f, then the
// deltas after it in order — into the staging directory. A base damaged in
// the bucket (its SHA-256 does not match its name) is refused loudly —
// logged, and said in the result — and the rest of the restore goes on: a
// corrupt object must not keep the agent from starting again and again.
// The deltas are followed from the base's end, each starting where the
// previous ended (of two starting at one offset — a merge whose replaced
// deltas were not deleted yet — the longer is used): a delta missing (a gap
// in the offsets) or damaged ends the chain there, and the journal is
// restored up to it — an earlier state of the journal, never one with a
// hole — logged as an error and said in Result.RequestsJournalIncomplete.
// (Deltas missing at the end leave no gap: that is indistinguishable from
// changes not uploaded yet, and the journal ends at the last one present.)
// Any other failure (the store) fails the restore.
func (c *Client) restoreJournal(ctx context.Context, f object, deltas []object, stage string, res *Result, log *slog.Logger) (bool, error) {
	b, err := c.get(ctx, f, journalLimit)
	res.Bytes += int64(len(b))
	if errors.Is(err, ErrCorrupt) {
		res.RequestsJournalError = err.Error()
		log.Error("replica: the request journal in the replica is damaged and is not restored; the requests it held are not delivered on this node (the rest of the data directory is restored)",
			"object", f.Key, "err", err)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var broken error
	end := int64(len(b))
	for i := 0; i < len(deltas); {
		d := deltas[i]
		if d.From < end {
			i++ // covered already (a delta a merge replaced)
			continue
		}
		if d.From > end {
			broken = fmt.Errorf("the delta holding bytes %d to %d is missing (the next one, %s, starts at %d)", end, d.From, d.Key, d.From)
			break
		}
		// Deltas from end, the longest first: the first intact one.
		var db []byte
		var derr error
		for ; i < len(deltas) && deltas[i].From == end; i++ {
			if len(db) > 0 {
				continue
			}
			db, derr = c.get(ctx, deltas[i], journalLimit)
			res.Bytes += int64(len(db))
			if derr == nil && int64(len(db)) != deltas[i].To-deltas[i].From {
				derr = fmt.Errorf("%w: %s holds %d bytes, its name says %d", ErrCorrupt, deltas[i].Key, len(db), deltas[i].To-deltas[i].From)
			}
			if derr != nil {
				if !errors.Is(derr, ErrCorrupt) {
					return false, derr
				}
				db = nil
			}
		}
		if len(db) == 0 {
			broken = derr
			break
		}
		b = append(b, db...)
		end += int64(len(db))
	}
	if broken != nil {
		total := end
		for _, d := range deltas {
			total = max(total, d.To)
		}
		res.RequestsJournalIncomplete = fmt.Sprintf("restored up to byte %d of %d: %v", end, total, broken)
		log.Error("replica: the request journal in the replica is incomplete (a delta is missing or damaged); it is restored up to the delta, an earlier state of the journal: "+
			"requests accepted, answered or cancelled after that point are not known on this node",
			"base", f.Key, "restored_bytes", end, "uploaded_bytes", total, "err", broken)
	}
	dir := filepath.Join(stage, filepath.Dir(JournalPath))
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("replica restore: create %s: %w", dir, err)
	}
	if err := atomicfile.WriteFile(dir, filepath.Base(JournalPath), b); err != nil {
		return false, fmt.Errorf("replica restore: write the request journal: %w", err)
	}
	res.RequestsJournalBytes = int64(len(b))
	return true, nil
}

// fetchCheckpoint downloads checkpoint o into dir as ID.ckpt, checking its
// SHA-256 as it streams, then loads it through the checkpoint store, which
// verifies its own checksum. A mismatch is ErrCorrupt and leaves nothing.
func (c *Client) fetchCheckpoint(ctx context.Context, o object, dir string) (int64, error) {
	r, err := c.mc.GetObject(ctx, c.loc.Bucket, c.loc.key(o.Key), minio.GetObjectOptions{})
	if err != nil {
		return 0, c.wrap("download", o.Key, err)
	}
	defer r.Close()
	// Into place only once its SHA-256 matches its name (atomicfile: a
	// failed or short download leaves nothing behind).
	path := filepath.Join(dir, o.ID+".ckpt")
	var n int64
	_, err = atomicfile.Write(dir, o.ID+".ckpt", func(f *os.File) error {
		h := sha256.New()
		var err error
		n, err = io.Copy(io.MultiWriter(f, h), io.LimitReader(r, o.Size+1))
		if err != nil {
			return c.wrap("download", o.Key, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != o.SHA || n != o.Size {
			return fmt.Errorf("%w: %s: SHA-256 is %s… (%d bytes), its name says %s…; the object was changed or damaged in the bucket and is not used",
				ErrCorrupt, o.Key, got[:16], n, o.SHA[:16])
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("replica restore: %w", err)
	}
	st, err := checkpoint.Open(dir, checkpoint.Options{})
	if err != nil {
		return n, fmt.Errorf("replica restore: open the checkpoint store: %w", err)
	}
	m, _, err := st.LoadCompressed(o.ID)
	if errors.Is(err, checkpoint.ErrNoContentSize) {
		m, _, err = st.Load(o.ID)
	}
	if err == nil && m.Watermark != o.Watermark {
		err = fmt.Errorf("its header says watermark %d, its name %d", m.Watermark, o.Watermark)
	}
	if err != nil {
		os.Remove(path)
		return n, fmt.Errorf("%w: %s: %v", ErrCorrupt, o.Key, err)
	}
	return n, nil
}

// RestoreTimeout bounds a restore at a supervisor's start (a 100 MiB state
// takes seconds).
const RestoreTimeout = 10 * time.Minute
