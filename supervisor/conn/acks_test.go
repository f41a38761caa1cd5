package conn

import (
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/agent-sidecar/supervisor/wire"
)

// ackTestInstance is an instance without a process: what it sends to the
// agent stays in its outbound queue for the test to read.
func ackTestInstance(t *testing.T) *Instance {
	t.Helper()
	in := &Instance{
		role: RolePrimary, codec: schema.NewCodec(schema.Options{}), out: make(chan OutFrame, 64),
		met: observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 }), log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	t.Cleanup(in.stopAcks)
	return in
}

func nextToAgent(t *testing.T, in *Instance) schema.Message {
	t.Helper()
	select {
	case f := <-in.out:
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
			in.AckWhenDurable(l, 3)
			ack, ok := nextToAgent(t, in).(*schema.WALAck)
			if !ok || ack.Sequence != 3 {
				t.Fatalf("sent %+v, want wal_ack 3", ack)
			}
			if d := l.DurableSequence(); d < 3 {
				t.Fatalf("acknowledged 3 with only %d durable", d)
			}
			// A replayed (duplicate) entry that asks is acknowledged too.
			in.AckWhenDurable(l, 2)
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
		in.AckWhenDurable(l, s)
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
	in.AckWhenDurable(l, 1)
	nextToAgent(t, in)
	in.stopAcks()
	if in.Acking() {
		t.Fatal("the WAL watcher is still registered after stopAcks")
	}
	in.stopAcks() // harmless twice
	appendSeq(t, l, 2)
	in.AckWhenDurable(l, 2) // ignored after the stop
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if in.Acking() {
		t.Error("an ask after stopAcks registered a watcher again")
	}
	select {
	case f := <-in.out:
		t.Fatalf("sent %q after stopAcks", f.Head)
	default:
	}
}

// pipeAckInstance is an ackTestInstance whose output is a real pipe, with
// no writer goroutine until the test starts one (startWriter).
func pipeAckInstance(t *testing.T) (in *Instance, fromSup *wire.Reader, startWriter func()) {
	t.Helper()
	in = ackTestInstance(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	in.w = wire.NewWriter(w, 0)
	in.writerEnd = make(chan struct{})
	var once sync.Once
	return in, wire.NewReader(r, 0), func() { once.Do(func() { go in.writeLoop(in.w, w) }) }
}

func readToAgent(t *testing.T, r *wire.Reader) schema.Message {
	t.Helper()
	b, err := r.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	m, err := schema.Decode(schema.ToAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestAckWrittenByTheSyncer: with nothing else queued for the agent, the
// wal_ack goes into the pipe from the WAL's syncer itself: it arrives with
// no writer goroutine running at all (issue 31: no hand-off after the fsync).
func TestAckWrittenByTheSyncer(t *testing.T) {
	l := openTestWAL(t, wal.SyncBatch)
	in, r, _ := pipeAckInstance(t)
	appendSeq(t, l, 1, 2)
	in.AckWhenDurable(l, 2)
	ack, ok := readToAgent(t, r).(*schema.WALAck)
	if !ok || ack.Sequence != 2 {
		t.Fatalf("read %+v, want wal_ack 2", ack)
	}
	if len(in.out) != 0 {
		t.Fatal("the ack was also queued")
	}
}

// TestDirectAckKeepsOrder: while a frame is queued (or being written) the
// ack does not overtake it: it is queued behind it.
func TestDirectAckKeepsOrder(t *testing.T) {
	l := openTestWAL(t, wal.SyncBatch)
	in, r, startWriter := pipeAckInstance(t)
	if !in.SendMsg(&schema.EvolutionResult{Success: false, Decision: "rejected", Reason: "queued first"}) {
		t.Fatal("queue refused")
	}
	appendSeq(t, l, 1)
	in.AckWhenDurable(l, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	startWriter()
	if m := readToAgent(t, r); m.MessageType() != schema.TypeEvolutionResult {
		t.Fatalf("first frame %s, want the evolution_result queued before the ack", m.MessageType())
	}
	if ack, ok := readToAgent(t, r).(*schema.WALAck); !ok || ack.Sequence != 1 {
		t.Fatalf("second frame %+v, want wal_ack 1", ack)
	}
}
