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
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
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
	evFinished                  // drained and reaped after evExited (status set)
)

// event is what an instance tells its owner. The owner alone changes
// lifecycle state.
type event struct {
	inst   *instance
	kind   eventKind
	err    error
	msg    schema.Message
	status agentproc.ExitStatus // evFinished
}

// instance is one incarnation of an agent: the process, a goroutine reading
// its frames, one writing frames to it, and one per log pipe. All of them end
// when the process is reaped and its pipes are closed.
type instance struct {
	n       int // incarnation number, for logs
	role    string
	proc    agentproc.Proc
	started time.Time
	log     *slog.Logger
	codec   *schema.Codec
	sinks   *sinks
	events  chan<- event
	met     *observe.Metrics

	// Per-frame counters resolved once (label lookups hash on every call).
	inBytes  prometheus.Counter
	inFrames map[string]prometheus.Counter

	lastHeartbeat atomic.Int64 // unix nanos; 0 before the first
	firstHBAt     atomic.Int64
	version       atomic.Int32 // highest protocol version the agent has used

	// Liveness measures the agent, not us (SPEC §3). The reader records how
	// long it spends inside our sinks (the WAL append, the checkpoint queue)
	// — time the agent may be blocked on our storage — and heartbeatAge
	// leaves it out. Written by the reader only.
	sinkSince   atomic.Int64 // unix nanos the current sink call began; 0 outside one
	blockedNano atomic.Int64 // time spent in sinks since the last heartbeat
	lastFrameAt atomic.Int64 // unix nanos the reader last finished a frame

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
	draining       bool // exited; being drained and reaped (drainInstance)
	unresponsiveEv atomic.Bool
	// abandoned is closed when the owner starts finishing the instance: events
	// sent after that are dropped instead of blocking a goroutine the owner is
	// waiting for.
	abandoned chan struct{}
	abandonMu sync.Once

	acks acks // wal_ack for ack: true entries (acks.go)
}

func newInstance(n int, role string, proc agentproc.Proc, codec *schema.Codec, maxFrame int, sk *sinks, events chan<- event, met *observe.Metrics, log *slog.Logger) *instance {
	inst := &instance{
		n: n, role: role, proc: proc, started: time.Now(), codec: codec, sinks: sk,
		events: events, met: met,
		log:       log.With("role", role, "pid", proc.ID(), "incarnation", n),
		out:       make(chan []byte, outboundQueue),
		writerEnd: make(chan struct{}),
		readerEnd: make(chan struct{}),
		abandoned: make(chan struct{}),
		inBytes:   met.FrameBytes.WithLabelValues("in"),
		inFrames:  map[string]prometheus.Counter{},
	}
	for _, typ := range schema.Types(schema.FromAgent) {
		inst.inFrames[typ] = met.Frames.WithLabelValues("in", typ)
	}
	toAgent, fromAgent, logs := proc.Pipes()
	go inst.writeLoop(wire.NewWriter(toAgent, 0))
	go inst.readLoop(wire.NewReader(fromAgent, maxFrame))
	for i, f := range logs {
		stream := "stderr"
		if i == 1 {
			stream = "stdout"
		}
		inst.logsEnd.Add(1)
		go inst.logLoop(f, stream)
	}
	go func() {
		<-proc.Exited()
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
		in.met.OutboundDropped.Inc()
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
		in.met.OutboundDropped.Inc()
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
	in.met.Frames.WithLabelValues("out", typ).Inc()
	in.met.FrameBytes.WithLabelValues("out").Add(float64(len(b)))
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
			in.sinks.versionSeen(in, v)
		}
		switch m := msg.(type) {
		case *schema.Heartbeat:
			now := time.Now().UnixNano()
			in.blockedNano.Store(0)
			in.lastFrameAt.Store(now)
			if in.lastHeartbeat.Swap(now) == 0 {
				in.firstHBAt.Store(now)
				in.emit(event{kind: evFirstHeartbeat})
			}
		case *schema.WALEntry:
			start := in.sinkBegin()
			in.sinks.appendWAL(in, []schema.WALRecord{m.Entry}, m.Ack)
			in.sinkEnd(start)
		case *schema.WALBatch:
			start := in.sinkBegin()
			in.sinks.appendWAL(in, m.Entries, m.Ack)
			in.sinkEnd(start)
		case *schema.RequestResult:
			in.sinks.requestResult(in, m)
		case *schema.Checkpoint:
			start := in.sinkBegin()
			in.sinks.checkpoint(in, m, start)
			in.sinkEnd(start)
		case *schema.Metrics:
			in.sinks.agentMetrics(in, m)
		case *schema.Error:
			in.sinks.agentError(in, m)
		case *schema.EvolutionIntent:
			in.emit(event{kind: evEvolutionIntent, msg: m})
		}
	}
}

