package conn

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wire"
)

// OutboundQueue is how many frames may wait for an agent to read them, and
// OutboundBytes how many bytes. A full queue refuses frames: it is the
// supervisor's back-pressure, never a verdict on the agent, which is judged
// by its heartbeats and by whether it reads its pipe at all (WriteStalled).
//
// Requests may fill only half of either bound (RequestShare): the rest stays
// for what the agent waits on — wal_acks, restores, evolution results — so a
// flood of requests refused with 503 never costs an acknowledgement.
const (
	OutboundQueue = 4096
	OutboundBytes = 8 << 20
	RequestShare  = 2 // requests use at most 1/RequestShare of the queue
)

// outCharge is what a frame counts against OutboundBytes: its size, but at
// most a quarter of the bound, so that a large restore (which must be sent
// whole) still leaves room for the acknowledgements behind it. Memory is
// then bounded by OutboundBytes plus the restore.
func outCharge(frame []byte) int64 { return min(int64(len(frame)), OutboundBytes/4) }

// Role of an agent instance.
const (
	RolePrimary = "primary"
	RoleShadow  = "shadow"
)

// EventKind says what an Event reports.
type EventKind int

// What an instance tells its owner.
const (
	FirstHeartbeat  EventKind = iota + 1
	StreamEnded               // the frame reader returned (Err: io.EOF or a framing/read error)
	Exited                    // the process exited (not yet reaped)
	EvolutionIntent           // Msg holds the *schema.EvolutionIntent
	Finished                  // drained and reaped after Exited (Status set); sent by the owner's drain
)

// Event is what an instance tells its owner: only what the owner decides on
// (lifecycle). The owner alone changes lifecycle state.
type Event struct {
	Inst   *Instance
	Kind   EventKind
	Err    error
	Msg    schema.Message
	Status agentproc.ExitStatus // Finished
}

// Sink is where an instance's valid messages go, on its reader goroutine.
// The owner gives a primary a sink onto its durable stores and a shadow one
// onto its trial's scratch stores; a sink that blocks (storage, a full
// checkpoint queue) is time the agent is not charged for (HeartbeatAge).
type Sink interface {
	AppendWAL(in *Instance, recs []schema.WALRecord, ack bool)
	VersionSeen(in *Instance, v int32)
	Checkpoint(in *Instance, cp *schema.Checkpoint, arrived time.Time)
	AgentMetrics(in *Instance, m *schema.Metrics)
	AgentError(in *Instance, m *schema.Error)
	Invalid(in *Instance, err error)
	RequestResult(in *Instance, m *schema.RequestResult)
}

// Config is what an instance is started with.
type Config struct {
	N        int    // incarnation number, for logs
	Role     string // RolePrimary or RoleShadow
	Proc     agentproc.Proc
	Codec    *schema.Codec
	MaxFrame int // the largest frame read from the agent
	Sink     Sink
	Events   chan<- Event // where the owner hears of lifecycle events
	Metrics  *observe.Metrics
	Log      *slog.Logger
}

// Instance is one incarnation of an agent: the process, a goroutine reading
// its frames, one writing frames to it, and one per log pipe. All of them end
// when the process is reaped and its pipes are closed (Finish). What the
// owner decides about it (stopping, draining) is the owner's, not here.
type Instance struct {
	n       int // incarnation number, for logs
	role    string
	proc    agentproc.Proc
	started time.Time
	log     *slog.Logger
	codec   *schema.Codec
	sink    Sink
	events  chan<- Event
	met     *observe.Metrics

	// Per-frame counters resolved once (label lookups hash on every call).
	inBytes  prometheus.Counter
	inFrames map[string]prometheus.Counter

	lastHeartbeat atomic.Int64 // unix nanos; 0 before the first
	// acceptsCancel: a heartbeat carried accepts: ["cancel_request"].
	acceptsCancel atomic.Bool
	firstHBAt     atomic.Int64
	version       atomic.Int32 // highest protocol version the agent has used

	// Liveness measures the agent, not us (SPEC §3). The reader records how
	// long it spends inside our sinks (the WAL append, the checkpoint queue,
	// a streamed checkpoint's staging writes) — time the agent may be
	// blocked on our storage — and HeartbeatAge leaves it out. Written by
	// the reader only.
	sinkSince atomic.Int64 // unix nanos the current sink call began; 0 outside one
	// lastOfBurst: the frame being handled is the last the agent has sent
	// for now (nothing more buffered) — an ask for an ack may then fsync on
	// the reader (AckWhenDurable). Reader goroutine only.
	lastOfBurst bool
	blockedNano atomic.Int64 // time spent in sinks since the last heartbeat
	lastFrameAt atomic.Int64 // unix nanos the reader last finished a frame or a sink call

	outMu     sync.Mutex
	out       chan OutFrame
	outQueued atomic.Int64 // bytes in out or being written; 0: the writer is idle
	w         *wire.Writer // the writer goroutine's, for sendSmall's direct writes; nil when detached
	// writingSince is when the writer began writing the frame it is on (unix
	// nanos; 0 between frames): an agent that does not read its pipe leaves
	// it set. Written by the writer only.
	writingSince atomic.Int64
	outClosed    bool
	writerEnd    chan struct{}
	readerEnd    chan struct{}
	logsEnd      sync.WaitGroup

	restoreQueuedAt atomic.Int64 // unix nanos the restore was queued (SendRestore); 0: none
	// abandoned is closed when the owner starts finishing the instance: events
	// sent after that are dropped instead of blocking a goroutine the owner is
	// waiting for.
	abandoned chan struct{}
	abandonMu sync.Once

	acks acks // wal_ack for ack: true entries (acks.go)
}

