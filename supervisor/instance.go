package supervisor

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// outboundQueue is how many frames may wait for an agent to read them, and
// outboundBytes how many bytes. An agent that lets either fill has stopped
// reading its input and is treated as hung.
const (
	outboundQueue = 4096
	outboundBytes = 8 << 20
)

// outCharge is what a frame counts against outboundBytes: its size, but at
// most a quarter of the bound, so that a large restore (which must be sent
// whole) still leaves room for the acknowledgements behind it. Memory is
// then bounded by outboundBytes plus the restore.
func outCharge(frame []byte) int64 { return min(int64(len(frame)), outboundBytes/4) }

// Role of an agent instance.
const (
	RolePrimary = "primary"
	RoleShadow  = "shadow"
)

type eventKind int

const (
	evFirstHeartbeat  eventKind = iota + 1
	evStreamEnded               // the frame reader returned (err: io.EOF or a framing/read error)
	evExited                    // the process exited (not yet reaped)
	evUnresponsive              // the outbound queue filled up
	evEvolutionIntent           // msg holds the *schema.EvolutionIntent
)

// event is what an instance tells its owner. The owner alone changes
// lifecycle state.
type event struct {
	inst *instance
	kind eventKind
	err  error
	msg  schema.Message
}

// sinks are where an instance's valid messages go. A primary's sinks are the
// supervisor's WAL, checkpoint store and metrics; a shadow's are scratch ones.
type sinks interface {
	appendWAL(inst *instance, recs []schema.WALRecord)
	checkpoint(inst *instance, cp *schema.Checkpoint, arrived time.Time)
	agentMetrics(inst *instance, m *schema.Metrics)
	agentError(inst *instance, m *schema.Error)
	invalid(inst *instance, err error)
}

// instance is one incarnation of an agent: the process, a goroutine reading
// its frames, one writing frames to it, and one per log pipe. All of them end
// when the process is reaped and its pipes are closed.
type instance struct {
	n       int // incarnation number, for logs
	role    string
	proc    *process
	started time.Time
	log     *slog.Logger
	codec   *schema.Codec
	sinks   sinks
	events  chan<- event
	met     *metrics

	// Per-frame counters resolved once (label lookups hash on every call).
	inBytes  prometheus.Counter
	inFrames map[string]prometheus.Counter

	lastHeartbeat atomic.Int64 // unix nanos; 0 before the first
	// startRef is started (unix nanos), moved forward by the time the
	// reader was held up by our storage, like lastHeartbeat; pausedAt is
	// when the current hold-up began (0: none). See pauseLiveness.
	startRef  atomic.Int64
	pausedAt  atomic.Int64
	firstHBAt atomic.Int64
	version   atomic.Int32 // highest protocol version the agent has used

	outMu     sync.Mutex
	out       chan []byte
	outQueued atomic.Int64 // bytes in out, not yet written
	outClosed bool
	writerEnd chan struct{}
	readerEnd chan struct{}
	logsEnd   sync.WaitGroup

	// Owner-only fields.
	restoredFrom   string       // checkpoint id of the restore sent at start
	restoreSentAt  atomic.Int64 // unix nanos when it was queued
	stopReason     string       // why we stopped it, if we did
	stopping       bool
	unresponsiveEv atomic.Bool
	// abandoned is closed when the owner starts finishing the instance: events
	// sent after that are dropped instead of blocking a goroutine the owner is
	// waiting for.
	abandoned chan struct{}
	abandonMu sync.Once
}

func newInstance(n int, role string, proc *process, codec *schema.Codec, maxFrame int, sk sinks, events chan<- event, met *metrics, log *slog.Logger) *instance {
	inst := &instance{
		n: n, role: role, proc: proc, started: time.Now(), codec: codec, sinks: sk,
		events: events, met: met,
		log:       log.With("role", role, "pid", proc.pid, "incarnation", n),
		out:       make(chan []byte, outboundQueue),
		writerEnd: make(chan struct{}),
		readerEnd: make(chan struct{}),
		abandoned: make(chan struct{}),
		inBytes:   met.frameBytes.WithLabelValues("in"),
		inFrames:  map[string]prometheus.Counter{},
	}
	inst.startRef.Store(inst.started.UnixNano())
	for _, typ := range schema.Types(schema.FromAgent) {
		inst.inFrames[typ] = met.frames.WithLabelValues("in", typ)
	}
	go inst.writeLoop(wire.NewWriter(proc.toAgent, 0))
	go inst.readLoop(wire.NewReader(proc.fromAgent, maxFrame))
	for i, f := range proc.logs {
		stream := "stderr"
		if i == 1 {
			stream = "stdout"
		}
		inst.logsEnd.Add(1)
		go inst.logLoop(f, stream)
	}
	go func() {
		<-proc.exited
		inst.emit(event{kind: evExited})
	}()
	return inst
}

// emit hands an event to the owner, or drops it once the owner has abandoned
// this instance.
func (in *instance) emit(ev event) {
	ev.inst = in
	select {
	case in.events <- ev:
	case <-in.abandoned:
	}
}

// send queues an encoded frame for the agent without blocking. It reports
// false when the instance is gone or its queue is full.
func (in *instance) send(frame []byte) bool {
	in.outMu.Lock()
	defer in.outMu.Unlock()
	if in.outClosed {
		return false
	}
	n := outCharge(frame)
	if q := in.outQueued.Load(); q+n > outboundBytes {
		in.met.outboundDropped.Inc()
		if in.unresponsiveEv.CompareAndSwap(false, true) {
			go in.emit(event{kind: evUnresponsive})
		}
		return false
	}
	select {
	case in.out <- frame:
		in.outQueued.Add(n)
		return true
	default:
		in.met.outboundDropped.Inc()
		if in.unresponsiveEv.CompareAndSwap(false, true) {
			go in.emit(event{kind: evUnresponsive})
		}
		return false
	}
}

