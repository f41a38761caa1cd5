package conn

import (
	"encoding/binary"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wire"
)

// Time the reader spends inside our sinks (blocked on our storage, or on a
// full checkpoint queue) does not count against the agent's heartbeat, while
// it lasts and after. Fake time (synctest): exact, no sleeping.
func TestTimeInSinksDoesNotAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := &Instance{started: time.Now()}
		if age, seen := in.HeartbeatAge(time.Now()); age != 0 || seen {
			t.Fatalf("at start: %s, %v", age, seen)
		}
		time.Sleep(2 * time.Second)
		start := in.sinkBegin() // before the first heartbeat: start timeout
		time.Sleep(time.Minute)
		in.sinkEnd(start)
		if age, _ := in.HeartbeatAge(time.Now()); age != 2*time.Second {
			t.Fatalf("age %s after a minute in a sink before the first heartbeat, want 2s", age)
		}
		in.lastHeartbeat.Store(time.Now().UnixNano())
		in.blockedNano.Store(0)
		time.Sleep(time.Second)
		start = in.sinkBegin()
		time.Sleep(10 * time.Second)
		if age, _ := in.HeartbeatAge(time.Now()); age != time.Second {
			t.Errorf("age %s while blocked in a sink, want 1s", age)
		}
		in.sinkEnd(start)
		if age, _ := in.HeartbeatAge(time.Now()); age != time.Second {
			t.Fatalf("age %s after 10s in a sink, want 1s", age)
		}
		time.Sleep(2 * time.Second)
		if age, _ := in.HeartbeatAge(time.Now()); age != 3*time.Second {
			t.Fatalf("age %s 2s later, want 3s: the agent's own silence counts", age)
		}
	})
}

// pipeProc is an agent process made of in-memory pipes: what the agent
// sends is written to fromAgentW, and exit (StopGroup) leaves fromAgentW
// open, as an escaped descendant holding the agent's stdout does.
type pipeProc struct {
	toAgentR, fromAgentR *io.PipeReader
	toAgentW, fromAgentW *io.PipeWriter
	exited               chan struct{}
	once                 sync.Once
}

func newPipeProc() *pipeProc {
	p := &pipeProc{exited: make(chan struct{})}
	p.toAgentR, p.toAgentW = io.Pipe()
	p.fromAgentR, p.fromAgentW = io.Pipe()
	go io.Copy(io.Discard, p.toAgentR) // ends when the test closes toAgentW
	return p
}

func (p *pipeProc) ID() int                                    { return 4242 }
func (p *pipeProc) Pipes() (io.Writer, io.Reader, []io.Reader) { return p.toAgentW, p.fromAgentR, nil }
func (p *pipeProc) Exited() <-chan struct{}                    { return p.exited }
func (p *pipeProc) SignalGroup(syscall.Signal) error           { return nil }
func (p *pipeProc) StopGroup(time.Duration) bool               { p.once.Do(func() { close(p.exited) }); return false }
func (p *pipeProc) Reap() agentproc.ExitStatus                 { <-p.exited; return agentproc.ExitStatus{Known: true} }
func (p *pipeProc) CloseReaders()                              { p.fromAgentR.CloseWithError(io.ErrClosedPipe) }

// frameOf is v encoded as one frame from the agent.
func frameOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return wire.AppendFrame(nil, b)
}

// stageSink is a StreamSink that stages streamed checkpoints into stage
// (io.Discard when nil) and records what the reader concluded of them.
type stageSink struct {
	stage   io.Writer
	mu      sync.Mutex
	staged  []*schema.Checkpoint // CheckpointStaged, valid and stored
	aborted int                  // StageAborted, or CheckpointStaged with a store error
}

func (*stageSink) AppendWAL(*Instance, []schema.WALRecord, bool)       {}
func (*stageSink) VersionSeen(*Instance, int32)                        {}
func (*stageSink) Checkpoint(*Instance, *schema.Checkpoint, time.Time) {}
func (*stageSink) AgentMetrics(*Instance, *schema.Metrics)             {}
func (*stageSink) AgentError(*Instance, *schema.Error)                 {}
func (*stageSink) Invalid(*Instance, error)                            {}
func (*stageSink) RequestResult(*Instance, *schema.RequestResult)      {}

func (k *stageSink) StageCheckpoint(*Instance) (io.Writer, error) {
	if k.stage == nil {
		return io.Discard, nil
	}
	return k.stage, nil
}

func (k *stageSink) CheckpointStaged(_ *Instance, _ io.Writer, cp *schema.Checkpoint, storeErr error, _ time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if storeErr != nil || cp == nil {
		k.aborted++
		return
	}
	k.staged = append(k.staged, cp)
}

func (k *stageSink) StageAborted(*Instance, io.Writer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.aborted++
}