// Start begins serving a spawned agent process: its frames, its log lines
// and its exit.
func Start(c Config) *Instance {
	inst := newInstance(c)
	toAgent, fromAgent, logs := c.Proc.Pipes()
	inst.w = wire.NewWriter(toAgent, 0)
	go inst.writeLoop(inst.w, toAgent)
	r := wire.NewReader(fromAgent, c.MaxFrame)
	// A frame no message may have is skipped by its length, never held
	// (issue 33: four 120 MiB frames cost 447 MiB read whole).
	r.DiscardAbove(c.Codec.MaxFrameSizeFor(schema.FromAgent))
	go inst.readLoop(r)
	for i, f := range logs {
		stream := "stderr"
		if i == 1 {
			stream = "stdout"
		}
		inst.logsEnd.Add(1)
		go inst.logLoop(f, stream)
	}
	go func() {
		<-c.Proc.Exited()
		inst.emit(Event{Kind: Exited})
	}()
	return inst
}

func newInstance(c Config) *Instance {
	in := &Instance{
		n: c.N, role: c.Role, proc: c.Proc, started: time.Now(), codec: c.Codec, sink: c.Sink,
		events: c.Events, met: c.Metrics,
		out:       make(chan OutFrame, OutboundQueue),
		writerEnd: make(chan struct{}),
		readerEnd: make(chan struct{}),
		abandoned: make(chan struct{}),
		inBytes:   c.Metrics.FrameBytes.WithLabelValues("in"),
		inFrames:  map[string]prometheus.Counter{},
	}
	pid := 0
	if c.Proc != nil {
		pid = c.Proc.ID()
	}
	in.log = c.Log.With("role", c.Role, "pid", pid, "incarnation", c.N)
	for _, typ := range schema.Types(schema.FromAgent) {
		in.inFrames[typ] = c.Metrics.Frames.WithLabelValues("in", typ)
	}
	return in
}

// NewDetached is an instance with no process, for tests: what it sends
// stays in its outbound queue (Outbound) for the test to read.
func NewDetached(role string, proc agentproc.Proc, codec *schema.Codec, met *observe.Metrics, log *slog.Logger) *Instance {
	in := newInstance(Config{Role: role, Proc: proc, Codec: codec, Metrics: met, Log: log})
	in.writerEnd = nil
	return in
}

// Outbound is the queue of frames for the agent: a detached instance's
// (NewDetached) is read by its test.
func (in *Instance) Outbound() <-chan OutFrame { return in.out }

// OutFrame is a frame queued for the agent: Head is the whole payload, or,
// with a Tail, its first bytes, the Tail's following on the wire.
type OutFrame struct {
	Head []byte
	Tail Tail
}

// Tail is the end of a frame too large to hold (a restore's WAL entries):
// the writer streams it from where it is kept, behind the frame's head.
type Tail interface {
	// Size is how many bytes Stream writes.
	Size() int64
	// Stream writes exactly Size bytes to w, or fails.
	Stream(w io.Writer) error
}

// charge is what the frame counts against OutboundBytes.
func (f OutFrame) charge() int64 { return outCharge(f.Head) }

// Acking reports whether the instance watches its WAL to send wal_acks
// (since an entry asked for one, until the instance finishes).
func (in *Instance) Acking() bool {
	in.acks.mu.Lock()
	defer in.acks.mu.Unlock()
	return in.acks.unwatch != nil
}

// Close stops a detached instance's wal_acks (NewDetached).
func (in *Instance) Close() { in.stopAcks() }

// N is the incarnation number.
func (in *Instance) N() int { return in.n }

