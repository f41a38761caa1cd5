package requests

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/agent-sidecar/supervisor/schema"
)

// Request statuses (GET /v1/requests/ID).
const (
	StatusPending   = "pending"
	StatusAnswered  = "answered"
	StatusFailed    = "failed"
	StatusExpired   = "expired"
	StatusCancelled = "cancelled"
)

// Error codes the supervisor sets on a request.
const (
	CodeExpired = "REQUEST_EXPIRED"
	CodePoison  = "REQUEST_POISON"
)

// Audit kinds of the book's decisions.
const (
	AuditExpired   = "request_expired"
	AuditPoison    = "request_poison"
	AuditCancelled = "request_cancelled"
	AuditDamaged   = "request_journal_damaged"
)

// Errors of the book's operations; the API maps them to status codes.
var (
	ErrUnknown     = errors.New("no such request")
	ErrFull        = errors.New("the request journal is full")
	ErrKeyConflict = errors.New("this Idempotency-Key was used for a different body")
	ErrFinished    = errors.New("the request is already finished")
	ErrDuplicate   = errors.New("the request was already answered")
	ErrClosed      = errors.New("the request book is closed")
)

// Death is one agent death with the request in flight.
type Death struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	Alone  bool      `json:"alone"` // the only request in flight then
}

// Request is one accepted request: what the journal keeps of it.
type Request struct {
	ID        string          `json:"request_id"`
	Key       string          `json:"idempotency_key,omitempty"`
	Digest    string          `json:"body_digest,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Accepted  time.Time       `json:"accepted"`
	Deadline  time.Time       `json:"deadline"`
	Status    string          `json:"status"`
	Attempts  int             `json:"attempts"`
	Deaths    []Death         `json:"deaths,omitempty"`
	Suspect   bool            `json:"suspect,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	Error     *ErrorBody      `json:"error,omitempty"`
	Finished  time.Time       `json:"finished,omitzero"`
	LateData  json.RawMessage `json:"late_data,omitempty"`
	LateError *ErrorBody      `json:"late_error,omitempty"`

	seq     uint64
	durable bool
	ticket  *Ticket
	// final is the journal write of the record that finished the request
	// (answer, cancellation, expiry, setting aside); nil once replayed.
	final    *Ticket
	done     chan struct{}
	inflight int // the agent generation it is in flight to; 0: none
	// sentAttempt: the highest attempt actually sent (Attempts may be one
	// higher: journaled, then refused by a full queue).
	sentAttempt int
	size        int64
}

// Final reports whether the request's status can no longer change.
func (r *Request) Final() bool { return r.Status != StatusPending }

// View is a copy of a request for readers.
type View struct {
	Request
	InFlight bool `json:"in_flight,omitempty"`
}

// Body is the JSON body of POST /v1/requests as the agent gets it.
type Body struct {
	Message string         `json:"message"`
	Context map[string]any `json:"context,omitempty"`
	UserID  string         `json:"user_id,omitempty"`
}

// Agent is the primary as the book delivers to it.
type Agent interface {
	// SendRequest queues a process_request; false: the queue is full
	// (delivery is retried shortly).
	SendRequest(frame []byte) bool
	// SendMsg queues a message (cancel_request).
	SendMsg(m schema.Message) bool
	// AcceptsCancel: a heartbeat of this process carried
	// accepts: ["cancel_request"].
	AcceptsCancel() bool
}

// Config configures a Book.
type Config struct {
	Retention   time.Duration // --request-retention: finished requests are kept this long
	Timeout     time.Duration // --request-timeout: a request not answered by then expires
	MaxBytes    int64         // --request-journal-bytes
	MaxAttempts int           // --request-max-attempts
	// Encode encodes a process_request (the run's codec).
	Encode  func(schema.Message) ([]byte, error)
	Log     *slog.Logger
	Metrics *Metrics
	// Audit records a decision in the audit log.
	Audit func(kind string, fields map[string]any)
	Now   func() time.Time
}

