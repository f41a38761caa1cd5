package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/agent-sidecar/supervisor/schema"
)

// Durable requests, steps and cancellation (docs/protocol.md, "Extensions:
// durable requests, steps and cancellation"). A request accepted by the
// supervisor is delivered until the agent answers it; after a restart the
// agent sees it again with a higher Attempt. A step's result is logged in the
// WAL before Step returns, and a redelivery finds it there: completed steps
// are never run twice.

// The WAL operations of steps. The supervisor accepts them from every agent.
const (
	OpRequestStep = schema.OpRequestStep // params {request_id, index, name, result}
	OpRequestDone = schema.OpRequestDone // params {request_id}
)

// StepsKey is the checkpoint key under which the client keeps the step table
// of the requests not yet answered. [Conn.SendCheckpoint] adds it, and the
// Conn removes it from every restore's snapshot before the agent's code sees
// it.
const StepsKey = "__supervisor_steps__"

// Error codes of the request_result a [Handlers.Handle] handler's error
// becomes (besides a *RequestError's own code and schema.CodeRequestFailed).
const (
	CodeRequestCancelled   = "REQUEST_CANCELLED"     // the handler returned after a cancel_request
	CodeStepMismatch       = "STEP_MISMATCH"         // ErrStepMismatch
	CodeStepResultTooLarge = "STEP_RESULT_TOO_LARGE" // ErrStepResultTooLarge
)

var (
	// ErrRequestCancelled is the cause ([context.Cause]) of a request's
	// context when the supervisor sent cancel_request for it: a caller
	// cancelled the request (DELETE /v1/requests/ID).
	ErrRequestCancelled = errors.New("agent: the request was cancelled")
	// ErrStepMismatch: a redelivered request's handler called its steps in
	// another order than the first time (the step logged at this index has
	// another name). The handler is not deterministic in its steps; the
	// request should fail.
	ErrStepMismatch = errors.New("agent: step does not match the step logged at its index")
	// ErrStepResultTooLarge: a step's result does not fit in one WAL entry
	// (the supervisor's wal_entry limit, 10 KiB by default). Nothing was
	// logged. Store big results elsewhere (a file, an object store) and make
	// the step's result their key.
	ErrStepResultTooLarge = errors.New("agent: step result too large for a WAL entry")
)

// Request is one delivery of a process_request to a [Handlers.Handle]
// handler (or one started with [Conn.StartRequest]).
type Request struct {
	ID   string             // request_id
	Data schema.RequestData // message, context, user_id
	// Attempt is 1 on the first delivery and higher when the request is
	// delivered again after the agent restarted without answering it.
	Attempt int

	conn   *Conn
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	next   uint64 // index of the next step of this delivery
	done   atomic.Bool
}

// StartRequest registers a process_request received by the agent's own loop
// (from [Conn.Messages]) and returns it with its context: the context is
// cancelled when a cancel_request for the request arrives (cause
// [ErrRequestCancelled]), when the connection ends, or when parent ends.
// Answer it with [Request.Answer]. [Conn.Run] does this itself for a
// [Handlers.Handle] handler.
func (c *Conn) StartRequest(parent context.Context, m *schema.ProcessRequest) (*Request, context.Context) {
	ctx, cancel := context.WithCancelCause(parent)
	r := &Request{ID: m.RequestID, Data: m.Data, Attempt: int(max(m.Attempt, 1)), conn: c, ctx: ctx, cancel: cancel}
	c.reqs.start(r)
	return r, ctx
}

// Answer sends the request's request_result: data (which must encode to a
// map) when err is nil, else an error with the code of a *RequestError,
// CodeRequestCancelled after a cancellation, CodeStepMismatch,
// CodeStepResultTooLarge, or schema.CodeRequestFailed. When steps were
// logged for the request, it then logs request_done, so their results may
// be forgotten: after the answer, never before (docs/protocol.md: the
// supervisor holds request_done until the answer is journaled, so a restart
// never redelivers a request whose steps are gone). Only the first call
// sends anything.
func (r *Request) Answer(data any, err error) error {
	if r.done.Swap(true) {
		return nil
	}
	c := r.conn
	defer c.reqs.finish(r)
	serr := r.sendAnswer(data, err)
	if serr == nil {
		if derr := c.stepsDone(r.ID); derr != nil {
			c.log.Warn("could not log request_done", "request_id", r.ID, "err", derr)
		}
	}
	return serr
}