// startPiped starts an instance on a pipeProc with sink, and returns once
// the agent's first heartbeat has been read. The caller ends it with
// finish.
func startPiped(t *testing.T, sink Sink) (*Instance, *pipeProc, *schema.Codec) {
	t.Helper()
	p := newPipeProc()
	codec := schema.NewCodec(schema.Options{StreamCheckpoints: true})
	events := make(chan Event, 16)
	in := Start(Config{N: 1, Role: RolePrimary, Proc: p, Codec: codec, MaxFrame: wire.DefaultMaxFrameSize,
		Sink: sink, Events: events,
		Metrics: observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 }),
		Log:     slog.New(slog.NewTextHandler(t.Output(), nil))})
	if _, err := p.fromAgentW.Write(frameOf(t, map[string]any{"type": "heartbeat", "timestamp": time.Now().Unix()})); err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Kind != FirstHeartbeat {
		t.Fatalf("first event %v, want FirstHeartbeat", ev.Kind)
	}
	return in, p, codec
}

// finishWithin calls Finish(drain) on the exited agent and reports whether
// it returned within limit; when it did not, the agent's output is closed
// so that it does.
func finishWithin(t *testing.T, in *Instance, p *pipeProc, drain, limit time.Duration) bool {
	t.Helper()
	p.StopGroup(0)
	done := make(chan struct{})
	go func() { in.Finish(drain); close(done) }()
	defer p.toAgentW.Close()
	select {
	case <-done:
		return true
	case <-time.After(limit):
		p.fromAgentR.CloseWithError(io.ErrClosedPipe)
		<-done
		return false
	}
}

// An agent that hangs in the middle of a streamed checkpoint frame (its
// header and a few bytes sent, then nothing) is hung: waiting for its bytes
// is the agent's time, not our storage's. The first build counted the whole
// read of the frame as time in a sink: its heartbeat age stayed 0, so it was
// never restarted, and once it exited with a descendant holding its stdout
// the drain waited for ever. Fake time (synctest).
func TestHungMidStreamedCheckpointStillAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in, p, codec := startPiped(t, &stageSink{})
		size := codec.StreamAbove() + 1<<20
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(size))
		part, _ := msgpack.Marshal(map[string]any{"type": "checkpoint", "timestamp": 1, "data": map[string]any{"blob": "x"}})
		if _, err := p.fromAgentW.Write(append(hdr[:], part[:len(part)-2]...)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the reader waits for the rest of the frame
		time.Sleep(1500 * time.Millisecond)
		if age, _ := in.HeartbeatAge(time.Now()); age != 1500*time.Millisecond {
			t.Errorf("heartbeat age %s after 1.5 s in which the agent sent nothing (stuck mid-checkpoint), want 1.5s: a hung agent is never noticed", age)
		}
		if !finishWithin(t, in, p, 200*time.Millisecond, 3*time.Second) {
			t.Errorf("Finish(200ms) had not returned 3 s after the agent exited: the drain waits for ever on an output held open mid-frame")
		}
	})
}

// frozenWriter is a staging file on a disk that freezes for d at the first
// write.
type frozenWriter struct {
	d      time.Duration
	frozen bool
}

func (w *frozenWriter) Write(b []byte) (int, error) {
	if !w.frozen {
		w.frozen = true
		time.Sleep(w.d)
	}
	return len(b), nil
}

// The other side of TestHungMidStreamedCheckpointStillAges: while our disk
// holds the staging of a streamed checkpoint the agent sent whole, the
// agent does not age, and when it exits meanwhile (a descendant holding its
// stdout) the frame is still read to its end and staged, however long the
// disk takes, before the output is cut off. Fake time (synctest).
func TestFrozenDiskMidStreamedCheckpointDoesNotAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &stageSink{stage: &frozenWriter{d: 10 * time.Second}}
		in, p, codec := startPiped(t, sink)
		blob := strings.Repeat("x", codec.StreamAbove())
		ckpt := frameOf(t, map[string]any{"type": "checkpoint", "timestamp": 1,
			"data": map[string]any{"agent_state": map[string]any{"status": "idle"}, "blob": blob}})
		go p.fromAgentW.Write(ckpt)
		synctest.Wait() // the reader is in the frozen write
		time.Sleep(5 * time.Second)
		if age, _ := in.HeartbeatAge(time.Now()); age != 0 {
			t.Errorf("heartbeat age %s after 5 s blocked on our own disk, want 0: a healthy agent would be killed for our storage", age)
		}
		if !finishWithin(t, in, p, 200*time.Millisecond, time.Minute) {
			t.Fatal("Finish(200ms) had not returned a minute after the agent exited")
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if len(sink.staged) != 1 || sink.aborted != 0 {
			t.Fatalf("%d checkpoints staged, %d aborted, want the one the agent sent staged: its output was cut while our disk held it", len(sink.staged), sink.aborted)
		}
		if age, _ := in.HeartbeatAge(time.Now()); age >= time.Second {
			t.Errorf("heartbeat age %s after the checkpoint was staged, want under 1s (the 10 s freeze is ours)", age)
		}
	})
}