// Book is the state of every request, backed by the journal. Safe for
// concurrent use; it never waits on the disk while holding its lock, and
// the owner's calls (AgentUp, AgentGone, Answer) never wait on an fsync.
type Book struct {
	cfg Config
	j   *Journal

	mu    sync.Mutex
	reqs  map[string]*Request
	keys  map[string]*Request
	order []*Request // durable requests in acceptance order (finished ones are dropped lazily)
	// open: the durable requests not finished, in acceptance order — what
	// a delivery looks through (dueLocked drops the finished ones), so that
	// its cost follows the requests still open, not the retained answers.
	open      []*Request
	seq       uint64
	agent     Agent
	gen       int
	liveBytes int64
	// bodyBytes: the bodies of pending requests, held in memory for their
	// deliveries (MaxPendingBodyBytes). A finished request's body is let go.
	bodyBytes int64
	closed    bool
	// resultBytes: the answers' data held (MaxResultBytes).
	resultBytes int64
	full        bool         // the agent's queue refused a request: retried at the next tick
	ticks       atomic.Int64 // run's timer wake-ups (tests)

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// Journal is the book's journal file (the replica uploads its durable
// bytes).
func (b *Book) Journal() *Journal { return b.j }

// OpenBook opens the journal in dataDir and rebuilds the requests from it.
func OpenBook(dataDir string, cfg Config) (*Book, *Replay, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Audit == nil {
		cfg.Audit = func(string, map[string]any) {}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	j, rp, err := Open(dataDir)
	if err != nil {
		return nil, nil, err
	}
	b := &Book{cfg: cfg, j: j, reqs: map[string]*Request{}, keys: map[string]*Request{},
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
	for _, rec := range rp.Records {
		b.apply(rec)
	}
	for _, r := range b.reqs {
		r.durable = true
		r.inflight = 0
		if r.Status == StatusPending && r.Attempts == 0 {
			r.Attempts = 1 // the accepted record stands for the first delivery
		}
		r.sentAttempt = r.Attempts // a restart delivers the next one
		b.order = append(b.order, r)
	}
	sort.Slice(b.order, func(i, k int) bool { return b.order[i].seq < b.order[k].seq })
	now := cfg.Now()
	kept := b.order[:0]
	for _, r := range b.order {
		if r.Final() && cfg.Retention > 0 && now.Sub(r.Finished) >= cfg.Retention {
			// Forgotten before this start (the journal keeps its records
			// until a compaction): not served again, its Idempotency-Key
			// free, as the sweep would have left it.
			b.removeLocked(r)
			continue
		}
		kept = append(kept, r)
	}
	clear(b.order[len(kept):])
	b.order = kept
	for _, r := range b.order {
		if !r.Final() && len(r.Deaths) >= cfg.MaxAttempts && r.Deaths[len(r.Deaths)-1].Alone {
			// It killed the agent alone as often as --request-max-attempts
			// allows (lowered since, or the record setting it aside lost
			// to a crash): set aside now, never delivered again.
			b.poisonLocked(r, now)
		}
		if !r.Final() {
			b.open = append(b.open, r)
		}
	}
	// The journal holds every answer's data until a compaction, also the
	// data dropped since (and a drop record may have been lost to a crash,
	// or the journal written before drops were journaled): the bound is
	// kept now that the acceptance order is known, as Answer keeps it.
	b.boundResultsLocked(nil)
	var failing atomic.Bool // the last write failed: logged once per run of failures
	j.Start(b.snapshot, func(n int64, err error) {
		if cfg.Metrics != nil {
			cfg.Metrics.journalBytes.Set(float64(j.Size()))
		}
		switch {
		case err != nil && !failing.Swap(true):
			// A waiter (Accept, Cancel) gets its error; the records
			// written lazily — answers, expiries, drops, deaths — have
			// nobody else to say so.
			cfg.Log.Error("REQUEST JOURNAL WRITE FAILED: answers, expiries and cancellations not written are held in memory only, "+
				"and lost if the supervisor stops before the journal is written again (a request whose answer is lost "+
				"is delivered to the agent again after a restart); new requests are refused meanwhile. "+
				"Check the disk holding DATA_DIR/requests (space, errors in dmesg)", "err", err)
		case err == nil && failing.Swap(false):
			// What failed was not retried: a compaction writes the
			// book's whole state, the lost records' effects with it.
			cfg.Log.Info("request journal writes succeed again; rewriting it with what the failed writes held")
			j.Compact()
		}
	})
	if rp.Corruption != nil {
		cfg.Audit(AuditDamaged, map[string]any{"error": rp.Corruption.Error(), "skipped_bytes": rp.SkippedBytes, "set_aside": rp.SetAside, "requests": len(b.reqs)})
	}
	b.wg.Add(1)
	go b.run()
	return b, rp, nil
}

// apply replays one record (idempotently: a record also reflected in a
// compacted state changes nothing).
func (b *Book) apply(rec *Record) {
	at := time.Unix(0, rec.At)
	if rec.Kind == KindState && rec.State != nil {
		r := rec.State
		if old := b.reqs[r.ID]; old != nil {
			b.removeLocked(old)
		}
		b.addLocked(r)
		if r.Final() {
			close(r.done)
		}
		return
	}
	if rec.Kind == KindAccepted {
		if b.reqs[rec.ID] != nil {
			return
		}
		b.addLocked(&Request{ID: rec.ID, Key: rec.Key, Digest: rec.Digest, Body: rec.Body, Accepted: at,
			Deadline: time.Unix(0, rec.Deadline), Status: StatusPending})
		return
	}
	r := b.reqs[rec.ID]
	if r == nil {
		return // its request was compacted away, or lost to damage
	}
	switch rec.Kind {
	case KindDelivered:
		r.Attempts = max(r.Attempts, rec.Attempt)
	case KindDeath:
		if !slices.ContainsFunc(r.Deaths, func(d Death) bool { return d.At.Equal(at) }) {
			r.Deaths = append(r.Deaths, Death{At: at, Reason: rec.Reason, Alone: rec.Attempt == 1})
			b.chargeLocked(r, deathBytes)
			r.Suspect = r.Status == StatusPending
		}
	case KindAnswered:
		// An answer was delivered first: the first delivery is journaled
		// only by the accepted record, so replay would say 0 attempts.
		r.Attempts = max(r.Attempts, 1)
		b.answerLocked(r, rec.Data, rec.Error, at)
	case KindDropped:
		if r.Status == StatusAnswered && r.Data != nil {
			b.dropLocked(r)
		} else if r.LateData != nil {
			b.dropLateLocked(r)
		}
	case KindExpired, KindCancelled, KindFailed:
		if r.Final() {
			return
		}
		r.Status, r.Finished, r.Error, r.Suspect = map[string]string{KindExpired: StatusExpired, KindCancelled: StatusCancelled, KindFailed: StatusFailed}[rec.Kind], at, rec.Error, false
		b.chargeLocked(r, errorBytes(r.Error))
		b.releaseBodyLocked(r)
		close(r.done)
	}
}

func (b *Book) addLocked(r *Request) {
	b.seq++
	r.seq = b.seq
	r.done = make(chan struct{})
	if r.Final() {
		r.Body = nil // never delivered again
	} else {
		b.bodyBytes += int64(len(r.Body))
	}
	r.size = r.heldBytes()
	b.reqs[r.ID] = r
	if r.Key != "" {
		b.keys[r.Key] = r
	}
	if r.Status == StatusAnswered {
		b.resultBytes += int64(len(r.Data))
	}
	b.resultBytes += int64(len(r.LateData))
	b.liveBytes += r.size
}

// requestOverhead is what a held request costs the heap beyond the lengths
// of its variable-length fields (heldBytes): the Request (328 bytes, 352
// allocated), its done channel (96), its entries in reqs, keys, order and
// open as those grow, and the fields' size-class rounding. Measured on
// this build (go1.26, amd64) by accepting N requests with a 36-byte ID, a
// 14-byte body, with and without a 255-byte key and a 64-byte digest, N
// from 1,000 to 65,536 so that the maps and slices are caught just after
// and just before they grow, and reading HeapAlloc after a collection:
// 549-607 bytes a request beyond the fields' lengths (976 bytes in all
// with the key and digest). 768 is that with a margin;
// TestHeldRequestsWithinTheBound checks it. Before, a request was charged
// its body and 512 bytes: 127,583 requests with 255-byte keys filled the
// 64 MiB of --request-journal-bytes and held 118.8 MiB of heap.
const requestOverhead = 768

// deathBytes is what a death charged to a request costs: a Death (48
// bytes), doubled for its slice's growth.
const deathBytes = 2 * int64(unsafe.Sizeof(Death{}))

// heldBytes is what r costs the book as it is: its fields and
// requestOverhead. A request is charged this when added; chargeLocked
// follows its changes (data, errors, deaths). Its body stays charged once
// let go (the journal holds it until a compaction).
func (r *Request) heldBytes() int64 {
	return requestOverhead + int64(len(r.ID)+len(r.Key)+len(r.Digest)+len(r.Body)+len(r.Data)+len(r.LateData)) +
		errorBytes(r.Error) + errorBytes(r.LateError) + int64(len(r.Deaths))*deathBytes
}

// errorBytes is what an error body costs: its texts, the ErrorBody (40
// bytes, 48 allocated) with a margin, and a poison error's details
// (measured as above: 410 bytes with three deaths).
func errorBytes(e *ErrorBody) int64 {
	if e == nil {
		return 0
	}
	n := int64(64 + len(e.Code) + len(e.Message))
	if e.Details != nil {
		n += 512
	}
	return n
}

// chargeLocked charges request r n bytes more (less when negative).
func (b *Book) chargeLocked(r *Request, n int64) {
	r.size += n
	b.liveBytes += n
}

func (b *Book) removeLocked(r *Request) {
	delete(b.reqs, r.ID)
	b.releaseBodyLocked(r)
	if r.Status == StatusAnswered {
		b.resultBytes -= int64(len(r.Data))
	}
	b.resultBytes -= int64(len(r.LateData))
	if r.Key != "" && b.keys[r.Key] == r {
		delete(b.keys, r.Key)
	}
	b.liveBytes -= r.size
}

// FinishedDurably waits until the record that finished request id — its
// answer, cancellation, expiry or setting aside — is on disk (asking the
// journal to write it now rather than within its lazy delay). It returns at
// once for an id that is unknown, still pending, or finished by records
// already durable. The agent's request_done entry, which lets the agent
// forget the request's steps, is appended to the WAL only after this: a
// supervisor killed in between must never redeliver a request whose steps
// the agent's restore has dropped (they would all run again).
func (b *Book) FinishedDurably(id string) error {
	b.mu.Lock()
	r := b.reqs[id]
	var t *Ticket
	if r != nil && r.Final() {
		t = r.final
	}
	b.mu.Unlock()
	if t == nil {
		return nil
	}
	select {
	case <-t.Done():
	default:
		b.j.kick()
	}
	return t.Wait()
}

// releaseBodyLocked lets go of a request's body once it is never delivered
// again (finished, or forgotten).
func (b *Book) releaseBodyLocked(r *Request) {
	b.bodyBytes -= int64(len(r.Body))
	r.Body = nil
}

// MaxPendingBodyBytes bounds the bodies of pending requests, which the book
// holds in memory for their deliveries: over it POST /v1/requests answers 429
// (an accepted request is never dropped to make room). Part of the
// supervisor's memory bound (64 MiB in all, SPEC §8), beside the results'
// MaxResultBytes; --request-journal-bytes bounds the journal on disk.
const MaxPendingBodyBytes = 8 << 20

// snapshot is the compacted journal: one state record per durable request
// (and per request whose acceptance is on disk, see below).
func (b *Book) snapshot() []*Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	recs := make([]*Record, 0, len(b.reqs))
	add := func(r *Request) {
		st := *r
		st.ticket, st.done = nil, nil
		recs = append(recs, &Record{Kind: KindState, ID: r.ID, State: &st})
	}
	for _, r := range b.order {
		if b.reqs[r.ID] != r || !r.durable {
			continue
		}
		add(r)
	}
	// A request whose accepted record is written, in the file this
	// compaction replaces, while its Accept has not yet taken the lock
	// back to mark it durable (and answer 202): it must be in the new file
	// too. One whose record is still queued is not: that record is written
	// after the compaction (the compaction holds the writer's place).
	var written []*Request
	for _, r := range b.reqs {
		if !r.durable && r.ticket != nil && r.ticket.succeeded() {
			written = append(written, r)
		}
	}
	sort.Slice(written, func(i, k int) bool { return written[i].seq < written[k].seq })
	for _, r := range written {
		add(r)
	}
	return recs
}

// Accept journals a new request and returns once it is on disk. With a key
// already used for the same body it returns that request instead (created
// false), waiting for it to be on disk if it is not yet. With deferDelivery
// the caller wakes the delivery itself (Deliver) once it has answered its
// client; otherwise Accept does.
func (b *Book) Accept(key, digest string, body json.RawMessage, id string, deferDelivery bool) (v View, created bool, err error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return View{}, false, ErrClosed
	}
	if key != "" {
		if r := b.keys[key]; r != nil {
			if r.Digest != digest {
				b.mu.Unlock()
				return View{}, false, ErrKeyConflict
			}
			t := r.ticket
			b.mu.Unlock()
			if t != nil {
				if err := t.Wait(); err != nil {
					return View{}, false, err
				}
			}
			// Its record is on disk: it is the request, even if the
			// Accept that made it has not yet marked it durable (Get
			// would not show it yet).
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.reqs[r.ID] != r {
				return View{}, false, ErrUnknown // forgotten since
			}
			return b.viewLocked(r), false, nil
		}
	}
	now := b.cfg.Now()
	r := &Request{ID: id, Key: key, Digest: digest, Body: body, Accepted: now, Deadline: now.Add(b.cfg.Timeout), Status: StatusPending}
	size := r.heldBytes()
	if b.cfg.MaxBytes > 0 && b.liveBytes+size > b.cfg.MaxBytes || b.bodyBytes+int64(len(body)) > MaxPendingBodyBytes {
		b.mu.Unlock()
		b.cfg.Metrics.rejected(rejectFull)
		return View{}, false, ErrFull
	}
	b.addLocked(r)
	r.ticket = b.j.Append(&Record{Kind: KindAccepted, ID: id, Key: key, Digest: digest, Body: body, At: now.UnixNano(), Deadline: r.Deadline.UnixNano()})
	t := r.ticket
	b.mu.Unlock()

	err = t.Wait()

	b.mu.Lock()
	defer b.mu.Unlock()
	r.ticket = nil
	if err != nil {
		if b.reqs[id] == r {
			b.removeLocked(r)
		}
		close(r.done)
		if errors.Is(err, ErrDiskFull) {
			b.cfg.Metrics.rejected(rejectDiskFull)
		}
		return View{}, false, err
	}
	r.durable = true
	b.order = append(b.order, r)
	b.open = append(b.open, r)
	b.cfg.Metrics.accepted.Inc()
	if !deferDelivery {
		b.kickLocked()
	}
	return b.viewLocked(r), true, nil
}

// Deliver wakes the book's delivery (after an Accept with deferDelivery).
func (b *Book) Deliver() {
	b.mu.Lock()
	b.kickLocked()
	b.mu.Unlock()
}

// Get returns a request's state.
func (b *Book) Get(id string) (View, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.reqs[id]
	if r == nil || !r.durable {
		return View{}, false
	}
	return b.viewLocked(r), true
}

// Done is closed when the request stops being pending (nil: unknown).
func (b *Book) Done(id string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.reqs[id]; r != nil {
		return r.done
	}
	return nil
}

func (b *Book) viewLocked(r *Request) View {
	c := *r
	c.Deaths = slices.Clone(r.Deaths)
	c.ticket, c.done = nil, nil
	return View{Request: c, InFlight: r.inflight != 0}
}

// AgentUp: a is the primary now, its restore queued. Every pending request
// is delivered to it (again, attempt incremented), in acceptance order.
func (b *Book) AgentUp(a Agent) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen++
	b.agent = a
	b.full = false
	for _, r := range b.order {
		r.inflight = 0
	}
	b.kickLocked() // delivered by the book's goroutine: the owner never waits on it
}

