package durable

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
)

// restored builds the restore for point and reads it as the agent would.
func restored(t *testing.T, st *Stores, point Point) (*Plan, *schema.Restore) {
	t.Helper()
	plan, err := st.BuildRestore(point)
	if err != nil {
		t.Fatal(err)
	}
	r, err := restoreThrough(t, plan)
	if err != nil {
		t.Fatal(err)
	}
	return plan, r
}

// saveCheckpoint stores a checkpoint of about size bytes at watermark.
func saveCheckpoint(t *testing.T, st *Stores, size int, watermark uint64) checkpoint.Meta {
	t.Helper()
	m, _, _, invalid, err := st.SaveCheckpoint(bigData(t, size), nil, watermark, 0)
	if invalid != nil || err != nil {
		t.Fatal(invalid, err)
	}
	return m
}

// listIDs is the store's checkpoint ids, newest first.
func listIDs(t *testing.T, st *Stores) []checkpoint.Meta {
	t.Helper()
	metas, err := st.ckpt.List()
	if err != nil {
		t.Fatal(err)
	}
	return metas
}

// A compressed checkpoint whose body is not a checkpoint (here a MessagePack
// array, not a map) is an invalid message: SaveCheckpoint says so, stores
// nothing, and leaves the restore where it was — the older checkpoint and
// every entry after it. Both ways of finding out are covered: a zstd frame
// that declares its size (checked as it is stored) and one that does not (a
// first validating pass).
func TestSaveCheckpointInvalidCompressedStoresNothing(t *testing.T) {
	// An array of 2^21 ones: more than the stream encoder buffers, so its
	// frame cannot declare the size.
	notAMap := append([]byte{0xdd, 0x00, 0x20, 0x00, 0x00}, bytes.Repeat([]byte{0x01}, 1<<21)...)
	sized, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	withSize := sized.EncodeAll(notAMap, nil)
	var unsized bytes.Buffer
	zw, err := zstd.NewWriter(&unsized, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(notAMap); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		zdata []byte
		fcs   bool
	}{{"size-declared", withSize, true}, {"size-undeclared", unsized.Bytes(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			var h zstd.Header
			if err := h.Decode(tc.zdata); err != nil || h.HasFCS != tc.fcs {
				t.Fatalf("test frame: header %v, declares its size %v, want %v", err, h.HasFCS, tc.fcs)
			}
			st := openStores(t)
			appendEntries(t, st, 1, 5, 100)
			good := saveCheckpoint(t, st, 1000, 5)
			appendEntries(t, st, 6, 5, 100)
			meta, _, _, invalid, err := st.SaveCheckpoint(nil, tc.zdata, 10, 0)
			if err != nil {
				t.Fatalf("an invalid checkpoint is not a storage failure: %v", err)
			}
			if !errors.Is(invalid, schema.ErrInvalidMessage) {
				t.Fatalf("invalid = %v, want an ErrInvalidMessage (the agent is answered INVALID_MESSAGE)", invalid)
			}
			if meta.ID != "" {
				t.Fatalf("meta %+v returned for a checkpoint that was not stored", meta)
			}
			if got := listIDs(t, st); len(got) != 1 || got[0].ID != good.ID {
				t.Fatalf("checkpoints after the invalid one: %+v, want only %s", got, good.ID)
			}
			_, r := restored(t, st, Point{})
			if r.CheckpointID != good.ID || len(r.WALEntries) != 5 || r.LastSequence != 10 {
				t.Fatalf("restore from %q with %d entries to %d, want %s with entries 6..10", r.CheckpointID, len(r.WALEntries), r.LastSequence, good.ID)
			}
		})
	}
}

