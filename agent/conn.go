package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// Errors returned by a [Conn]. Callers branch on them with errors.Is.
var (
	// ErrSupervisorGone: the supervisor closed its end of the pipe between
	// two frames. An agent should exit when it sees it.
	ErrSupervisorGone = errors.New("agent: supervisor closed the connection")
	// ErrShutdown: the supervisor sent shutdown and the Shutdown handler has
	// returned. The agent should exit 0.
	ErrShutdown = errors.New("agent: supervisor requested shutdown")
	// ErrClosed: the Conn was closed by its owner.
	ErrClosed = errors.New("agent: connection closed")
	// ErrNotSupervised: Connect was called in a process the supervisor did not
	// start (stdin is a terminal and no SUPERVISOR_* variables are set).
	ErrNotSupervised = errors.New("agent: not started by a supervisor")
	// ErrTransport: SUPERVISOR_TRANSPORT names a transport this package does
	// not know, or its file descriptors are not open.
	ErrTransport = errors.New("agent: unusable transport")
	// ErrBadMessage: a Send method was asked to send something the supervisor
	// would reject (sequence 0, params that are not a map, an empty batch...).
	// Nothing was written.
	ErrBadMessage = errors.New("agent: message would be invalid")
	// ErrCheckpointFailed: the supervisor answered a checkpoint with an error
	// of code CHECKPOINT_FAILED instead of an acknowledgement.
	ErrCheckpointFailed = errors.New("agent: supervisor could not store the checkpoint")
	// ErrMessagesInUse: Receive, Run or AwaitCheckpointAck was called on a
	// Conn whose messages go to the channel [Conn.Messages] returned.
	ErrMessagesInUse = errors.New("agent: messages are received through Conn.Messages")
)

// Error codes this package sends to the supervisor in `error` messages.
const (
	CodeRestoreFailed   = "RESTORE_FAILED"    // the Restore handler returned an error
	CodeHotReloadFailed = "HOT_RELOAD_FAILED" // the HotReload handler returned an error
)

// Options tune a [Conn]. The zero value is ready to use.
type Options struct {
	// Version is the protocol version the agent speaks: 1 (the seed's schema)
	// or 2 (adds compression). Default 2. The Conn sends at most the version
	// the supervisor announced in SUPERVISOR_PROTOCOL_VERSION.
	Version int
	// MaxFrameSize bounds frames in both directions. Default
	// wire.DefaultMaxFrameSize (128 MiB).
	MaxFrameSize int
	// Logger receives the Conn's own diagnostics. Default: text to stderr,
	// which the supervisor captures line by line.
	Logger *slog.Logger
	// ExtraWALOperations lists WAL operation names beyond memory_add,
	// tool_register and state_update that incoming restores may carry
	// (the supervisor's --wal-operations).
	ExtraWALOperations []string
}

// Conn is the agent's connection to its supervisor.
//
// Sends are safe for concurrent use. Messages are received in one of two
// ways, chosen by the agent once: from the channel [Conn.Messages] returns,
// by an agent with its own select loop, or by calling [Conn.Receive],
// [Conn.Run] and [Conn.AwaitCheckpointAck], one goroutine at a time (the one
// exception: AwaitCheckpointAck called from inside a handler that Run is
// running, which is how an agent waits for the ack of its final checkpoint).
//
// A Conn owns one goroutine that reads and decodes frames ahead of the
// receiver (up to 64 MiB of them), so that an agent waiting in [Conn.Log]
// never stops the wal_ack it waits for from being read. It ends when the
// input returns an error: the supervisor closed its end, or [Conn.Close]
// closed the input. With [Conn.Messages] it owns a second one, which hands
// what the first read to the channel and ends with it (or at Close).
type Conn struct {
	cfg     Config
	version int
	log     *slog.Logger
	codec   *schema.Codec

	w       io.Writer
	fw      *wire.Writer
	wmu     sync.Mutex // orders WriteRaw against framed writes
	fr      *wire.Reader
	closers []io.Closer

	startReader sync.Once
	readerDone  chan struct{}
	readErr     error // written by the reader before it closes readerDone

	// The reader queues what it reads instead of handing it over one at a
	// time, so that it keeps reading while a handler waits for a wal_ack
	// (which the reader delivers to durable directly). qbytes bounds it.
	qmu    sync.Mutex
	queue  []received
	qbytes int
	qready chan struct{} // a message was queued (capacity 1)
	qspace chan struct{} // a message was taken (capacity 1)

	durable durability // wal_ack waiters (durable.go)

	// Requests (requests.go): the highest sequence sent or restored, the
	// step table, and the requests being handled (for cancel_request).
	lastSeq atomic.Uint64
	steps   stepTable
	reqs    inflight

	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error

	rmu     sync.Mutex       // one receiver at a time
	pending []schema.Message // read by AwaitCheckpointAck, not yet received

	// Messages: msgs is fed by the pump goroutine, started by the first
	// call; msgsErr is written by the pump before it closes msgsDone and
	// then msgs.
	startPump sync.Once
	pumping   atomic.Bool
	msgs      chan schema.Message
	msgsDone  chan struct{}
	msgsErr   error
}