// Detach stops deliveries to the primary being stopped (its requests in
// flight stay charged to it until AgentGone).
func (b *Book) Detach() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.agent = nil
	b.mu.Unlock()
}

// AgentGone: the primary died (reason: crashed, killed, hung, framing…,
// or exited: it went on its own, code 0, with the request unanswered — an
// agent that calls exit() on one request is restarted, and counted
// against --max-restarts, like one that crashes on it). Every request in
// flight to it is charged a death; when several were, they become suspects,
// redelivered one at a time. A request that reaches
// --request-max-attempts deaths alone is set aside as poison. A stop the
// supervisor made (shutdown, an operator's restore, a WAL failure) charges
// nothing.
func (b *Book) AgentGone(reason string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.agent = nil
	var inflight []*Request
	for _, r := range b.order {
		if r.inflight != 0 && r.inflight == b.gen && !r.Final() {
			inflight = append(inflight, r)
		}
		r.inflight = 0
	}
	if reason == "" || reason == "shutdown" || reason == "operator_restore" || reason == "wal_failed" {
		return // not the agent's death with the request: redelivered, no charge
	}
	now := b.cfg.Now()
	alone := len(inflight) == 1
	for _, r := range inflight {
		r.Deaths = append(r.Deaths, Death{At: now, Reason: reason, Alone: alone})
		b.chargeLocked(r, deathBytes)
		flag := 0
		if alone {
			flag = 1
		}
		b.j.AppendLazy(&Record{Kind: KindDeath, ID: r.ID, At: now.UnixNano(), Reason: reason, Attempt: flag})
		// A suspect is delivered alone from now on, until it is answered
		// (cleared) or set aside: a request that died alone is the
		// culprit, one that died with others may be.
		r.Suspect = true
		if alone && len(r.Deaths) >= b.cfg.MaxAttempts {
			b.poisonLocked(r, now)
		}
	}
}