// sinkBegin and sinkEnd bracket a call into our storage that may block on
// our disk (a WAL append, the checkpoint queue): the time between them is
// recorded as not the agent's (see heartbeatAge). Reader goroutine only; no
// allocation on the frame path.
func (in *instance) sinkBegin() time.Time {
	start := time.Now()
	in.sinkSince.Store(start.UnixNano())
	return start
}

func (in *instance) sinkEnd(start time.Time) {
	end := time.Now()
	in.sinkSince.Store(0)
	in.blockedNano.Add(int64(end.Sub(start)))
	in.lastFrameAt.Store(end.UnixNano())
}

// logLoop copies the agent's log stream line by line into our log. Lines are
// capped so an agent writing without newlines cannot grow our memory.
func (in *instance) logLoop(f io.Reader, stream string) {
	defer in.logsEnd.Done()
	const maxLine = 64 << 10
	br := bufio.NewReaderSize(f, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if errors.Is(err, bufio.ErrBufferFull) {
				in.log.Info("agent output", "stream", stream, "line", string(trimNewline(line)), "truncated", true)
			} else {
				// Structured lines (JSON, key=value) become a group, not a
				// quoted string inside our line: agentlog.go.
				in.log.Info("agent output", slog.String("stream", stream), agentLineAttr(trimNewline(line)))
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
// when none has arrived yet, and whether one has — less the time the reader
// spent blocked on our own storage meanwhile (a slow disk is not a hung
// agent).
func (in *instance) heartbeatAge(now time.Time) (time.Duration, bool) {
	since, seen := in.started, false
	if last := in.lastHeartbeat.Load(); last != 0 {
		since, seen = time.Unix(0, last), true
	}
	age := now.Sub(since) - time.Duration(in.blockedNano.Load())
	if s := in.sinkSince.Load(); s != 0 {
		age -= now.Sub(time.Unix(0, s))
	}
	return max(age, 0), seen
}

// finish reaps the process and waits for its goroutines. The frame reader
// reads what the agent wrote before it died to the end, and stores it,
// however long our own storage takes: the agent's WAL entries must not be
// lost. Only when the reader has waited drainTimeout for bytes that do not
// come (the pipe is held open by a descendant that escaped the process
// group) is the pipe closed.
func (in *instance) finish(drainTimeout time.Duration) agentproc.ExitStatus {
	in.abandonMu.Do(func() { close(in.abandoned) })
	st := in.proc.Reap()
	exited := time.Now().UnixNano()
	tick := time.NewTicker(min(drainTimeout/4, 100*time.Millisecond))
	defer tick.Stop()
wait:
	for {
		select {
		case <-in.readerEnd:
			break wait
		case now := <-tick.C:
			if in.sinkSince.Load() != 0 {
				continue // busy storing what the agent wrote: ours to wait for
			}
			idleSince := max(exited, in.lastFrameAt.Load())
			if now.Sub(time.Unix(0, idleSince)) >= drainTimeout {
				in.log.Warn("agent output still open after the agent exited, with nothing more arriving (a descendant escaped its process group?); closing it",
					"waited", drainTimeout)
				break wait
			}
		}
	}
	in.proc.CloseReaders()
	<-in.readerEnd
	in.stopAcks()
	in.logsEnd.Wait()
	in.closeOutbound()
	<-in.writerEnd
	return st
}