// sendAnswer sends the request_result of Answer.
func (r *Request) sendAnswer(data any, err error) error {
	c := r.conn
	if err == nil {
		serr := c.SendRequestResult(r.ID, data)
		if errors.Is(serr, ErrBadMessage) {
			return c.SendRequestError(r.ID, schema.CodeRequestFailed, "the answer could not be encoded as a map: "+serr.Error())
		}
		return serr
	}
	code, msg := schema.CodeRequestFailed, err.Error()
	var re *RequestError
	switch {
	case errors.As(err, &re) && re.Code != "":
		code, msg = re.Code, re.Message
	case errors.Is(err, ErrStepMismatch):
		code = CodeStepMismatch
	case errors.Is(err, ErrStepResultTooLarge):
		code = CodeStepResultTooLarge
	case errors.Is(context.Cause(r.ctx), ErrRequestCancelled):
		code = CodeRequestCancelled
	}
	return c.SendRequestError(r.ID, code, msg)
}

// Cancelled reports whether a cancel_request arrived for this request.
func (r *Request) Cancelled() bool { return errors.Is(context.Cause(r.ctx), ErrRequestCancelled) }

// Step runs one step of the request: a unit of work whose result must not be
// computed twice (an LLM call, a tool call with effects).
//
// Steps are numbered from 0 in the order the handler calls them. If a
// previous delivery of the request completed the step at this index, Step
// returns its logged result without calling fn (an error wrapping
// [ErrStepMismatch] if it was logged under another name). Otherwise it calls
// fn, logs the result (MessagePack-encoded) as a request_step WAL entry with
// ack: true, and returns it once the supervisor reports it durable. An error
// from fn is returned as it is, and nothing is logged: the step runs again
// on a redelivery. A result that does not fit the wal_entry limit is
// [ErrStepResultTooLarge].
//
// When ctx is already cancelled (cancel_request, the connection's end), Step
// returns context.Cause(ctx) without calling fn: the request's remaining
// steps never run. A cancellation while fn runs is fn's to honour (pass ctx
// on); a result fn still returns is logged.
//
// The steps of one request are called one after another (their order is
// their identity), not concurrently. See [Step] for a typed result.
func (r *Request) Step(ctx context.Context, name string, fn func(context.Context) (any, error)) (msgpack.RawMessage, error) {
	raw, _, err := r.step(ctx, name, fn)
	return raw, err
}