type received struct {
	msg  schema.Message
	err  error
	size int // frame bytes, counted against maxQueuedBytes
}

// maxQueuedBytes bounds the frames read ahead of the receiver; the reader
// waits beyond it (one frame is always accepted, whatever its size).
const maxQueuedBytes = 64 << 20

// Connect connects to the supervisor that started this process, using the
// transport named by SUPERVISOR_TRANSPORT: stdin/stdout for "stdio", fds 3
// and 4 for "fd". It returns [ErrNotSupervised] when run by hand from a
// terminal, and [ErrTransport] for an unknown transport or closed fds.
func Connect(opts Options) (*Conn, error) {
	cfg := ConfigFromEnv()
	switch cfg.Transport {
	case TransportStdio:
		if _, set := os.LookupEnv(EnvRole); !set {
			if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				return nil, fmt.Errorf("%w: stdin is a terminal; this program is an agent that speaks "+
					"length-prefixed MessagePack and is meant to be started by `supervisor run -- COMMAND`", ErrNotSupervised)
			}
		}
		in, out := pollable(os.Stdin, "supervisor-in"), pollable(os.Stdout, "supervisor-out")
		return newConn(in, out, cfg, opts, []io.Closer{in, out}), nil
	case TransportFD:
		in, err := openFD(3, "supervisor-in")
		if err != nil {
			return nil, err
		}
		out, err := openFD(4, "supervisor-out")
		if err != nil {
			in.Close()
			return nil, err
		}
		return newConn(in, out, cfg, opts, []io.Closer{in, out}), nil
	default:
		return nil, fmt.Errorf("%w: %s=%q; want %q or %q", ErrTransport, EnvTransport, cfg.Transport, TransportStdio, TransportFD)
	}
}

func openFD(fd uintptr, name string) (*os.File, error) {
	// Checked on the raw descriptor: an *os.File made only to look would
	// close it when garbage-collected.
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		return nil, fmt.Errorf("%w: %s=%s but fd %d is not open (%v); start the agent with `supervisor run --stdio=false`",
			ErrTransport, EnvTransport, TransportFD, fd, err)
	}
	_ = syscall.SetNonblock(int(fd), true) // see pollable
	f := os.NewFile(fd, name)
	if f == nil {
		return nil, fmt.Errorf("%w: fd %d is not valid", ErrTransport, fd)
	}
	return f, nil
}

// pollable returns the descriptor of f (os.Stdin or os.Stdout, which live as
// long as the process) as a file that Go's network poller serves: the
// descriptor is switched to non-blocking mode. An inherited pipe
// is in blocking mode, and a goroutine blocked reading it holds an OS thread
// in the read(2) system call; the goroutines it wakes (a Log waiting for its
// wal_ack) then wait for the runtime to notice, tens of microseconds on
// every message. The pipe ends are the agent's own (the supervisor holds the
// other ends), so nothing else sees the change. If the switch fails, f is
// returned as it is.
func pollable(f *os.File, name string) *os.File {
	fd := int(f.Fd()) // Fd puts f in blocking mode; the new file below takes it back out
	if err := syscall.SetNonblock(fd, true); err != nil {
		return f
	}
	return os.NewFile(uintptr(fd), name)
}