// Role is RolePrimary or RoleShadow.
func (in *Instance) Role() string { return in.role }

// Proc is the agent process.
func (in *Instance) Proc() agentproc.Proc { return in.proc }

// Log is the instance's logger (role, pid, incarnation).
func (in *Instance) Log() *slog.Logger { return in.log }

// Started is when the instance was started.
func (in *Instance) Started() time.Time { return in.started }

// Abandoned is closed once the owner has begun finishing the instance: a
// sink waiting for room gives up.
func (in *Instance) Abandoned() <-chan struct{} { return in.abandoned }

// AcceptsCancel reports whether a heartbeat of this process opted in to
// cancel_request (docs/protocol.md).
func (in *Instance) AcceptsCancel() bool { return in.acceptsCancel.Load() }

// FirstHeartbeatAt is when the first heartbeat arrived (zero: none yet).
func (in *Instance) FirstHeartbeatAt() time.Time {
	if n := in.firstHBAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// LastHeartbeat is when the last heartbeat arrived (zero: none yet).
func (in *Instance) LastHeartbeat() time.Time {
	if n := in.lastHeartbeat.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// OutQueued is the bytes queued for the agent and not yet written.
func (in *Instance) OutQueued() int64 { return in.outQueued.Load() }

// RestoreQueuedAt is when SendRestore queued the restore (zero: none).
func (in *Instance) RestoreQueuedAt() time.Time {
	if n := in.restoreQueuedAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// SendRestore queues a restore frame, encoded — head, followed on the wire
// by tail when it is not nil (the WAL entries of a large restore, streamed
// from the log) — and counts it. It reports false when the queue refused
// it.
func (in *Instance) SendRestore(head []byte, tail Tail) bool {
	if !in.send(OutFrame{Head: head, Tail: tail}, 1) {
		return false
	}
	size := int64(len(head))
	if tail != nil {
		size += tail.Size()
	}
	in.countOut(schema.TypeRestore, size)
	in.restoreQueuedAt.Store(time.Now().UnixNano())
	return true
}

// emit hands an event to the owner, or drops it once the owner has abandoned
// this instance.
func (in *Instance) emit(ev Event) {
	ev.Inst = in
	select {
	case in.events <- ev:
	case <-in.abandoned:
	}
}

// Send queues an encoded frame for the agent without blocking. It reports
// false when the instance is gone or its queue is full (the frame is
// refused and counted; the agent is not blamed for it).
func (in *Instance) Send(frame []byte) bool { return in.send(OutFrame{Head: frame}, 1) }

// send queues frame when the queue, this frame included, stays within
// 1/share of its bounds.
func (in *Instance) send(frame OutFrame, share int) bool {
	in.outMu.Lock()
	defer in.outMu.Unlock()
	if in.outClosed {
		return false
	}
	n := frame.charge()
	if q := in.outQueued.Load(); q+n > OutboundBytes/int64(share) || len(in.out) >= OutboundQueue/share {
		in.met.OutboundDropped.Inc()
		return false
	}
	select {
	case in.out <- frame:
		in.outQueued.Add(n)
		return true
	default:
		in.met.OutboundDropped.Inc()
		return false
	}
}

// SendRequest queues an encoded process_request, within the requests' share
// of the queue (RequestShare). false: the queue is too full for another
// request — the caller answers 503 with Retry-After, and the agent's
// acknowledgements still have room.
func (in *Instance) SendRequest(frame []byte) bool {
	if !in.send(OutFrame{Head: frame}, RequestShare) {
		return false
	}
	in.countOut(schema.TypeProcessRequest, int64(len(frame)))
	return true
}

// WriteStalled is how long the writer has been blocked on one frame: the
// agent has not read its pipe for that long while a frame waited (0: the
// writer is idle or making progress).
func (in *Instance) WriteStalled(now time.Time) time.Duration {
	if n := in.writingSince.Load(); n != 0 {
		return max(now.Sub(time.Unix(0, n)), 0)
	}
	return 0
}

// sendMsg encodes and queues a message.
func (in *Instance) SendMsg(m schema.Message) bool {
	b, err := in.codec.Encode(m)
	if err != nil {
		in.log.Error("cannot encode message for the agent", "type", m.MessageType(), "err", err)
		return false
	}
	return in.SendFrame(m.MessageType(), b)
}

// sendSmall sends a small encoded frame of type typ: written into the pipe
// at once by the calling goroutine when the writer is idle and the pipe has
// room (it never blocks), else queued like SendFrame. The WAL's syncer sends
// wal_acks this way, without waking the writer goroutine (acks.go).
func (in *Instance) sendSmall(typ string, b []byte) bool {
	in.outMu.Lock()
	direct := in.w != nil && !in.outClosed && in.outQueued.Load() == 0 && in.w.TryWriteFrame(b)
	in.outMu.Unlock()
	if !direct {
		return in.SendFrame(typ, b)
	}
	in.countOut(typ, int64(len(b)))
	return true
}

// sendFrame queues a message of type typ already encoded, and counts it.
func (in *Instance) SendFrame(typ string, b []byte) bool {
	if !in.Send(b) {
		return false
	}
	in.countOut(typ, int64(len(b)))
	return true
}

// countOut counts a frame of size bytes queued for the agent.
func (in *Instance) countOut(typ string, size int64) {
	in.met.Frames.WithLabelValues("out", typ).Inc()
	in.met.FrameBytes.WithLabelValues("out").Add(float64(size))
}

// closeOutbound stops the writer after it has written what is queued (or
// failed to: the pipe may be broken).
func (in *Instance) closeOutbound() {
	in.outMu.Lock()
	defer in.outMu.Unlock()
	if !in.outClosed {
		in.outClosed = true
		close(in.out)
	}
}

// writeLoop writes queued frames to the agent's input, pipe being the
// underlying writer of w.
func (in *Instance) writeLoop(w *wire.Writer, pipe io.Writer) {
	defer close(in.writerEnd)
	broken := false
	for frame := range in.out {
		if broken {
			in.outQueued.Add(-frame.charge())
			continue
		}
		in.writingSince.Store(time.Now().UnixNano())
		var err error
		if frame.Tail == nil {
			err = w.WriteFrame(frame.Head)
		} else {
			err = w.WriteFrameStream(frame.Head, frame.Tail.Size(), frame.Tail.Stream)
		}
		in.writingSince.Store(0)
		// Counted until written: sendSmall writes directly only when
		// nothing is queued or being written, so frames keep their order.
		in.outQueued.Add(-frame.charge())
		if err != nil {
			// EPIPE or closed: the agent is gone; its exit is handled
			// elsewhere. A streamed frame that could not be read to its end
			// is cut short: its input is closed so that it sees the cut
			// rather than wait for the rest.
			broken = true
			if frame.Tail != nil {
				in.log.Error("a streamed frame to the agent was cut short; closing its input (it will see the end of its input, and be restarted)", "err", err)
				if c, ok := pipe.(io.Closer); ok {
					_ = c.Close()
				}
				continue
			}
			in.log.Debug("writing to the agent failed", "err", err)
		}
	}
}

// StreamSink is a Sink that takes a checkpoint too large to hold as it
// arrives: its data is written, as it is read from the pipe, to the writer
// StageCheckpoint returns (a checkpoint compressed into a temporary file),
// before the frame is known to be valid. The reader then calls exactly one
// of CheckpointStaged (the frame was a valid checkpoint: store and
// acknowledge it) or StageAborted (it was not, or the pipe broke: throw the
// bytes away). A frame above the codec's StreamAbove can only be a
// checkpoint.
//
// Time in StageCheckpoint and in the writer's Write is our storage's
// (HeartbeatAge leaves it out); the time between the writes, waiting for
// the agent's next bytes, is the agent's.
type StreamSink interface {
	StageCheckpoint(in *Instance) (io.Writer, error)
	CheckpointStaged(in *Instance, w io.Writer, cp *schema.Checkpoint, storeErr error, arrived time.Time)
	StageAborted(in *Instance, w io.Writer)
}

// readStreamed reads a frame too large to hold (a checkpoint) from body:
// decoded as it comes, its data streamed to the sink. It reports false when
// the stream broke.
func (in *Instance) readStreamed(body *wire.FrameBody) bool {
	ss, ok := in.sink.(StreamSink)
	if !ok {
		payload, err := io.ReadAll(body)
		if err != nil {
			in.emit(Event{Kind: StreamEnded, Err: err})
			return false
		}
		in.handle(payload)
		return true
	}
	// Opening the staging file and compressing and writing the data as it
	// comes is our storage's time, not the agent's (as a sink's is); the
	// time between the writes, waiting for the agent's next bytes, is the
	// agent's: an agent that stops mid-frame ages (HeartbeatAge), and once
	// it has exited the drain timeout applies (Finish).
	arrived := time.Now()
	in.inBytes.Add(float64(body.Size()))
	var staged io.Writer
	msg, streamed, err := in.codec.DecodeCheckpointStream(body, body.Size(), func() (io.Writer, error) {
		start := in.sinkBegin()
		w, err := ss.StageCheckpoint(in)
		in.sinkEnd(start)
		staged = w
		if err != nil {
			return nil, err
		}
		return &sinkWriter{in: in, w: w}, nil
	})
	// Handing the staged file back (answered, or removed) is our storage's
	// time too: on a frozen disk an unlink blocks.
	abort := func() {
		start := in.sinkBegin()
		ss.StageAborted(in, staged)
		in.sinkEnd(start)
	}
	var storeErr *schema.StoreError
	cp, isCkpt := msg.(*schema.Checkpoint)
	switch {
	case errors.As(err, &storeErr) && streamed:
		// Valid, not stored: the sink answers CHECKPOINT_FAILED.
		start := in.sinkBegin()
		ss.CheckpointStaged(in, staged, nil, storeErr.Err, arrived)
		in.sinkEnd(start)
		return true
	case err != nil && !errors.Is(err, schema.ErrInvalidMessage):
		if staged != nil {
			abort()
		}
		in.emit(Event{Kind: StreamEnded, Err: err})
		return false
	case err != nil:
		if staged != nil {
			abort()
		}
		in.sink.Invalid(in, err)
		return true
	case !streamed:
		if staged != nil {
			abort()
		}
		in.dispatch(msg)
		return true
	}
	if c := in.inFrames[schema.TypeCheckpoint]; c != nil {
		c.Inc()
	}
	if !isCkpt { // unreachable: a streamed message is a checkpoint
		abort()
		return true
	}
	in.noteVersion(cp)
	wait := in.sinkBegin()
	ss.CheckpointStaged(in, staged, cp, nil, arrived)
	in.sinkEnd(wait)
	return true
}

func (in *Instance) readLoop(r *wire.Reader) {
	defer close(in.readerEnd)
	streamAbove := in.codec.StreamAbove()
	for {
		payload, body, err := r.ReadFrameOrBody(streamAbove)
		if body != nil {
			if !in.readStreamed(body) {
				return
			}
			continue
		}
		var skipped *wire.DiscardedError
		if errors.As(err, &skipped) {
			in.inBytes.Add(float64(skipped.Size))
			in.sink.Invalid(in, schema.FrameTooLarge(skipped.Size, skipped.Limit))
			continue
		}
		if err != nil {
			in.emit(Event{Kind: StreamEnded, Err: err})
			return
		}
		in.lastOfBurst = r.Buffered() == 0
		in.handle(payload)
	}
}

// handle decodes one frame's payload and hands the message on.
func (in *Instance) handle(payload []byte) {
	in.inBytes.Add(float64(len(payload)))
	msg, err := in.codec.Decode(schema.FromAgent, payload)
	if err != nil {
		in.sink.Invalid(in, err)
		return
	}
	in.dispatch(msg)
}

// noteVersion records the protocol version msg was sent with.
func (in *Instance) noteVersion(msg schema.Message) {
	if v := int32(msg.Head().Version); v > in.version.Load() {
		in.version.Store(v)
		in.sink.VersionSeen(in, v)
	}
}

// dispatch hands a decoded message to the sink (or the owner).
func (in *Instance) dispatch(msg schema.Message) {
	if c := in.inFrames[msg.MessageType()]; c != nil {
		c.Inc()
	}
	in.noteVersion(msg)
	switch m := msg.(type) {
	case *schema.Heartbeat:
		now := time.Now().UnixNano()
		in.blockedNano.Store(0)
		in.lastFrameAt.Store(now)
		if !in.acceptsCancel.Load() && slices.Contains(m.Accepts, schema.TypeCancelRequest) {
			in.acceptsCancel.Store(true)
		}
		if in.lastHeartbeat.Swap(now) == 0 {
			in.firstHBAt.Store(now)
			in.emit(Event{Kind: FirstHeartbeat})
		}
	case *schema.WALEntry:
		start := in.sinkBegin()
		in.sink.AppendWAL(in, []schema.WALRecord{m.Entry}, m.Ack)
		in.sinkEnd(start)
	case *schema.WALBatch:
		start := in.sinkBegin()
		in.sink.AppendWAL(in, m.Entries, m.Ack)
		in.sinkEnd(start)
	case *schema.RequestResult:
		in.sink.RequestResult(in, m)
	case *schema.Checkpoint:
		start := in.sinkBegin()
		in.sink.Checkpoint(in, m, start)
		in.sinkEnd(start)
	case *schema.Metrics:
		in.sink.AgentMetrics(in, m)
	case *schema.Error:
		in.sink.AgentError(in, m)
	case *schema.EvolutionIntent:
		in.emit(Event{Kind: EvolutionIntent, Msg: m})
	}
}
