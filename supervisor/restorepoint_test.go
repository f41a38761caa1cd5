package supervisor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/wal"
)

// A restore point recorded while no supervisor ran (`supervisor restore
// --no-wal` on a stopped one) stays on disk until the first start has
// acted on it. Before, open took it off the disk at once: a supervisor
// that crashed before the rollback (the store worker busy, a slow disk)
// came back without it, and the operator's rollback silently never
// happened.
func TestRecordedRestorePointSurvivesACrashBeforeItIsApplied(t *testing.T) {
	cfg := testConfig(t)
	seedWAL(t, cfg, 5)
	st, err := durable.Open(durable.Options{Dir: cfg.DataDir, Codec: newCodec(cfg), Log: cfg.Logger, MaxFrameSize: cfg.MaxFrameSize,
		WALSegmentSize: cfg.WALSegmentSize, WALSync: wal.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := schema.MarshalMap(map[string]any{"k": 1})
	if err != nil {
		t.Fatal(err)
	}
	meta, err := st.Checkpoints().Save(snap, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Checkpoints().SetRestorePoint(meta.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(cfg.DataDir, "checkpoints", "restore-point.json")

	// The first run opens its stores and dies before its first start is
	// assembled (a kill -9 while the store worker is busy).
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.open(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the restore point is gone before it was applied: %v", err)
	}
	s.close()

	// The next run applies it: the agent's restore is the checkpoint alone,
	// and the point is cleared once the rollback is done.
	synctest.Test(t, func(t *testing.T) {
		first := make(chan schema.Message, 1)
		h := startLoop(t, cfg, firstThenHeartbeat(t, first))
		defer h.stop()
		h.next()
		r, ok := (<-first).(*schema.Restore)
		if !ok {
			t.Fatal("the first frame is not the restore")
		}
		if r.CheckpointID != meta.ID || len(r.WALEntries) != 0 || r.LastSequence != 3 {
			t.Fatalf("restore %s with %d entries up to %d; want %s alone, up to 3", r.CheckpointID, len(r.WALEntries), r.LastSequence, meta.ID)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if _, err := os.Stat(file); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the restore point is still recorded after it was applied: %v", err)
		}
		if got := h.s.st.WAL().LastSequence(); got != 3 {
			t.Fatalf("WAL ends at %d after the --no-wal restore, want 3", got)
		}
	})
}