// NewConn returns a Conn reading frames from r and writing them to w, for
// tests and custom transports. cfg is used as given (see [ConfigFromEnv]).
// [Conn.Close] closes r and w if they implement io.Closer.
func NewConn(r io.Reader, w io.Writer, cfg Config, opts Options) *Conn {
	var closers []io.Closer
	if c, ok := r.(io.Closer); ok {
		closers = append(closers, c)
	}
	if c, ok := w.(io.Closer); ok && any(w) != any(r) {
		closers = append(closers, c)
	}
	return newConn(r, w, cfg, opts, closers)
}

func newConn(r io.Reader, w io.Writer, cfg Config, opts Options, closers []io.Closer) *Conn {
	if opts.Version <= 0 {
		opts.Version = DefaultProtocolVersion
	}
	version := opts.Version
	if cfg.ProtocolVersion > 0 && cfg.ProtocolVersion < version {
		version = cfg.ProtocolVersion
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = wire.DefaultMaxFrameSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return &Conn{
		cfg:        cfg,
		version:    version,
		log:        opts.Logger,
		codec:      schema.NewCodec(schema.Options{ExtraWALOperations: opts.ExtraWALOperations}),
		w:          w,
		fw:         wire.NewWriter(w, opts.MaxFrameSize),
		fr:         wire.NewReader(r, opts.MaxFrameSize),
		closers:    closers,
		readerDone: make(chan struct{}),
		qready:     make(chan struct{}, 1),
		qspace:     make(chan struct{}, 1),
		closed:     make(chan struct{}),
		msgs:       make(chan schema.Message),
		msgsDone:   make(chan struct{}),
	}
}

// Config returns the configuration the Conn was made with.
func (c *Conn) Config() Config { return c.cfg }

// Version returns the protocol version the Conn sends: the smaller of
// Options.Version and the supervisor's announced version.
func (c *Conn) Version() int { return c.version }

// Close stops receiving and closes the transport. Receivers blocked in
// Receive or Run return [ErrClosed]; later sends fail with ErrClosed. A read
// blocked on a descriptor in blocking mode (a plain stdin pipe) may only end
// when the process exits or the supervisor closes its end. Close may be
// called more than once; later calls return the first call's result.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		for _, cl := range c.closers {
			if err := cl.Close(); err != nil && c.closeErr == nil && !errors.Is(err, os.ErrClosed) {
				c.closeErr = fmt.Errorf("agent: close transport: %w", err)
			}
		}
	})
	return c.closeErr
}

func (c *Conn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// readLoop reads and decodes frames until the input fails. It is started by
// the first receive (or the first Log) and owned by the Conn. wal_ack
// messages go to the durability waiters, never to the receiver.
func (c *Conn) readLoop() {
	defer close(c.readerDone)
	defer func() { c.durable.end(c.readErr) }()
	defer func() { c.reqs.end(c.readErr) }()
	for {
		frame, err := c.fr.ReadFrame()
		if err != nil {
			switch {
			case c.isClosed():
				c.readErr = ErrClosed
			case errors.Is(err, io.EOF):
				c.readErr = ErrSupervisorGone
			default:
				c.readErr = fmt.Errorf("agent: reading frames from the supervisor: %w", err)
			}
			return
		}
		msg, err := c.codec.Decode(schema.ToAgent, frame)
		if err == nil && c.durable.observe(msg) {
			continue
		}
		if err == nil {
			if rerr := c.observeRequests(msg); rerr != nil {
				c.log.Error("the restore's step table could not be rebuilt: completed steps of requests in flight may run again", "err", rerr)
			}
		}
		if !c.enqueue(received{msg: msg, err: err, size: len(frame)}) {
			c.readErr = ErrClosed
			return
		}
	}
}

// enqueue queues a message for the receiver, waiting while the queue is
// over its byte bound; false when the Conn was closed meanwhile.
func (c *Conn) enqueue(r received) bool {
	for {
		c.qmu.Lock()
		if len(c.queue) == 0 || c.qbytes+r.size <= maxQueuedBytes {
			c.queue = append(c.queue, r)
			c.qbytes += r.size
			c.qmu.Unlock()
			select {
			case c.qready <- struct{}{}:
			default:
			}
			return true
		}
		c.qmu.Unlock()
		select {
		case <-c.qspace:
		case <-c.closed:
			return false
		}
	}
}

// dequeue takes the oldest queued message.
func (c *Conn) dequeue() (received, bool) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if len(c.queue) == 0 {
		return received{}, false
	}
	r := c.queue[0]
	c.queue[0] = received{}
	c.queue = c.queue[1:]
	c.qbytes -= r.size
	select {
	case c.qspace <- struct{}{}:
	default:
	}
	return r, true
}

