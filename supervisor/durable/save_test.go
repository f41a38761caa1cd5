package durable

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
)

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
			good, _, _, invalid, err := st.SaveCheckpoint(bigData(t, 1000), nil, 5, 0)
			if invalid != nil || err != nil {
				t.Fatal(invalid, err)
			}
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
			plan, err := st.BuildRestore(Point{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := restoreThrough(t, plan)
			if err != nil {
				t.Fatal(err)
			}
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
		m, _, _, invalid, err := st.SaveCheckpoint(bigData(t, 1000), nil, uint64(wm), 0)
		if invalid != nil || err != nil {
			t.Fatal(invalid, err)
		}
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
