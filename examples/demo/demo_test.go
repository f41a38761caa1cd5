package demo_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/examples/demo"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// fakeSupervisor plays the supervisor's side of the pipes.
type fakeSupervisor struct {
	t     *testing.T
	codec *schema.Codec
	r     *wire.Reader
	w     *wire.Writer
}

func (f *fakeSupervisor) send(m schema.Message) {
	f.t.Helper()
	b, err := f.codec.Encode(m)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.w.WriteFrame(b); err != nil {
		f.t.Fatal(err)
	}
}

// next returns the next message from the agent other than a heartbeat.
func (f *fakeSupervisor) next() schema.Message {
	f.t.Helper()
	for {
		b, err := f.r.ReadFrame()
		if err != nil {
			f.t.Fatal(err)
		}
		m, err := f.codec.Decode(schema.FromAgent, b)
		if err != nil {
			f.t.Fatal(err)
		}
		if _, hb := m.(*schema.Heartbeat); !hb {
			return m
		}
	}
}

// The demo applies a pending restore before it writes anything, numbers its
// notes after what it restored, logs each note before applying it, and
// checkpoints its whole state on shutdown.
func TestDemoRestoresFirstAndCheckpointsOnShutdown(t *testing.T) {
	toAgent, fromSup := io.Pipe()
	fromAgent, toSup := io.Pipe()
	conn := agent.NewConn(toAgent, toSup, agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2,
		Transport: agent.TransportStdio, RestorePending: true}, agent.Options{})
	sup := &fakeSupervisor{t: t, codec: schema.NewCodec(schema.Options{}), r: wire.NewReader(fromAgent, 0), w: wire.NewWriter(fromSup, 0)}
	done := make(chan error, 1)
	go func() {
		done <- demo.Run(t.Context(), conn, slog.New(slog.DiscardHandler), 5*time.Millisecond, time.Hour)
	}()

	// Many note intervals pass before the restore arrives: nothing is written.
	time.Sleep(50 * time.Millisecond) // the demo must hold still meanwhile; a wal_entry would show below as seq 1
	var st demo.State
	st.Notes, st.Written, st.LastSeq = []demo.Note{{Seq: 1, Text: "note 1"}, {Seq: 2, Text: "note 2"}}, 2, 2
	snap, _ := msgpack.Marshal(st)
	entry, _ := msgpack.Marshal(map[string]any{"operation": "memory_add", "params": map[string]any{"text": "note 3"}, "sequence": 3})
	sup.send(&schema.Restore{CheckpointID: "01a207a9-0d05-73d3-a091-75f49042af96", Snapshot: snap, WALEntries: []msgpack.RawMessage{entry}})

	w, ok := sup.next().(*schema.WALEntry)
	if !ok || w.Entry.Sequence != 4 || w.Entry.Operation != "memory_add" {
		t.Fatalf("first message after the restore: %#v; want wal_entry 4 (numbered after the restored 3)", w)
	}
	sup.send(&schema.Shutdown{Reason: "test", CreateCheckpoint: true})
	var cp *schema.Checkpoint
	for cp == nil {
		switch m := sup.next().(type) {
		case *schema.Checkpoint:
			cp = m
		case *schema.WALEntry: // notes written before shutdown arrived
		default:
			t.Fatalf("unexpected %T before the final checkpoint", m)
		}
	}
	var got demo.State
	if err := msgpack.Unmarshal(cp.Data, &got); err != nil {
		t.Fatal(err)
	}
	if got.LastSeq < 4 || got.Notes[0].Text != "note 1" || got.Notes[2].Text != "note 3" || got.Notes[3].Seq != 4 {
		t.Fatalf("final checkpoint %+v: want the restored notes 1-3 and note 4 on top", got)
	}
	sup.send(&schema.CheckpointAck{CheckpointID: "01a207a9-0d05-73d3-a091-75f49042af97", Size: 10})
	if err := <-done; !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("Run returned %v, want ErrShutdown", err)
	}
}