func (b *Book) poisonLocked(r *Request, now time.Time) {
	reasons := make([]string, len(r.Deaths))
	for i, d := range r.Deaths {
		reasons[i] = d.Reason
	}
	r.Status, r.Finished = StatusFailed, now
	r.Error = &ErrorBody{Code: CodePoison, Message: fmt.Sprintf(
		"the agent died %d times with this request in flight (%s); it is set aside and never delivered again (--request-max-attempts %d)",
		len(r.Deaths), strings.Join(reasons, ", "), b.cfg.MaxAttempts),
		Details: map[string]any{"deaths": len(r.Deaths), "reasons": reasons, "attempts": r.Attempts}}
	b.chargeLocked(r, errorBytes(r.Error))
	r.final = b.j.AppendLazy(&Record{Kind: KindFailed, ID: r.ID, At: now.UnixNano(), Error: r.Error})
	b.releaseBodyLocked(r)
	close(r.done)
	b.cfg.Metrics.poison.Inc()
	b.cfg.Log.Error("request set aside as poison: the agent died every time it had it", "request_id", r.ID,
		"deaths", len(r.Deaths), "reasons", strings.Join(reasons, ","), "max_attempts", b.cfg.MaxAttempts)
	b.cfg.Audit(AuditPoison, map[string]any{"request_id": r.ID, "deaths": len(r.Deaths), "reasons": reasons, "attempts": r.Attempts})
}

