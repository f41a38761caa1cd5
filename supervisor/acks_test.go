package supervisor

import (
	"log/slog"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// ackTestInstance is an instance without a process: what it sends to the
// agent stays in its outbound queue for the test to read.
func ackTestInstance(t *testing.T) *instance {
	t.Helper()
	in := &instance{
		role: RolePrimary, codec: schema.NewCodec(schema.Options{}), out: make(chan []byte, 64),
		met: observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 }), log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	t.Cleanup(in.stopAcks)
	return in
}

func nextToAgent(t *testing.T, in *instance) schema.Message {
	t.Helper()
	select {
	case b := <-in.out:
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

func appendSeq(t *testing.T, l *wal.Log, seqs ...uint64) {
	t.Helper()
	es := make([]wal.Entry, len(seqs))
	for i, s := range seqs {
		es[i] = wal.Entry{Sequence: s, Data: []byte{0x80}}
	}
	if _, err := l.Append(es...); err != nil {
		t.Fatal(err)
	}
}

func TestAckOnceDurable(t *testing.T) {
	for _, policy := range []wal.SyncPolicy{wal.SyncBatch, wal.SyncAlways, wal.SyncNone} {
		t.Run(policy.String(), func(t *testing.T) {
			l := openTestWAL(t, policy)
			in := ackTestInstance(t)
			appendSeq(t, l, 1, 2, 3)
			in.ackWhenDurable(l, 3)
			ack, ok := nextToAgent(t, in).(*schema.WALAck)
			if !ok || ack.Sequence != 3 {
				t.Fatalf("sent %+v, want wal_ack 3", ack)
			}
			if d := l.DurableSequence(); d < 3 {
				t.Fatalf("acknowledged 3 with only %d durable", d)
			}
			// A replayed (duplicate) entry that asks is acknowledged too.
			in.ackWhenDurable(l, 2)
			if ack, ok := nextToAgent(t, in).(*schema.WALAck); !ok || ack.Sequence < 2 {
				t.Fatalf("replay ack %+v", ack)
			}
		})
	}
}

// TestAcksCoalesce: asks queued while the acker waits are answered by
// cumulative acks, never one per entry, and every ask is covered.
func TestAcksCoalesce(t *testing.T) {
	l := openTestWAL(t, wal.SyncBatch)
	in := ackTestInstance(t)
	for s := uint64(1); s <= 50; s++ {
		appendSeq(t, l, s)
		in.ackWhenDurable(l, s)
	}
	var acks []uint64
	for len(acks) == 0 || acks[len(acks)-1] < 50 {
		ack := nextToAgent(t, in).(*schema.WALAck)
		if len(acks) > 0 && ack.Sequence <= acks[len(acks)-1] {
			t.Fatalf("acks not increasing: %v then %d", acks, ack.Sequence)
		}
		acks = append(acks, ack.Sequence)
	}
	if len(acks) >= 50 {
		t.Errorf("%d acks for 50 entries asked at once: not coalesced", len(acks))
	}
	t.Logf("50 asks answered by %d acks: %v", len(acks), acks)
}

func TestAckerStops(t *testing.T) {
	l := openTestWAL(t, wal.SyncBatch)
	in := ackTestInstance(t)
	appendSeq(t, l, 1)
	in.ackWhenDurable(l, 1)
	nextToAgent(t, in)
	done := in.acks.done
	in.stopAcks()
	select {
	case <-done:
	default:
		t.Fatal("stopAcks returned before the acker exited")
	}
	in.stopAcks()           // harmless twice
	in.ackWhenDurable(l, 1) // ignored after the stop: no new goroutine
	if in.acks.done != done {
		t.Error("an ask after stopAcks started a new acker")
	}
}

// TestFailedAppendAnswersErrorNotAck: an entry that asked for an ack but
// could not be appended gets WAL_FAILED naming its sequences, never an ack.
func TestFailedAppendAnswersErrorNotAck(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Command = t.TempDir(), []string{"/bin/true"}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := ackTestInstance(t)
	in.proc = &agentproc.Process{}
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
	if in.acks.done != nil {
		t.Error("a failed append started the acker")
	}
	if n := len(in.out); n != 0 {
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
	primary := openTestWAL(t, wal.SyncBatch)
	s.st = &stores{wal: primary}
	tr := &trial{id: "t1", wal: openTestWAL(t, wal.SyncNone)}
	in := ackTestInstance(t)
	in.role = RoleShadow
	s.shadowSinks(tr).appendWAL(in, []schema.WALRecord{{Sequence: 9, Raw: []byte{0x80}}}, true)
	if ack, ok := nextToAgent(t, in).(*schema.WALAck); !ok || ack.Sequence != 9 {
		t.Fatalf("shadow got %+v, want wal_ack 9", ack)
	}
	if tr.wal.LastSequence() != 9 || primary.LastSequence() != 0 {
		t.Errorf("scratch WAL at %d, primary at %d; want 9 and 0", tr.wal.LastSequence(), primary.LastSequence())
	}
}