// Receive returns the next message from the supervisor. It returns
// [ErrSupervisorGone] on a clean end of input, an error wrapping the wire
// error for a broken stream (both final: every later call returns the same),
// an error wrapping schema.ErrInvalidMessage for a frame that failed
// validation (not final: the next call reads the next frame), ctx.Err() when
// ctx ends, and [ErrClosed] after Close.
func (c *Conn) Receive(ctx context.Context) (schema.Message, error) {
	if c.pumping.Load() {
		return nil, ErrMessagesInUse
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(c.pending) > 0 {
		m := c.pending[0]
		c.pending[0] = nil
		c.pending = c.pending[1:]
		return m, nil
	}
	return c.receive(ctx)
}

func (c *Conn) receive(ctx context.Context) (schema.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.startReader.Do(func() { go c.readLoop() })
	for {
		if in, ok := c.dequeue(); ok {
			if in.err != nil {
				return nil, fmt.Errorf("agent: the supervisor sent a message that failed validation: %w", in.err)
			}
			return in.msg, nil
		}
		select {
		case <-c.qready:
		case <-c.readerDone:
			if in, ok := c.dequeue(); ok { // what was read before the end comes first
				if in.err != nil {
					return nil, fmt.Errorf("agent: the supervisor sent a message that failed validation: %w", in.err)
				}
				return in.msg, nil
			}
			return nil, c.readErr
		case <-c.closed:
			return nil, ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// AwaitCheckpointAck reads messages until a checkpoint_ack arrives and
// returns it. Other messages read meanwhile are kept, in order, for the next
// Receive or Run. An `error` with code CHECKPOINT_FAILED ends the wait with
// [ErrCheckpointFailed]. Acks arrive in the order the checkpoints were sent.
//
// It may be called from inside a handler run by [Conn.Run] (typically
// Shutdown, after SendCheckpoint), never concurrently with Receive or Run
// from another goroutine.
func (c *Conn) AwaitCheckpointAck(ctx context.Context) (*schema.CheckpointAck, error) {
	if c.pumping.Load() {
		return nil, ErrMessagesInUse
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for i, m := range c.pending {
		if ack, ok, err := ackOrFailure(m); ok {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return ack, err
		}
	}
	for {
		m, err := c.receive(ctx)
		if errors.Is(err, schema.ErrInvalidMessage) {
			c.log.Warn("ignoring an invalid message from the supervisor while waiting for a checkpoint ack", "err", err)
			continue
		}
		if err != nil {
			return nil, err
		}
		if ack, ok, err := ackOrFailure(m); ok {
			return ack, err
		}
		c.pending = append(c.pending, m)
	}
}

func ackOrFailure(m schema.Message) (ack *schema.CheckpointAck, ok bool, err error) {
	switch m := m.(type) {
	case *schema.CheckpointAck:
		return m, true, nil
	case *schema.Error:
		if m.Error.Code == schema.CodeCheckpointFailed {
			return nil, true, fmt.Errorf("%w: %s", ErrCheckpointFailed, m.Error.Message)
		}
	}
	return nil, false, nil
}
