package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
)

// ErrNotDurable: the supervisor answered a [Conn.Log] or [Conn.LogBatch]
// with an error instead of a wal_ack (WAL_FULL, WAL_FAILED,
// SEQUENCE_CONFLICT, or INVALID_MESSAGE for a WAL message). The entry must
// not be acted on. The error's text carries the supervisor's code and
// message.
var ErrNotDurable = errors.New("agent: the supervisor did not make the entry durable")

// CodeSequenceConflict is the supervisor's error code for an entry whose
// sequence is at or below the last one logged but whose bytes differ.
const CodeSequenceConflict = "SEQUENCE_CONFLICT"

// RequestError is an error a [Handlers.Request] handler returns to choose
// the code of the request_result's error (a plain error is sent as
// schema.CodeRequestFailed).
type RequestError struct {
	Code    string // e.g. TOOL_FAILED; not empty
	Message string
}

func (e *RequestError) Error() string { return e.Code + ": " + e.Message }

// Log logs one operation in the supervisor's write-ahead log and returns
// once the supervisor reports it durable (it sends the entry with
// ack: true and waits for a wal_ack covering seq). Call it before any side
// effect outside the agent — a message sent, a payment made — so that what
// was done is never missing from the log after a crash. It costs about one
// fsync of the supervisor's disk; concurrent Logs share one (group commit).
//
// seq must be above every sequence sent before. It returns nil once durable,
// an error wrapping [ErrNotDurable] when the supervisor answered with an
// error instead, ctx.Err(), or the connection's end ([ErrSupervisorGone],
// [ErrClosed]). After an error other than ErrNotDurable the entry may or may
// not be durable: logging it again with the same seq and params is safe (the
// supervisor skips an identical replay and acknowledges it).
//
// Log may be called from a handler that [Conn.Run] is running: wal_ack
// messages are taken by the Conn's reader, not by Run.
func (c *Conn) Log(ctx context.Context, op string, params any, seq uint64) error {
	wait, err := c.StartLog(op, params, seq)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// StartLog sends one entry with ack: true, like [Conn.Log], and returns a
// function that waits for its durability (with Log's results). It keeps
// several entries in flight: the caller sends them in sequence order (one
// goroutine, or under its own lock) and may wait for them concurrently.
// Every returned wait function must be called (it releases the waiter).
func (c *Conn) StartLog(op string, params any, seq uint64) (wait func(context.Context) error, err error) {
	rec, err := walRecord(op, params, seq)
	if err != nil {
		return nil, err
	}
	return c.startDurable(&schema.WALEntry{Entry: rec, Ack: true}, seq, seq)
}

// LogBatch is [Conn.Log] for several operations, logged as one unit (all of
// them or none after a crash); it returns once all are durable.
func (c *Conn) LogBatch(ctx context.Context, entries []WALOp) error {
	if len(entries) == 0 {
		return fmt.Errorf("%w: empty WAL batch", ErrBadMessage)
	}
	if limit := schema.DefaultLimits().BatchEntries; len(entries) > limit {
		return fmt.Errorf("%w: WAL batch of %d entries; the supervisor accepts at most %d, split it", ErrBadMessage, len(entries), limit)
	}
	recs := make([]schema.WALRecord, len(entries))
	lo, hi := entries[0].Sequence, entries[0].Sequence
	for i, e := range entries {
		rec, err := walRecord(e.Operation, e.Params, e.Sequence)
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		recs[i] = rec
		lo, hi = min(lo, e.Sequence), max(hi, e.Sequence)
	}
	wait, err := c.startDurable(&schema.WALBatch{Entries: recs, Ack: true}, lo, hi)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// startDurable registers a waiter for [first, last] before sending m, so an
// ack that comes at once is not missed.
func (c *Conn) startDurable(m schema.Message, first, last uint64) (func(context.Context) error, error) {
	c.startReader.Do(func() { go c.readLoop() })
	w := c.durable.wait(first, last)
	if err := c.Send(m); err != nil {
		c.durable.cancel(w)
		return nil, err
	}
	return c.durableWait(w), nil
}

// durableWait returns the function that waits for w's result.
func (c *Conn) durableWait(w *durableWaiter) func(context.Context) error {
	return func(ctx context.Context) error {
		defer c.durable.cancel(w)
		select {
		case err := <-w.done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-c.closed:
			return ErrClosed
		}
	}
}

// durability matches wal_ack and WAL errors from the supervisor to the Log
// calls waiting for them.
type durability struct {
	mu      sync.Mutex
	waiters map[*durableWaiter]struct{}
	ended   error // the reader's end; later waits fail with it at once
}

type durableWaiter struct {
	first, last uint64
	done        chan error // capacity 1; receives exactly one result
}

func (d *durability) wait(first, last uint64) *durableWaiter {
	w := &durableWaiter{first: first, last: last, done: make(chan error, 1)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended != nil {
		w.done <- d.ended
		return w
	}
	if d.waiters == nil {
		d.waiters = map[*durableWaiter]struct{}{}
	}
	d.waiters[w] = struct{}{}
	return w
}

func (d *durability) cancel(w *durableWaiter) {
	d.mu.Lock()
	delete(d.waiters, w)
	d.mu.Unlock()
}

// resolve completes the waiters for which match holds.
func (d *durability) resolve(match func(*durableWaiter) bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.waiters {
		if match(w) {
			w.done <- err
			delete(d.waiters, w)
		}
	}
}

// end fails every waiter, now and later, with the reader's error.
func (d *durability) end(err error) {
	if err == nil {
		err = ErrSupervisorGone
	}
	d.mu.Lock()
	d.ended = err
	d.mu.Unlock()
	d.resolve(func(*durableWaiter) bool { return true }, err)
}

// observe looks at a message from the supervisor on the reader's goroutine.
// A wal_ack completes the waiters it covers and is consumed (true); a WAL
// error fails the waiters it names and is passed on to the receiver too.
func (d *durability) observe(m schema.Message) (consumed bool) {
	switch m := m.(type) {
	case *schema.WALAck:
		d.resolve(func(w *durableWaiter) bool { return w.last <= m.Sequence }, nil)
		return true
	case *schema.Error:
		d.walError(m)
	}
	return false
}

// walError fails the waiters an error names: WAL_FULL, WAL_FAILED and
// SEQUENCE_CONFLICT name their entries in details (first_sequence and
// last_sequence, or sequence); an INVALID_MESSAGE about a WAL message does
// not say which one, so every waiter fails (they may retry: an identical
// replay is acknowledged).
func (d *durability) walError(m *schema.Error) {
	var det struct {
		Type     string `msgpack:"type"`
		First    uint64 `msgpack:"first_sequence"`
		Last     uint64 `msgpack:"last_sequence"`
		Sequence uint64 `msgpack:"sequence"`
	}
	if m.Error.Details != nil {
		_ = msgpack.Unmarshal(m.Error.Details, &det) // walked by the decoder; a mistyped field stays 0
	}
	msg := m.Error.Message
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	err := fmt.Errorf("%w: %s: %s", ErrNotDurable, m.Error.Code, msg)
	switch m.Error.Code {
	case schema.CodeWALFull, schema.CodeWALFailed, CodeSequenceConflict:
		lo, hi := det.First, det.Last
		if lo == 0 && det.Sequence != 0 {
			lo, hi = det.Sequence, det.Sequence
		}
		if lo == 0 {
			d.resolve(func(*durableWaiter) bool { return true }, err)
			return
		}
		d.resolve(func(w *durableWaiter) bool { return w.first <= hi && lo <= w.last }, err)
	case schema.CodeInvalidMessage:
		if det.Type == schema.TypeWALEntry || det.Type == schema.TypeWALBatch {
			d.resolve(func(*durableWaiter) bool { return true }, err)
		}
	}
}

// SendRequestResult answers the process_request requestID with data, which
// must encode to a MessagePack map. For handlers that answer later; a
// [Handlers.Request] handler's return value is sent this way.
func (c *Conn) SendRequestResult(requestID string, data any) error {
	raw, err := encodeMap(data, "request result data")
	if err != nil {
		return err
	}
	return c.Send(&schema.RequestResult{RequestID: requestID, Data: raw})
}

// SendRequestError answers the process_request requestID with an error.
func (c *Conn) SendRequestError(requestID, code, message string) error {
	if code == "" {
		return fmt.Errorf("%w: request error without a code", ErrBadMessage)
	}
	return c.Send(&schema.RequestResult{RequestID: requestID, Error: &schema.ErrorBody{Code: code, Message: message}})
}

// answer runs a Request handler and sends its return value as the
// request_result.
func (c *Conn) answer(m *schema.ProcessRequest, h func(*schema.ProcessRequest) (any, error)) {
	data, err := h(m)
	var serr error
	switch {
	case err != nil:
		code, msg := schema.CodeRequestFailed, err.Error()
		var re *RequestError
		if errors.As(err, &re) && re.Code != "" {
			code, msg = re.Code, re.Message
		}
		serr = c.SendRequestError(m.RequestID, code, msg)
	default:
		if serr = c.SendRequestResult(m.RequestID, data); errors.Is(serr, ErrBadMessage) {
			serr = c.SendRequestError(m.RequestID, schema.CodeRequestFailed, "the answer could not be encoded as a map: "+serr.Error())
		}
	}
	if serr != nil {
		c.log.Warn("could not send the request result", "request_id", m.RequestID, "err", serr)
	}
}
