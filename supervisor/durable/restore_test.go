package durable

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/agent-sidecar/supervisor/wire"
)

func openStores(t *testing.T) *Stores {
	t.Helper()
	st, err := Open(Options{Dir: t.TempDir(), Codec: schema.NewCodec(schema.Options{}), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxFrameSize: wire.DefaultMaxFrameSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func appendEntries(t *testing.T, st *Stores, from, n, size int) {
	t.Helper()
	pad := strings.Repeat("p", size)
	for i := from; i < from+n; i++ {
		raw, err := schema.MarshalMap(map[string]any{"operation": "memory_add", "params": map[string]any{"pad": pad}, "sequence": i})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append([]wal.Entry{{Sequence: uint64(i), Data: raw}}); err != nil {
			t.Fatal(err)
		}
	}
}

// A restore whose WAL tail is over streamTailFrom holds only its first
// entries; the rest, streamed from the log behind them, make the same
// restore a reader decodes.
func TestRestoreTailStreamed(t *testing.T) {
	st := openStores(t)
	appendEntries(t, st, 1, 3000, 1000) // about 3 MB
	plan, err := st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Tail == nil || len(plan.Frame) > 2*streamTailFrom {
		t.Fatalf("tail %v, head %d bytes: want the tail streamed", plan.Tail, len(plan.Frame))
	}
	var buf bytes.Buffer
	w := wire.NewWriter(&buf, 0)
	if err := w.WriteFrameStream(plan.Frame, plan.Tail.Size(), plan.Tail.Stream); err != nil {
		t.Fatal(err)
	}
	payload, err := wire.NewReader(&buf, 0).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.ToAgent, payload)
	if err != nil {
		t.Fatal(err)
	}
	r := m.(*schema.Restore)
	if len(r.WALEntries) != 3000 || r.LastSequence != 3000 || plan.Entries != 3000 {
		t.Fatalf("restore of %d entries, last_sequence %d; plan %d entries", len(r.WALEntries), r.LastSequence, plan.Entries)
	}
	for i, raw := range r.WALEntries {
		var e struct {
			Sequence uint64 `msgpack:"sequence"`
		}
		if err := msgpack.Unmarshal(raw, &e); err != nil || e.Sequence != uint64(i+1) {
			t.Fatalf("entry %d has sequence %d (%v)", i, e.Sequence, err)
		}
	}

	// Entries appended after the plan are not part of it.
	appendEntries(t, st, 3001, 10, 1000)
	buf.Reset()
	if err := wire.NewWriter(&buf, 0).WriteFrameStream(plan.Frame, plan.Tail.Size(), plan.Tail.Stream); err != nil {
		t.Fatalf("with entries appended since: %v", err)
	}

	// A log that no longer holds what was counted cuts the frame short.
	if _, err := st.WAL().TruncateAfter(2000); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	err = wire.NewWriter(&buf, 0).WriteFrameStream(plan.Frame, plan.Tail.Size(), plan.Tail.Stream)
	if err == nil || !strings.Contains(err.Error(), "no longer holds") {
		t.Fatalf("after a rollback: %v, want the tail refused", err)
	}
	if _, err := wire.NewReader(&buf, 0).ReadFrame(); err == nil {
		t.Fatal("the cut frame reads whole")
	}
}

// A small tail stays in the frame.
func TestRestoreSmallTailInline(t *testing.T) {
	st := openStores(t)
	appendEntries(t, st, 1, 10, 100)
	plan, err := st.BuildRestore(Point{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Tail != nil || plan.Entries != 10 {
		t.Fatalf("tail %v, %d entries", plan.Tail, plan.Entries)
	}
}
