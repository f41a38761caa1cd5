package durable

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/agent-sidecar/supervisor/wire"
)

// bigData is a checkpoint data map of about n bytes: text and float32-like
// random bytes, so that it compresses to several zstd blocks.
func bigData(t *testing.T, n int) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	emb := make([]byte, n/2)
	for i := range emb {
		emb[i] = byte(rng.Uint32())
	}
	text := bytes.Repeat([]byte("the agent remembers this sentence. "), n/2/35)
	raw, err := schema.MarshalMap(map[string]any{"agent_state": map[string]any{"status": "idle"}, "text": string(text), "emb": emb})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// restoreThrough writes plan's frame through a wire writer and reads it
// back as the agent would.
func restoreThrough(t *testing.T, plan *Plan) (*schema.Restore, error) {
	t.Helper()
	var buf bytes.Buffer
	w := wire.NewWriter(&buf, 0)
	var werr error
	if plan.Tail != nil {
		werr = w.WriteFrameStream(plan.Frame, plan.Tail.Size(), plan.Tail.Stream)
	} else {
		werr = w.WriteFrame(plan.Frame)
	}
	payload, err := wire.NewReader(&buf, 0).ReadFrame()
	if err != nil {
		return nil, errors.Join(werr, err)
	}
	if werr != nil {
		t.Fatalf("the writer failed (%v) but the reader got a whole frame", werr)
	}
	m, err := schema.Decode(schema.ToAgent, payload)
	if err != nil {
		t.Fatalf("decode restore: %v", err)
	}
	return m.(*schema.Restore), nil
}

// A large checkpoint's snapshot is streamed from the store into the frame,
// never held: the plan holds only the restore's first bytes, and what the
// agent reads is the stored data byte for byte, then every entry after it.
func TestRestoreSnapshotStreamed(t *testing.T) {
	st := openStores(t)
	appendEntries(t, st, 1, 10, 100)
	data := bigData(t, 4<<20)
	if _, _, _, invalid, err := st.SaveCheckpoint(data, nil, 10, 0); invalid != nil || err != nil {
		t.Fatal(invalid, err)
	}
	appendEntries(t, st, 11, 2000, 1000) // 2 MB: the entries are streamed too
	plan, err := st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Tail == nil || len(plan.Frame) > 1024 {
		t.Fatalf("head of %d bytes: want the snapshot streamed", len(plan.Frame))
	}
	r, err := restoreThrough(t, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Snapshot, data) || len(r.WALEntries) != 2000 || r.LastSequence != 2010 || r.CheckpointID != plan.CheckpointID {
		t.Fatalf("snapshot equal %v, %d entries, last %d", bytes.Equal(r.Snapshot, data), len(r.WALEntries), r.LastSequence)
	}
}