// Step is [Request.Step] with a typed result: T must survive a MessagePack
// round trip (exported fields, maps, slices, strings, numbers). A result
// replayed from the log is decoded into T; a fresh one is returned as fn
// gave it.
func Step[T any](ctx context.Context, r *Request, name string, fn func(context.Context) (T, error)) (T, error) {
	var out T
	raw, ran, err := r.step(ctx, name, func(ctx context.Context) (any, error) {
		v, err := fn(ctx)
		out = v
		return v, err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	if ran {
		return out, nil
	}
	if err := msgpack.Unmarshal(raw, &out); err != nil {
		var zero T
		return zero, fmt.Errorf("agent: step %q of request %s: the logged result does not decode into %T: %w", name, r.ID, out, err)
	}
	return out, nil
}

// step returns the result, whether fn ran, and an error.
func (r *Request) step(ctx context.Context, name string, fn func(context.Context) (any, error)) (msgpack.RawMessage, bool, error) {
	r.mu.Lock()
	idx := r.next
	r.next++
	r.mu.Unlock()
	c := r.conn
	if ctx.Err() != nil {
		return nil, false, context.Cause(ctx)
	}
	if rec, ok := c.steps.lookup(r.ID, idx); ok {
		if rec.Name != name {
			return nil, false, fmt.Errorf("%w: request %s step %d is %q in the log but the handler called %q; make the order of steps depend only on the request",
				ErrStepMismatch, r.ID, idx, rec.Name, name)
		}
		return rec.Result, false, nil
	}
	v, err := fn(ctx)
	if err != nil {
		return nil, true, err
	}
	raw, err := encodeValue(v)
	if err != nil {
		return nil, true, fmt.Errorf("%w: step %q of request %s: encode its result: %w", ErrBadMessage, name, r.ID, err)
	}
	wait, err := c.logStep(r.ID, idx, name, raw)
	if err != nil {
		return nil, true, err
	}
	// The result exists: wait for its durability even if the request was
	// cancelled meanwhile (the wait ends with the connection at the latest).
	if err := wait(context.WithoutCancel(ctx)); err != nil {
		if errors.Is(err, ErrNotDurable) {
			c.steps.forget(r.ID, idx)
		}
		return nil, true, fmt.Errorf("agent: step %q of request %s: %w", name, r.ID, err)
	}
	return raw, true, nil
}

// encodeValue encodes a step's result like the Conn's maps: sorted keys,
// compact integers; a msgpack.RawMessage is used as is.
func encodeValue(v any) (msgpack.RawMessage, error) {
	if raw, ok := v.(msgpack.RawMessage); ok && len(raw) > 0 {
		if err := schema.Unmarshal(raw, new(any)); err != nil {
			return nil, err
		}
		return raw, nil
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return msgpack.RawMessage(buf.Bytes()), nil
}

// ---- sequences

// NextSequence returns the sequence the Conn would give the next entry it
// logs itself: one above every sequence sent through the Conn or restored.
// An agent that uses steps numbers its own entries through [Conn.LogNext],
// which takes the number and sends under one lock; numbering them itself
// beside steps would collide with the steps' entries.
func (c *Conn) NextSequence() uint64 { return c.lastSeq.Load() + 1 }

// LogNext is [Conn.Log] with the sequence chosen by the Conn (the next one,
// see [Conn.NextSequence]); it returns the sequence used.
func (c *Conn) LogNext(ctx context.Context, op string, params any) (uint64, error) {
	c.steps.mu.Lock()
	seq := c.lastSeq.Load() + 1
	wait, err := c.StartLog(op, params, seq)
	c.steps.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return seq, wait(ctx)
}

// sentSequences records the sequences of a WAL message that was sent.
func (c *Conn) sentSequences(m schema.Message) {
	switch m := m.(type) {
	case *schema.WALEntry:
		c.seenSequence(m.Entry.Sequence)
	case *schema.WALBatch:
		for _, e := range m.Entries {
			c.seenSequence(e.Sequence)
		}
	}
}

func (c *Conn) seenSequence(seq uint64) {
	for {
		cur := c.lastSeq.Load()
		if seq <= cur || c.lastSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// ---- the step table

type stepRecord struct {
	Index  uint64             `msgpack:"index"`
	Name   string             `msgpack:"name"`
	Result msgpack.RawMessage `msgpack:"result"`
}

// stepTable holds the logged steps of the requests not yet answered. Its
// lock also orders the frames that change it (request_step, request_done)
// against checkpoints that carry it, so that every step is either in a
// checkpoint or in the WAL after it.
type stepTable struct {
	mu    sync.Mutex
	byReq map[string]map[uint64]stepRecord
}

func (t *stepTable) lookup(id string, idx uint64) (stepRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.byReq[id][idx]
	return rec, ok
}

func (t *stepTable) addLocked(id string, rec stepRecord) {
	if t.byReq == nil {
		t.byReq = map[string]map[uint64]stepRecord{}
	}
	m := t.byReq[id]
	if m == nil {
		m = map[uint64]stepRecord{}
		t.byReq[id] = m
	}
	m[rec.Index] = rec
}

func (t *stepTable) forget(id string, idx uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.byReq[id]; m != nil {
		delete(m, idx)
		if len(m) == 0 {
			delete(t.byReq, id)
		}
	}
}

// encodeLocked returns the table as the value of StepsKey: request id →
// [{index, name, result}] by index; nil when empty.
func (t *stepTable) encodeLocked() ([]byte, error) {
	if len(t.byReq) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(t.byReq))
	for id := range t.byReq {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	b := schema.AppendMapHeader(nil, len(ids))
	for _, id := range ids {
		m := t.byReq[id]
		idxs := make([]uint64, 0, len(m))
		for i := range m {
			idxs = append(idxs, i)
		}
		sort.Slice(idxs, func(i, j int) bool { return idxs[i] < idxs[j] })
		b = schema.AppendStr(b, id)
		b = schema.AppendArrayHeader(b, len(idxs))
		for _, i := range idxs {
			b = appendStepRecord(b, m[i])
		}
	}
	return b, nil
}

func appendStepRecord(b []byte, rec stepRecord) []byte {
	b = schema.AppendMapHeader(b, 3)
	b = schema.AppendStr(b, "index")
	b = schema.AppendUint(b, rec.Index)
	b = schema.AppendStr(b, "name")
	b = schema.AppendStr(b, rec.Name)
	b = schema.AppendStr(b, "result")
	return append(b, rec.Result...)
}

// logStep sends a request_step entry with ack: true under the table's lock:
// the sequence is taken, the entry's size checked, the table updated and
// the frame written in one piece.
func (c *Conn) logStep(id string, idx uint64, name string, result msgpack.RawMessage) (func(context.Context) error, error) {
	params := schema.AppendMapHeader(nil, 4)
	params = schema.AppendStr(params, "request_id")
	params = schema.AppendStr(params, id)
	params = schema.AppendStr(params, "index")
	params = schema.AppendUint(params, idx)
	params = schema.AppendStr(params, "name")
	params = schema.AppendStr(params, name)
	params = schema.AppendStr(params, "result")
	params = append(params, result...)
	limit := c.codec.Limits().WALEntry
	tooLarge := func(size int) error {
		return fmt.Errorf("%w: step %q of request %s has a %d-byte result; a request_step wal_entry must fit the wal_entry limit of %d bytes (10 KiB by default): "+
			"store big results elsewhere (a file, an object store) and return their key from the step", ErrStepResultTooLarge, name, id, size, limit)
	}
	if len(params) > limit {
		return nil, tooLarge(len(result))
	}
	c.startReader.Do(func() { go c.readLoop() })
	t := &c.steps
	t.mu.Lock()
	defer t.mu.Unlock()
	seq := c.lastSeq.Load() + 1
	m := &schema.WALEntry{Entry: schema.WALRecord{Operation: OpRequestStep, Sequence: seq, Params: params}, Ack: true}
	payload, err := c.encode(m)
	if schema.RuleOf(err) == schema.RuleTooLarge {
		return nil, tooLarge(len(result))
	}
	if err != nil {
		return nil, fmt.Errorf("agent: encode %s: %w", m.MessageType(), err)
	}
	w := c.durable.wait(seq, seq)
	t.addLocked(id, stepRecord{Index: idx, Name: name, Result: result})
	if err := c.writeFrame(payload); err != nil {
		c.durable.cancel(w)
		if m := t.byReq[id]; m != nil {
			delete(m, idx)
			if len(m) == 0 {
				delete(t.byReq, id)
			}
		}
		return nil, fmt.Errorf("agent: send %s: %w", m.MessageType(), err)
	}
	c.seenSequence(seq)
	return c.durableWait(w), nil
}

// stepsDone logs request_done (without ack) and drops the request's steps,
// when it has any.
func (c *Conn) stepsDone(id string) error {
	t := &c.steps
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byReq[id]; !ok {
		return nil
	}
	delete(t.byReq, id)
	seq := c.lastSeq.Load() + 1
	params := schema.AppendMapHeader(nil, 1)
	params = schema.AppendStr(params, "request_id")
	params = schema.AppendStr(params, id)
	if err := c.Send(&schema.WALEntry{Entry: schema.WALRecord{Operation: OpRequestDone, Sequence: seq, Params: params}}); err != nil {
		return err
	}
	return nil
}

// checkpointData adds the step table to a checkpoint's data map under
// StepsKey (replacing nothing: the agent's state never holds the key, since
// restores remove it). Called with the table's lock held.
func (t *stepTable) checkpointDataLocked(data msgpack.RawMessage) (msgpack.RawMessage, error) {
	table, err := t.encodeLocked()
	if err != nil || table == nil {
		return data, err
	}
	n, hlen, ok := mapHeader(data)
	if !ok {
		return nil, fmt.Errorf("%w: checkpoint data must be a MessagePack map", ErrBadMessage)
	}
	out := schema.AppendMapHeader(make([]byte, 0, len(data)+len(table)+32), n+1)
	out = append(out, data[hlen:]...)
	out = schema.AppendStr(out, StepsKey)
	return append(out, table...), nil
}

// mapHeader reads a map header: its count and length.
func mapHeader(b []byte) (n, hlen int, ok bool) {
	switch {
	case len(b) == 0:
		return 0, 0, false
	case b[0] >= 0x80 && b[0] <= 0x8f:
		return int(b[0] & 0x0f), 1, true
	case b[0] == 0xde && len(b) >= 3:
		return int(b[1])<<8 | int(b[2]), 3, true
	case b[0] == 0xdf && len(b) >= 5:
		return int(b[1])<<24 | int(b[2])<<16 | int(b[3])<<8 | int(b[4]), 5, true
	}
	return 0, 0, false
}

// restoreLocked rebuilds the table from a restore — the snapshot's StepsKey
// (when there is a checkpoint), then the WAL tail's request_step and
// request_done entries in order — and removes both from the message, so the
// agent's code sees only its own state and entries.
func (t *stepTable) restoreLocked(m *schema.Restore) (maxSeq uint64, err error) {
	t.byReq = nil
	if m.CheckpointID != "" && len(m.Snapshot) > 0 {
		snap, table, found, err := cutKey(m.Snapshot, StepsKey)
		if err != nil {
			return 0, err
		}
		if found {
			var tbl map[string][]stepRecord
			if err := msgpack.Unmarshal(table, &tbl); err != nil {
				return 0, fmt.Errorf("agent: the restore's %s is not a step table: %w", StepsKey, err)
			}
			for id, recs := range tbl {
				for _, rec := range recs {
					t.addLocked(id, rec)
				}
			}
			m.Snapshot = snap
		}
	}
	kept := m.WALEntries[:0:0]
	for i, e := range m.WALEntries {
		var rec struct {
			Operation string             `msgpack:"operation"`
			Sequence  uint64             `msgpack:"sequence"`
			Params    msgpack.RawMessage `msgpack:"params"`
		}
		if err := msgpack.Unmarshal(e, &rec); err != nil {
			return 0, fmt.Errorf("agent: restore WAL entry %d: %w", i, err)
		}
		maxSeq = max(maxSeq, rec.Sequence)
		switch rec.Operation {
		case OpRequestStep:
			var p struct {
				RequestID string             `msgpack:"request_id"`
				Index     uint64             `msgpack:"index"`
				Name      string             `msgpack:"name"`
				Result    msgpack.RawMessage `msgpack:"result"`
			}
			if err := msgpack.Unmarshal(rec.Params, &p); err != nil {
				return 0, fmt.Errorf("agent: restore WAL entry %d (%s, sequence %d): %w", i, rec.Operation, rec.Sequence, err)
			}
			t.addLocked(p.RequestID, stepRecord{Index: p.Index, Name: p.Name, Result: p.Result})
		case OpRequestDone:
			var p struct {
				RequestID string `msgpack:"request_id"`
			}
			if err := msgpack.Unmarshal(rec.Params, &p); err != nil {
				return 0, fmt.Errorf("agent: restore WAL entry %d (%s, sequence %d): %w", i, rec.Operation, rec.Sequence, err)
			}
			delete(t.byReq, p.RequestID)
		default:
			kept = append(kept, e)
		}
	}
	if len(kept) != len(m.WALEntries) {
		m.WALEntries = kept
	}
	return maxSeq, nil
}

// cutKey returns the map b without its top-level key (and the key's value);
// found is false, and b returned unchanged, when the key is absent.
func cutKey(b []byte, key string) (rest, value []byte, found bool, err error) {
	n, hlen, ok := mapHeader(b)
	if !ok {
		return b, nil, false, fmt.Errorf("agent: the restore's snapshot is not a map")
	}
	r := bytes.NewReader(b[hlen:])
	dec := msgpack.NewDecoder(r)
	pos := func() int { return len(b) - r.Len() }
	for range n {
		start := pos()
		c, err := dec.PeekCode()
		if err != nil {
			return b, nil, false, err
		}
		if !msgpcode.IsString(c) {
			// A key that is not a string is not ours: skip it and its value.
			if err := dec.Skip(); err != nil {
				return b, nil, false, err
			}
			if err := dec.Skip(); err != nil {
				return b, nil, false, err
			}
			continue
		}
		k, err := dec.DecodeString()
		if err != nil {
			return b, nil, false, err
		}
		vstart := pos()
		if err := dec.Skip(); err != nil {
			return b, nil, false, err
		}
		if k != key {
			continue
		}
		end := pos()
		out := schema.AppendMapHeader(make([]byte, 0, len(b)-(end-start)), n-1)
		out = append(out, b[hlen:start]...)
		out = append(out, b[end:]...)
		return out, b[vstart:end], true, nil
	}
	return b, nil, false, nil
}

// ---- requests in flight and cancellation

// inflight maps the ids of requests being handled to their cancel
// functions; cancel_request arrives on the reader's goroutine.
type inflight struct {
	mu    sync.Mutex
	reqs  map[string]*Request
	early map[string]struct{} // cancelled before they started (bounded)
	order []string            // early ids, oldest first
	ended error               // the connection's end: later requests start cancelled
}

// maxEarlyCancels bounds the ids of cancel_requests kept for requests not
// yet started (a process_request still queued behind a busy handler).
const maxEarlyCancels = 1024

func (f *inflight) start(r *Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended != nil {
		r.cancel(f.ended)
		return
	}
	if _, ok := f.early[r.ID]; ok {
		delete(f.early, r.ID)
		r.cancel(ErrRequestCancelled)
	}
	if f.reqs == nil {
		f.reqs = map[string]*Request{}
	}
	f.reqs[r.ID] = r
}

func (f *inflight) finish(r *Request) {
	f.mu.Lock()
	if f.reqs[r.ID] == r {
		delete(f.reqs, r.ID)
	}
	f.mu.Unlock()
	r.cancel(context.Canceled)
}

// cancelRequest cancels the request id if it is being handled, or
// remembers the id for when it starts.
func (f *inflight) cancelRequest(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.reqs[id]; ok {
		r.cancel(ErrRequestCancelled)
		return
	}
	if f.early == nil {
		f.early = map[string]struct{}{}
	}
	if _, ok := f.early[id]; ok {
		return
	}
	if len(f.order) >= maxEarlyCancels {
		delete(f.early, f.order[0])
		f.order = f.order[1:]
	}
	f.early[id] = struct{}{}
	f.order = append(f.order, id)
}

// end cancels every request in flight, and every later one, with err.
func (f *inflight) end(err error) {
	if err == nil {
		err = ErrSupervisorGone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = err
	for _, r := range f.reqs {
		r.cancel(err)
	}
}

// observeRequests looks at a message on the reader's goroutine: a
// cancel_request cancels its request's context at once (and is passed on),
// a restore rebuilds the step table and loses the client's own keys and
// entries before the agent's code sees it.
func (c *Conn) observeRequests(m schema.Message) error {
	switch m := m.(type) {
	case *schema.CancelRequest:
		c.reqs.cancelRequest(m.RequestID)
	case *schema.Restore:
		c.steps.mu.Lock()
		maxSeq, err := c.steps.restoreLocked(m)
		c.steps.mu.Unlock()
		c.seenSequence(max(maxSeq, m.LastSequence))
		return err
	}
	return nil
}
