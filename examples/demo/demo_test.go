package demo_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/examples/demo"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// fakeSupervisor plays the supervisor's side of in-memory pipes.
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

// next returns the next message from the agent other than a heartbeat,
// acknowledging every durable wal_entry as the supervisor does once the
// entry is on disk.
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
		switch m := m.(type) {
		case *schema.Heartbeat:
			continue
		case *schema.WALEntry:
			if m.Ack {
				f.send(&schema.WALAck{Sequence: m.Entry.Sequence})
			}
		}
		return m
	}
}

// start runs the demo over in-memory pipes, writing a note every 5 ms and
// never checkpointing on its own; it returns the supervisor's end and Run's
// result.
func start(t *testing.T, cfg agent.Config) (*fakeSupervisor, <-chan error) {
	toAgent, fromSup := io.Pipe()
	fromAgent, toSup := io.Pipe()
	conn := agent.NewConn(toAgent, toSup, cfg, agent.Options{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { conn.Close(); fromSup.Close(); fromAgent.Close() })
	sup := &fakeSupervisor{t: t, codec: schema.NewCodec(schema.Options{}), r: wire.NewReader(fromAgent, 0), w: wire.NewWriter(fromSup, 0)}
	done := make(chan error, 1)
	go func() {
		done <- demo.Run(context.Background(), conn, slog.New(slog.DiscardHandler), 5*time.Millisecond, time.Hour)
	}()
	return sup, done
}

// The demo applies a pending restore before it writes anything, numbers its
// notes after what it restored, logs each note before applying it, and
// checkpoints its whole state on shutdown.
func TestDemoRestoresFirstAndCheckpointsOnShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sup, done := start(t, agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2, Transport: agent.TransportStdio, RestorePending: true})

		// Many note intervals pass (in fake time) before the restore arrives:
		// nothing is written; a wal_entry would show below as seq 1.
		time.Sleep(time.Second)
		var st demo.State
		st.Notes, st.Written, st.LastSeq = []demo.Note{{Seq: 1, Text: "note 1"}, {Seq: 2, Text: "note 2"}}, 2, 2
		snap, _ := msgpack.Marshal(st)
		entry, _ := msgpack.Marshal(map[string]any{"operation": "memory_add", "params": map[string]any{"text": "note 3"}, "sequence": 3})
		sup.send(&schema.Restore{CheckpointID: "01a207a9-0d05-73d3-a091-75f49042af96", Snapshot: snap, WALEntries: []msgpack.RawMessage{entry}})

		w, ok := sup.next().(*schema.WALEntry)
		if !ok || w.Entry.Sequence != 4 || w.Entry.Operation != "memory_add" || !w.Ack {
			t.Fatalf("first message after the restore: %#v; want a durable wal_entry 4 (numbered after the restored 3)", w)
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
	})
}

// A request becomes a note: logged durably first, then answered with the
// note's number. A note the supervisor could not log is not applied.
func TestDemoAnswersRequestsOnceLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sup, done := start(t, agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2, Transport: agent.TransportStdio})
		// The first note: the supervisor's WAL is full.
		for {
			b, err := sup.r.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			m, _ := sup.codec.Decode(schema.FromAgent, b)
			if w, ok := m.(*schema.WALEntry); ok {
				if w.Entry.Sequence != 1 {
					t.Fatalf("first note has sequence %d, want 1", w.Entry.Sequence)
				}
				sup.send(schema.NewError(schema.CodeWALFull, "disk full", map[string]any{"first_sequence": 1, "last_sequence": 1}))
				break
			}
		}
		sup.send(&schema.ProcessRequest{RequestID: "r1", Data: schema.RequestData{Message: "the sky is blue"}})
		var seq uint64
		for {
			switch m := sup.next().(type) {
			case *schema.WALEntry:
				if p := m.Entry.Params; p != nil && seq == 0 {
					var params map[string]any
					_ = msgpack.Unmarshal(p, &params)
					if params["text"] == "request: the sky is blue" {
						seq = m.Entry.Sequence
					}
				}
				continue
			case *schema.RequestResult:
				if seq == 0 {
					t.Fatalf("request answered before its note was logged: %+v", m)
				}
				var data struct {
					Note uint64 `msgpack:"note"`
				}
				if err := msgpack.Unmarshal(m.Data, &data); err != nil || m.RequestID != "r1" || data.Note != seq {
					t.Fatalf("answer %+v (note %d, %v), want request r1 answered with note %d", m, data.Note, err, seq)
				}
			default:
				t.Fatalf("unexpected %T", m)
			}
			break
		}
		if seq != 1 {
			t.Errorf("the request's note has sequence %d, want 1: the unlogged note was not applied", seq)
		}
		sup.send(&schema.Shutdown{Reason: "test"})
		if err := <-done; !errors.Is(err, agent.ErrShutdown) {
			t.Fatalf("Run returned %v, want ErrShutdown", err)
		}
	})
}

// A final checkpoint the supervisor never acknowledges holds the shutdown
// up for 2 seconds, not for ever.
func TestDemoShutdownWaitsForTheAckBriefly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sup, done := start(t, agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2, Transport: agent.TransportStdio})
		sup.send(&schema.Shutdown{Reason: "test", CreateCheckpoint: true})
		for {
			if _, ok := sup.next().(*schema.Checkpoint); ok {
				break
			}
		}
		began := time.Now()
		go func() { // keep reading: heartbeats go on meanwhile
			for {
				if _, err := sup.r.ReadFrame(); err != nil {
					return
				}
			}
		}()
		if err := <-done; !errors.Is(err, agent.ErrShutdown) {
			t.Fatalf("Run returned %v, want ErrShutdown", err)
		}
		if waited := time.Since(began); waited != 2*time.Second {
			t.Errorf("waited %v for the ack, want 2s", waited)
		}
	})
}
