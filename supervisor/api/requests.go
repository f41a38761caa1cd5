package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// Request statuses, as GET /v1/requests/ID reports them.
const (
	statusPending  = "pending"
	statusAnswered = "answered"
	statusFailed   = "failed"
	statusExpired  = "expired"
	// statusDropped: answered, but the result was dropped to keep the
	// results held within their byte budget (maxRetainedResultBytes).
	statusDropped = "dropped"
)

var (
	errRequestUnknown  = errors.New("no such request")
	errRequestAnswered = errors.New("request already answered")
	// errTableFull: every request held is still pending. A new one is
	// refused (429) rather than forgetting one already accepted.
	errTableFull = errors.New("the supervisor holds as many pending requests as it can")
)

// request is one process_request the supervisor sent to the primary.
type request struct {
	id       string
	sent     time.Time
	status   string
	data     json.RawMessage // answered: the agent's data map as JSON
	err      *resultError    // failed
	finished time.Time       // when it stopped being pending
	size     int             // bytes of data counted against the budget
	done     chan struct{}   // closed when it stops being pending

	// During an evolution trial the request is mirrored to the shadows:
	// trial is that trial's id (the trial pairs the answers).
	trial string
}

// requestView is what GET /v1/requests/ID answers.
type requestView struct {
	RequestID string          `json:"request_id"`
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data,omitempty"`
	Error     *resultError    `json:"error,omitempty"`
}

// RequestTable holds the requests sent to the primary and their results for
// --request-retention: a pending request expires that long after it was
// sent, and a finished one is forgotten that long after it finished. It is
// bounded by count and bytes. Expiry is applied lazily by every operation
// (at most once a second a full sweep), so it needs no goroutine. Safe for
// concurrent use.
type RequestTable struct {
	retention time.Duration
	maxCount  int
	maxBytes  int
	met       *observe.Metrics
	now       func() time.Time

	mu        sync.Mutex
	recs      map[string]*request
	bytes     int
	lastSweep time.Time
}

func newRequestTable(retention time.Duration, met *observe.Metrics) *RequestTable {
	return &RequestTable{
		retention: retention, maxCount: maxRetainedRequests, maxBytes: maxRetainedResultBytes,
		met: met, now: time.Now, recs: map[string]*request{},
	}
}

// add registers a request about to be sent (trial: the evolution trial it is
// mirrored to, or ""). At the count cap it forgets the oldest finished
// request; when every request held is pending it refuses the new one
// (errTableFull): an accepted request is never forgotten to make room.
func (t *RequestTable) add(id, trial string) (*request, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.sweepLocked(now, false)
	if len(t.recs) >= t.maxCount && !t.evictLocked() {
		return nil, errTableFull
	}
	r := &request{id: id, sent: now, status: statusPending, done: make(chan struct{}), trial: trial}
	t.recs[id] = r
	t.gaugesLocked()
	return r, nil
}

// forget removes a request that could not be sent.
func (t *RequestTable) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.recs[id]; r != nil {
		t.removeLocked(r)
	}
}

// finish records the primary's result. It returns the request's outcome
// (observe.OutcomeAnswered, observe.OutcomeFailed, or observe.OutcomeLate for a result that arrived
// after the request expired: dropped, not an error), how long the agent
// took, and the trial the request was mirrored to. An id the table does not
// hold is errRequestUnknown; one already answered errRequestAnswered.
func (t *RequestTable) finish(id string, data json.RawMessage, rerr *resultError) (outcome string, took time.Duration, trial string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	r := t.recs[id]
	if r == nil {
		return "", 0, "", errRequestUnknown
	}
	t.expireLocked(r, now)
	switch r.status {
	case statusExpired:
		return observe.OutcomeLate, now.Sub(r.sent), r.trial, nil
	case statusAnswered, statusFailed:
		return "", 0, r.trial, errRequestAnswered
	}
	r.finished = now
	if rerr != nil {
		r.status, r.err = statusFailed, rerr
		r.size = len(rerr.Code) + len(rerr.Message)
		outcome = observe.OutcomeFailed
	} else {
		r.status, r.data = statusAnswered, data
		r.size = len(data)
		outcome = observe.OutcomeAnswered
	}
	close(r.done)
	t.bytes += r.size
	for t.bytes > t.maxBytes && t.dropOldestResultLocked(r) {
	}
	t.gaugesLocked()
	return outcome, now.Sub(r.sent), r.trial, nil
}

// view returns the request's state, or false when the table does not hold it.
func (t *RequestTable) view(id string) (requestView, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.sweepLocked(now, false)
	r := t.recs[id]
	if r == nil {
		return requestView{}, false
	}
	t.expireLocked(r, now)
	return requestView{RequestID: r.id, Status: r.status, Data: r.data, Error: r.err}, true
}

// expireLocked marks a pending request expired once its time is up.
func (t *RequestTable) expireLocked(r *request, now time.Time) {
	if r.status == statusPending && now.Sub(r.sent) >= t.retention {
		r.status, r.finished = statusExpired, now
		close(r.done)
		t.met.RequestOutcomes.WithLabelValues(observe.OutcomeExpired).Inc()
	}
}

// sweepLocked expires and forgets what is due; unless force, at most once
// per second (or per retention/4 when that is shorter).
func (t *RequestTable) sweepLocked(now time.Time, force bool) {
	every := min(time.Second, t.retention/4)
	if !force && now.Sub(t.lastSweep) < every {
		return
	}
	t.lastSweep = now
	for _, r := range t.recs {
		t.expireLocked(r, now)
		if r.status != statusPending && now.Sub(r.finished) >= t.retention {
			t.removeLocked(r)
		}
	}
	t.gaugesLocked()
}

// dropOldestResultLocked keeps the results held within their byte budget:
// it drops the oldest result other than keep (the one just recorded, which
// its waiter is about to read), leaving its request as statusDropped with an
// error saying why. false when there is none to drop.
func (t *RequestTable) dropOldestResultLocked(keep *request) bool {
	var oldest *request
	for _, r := range t.recs {
		if r != keep && r.size > 0 && r.status != statusPending && (oldest == nil || r.finished.Before(oldest.finished)) {
			oldest = r
		}
	}
	if oldest == nil {
		return false
	}
	oldest.err = &resultError{Code: "RESULT_DROPPED", Message: fmt.Sprintf(
		"the agent answered (%s result, %d bytes), but the result was dropped: the supervisor holds at most %d bytes of results, newest first. Fetch results sooner, or wait for them with POST ?wait=",
		oldest.status, oldest.size, t.maxBytes)}
	oldest.status, oldest.data = statusDropped, nil
	t.bytes -= oldest.size
	oldest.size = 0
	return true
}

// evictLocked forgets the oldest finished request; false when every request
// held is pending.
func (t *RequestTable) evictLocked() bool {
	var oldest *request
	for _, r := range t.recs {
		if r.status != statusPending && (oldest == nil || r.finished.Before(oldest.finished)) {
			oldest = r
		}
	}
	if oldest == nil {
		return false
	}
	t.removeLocked(oldest)
	return true
}

func (t *RequestTable) removeLocked(r *request) {
	delete(t.recs, r.id)
	t.bytes -= r.size
}

func (t *RequestTable) gaugesLocked() {
	t.met.RequestsStored.Set(float64(len(t.recs)))
	t.met.RequestBytes.Set(float64(t.bytes))
}

// ---- request_result from the agents

// ---- HTTP: waiting, GET, authentication
