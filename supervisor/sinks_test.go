package supervisor

import (
	"github.com/agent-sidecar/supervisor/evolution"
	"log/slog"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/vmihailenco/msgpack/v5"
)

// TestFailedAppendAnswersErrorNotAck: an entry that asked for an ack but
// could not be appended gets WAL_FAILED naming its sequences, never an ack.
func TestFailedAppendAnswersErrorNotAck(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Command = t.TempDir(), []string{"/bin/true"}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := ackTestInstance(t, RolePrimary)
	l := openTestWAL(t, wal.SyncBatch)
	l.Close() // every append now fails
	s.appendWAL(in, l, func(es []wal.Entry) (wal.AppendResult, error) { return l.Append(es...) },
		[]schema.WALRecord{{Sequence: 4, Raw: []byte{0x80}}, {Sequence: 5, Raw: []byte{0x80}}}, true)
	m, ok := nextToAgent(t, in).(*schema.Error)
	if !ok || m.Error.Code != schema.CodeWALFailed {
		t.Fatalf("sent %+v, want a WAL_FAILED error", m)
	}
	var det struct {
		First uint64 `msgpack:"first_sequence"`
		Last  uint64 `msgpack:"last_sequence"`
	}
	if err := msgpack.Unmarshal(m.Error.Details, &det); err != nil || det.First != 4 || det.Last != 5 {
		t.Errorf("details %+v (%v), want first_sequence 4, last_sequence 5", det, err)
	}
	// No acker was started, so nothing can follow; nothing else is queued.
	if in.Acking() {
		t.Error("a failed append started the acker")
	}
	if n := len(in.Outbound()); n != 0 {
		t.Errorf("%d more frames sent after the error", n)
	}
}

// TestShadowAcksFromScratchWAL: a shadow's ack: true entries go to its
// trial's scratch WAL (never fsynced) and are acknowledged from it; the
// primary's WAL does not see them.
func TestShadowAcksFromScratchWAL(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Command = t.TempDir(), []string{"/bin/true"}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := durable.Open(durable.Options{Dir: t.TempDir(), Codec: s.codec, Log: s.log, MaxFrameSize: cfg.MaxFrameSize,
		WALSegmentSize: 1 << 20, WALSync: wal.SyncBatch})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s.st = st
	primary := st.WAL()
	sh := &shadow{role: evolution.RoleCandidate, wal: openTestWAL(t, wal.SyncNone)}
	tr := &trial{id: "t1", shadows: []*shadow{sh}}
	in := ackTestInstance(t, RoleShadow)
	s.shadowSinks(tr, sh).AppendWAL(in, []schema.WALRecord{{Sequence: 9, Raw: []byte{0x80}}}, true)
	if ack, ok := nextToAgent(t, in).(*schema.WALAck); !ok || ack.Sequence != 9 {
		t.Fatalf("shadow got %+v, want wal_ack 9", ack)
	}
	if sh.wal.LastSequence() != 9 || primary.LastSequence() != 0 {
		t.Errorf("scratch WAL at %d, primary at %d; want 9 and 0", sh.wal.LastSequence(), primary.LastSequence())
	}
}

// ackTestInstance is an instance without a process: what it sends to the
// agent stays in its outbound queue for the test to read.
func ackTestInstance(t *testing.T, role string) *conn.Instance {
	t.Helper()
	in := conn.NewDetached(role, &agentproc.Process{}, schema.NewCodec(schema.Options{}),
		observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 }), slog.New(slog.NewTextHandler(t.Output(), nil)))
	t.Cleanup(in.Close)
	return in
}

func nextToAgent(t *testing.T, in *conn.Instance) schema.Message {
	t.Helper()
	select {
	case f := <-in.Outbound():
		b := f.Head
		m, err := schema.Decode(schema.ToAgent, b)
		if err != nil {
			t.Fatal(err)
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("nothing sent to the agent")
		return nil
	}
}

func openTestWAL(t *testing.T, policy wal.SyncPolicy) *wal.Log {
	t.Helper()
	l, err := wal.Open(wal.Options{Dir: t.TempDir(), Sync: policy, NoPreallocate: true, SegmentSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