// Outcomes of Answer.
const (
	OutcomeAnswered = "answered"
	OutcomeFailed   = "failed"
	OutcomeLate     = "late"
)

// Answer records the agent's answer to id: data, or rerr. It returns the
// outcome and how long after acceptance it came. ErrUnknown: the book holds
// no such request; ErrDuplicate: already answered (ignored).
func (b *Book) Answer(id string, data json.RawMessage, rerr *ErrorBody) (outcome string, took time.Duration, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.reqs[id]
	if r == nil || !r.durable {
		return "", 0, ErrUnknown
	}
	now := b.cfg.Now()
	took = now.Sub(r.Accepted)
	if r.Status == StatusPending && !now.Before(r.Deadline) {
		b.expireLocked(r, now) // its time was up before the sweep saw it
	}
	switch r.Status {
	case StatusAnswered, StatusDropped: // dropped: answered, the data let go
		b.cfg.Metrics.duplicates.Inc()
		return "", took, ErrDuplicate
	case StatusFailed:
		if r.Error != nil && r.Error.Code == CodePoison {
			return OutcomeLate, took, nil
		}
		b.cfg.Metrics.duplicates.Inc()
		return "", took, ErrDuplicate
	case StatusExpired, StatusCancelled:
		// The first late answer is kept beside the status (late_answer
		// in GET); a second one is a duplicate.
		if r.LateData != nil || r.LateError != nil {
			b.cfg.Metrics.duplicates.Inc()
			return "", took, ErrDuplicate
		}
	}
	t := b.j.AppendLazy(&Record{Kind: KindAnswered, ID: id, At: now.UnixNano(), Data: data, Error: rerr})
	outcome = b.answerLocked(r, data, rerr, now)
	if r.final == nil {
		r.final = t
	}
	b.boundResultsLocked(r)
	b.kickLocked()
	return outcome, took, nil
}

func (b *Book) answerLocked(r *Request, data json.RawMessage, rerr *ErrorBody, now time.Time) string {
	r.inflight = 0
	r.Suspect = false
	if r.Status == StatusCancelled || r.Status == StatusExpired {
		if r.LateData == nil && r.LateError == nil {
			r.LateData, r.LateError = data, rerr
			b.chargeLocked(r, int64(len(data))+errorBytes(rerr))
			b.resultBytes += int64(len(data))
		}
		return OutcomeLate
	}
	if r.Final() {
		return OutcomeLate
	}
	r.Finished = now
	b.chargeLocked(r, int64(len(data))+errorBytes(rerr))
	b.releaseBodyLocked(r)
	if r.done != nil {
		close(r.done)
	}
	if rerr != nil {
		r.Status, r.Error = StatusFailed, rerr
		return OutcomeFailed
	}
	r.Status, r.Data = StatusAnswered, data
	b.resultBytes += int64(len(data))
	return OutcomeAnswered
}

// MaxResultBytes bounds the answers' data held (in memory and in the
// compacted journal); over it the oldest answers' data are dropped (status
// dropped, error RESULT_DROPPED): results are part of the supervisor's
// memory promise (docs/operations.md). A pending request is never dropped.
const MaxResultBytes = 16 << 20

// StatusDropped: answered, but the data was dropped to keep the results
// within MaxResultBytes.
const StatusDropped = "dropped"