// sendMsg encodes and queues a message.
func (in *instance) sendMsg(m schema.Message) bool {
	b, err := in.codec.Encode(m)
	if err != nil {
		in.log.Error("cannot encode message for the agent", "type", m.MessageType(), "err", err)
		return false
	}
	return in.sendFrame(m.MessageType(), b)
}

// sendFrame queues a message of type typ already encoded, and counts it.
func (in *instance) sendFrame(typ string, b []byte) bool {
	if !in.send(b) {
		return false
	}
	in.met.frames.WithLabelValues("out", typ).Inc()
	in.met.frameBytes.WithLabelValues("out").Add(float64(len(b)))
	return true
}

// closeOutbound stops the writer after it has written what is queued (or
// failed to: the pipe may be broken).
func (in *instance) closeOutbound() {
	in.outMu.Lock()
	defer in.outMu.Unlock()
	if !in.outClosed {
		in.outClosed = true
		close(in.out)
	}
}

func (in *instance) writeLoop(w *wire.Writer) {
	defer close(in.writerEnd)
	broken := false
	for frame := range in.out {
		in.outQueued.Add(-outCharge(frame))
		if broken {
			continue
		}
		if err := w.WriteFrame(frame); err != nil {
			// EPIPE or closed: the agent is gone; its exit is handled elsewhere.
			in.log.Debug("writing to the agent failed", "err", err)
			broken = true
		}
	}
}

func (in *instance) readLoop(r *wire.Reader) {
	defer close(in.readerEnd)
	for {
		payload, err := r.ReadFrame()
		if err != nil {
			in.emit(event{kind: evStreamEnded, err: err})
			return
		}
		in.inBytes.Add(float64(len(payload)))
		msg, err := in.codec.Decode(schema.FromAgent, payload)
		if err != nil {
			in.sinks.invalid(in, err)
			continue
		}
		if c := in.inFrames[msg.MessageType()]; c != nil {
			c.Inc()
		}
		if v := int32(msg.Head().Version); v > in.version.Load() {
			in.version.Store(v)
		}
		switch m := msg.(type) {
		case *schema.Heartbeat:
			now := time.Now().UnixNano()
			if in.lastHeartbeat.Swap(now) == 0 {
				in.firstHBAt.Store(now)
				in.emit(event{kind: evFirstHeartbeat})
			}
		case *schema.WALEntry:
			in.sinks.appendWAL(in, []schema.WALRecord{m.Entry})
		case *schema.WALBatch:
			in.sinks.appendWAL(in, m.Entries)
		case *schema.Checkpoint:
			in.sinks.checkpoint(in, m, time.Now())
		case *schema.Metrics:
			in.sinks.agentMetrics(in, m)
		case *schema.Error:
			in.sinks.agentError(in, m)
		case *schema.EvolutionIntent:
			in.emit(event{kind: evEvolutionIntent, msg: m})
		}
	}
}

// logLoop copies the agent's log stream line by line into our log. Lines are
// capped so an agent writing without newlines cannot grow our memory.
func (in *instance) logLoop(f *os.File, stream string) {
	defer in.logsEnd.Done()
	const maxLine = 64 << 10
	br := bufio.NewReaderSize(f, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			truncated := errors.Is(err, bufio.ErrBufferFull)
			s := string(trimNewline(line))
			if truncated {
				in.log.Info("agent output", "stream", stream, "line", s, "truncated", true)
			} else {
				in.log.Info("agent output", "stream", stream, "line", s)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				in.log.Debug("agent log stream ended", "stream", stream, "err", err)
			}
			return
		}
	}
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// heartbeatAge returns the time since the last heartbeat, or since the start
// when none has arrived yet, and whether one has.
func (in *instance) heartbeatAge(now time.Time) (time.Duration, bool) {
	if p := in.pausedAt.Load(); p != 0 && p < now.UnixNano() {
		now = time.Unix(0, p) // the clock stands still while we hold the reader up
	}
	last := in.lastHeartbeat.Load()
	if last == 0 {
		return max(0, now.Sub(time.Unix(0, in.startRef.Load()))), false
	}
	return max(0, now.Sub(time.Unix(0, last))), true
}

// pauseLiveness is called by the frame reader before it waits on our own
// storage (a full checkpoint queue); the returned func ends the wait. The
// time in between does not count against the agent: heartbeats it wrote
// meanwhile sit unread in the pipe because of us. Reader goroutine only.
func (in *instance) pauseLiveness() (resume func()) {
	t0 := time.Now().UnixNano()
	in.pausedAt.Store(t0)
	return func() {
		d := time.Now().UnixNano() - t0
		if in.lastHeartbeat.Load() != 0 {
			in.lastHeartbeat.Add(d)
		}
		in.startRef.Add(d)
		in.pausedAt.Store(0)
	}
}

// finish reaps the process and waits for its goroutines: the frame reader is
// given drainTimeout to read what the agent wrote before it died (its WAL
// entries must not be lost), then its pipe is closed.
func (in *instance) finish(drainTimeout time.Duration) *os.ProcessState {
	in.abandonMu.Do(func() { close(in.abandoned) })
	st := in.proc.reap()
	select {
	case <-in.readerEnd:
	case <-time.After(drainTimeout):
		in.log.Warn("agent output still open after the agent exited (a descendant escaped its process group?); closing it")
	}
	in.proc.closeReaders()
	<-in.readerEnd
	in.logsEnd.Wait()
	in.closeOutbound()
	<-in.writerEnd
	return st
}