// A --no-wal restore marks the checkpoints newer than its target bad, as
// abandoned; one already marked bad keeps its own reason (why it is bad —
// damage, a crash after its restore — is what an operator needs) and is
// not reported as abandoned again.
func TestRewindKeepsAnEarlierBadMark(t *testing.T) {
	st := openStores(t)
	var ids []checkpoint.Meta
	for i, wm := range []int{5, 10, 15} {
		appendEntries(t, st, 1+5*i, 5, 100)
		m := saveCheckpoint(t, st, 1000, uint64(wm))
		ids = append(ids, m)
	}
	const reason = "damaged: found by the test"
	if err := st.ckpt.MarkBad(ids[2].ID, reason); err != nil {
		t.Fatal(err)
	}
	abandoned, removed, prevLast, err := st.Rewind(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(abandoned, []string{ids[1].ID}) || removed != 10 || prevLast != 15 {
		t.Fatalf("Rewind: abandoned %v, %d removed, previous last %d; want [%s], 10, 15", abandoned, removed, prevLast, ids[1].ID)
	}
	for _, m := range listIDs(t, st) {
		switch m.ID {
		case ids[2].ID:
			if !m.Bad || m.BadReason != reason {
				t.Errorf("the checkpoint marked bad before the rewind: bad %v, reason %q; want %q kept", m.Bad, m.BadReason, reason)
			}
		case ids[1].ID:
			if !m.Bad {
				t.Errorf("the checkpoint the rewind abandoned is not marked bad")
			}
		case ids[0].ID:
			if m.Bad {
				t.Errorf("the rewind's target is marked bad: %q", m.BadReason)
			}
		}
	}
}

// A checkpoint too large to hold is chosen for a restore by its header
// alone (its data streamed later): one marked bad, or whose header does not
// read, is passed over all the same, for the older checkpoint and every
// entry after it.
func TestRestorePassesOverALargeCheckpointSetAside(t *testing.T) {
	for _, how := range []string{"marked bad", "header damaged"} {
		t.Run(how, func(t *testing.T) {
			st := openStores(t)
			appendEntries(t, st, 1, 5, 100)
			good := saveCheckpoint(t, st, 1000, 5)
			appendEntries(t, st, 6, 5, 100)
			big := saveCheckpoint(t, st, 4<<20, 10)
			appendEntries(t, st, 11, 5, 100)
			if plan, err := st.BuildRestore(Point{}); err != nil || plan.CheckpointID != big.ID || plan.Tail == nil || plan.Tail.snap == nil {
				t.Fatalf("before: %+v, %v; want %s, streamed", plan, err, big.ID)
			}
			if how == "marked bad" {
				if err := st.ckpt.MarkBad(big.ID, "set aside by the test"); err != nil {
					t.Fatal(err)
				}
			} else {
				path := filepath.Join(st.dir, "checkpoints", big.ID+".ckpt")
				f, err := os.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt([]byte{0xff}, 40); err != nil { // the watermark
					t.Fatal(err)
				}
				f.Close()
			}
			plan, r := restored(t, st, Point{})
			if r.CheckpointID != good.ID || len(r.WALEntries) != 10 || r.LastSequence != 15 {
				t.Fatalf("restore from %q with %d entries, want %s with entries 6..15", r.CheckpointID, len(r.WALEntries), good.ID)
			}
			if len(plan.Skipped) != 1 || plan.Skipped[0].ID != big.ID {
				t.Fatalf("skipped %+v, want %s", plan.Skipped, big.ID)
			}
		})
	}
}

// The crash-loop fallback (Point.OlderThan) restores from the newest good
// checkpoint older than the one that crash-looped, small or streamed, with
// every entry after it; a checkpoint the store does not hold is an error,
// never a restore from the newest.
func TestRestoreOlderThan(t *testing.T) {
	st := openStores(t)
	var metas []checkpoint.Meta
	for i, size := range []int{1000, 4 << 20, 1000} {
		appendEntries(t, st, 1+5*i, 5, 100)
		m := saveCheckpoint(t, st, size, uint64(5+5*i))
		metas = append(metas, m)
	}
	appendEntries(t, st, 16, 5, 100)
	for i, want := range []int{1, 0} { // older than the newest: the streamed one; older than that: the first
		_, r := restored(t, st, Point{OlderThan: metas[2-i].ID})
		if r.CheckpointID != metas[want].ID || r.LastSequence != 20 || len(r.WALEntries) != 20-int(metas[want].Watermark) {
			t.Fatalf("older than %s: restore from %q with %d entries to %d, want %s with the %d after it",
				metas[2-i].ID, r.CheckpointID, len(r.WALEntries), r.LastSequence, metas[want].ID, 20-metas[want].Watermark)
		}
	}
	gone := "01000000-0000-7000-8000-000000000000"
	if plan, err := st.BuildRestore(Point{OlderThan: gone}); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("older than a checkpoint the store does not hold: %+v, %v; want ErrNotFound", plan, err)
	}
}