// boundResultsLocked keeps the results within MaxResultBytes: it drops the
// data of the oldest answers other than keep (in acceptance order) until
// they fit — the answers' data and the late answers kept beside cancelled
// or expired requests alike. Each drop is journaled (lazily: a drop lost to a crash is made
// again at replay, oldest first), so that a restart does not bring the
// data back from the answer's record: an answer dropped stays dropped.
func (b *Book) boundResultsLocked(keep *Request) {
	for _, r := range b.order {
		if b.resultBytes <= MaxResultBytes {
			return
		}
		if r == keep || b.reqs[r.ID] != r {
			continue
		}
		switch {
		case r.Status == StatusAnswered && r.Data != nil:
			b.dropLocked(r)
		case r.LateData != nil:
			b.dropLateLocked(r)
		default:
			continue
		}
		if b.j != nil { // nil: Load
			b.j.AppendLazy(&Record{Kind: KindDropped, ID: r.ID})
		}
	}
}

// dropLocked drops an answer's data.
func (b *Book) dropLocked(r *Request) {
	n := int64(len(r.Data))
	r.Error = &ErrorBody{Code: "RESULT_DROPPED", Message: fmt.Sprintf(
		"the agent answered (%d bytes), but the result was dropped: the supervisor holds at most %d bytes of results, newest first. Fetch results sooner, or wait for them with POST ?wait=",
		n, MaxResultBytes)}
	r.Status, r.Data = StatusDropped, nil
	b.resultBytes -= n
	b.chargeLocked(r, errorBytes(r.Error)-n)
}

// dropLateLocked drops the data of a late answer kept beside a cancelled or
// expired request.
func (b *Book) dropLateLocked(r *Request) {
	n := int64(len(r.LateData))
	r.LateError = &ErrorBody{Code: "RESULT_DROPPED", Message: fmt.Sprintf(
		"the agent answered late (%d bytes), but the late answer was dropped: the supervisor holds at most %d bytes of results, newest first",
		n, MaxResultBytes)}
	r.LateData = nil
	b.resultBytes -= n
	b.chargeLocked(r, errorBytes(r.LateError)-n)
}

// Cancel cancels a pending request, durably: a request not yet delivered is
// never delivered; one in flight is sent cancel_request when the agent opted
// in. ErrUnknown (404), ErrFinished (409: answered, failed or expired); a
// request already cancelled is returned as it is once its cancellation is
// on disk.
//
// The cancellation takes effect at once, before its record is written (the
// agent may already have been told). When the record cannot be written,
// Cancel returns the journal's error with the request cancelled here but
// not durably: a crash would bring it back pending. A retried Cancel writes
// the record again, and succeeds only once it is on disk.
func (b *Book) Cancel(id string) (View, error) {
	b.mu.Lock()
	r := b.reqs[id]
	if r == nil || !r.durable {
		b.mu.Unlock()
		return View{}, ErrUnknown
	}
	if r.Status == StatusCancelled {
		return b.cancelledLocked(r)
	}
	now := b.cfg.Now()
	if r.Status == StatusPending && !now.Before(r.Deadline) {
		b.expireLocked(r, now) // its time was up before the sweep saw it, as in Answer
	}
	if r.Final() {
		v := b.viewLocked(r)
		b.mu.Unlock()
		return v, ErrFinished
	}
	r.Status, r.Finished, r.Suspect = StatusCancelled, now, false
	b.releaseBodyLocked(r)
	close(r.done)
	t := b.j.Append(&Record{Kind: KindCancelled, ID: id, At: now.UnixNano()})
	r.final = t
	inflight := r.inflight != 0 && r.inflight == b.gen
	sent := false
	if inflight && b.agent != nil && b.agent.AcceptsCancel() {
		sent = b.agent.SendMsg(&schema.CancelRequest{RequestID: id})
	}
	b.cfg.Metrics.cancelled.Inc()
	b.kickLocked()
	v := b.viewLocked(r)
	b.mu.Unlock()
	b.cfg.Audit(AuditCancelled, map[string]any{"request_id": id, "in_flight": inflight, "cancel_request_sent": sent, "attempts": r.Attempts})
	return v, t.Wait()
}

// cancelledLocked returns a request already cancelled once its
// cancellation is on disk: it waits for the record that cancelled it, and
// writes it again if that write failed. It unlocks b.mu.
func (b *Book) cancelledLocked(r *Request) (View, error) {
	for wrote := false; ; wrote = true {
		t, v := r.final, b.viewLocked(r)
		b.mu.Unlock()
		var err error
		if t != nil { // nil: cancelled by a record replayed from disk
			err = t.Wait()
		}
		if err == nil || wrote {
			return v, err
		}
		b.mu.Lock()
		if b.reqs[r.ID] != r {
			b.mu.Unlock()
			return View{}, ErrUnknown // forgotten meanwhile
		}
		if r.final == t { // not written again by another Cancel meanwhile
			r.final = b.j.Append(&Record{Kind: KindCancelled, ID: r.ID, At: r.Finished.UnixNano()})
		}
	}
}