// A checkpoint damaged in the middle of its file is found out while it is
// streamed: the frame is cut short (the agent never reads a whole restore
// with wrong content), and the next restore passes over it to the older
// checkpoint, with every entry after that one.
func TestRestoreSnapshotDamagedMidStream(t *testing.T) {
	st := openStores(t)
	appendEntries(t, st, 1, 5, 100)
	small := bigData(t, 1000)
	if _, _, _, _, err := st.SaveCheckpoint(small, nil, 5, 0); err != nil {
		t.Fatal(err)
	}
	appendEntries(t, st, 6, 5, 100)
	meta, _, _, _, err := st.SaveCheckpoint(bigData(t, 8<<20), nil, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendEntries(t, st, 11, 5, 100)
	path := filepath.Join(st.dir, "checkpoints", meta.ID+".ckpt")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	junk := bytes.Repeat([]byte{0x5a}, 64)
	if _, err := f.WriteAt(junk, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	f.Close()

	plan, err := st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.CheckpointID != meta.ID || plan.Tail == nil {
		t.Fatalf("restore from %s: want the damaged %s, streamed (its damage is not known yet)", plan.CheckpointID, meta.ID)
	}
	if r, err := restoreThrough(t, plan); err == nil {
		t.Fatalf("a whole restore came through from a damaged checkpoint (snapshot %d bytes)", len(r.Snapshot))
	}
	plan, err = st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.CheckpointID == meta.ID || len(plan.Skipped) != 1 || !errors.Is(plan.Skipped[0].Err, checkpoint.ErrCorrupt) {
		t.Fatalf("second restore from %s, skipped %v: want the older checkpoint, the damaged one skipped", plan.CheckpointID, plan.Skipped)
	}
	r, err := restoreThrough(t, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Snapshot, small) || len(r.WALEntries) != 10 || r.LastSequence != 15 {
		t.Fatalf("fallback restore: snapshot equal %v, %d entries, last %d", bytes.Equal(r.Snapshot, small), len(r.WALEntries), r.LastSequence)
	}
}

// The restorability accounting survives a restart whether the first
// restore counts the tail (Open no longer reads it) or an append comes
// first: entries are refused with ErrRestoreFull at the same point.
func TestRestorabilityAccountingAfterReopen(t *testing.T) {
	for _, restoreFirst := range []bool{false, true} {
		dir := t.TempDir()
		open := func() *Stores {
			st, err := Open(Options{Dir: dir, Codec: schema.NewCodec(schema.Options{}), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				MaxFrameSize: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		st := open()
		appendEntries(t, st, 1, 40, 1000) // about 41 KB of the 64 KiB
		st.Close()
		st = open()
		if restoreFirst {
			if _, err := st.BuildRestore(Point{}); err != nil {
				t.Fatal(err)
			}
		}
		accepted := 0
		for i := 41; i < 100; i++ {
			raw, _ := schema.MarshalMap(map[string]any{"operation": "memory_add", "params": map[string]any{"pad": string(bytes.Repeat([]byte("p"), 1000))}, "sequence": i})
			if _, err := st.Append([]wal.Entry{{Sequence: uint64(i), Data: raw}}); errors.Is(err, ErrRestoreFull) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			accepted++
		}
		plan, err := st.BuildRestore(Point{})
		if err != nil {
			t.Fatalf("restore first %v: %d more entries accepted, then the restore cannot be built: %v", restoreFirst, accepted, err)
		}
		if accepted < 15 || accepted > 25 || plan.Entries != 40+accepted {
			t.Fatalf("restore first %v: %d more entries accepted after the restart, restore of %d", restoreFirst, accepted, plan.Entries)
		}
		st.Close()
	}
}

// The entries a restore streams are counted from the WAL's own counts, not
// read before they are sent; one that is not a MessagePack map (a WAL
// written by something else: its checksums hold) is found as it is sent.
// The frame is cut short, never whole with the bad entry in it, and the next
// restore reads and checks every entry first: it is refused with the reason
// and the sequence. An entry held in the frame is checked before anything
// is sent.
func TestRestoreStreamedEntryMalformed(t *testing.T) {
	for _, at := range []struct {
		name string
		seq  int
	}{{"streamed", 3000}, {"held", 10}} {
		t.Run(at.name, func(t *testing.T) {
			st := openStores(t)
			appendEntries(t, st, 1, at.seq-1, 1000)
			if _, err := st.wal.Append(wal.Entry{Sequence: uint64(at.seq), Data: []byte{0x92, 0x01, 0x02}}); err != nil {
				t.Fatal(err)
			}
			appendEntries(t, st, at.seq+1, 10, 1000)
			plan, err := st.BuildRestore(Point{})
			if err == nil {
				if r, err := restoreThrough(t, plan); err == nil {
					t.Fatalf("a whole restore of %d entries came through with a malformed one", len(r.WALEntries))
				}
				plan, err = st.BuildRestore(Point{})
			}
			if !errors.Is(err, ErrUnrestorable) || !strings.Contains(err.Error(), "cannot be sent") {
				t.Fatalf("restore after the malformed entry %d: %v, %v; want ErrUnrestorable naming it", at.seq, plan, err)
			}
		})
	}
}

// A WAL record in the streamed part of a restore that is damaged after
// recovery verified it (a disk that changed what it had confirmed, read back
// once its pages left the cache) is found as it is sent: the frame is cut
// short, never whole with the damaged entry in it, and no later restore
// comes through whole with it either.
func TestRestoreStreamedRecordDamagedAfterOpen(t *testing.T) {
	st := openStores(t)
	appendEntries(t, st, 1, 3000, 1000) // about 3 MB: all but the first 1 MiB streamed
	plan, err := st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Tail == nil {
		t.Fatal("want the tail streamed")
	}
	segs, err := filepath.Glob(filepath.Join(st.dir, "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	path := segs[len(segs)-1]
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A byte of an entry's padding about two thirds of the way into the
	// records (the file is preallocated: zeros follow them).
	end := bytes.LastIndexByte(b, 'p')
	at := int64(bytes.IndexByte(b[end*2/3:], 'p') + end*2/3)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'q'}, at); err != nil {
		t.Fatal(err)
	}
	f.Close()

	r, err := restoreThrough(t, plan)
	if err == nil {
		t.Fatalf("a whole restore of %d entries came through a damaged record", len(r.WALEntries))
	}
	if !errors.Is(err, wal.ErrCorrupt) {
		t.Fatalf("the cut restore: %v, want the damage named", err)
	}
	// The next restores read the whole tail first: refused, with the
	// damage and what to do, as for damage recovery finds.
	for i := range 2 {
		plan, err = st.BuildRestore(Point{})
		if !errors.Is(err, ErrUnrestorable) || !errors.Is(err, wal.ErrCorrupt) || !strings.Contains(err.Error(), "checksum mismatch") {
			if err == nil {
				_, err = restoreThrough(t, plan)
			}
			t.Fatalf("restore %d after the damage was found: %v; want it refused (ErrUnrestorable) naming the damage", i+1, err)
		}
	}
}

// --max-frame-size lowered between two runs, below what the state needs: a
// checkpoint alone over the new limit, the entries held in the frame over
// it, or the streamed entries over it. Each restore is refused, naming the
// limit, never built and sent over it.
func TestRestoreOverALoweredFrameLimitRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ckpt  int // bytes of checkpoint data; 0: none
		limit int
	}{
		{"checkpoint alone", 200 << 10, 100 << 10},
		{"entries held in the frame", 0, 200 << 10},
		{"entries streamed", 0, 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			open := func(limit int) *Stores {
				st, err := Open(Options{Dir: dir, Codec: schema.NewCodec(schema.Options{}), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
					MaxFrameSize: limit})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			st := open(wire.DefaultMaxFrameSize)
			if tc.ckpt > 0 {
				if _, _, _, _, err := st.SaveCheckpoint(bigData(t, tc.ckpt), nil, 0, 0); err != nil {
					t.Fatal(err)
				}
			} else {
				appendEntries(t, st, 1, 3000, 1000) // about 3 MB
			}
			st.Close()
			st = open(tc.limit)
			defer st.Close()
			plan, err := st.BuildRestore(Point{})
			if !errors.Is(err, ErrUnrestorable) || !strings.Contains(err.Error(), "--max-frame-size") {
				t.Fatalf("restore under a %d-byte limit: plan %v, %v; want it refused naming --max-frame-size", tc.limit, plan != nil, err)
			}
		})
	}
}