func (b *Book) kickLocked() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// dueLocked picks what is due to the agent, at most n: while suspects
// wait, the oldest one alone (once nothing else is in flight); otherwise
// the pending requests not in flight, in acceptance order.
func (b *Book) dueLocked(n int) []*Request {
	// Drop what finished since the last look: the rest is still open.
	// Also while no agent is up, so that the requests finished meanwhile
	// (cancelled, expired, then forgotten) are let go, and the book stops
	// ticking once none is open. A request whose time ran out is expired
	// here, not delivered first: after a restart the first delivery comes
	// before the first sweep, and a request that expired while the
	// supervisor was down would cost the agent a call whose answer is late.
	now := b.cfg.Now()
	live := b.open[:0]
	for _, r := range b.open {
		if r.Status == StatusPending && b.reqs[r.ID] == r && !now.Before(r.Deadline) {
			b.expireLocked(r, now)
		}
		if !r.Final() && b.reqs[r.ID] == r {
			live = append(live, r)
		}
	}
	clear(b.open[len(live):])
	b.open = live
	if b.agent == nil {
		return nil
	}
	var suspect *Request
	busy := false
	for _, r := range b.open {
		if r.inflight == b.gen {
			busy = true
		}
		if r.Suspect && suspect == nil {
			suspect = r
		}
	}
	if suspect != nil {
		if busy {
			return nil
		}
		return []*Request{suspect}
	}
	var due []*Request
	for _, r := range b.open {
		if len(due) == n {
			break
		}
		if r.inflight != b.gen {
			due = append(due, r)
		}
	}
	return due
}

// deliver sends what is due, encoding outside the lock (a request's body
// never changes), in rounds, until nothing is due or the agent's queue is
// full (then retried at the next tick, not at every kick).
func (b *Book) deliver(tick bool) {
	b.mu.Lock()
	if b.full && !tick {
		b.mu.Unlock()
		return
	}
	b.full = false
	for {
		due := b.dueLocked(64)
		if len(due) == 0 {
			b.mu.Unlock()
			return
		}
		gen := b.gen
		// A delivery's attempt is journaled before the agent sees it; one
		// journaled but never sent (the queue was full) is sent with the
		// same number.
		attempts := make([]int, len(due))
		bodies := make([]json.RawMessage, len(due)) // read under the lock: a finished request lets go of its body
		var recs []*Record
		var numbered []int // due's indexes whose attempt recs number
		for i, r := range due {
			bodies[i] = r.Body
			attempts[i] = r.Attempts
			if r.Attempts == 0 {
				// The first delivery needs no record: the accepted record
				// stands for it (a replay counts it as made).
				attempts[i], r.Attempts = 1, 1
			} else if r.sentAttempt >= r.Attempts {
				attempts[i] = r.Attempts + 1
				r.Attempts = attempts[i]
				recs = append(recs, &Record{Kind: KindDelivered, ID: r.ID, Attempt: attempts[i]})
				numbered = append(numbered, i)
			}
		}
		var t *Ticket
		if len(recs) > 0 {
			t = b.j.Append(recs...)
		}
		b.mu.Unlock()
		frames := make([][]byte, len(due))
		for i, r := range due {
			frames[i] = b.frame(r.ID, bodies[i], attempts[i])
		}
		if t != nil {
			if err := t.Wait(); err != nil {
				b.cfg.Log.Error("cannot journal request deliveries; retrying", "err", err)
				b.mu.Lock()
				// The numbers not journaled are given back: sent
				// unjournaled, a restart would number a delivery the same
				// again.
				for _, i := range numbered {
					if r := due[i]; r.Attempts == attempts[i] {
						r.Attempts--
					}
				}
				b.full = true // retried at the next tick
				b.mu.Unlock()
				return
			}
		}
		b.mu.Lock()
		for i, r := range due {
			if b.gen != gen || b.agent == nil {
				break // the agent changed meanwhile: pick again
			}
			if r.Final() || r.inflight == gen || frames[i] == nil {
				continue
			}
			if r.Suspect != due[0].Suspect {
				break
			}
			if !b.agent.SendRequest(frames[i]) {
				b.full = true
				b.mu.Unlock()
				return
			}
			r.sentAttempt = attempts[i]
			r.inflight = gen
			b.cfg.Metrics.delivered.Inc()
		}
	}
}

// frame encodes a delivery of request id with raw, its body (read under the
// lock), without the book's lock held.
func (b *Book) frame(id string, raw json.RawMessage, attempt int) []byte {
	if raw == nil {
		return nil // finished since it was picked: not delivered
	}
	var body Body
	if err := json.Unmarshal(raw, &body); err != nil {
		b.cfg.Log.Error("cannot decode a journaled request; it is not delivered", "request_id", id, "err", err)
		return nil
	}
	msg := &schema.ProcessRequest{RequestID: id, Attempt: uint64(attempt),
		Data: schema.RequestData{Message: body.Message, UserID: body.UserID}}
	if body.Context != nil {
		if raw, err := msgpackMarshal(body.Context); err == nil {
			msg.Data.Context = raw
		}
	}
	frame, err := b.cfg.Encode(msg)
	if err != nil {
		b.cfg.Log.Error("cannot encode a journaled request for the agent; it is not delivered", "request_id", id, "err", err)
		return nil
	}
	return frame
}

// bookTick: how often run retries deliveries while requests are open (a
// full queue, a journal write to retry, a suspect waiting for its turn).
const bookTick = 50 * time.Millisecond

// run delivers, retries a full queue, expires and forgets, and compacts.
// While no request is open it wakes only to sweep (idleSweep): an idle
// supervisor's timers are what costs it CPU (issue 31, item 4).
func (b *Book) run() {
	defer b.wg.Done()
	tick := time.NewTimer(bookTick)
	defer tick.Stop()
	fast := true    // tick is armed for bookTick
	wasBusy := true // the last tick found a request open: sweep when none is
	var lastSweep time.Time
	for {
		select {
		case <-b.stop:
			return
		case <-b.wake:
			b.deliver(false)
			if !fast && b.busy() {
				tick.Reset(bookTick)
				fast = true
			}
			continue
		case <-tick.C:
		}
		b.ticks.Add(1)
		b.deliver(true)
		b.mu.Lock()
		now := b.cfg.Now()
		busy := b.busyLocked()
		// The last request closed: one sweep now, so that the gauges
		// say so before the book goes to sleep.
		if now.Sub(lastSweep) >= b.sweepEvery() || wasBusy && !busy {
			lastSweep = now
			b.sweepLocked(now)
			busy = b.busyLocked() // the sweep may have expired one
		}
		b.mu.Unlock()
		wasBusy = busy
		next := bookTick
		if !busy {
			next = max(bookTick, b.idleSweep())
		}
		tick.Reset(next)
		fast = next == bookTick
	}
}

// sweepEvery: how often expiry, forgetting and the gauges are looked at
// while a request is open.
func (b *Book) sweepEvery() time.Duration {
	return min(time.Second, max(min(b.cfg.Retention, b.cfg.Timeout)/4, 10*time.Millisecond))
}

// idleSweep: how often they are while none is: all that is left to do is
// forget the finished requests after --request-retention (and compact).
func (b *Book) idleSweep() time.Duration {
	return min(5*time.Second, max(b.cfg.Retention/4, 10*time.Millisecond))
}

// busy reports whether a request is open or a delivery is owed: run then
// ticks every bookTick.
func (b *Book) busy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busyLocked()
}

func (b *Book) busyLocked() bool { return b.full || len(b.open) > 0 }

// expireLocked expires a pending request whose --request-timeout is up.
func (b *Book) expireLocked(r *Request, now time.Time) {
	r.Status, r.Finished, r.Suspect = StatusExpired, now, false
	r.Error = &ErrorBody{Code: CodeExpired, Message: fmt.Sprintf("the agent did not answer within --request-timeout (%s); the request is no longer delivered", b.cfg.Timeout)}
	b.chargeLocked(r, errorBytes(r.Error))
	r.final = b.j.AppendLazy(&Record{Kind: KindExpired, ID: r.ID, At: now.UnixNano(), Error: r.Error})
	b.releaseBodyLocked(r)
	close(r.done)
	if r.inflight == b.gen && b.agent != nil && b.agent.AcceptsCancel() {
		b.agent.SendMsg(&schema.CancelRequest{RequestID: r.ID})
	}
	r.inflight = 0
	b.cfg.Metrics.expired.Inc()
	b.cfg.Audit(AuditExpired, map[string]any{"request_id": r.ID, "attempts": r.Attempts, "timeout": b.cfg.Timeout.String()})
}

// sweepLocked expires what is due, forgets finished requests after the
// retention, keeps the gauges, and asks for a compaction when the journal
// holds mostly what is forgotten.
func (b *Book) sweepLocked(now time.Time) {
	forgot := 0
	pending, inflight := 0, 0
	var oldest time.Time
	keep := b.order[:0]
	for _, r := range b.order {
		if r.Status == StatusPending && !now.Before(r.Deadline) {
			b.expireLocked(r, now)
		}
		if r.Final() && now.Sub(r.Finished) >= b.cfg.Retention {
			b.removeLocked(r)
			forgot++
			continue
		}
		if b.reqs[r.ID] != r {
			continue
		}
		if r.Status == StatusPending {
			pending++
			if r.inflight == b.gen && r.inflight != 0 {
				inflight++
			}
			if oldest.IsZero() || r.Accepted.Before(oldest) {
				oldest = r.Accepted
			}
		}
		keep = append(keep, r)
	}
	clear(b.order[len(keep):])
	b.order = keep
	m := b.cfg.Metrics
	m.pending.Set(float64(pending))
	m.inflight.Set(float64(inflight))
	m.stored.Set(float64(len(b.order)))
	m.resultBytes.Set(float64(b.resultBytes))
	if oldest.IsZero() {
		m.oldest.Set(0)
	} else {
		m.oldest.Set(now.Sub(oldest).Seconds())
	}
	size := b.j.Size()
	m.journalBytes.Set(float64(size))
	if forgot > 0 && size > 2*b.liveBytes+(64<<10) || size > max(b.cfg.MaxBytes, 1<<20) && size > 2*b.liveBytes {
		b.j.Compact()
	}
}

// Close stops delivering and closes the journal (what is queued is written).
func (b *Book) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.agent = nil
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()
	return b.j.Close()
}

// List returns every request held, in acceptance order.
func (b *Book) List() []View {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]View, 0, len(b.order))
	for _, r := range b.order {
		if b.reqs[r.ID] == r {
			out = append(out, b.viewLocked(r))
		}
	}
	return out
}

// Load reads a data directory's journal into views, without a running
// supervisor's help (the CLI): acceptance order.
func Load(dataDir string) ([]View, *Replay, error) {
	rp, err := ReadDir(dataDir)
	if err != nil {
		return nil, nil, err
	}
	b := &Book{reqs: map[string]*Request{}, keys: map[string]*Request{}}
	for _, rec := range rp.Records {
		b.apply(rec)
	}
	for _, r := range b.reqs {
		b.order = append(b.order, r)
	}
	sort.Slice(b.order, func(i, k int) bool { return b.order[i].seq < b.order[k].seq })
	b.boundResultsLocked(nil) // what the supervisor would hold
	out := make([]View, 0, len(b.order))
	for _, r := range b.order {
		out = append(out, b.viewLocked(r))
	}
	return out, rp, nil
}
