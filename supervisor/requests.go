package supervisor

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// Request API limits (docs/cli.md, docs/operations.md).
const (
	// maxRequestWait caps POST /v1/requests?wait=.
	maxRequestWait = 5 * time.Minute
	// maxRetainedRequests bounds the requests held for GET (pending and
	// finished); at the cap the oldest finished one is forgotten, or, when
	// every one is still pending (an agent that never answers), the oldest
	// pending one.
	maxRetainedRequests = 10000
	// maxRetainedResultBytes bounds the bytes of results held; the oldest
	// finished results are forgotten first.
	maxRetainedResultBytes = 64 << 20
	// maxResultJSON bounds one result converted to JSON (a 1 MiB MessagePack
	// map of bin values grows by a third in base64).
	maxResultJSON = 4 << 20
)

// Request statuses, as GET /v1/requests/ID reports them.
const (
	statusPending  = "pending"
	statusAnswered = "answered"
	statusFailed   = "failed"
	statusExpired  = "expired"
)

var (
	errRequestUnknown  = errors.New("no such request")
	errRequestAnswered = errors.New("request already answered")
)

// resultError is a failed request's error, as the agent sent it (truncated).
type resultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

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

	// During an evolution trial the request is mirrored to the shadow:
	// trial is that trial's id, shadowAnswered set once the shadow answered.
	trial          string
	shadowAnswered bool
}

// requestView is what GET /v1/requests/ID answers.
type requestView struct {
	RequestID string          `json:"request_id"`
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data,omitempty"`
	Error     *resultError    `json:"error,omitempty"`
}

// requestTable holds the requests sent to the primary and their results for
// --request-retention: a pending request expires that long after it was
// sent, and a finished one is forgotten that long after it finished. It is
// bounded by count and bytes. Expiry is applied lazily by every operation
// (at most once a second a full sweep), so it needs no goroutine. Safe for
// concurrent use.
type requestTable struct {
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

func newRequestTable(retention time.Duration, met *observe.Metrics) *requestTable {
	return &requestTable{
		retention: retention, maxCount: maxRetainedRequests, maxBytes: maxRetainedResultBytes,
		met: met, now: time.Now, recs: map[string]*request{},
	}
}

// add registers a request about to be sent (trial: the evolution trial it is
// mirrored to, or ""). At the count cap it forgets the oldest finished
// request, or the oldest pending one when none has finished (a caller
// waiting for it gets 202).
func (t *requestTable) add(id, trial string) *request {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.sweepLocked(now, false)
	if len(t.recs) >= t.maxCount && !t.evictLocked() {
		t.evictPendingLocked()
	}
	r := &request{id: id, sent: now, status: statusPending, done: make(chan struct{}), trial: trial}
	t.recs[id] = r
	t.gaugesLocked()
	return r
}

// forget removes a request that could not be sent.
func (t *requestTable) forget(id string) {
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
func (t *requestTable) finish(id string, data json.RawMessage, rerr *resultError) (outcome string, took time.Duration, trial string, err error) {
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
	for t.bytes > t.maxBytes && t.evictLocked() {
	}
	t.gaugesLocked()
	return outcome, now.Sub(r.sent), r.trial, nil
}

// shadowAnswered records the shadow's answer to a request mirrored to trial.
// It returns how long after sending it came, or errRequestUnknown /
// errRequestAnswered.
func (t *requestTable) shadowAnswer(id, trial string) (time.Duration, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.recs[id]
	if r == nil || r.trial == "" || r.trial != trial {
		return 0, errRequestUnknown
	}
	if r.shadowAnswered {
		return 0, errRequestAnswered
	}
	r.shadowAnswered = true
	return t.now().Sub(r.sent), nil
}

// view returns the request's state, or false when the table does not hold it.
func (t *requestTable) view(id string) (requestView, bool) {
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
func (t *requestTable) expireLocked(r *request, now time.Time) {
	if r.status == statusPending && now.Sub(r.sent) >= t.retention {
		r.status, r.finished = statusExpired, now
		close(r.done)
		t.met.RequestOutcomes.WithLabelValues(observe.OutcomeExpired).Inc()
	}
}

// sweepLocked expires and forgets what is due; unless force, at most once
// per second (or per retention/4 when that is shorter).
func (t *requestTable) sweepLocked(now time.Time, force bool) {
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

// evictLocked forgets the oldest finished request; false when every request
// held is pending.
func (t *requestTable) evictLocked() bool {
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

// evictPendingLocked forgets the oldest pending request, waking its waiter.
func (t *requestTable) evictPendingLocked() {
	var oldest *request
	for _, r := range t.recs {
		if r.status == statusPending && (oldest == nil || r.sent.Before(oldest.sent)) {
			oldest = r
		}
	}
	if oldest != nil {
		close(oldest.done)
		t.removeLocked(oldest)
	}
}

func (t *requestTable) removeLocked(r *request) {
	delete(t.recs, r.id)
	t.bytes -= r.size
}

func (t *requestTable) gaugesLocked() {
	t.met.RequestsStored.Set(float64(len(t.recs)))
	t.met.RequestBytes.Set(float64(t.bytes))
}

// ---- request_result from the agents

// requestResult handles the primary's answer: it completes the request (and
// wakes a POST waiting for it), or is an INVALID_MESSAGE for an id that was
// never sent or is already answered. A result for an expired request is
// counted as late and dropped without a reply: the agent did nothing wrong,
// it was slow.
func (s *Supervisor) primaryResult(in *conn.Instance, m *schema.RequestResult) {
	data, rerr, err := resultBody(m)
	if err != nil {
		s.invalidMessage(in, err)
		return
	}
	outcome, took, trial, err := s.requests.finish(m.RequestID, data, rerr)
	if err != nil {
		s.invalidMessage(in, unknownResult(m.RequestID, err))
		return
	}
	s.met.RequestOutcomes.WithLabelValues(outcome).Inc()
	if outcome == observe.OutcomeLate {
		if ok, sup := s.rec.Allow(time.Now()); ok {
			in.Log().Info("request_result arrived after its request expired; dropped", "request_id", clip(m.RequestID, 64),
				"after", took.Round(time.Millisecond), "request_retention", s.cfg.RequestRetention, "suppressed_before", sup)
		}
		return
	}
	s.met.RequestLatency.WithLabelValues(outcome).Observe(took.Seconds())
	if t := s.current().trial; t != nil && trial != "" && trial == t.id {
		t.collector.AddResult(evolution.Primary, outcome == observe.OutcomeFailed, took)
	}
}

// requestResult collects the shadow's answers to mirrored requests for the
// evolution decision; they never reach an HTTP client.
func (s *Supervisor) shadowResult(in *conn.Instance, t *trial, m *schema.RequestResult) {
	took, err := s.requests.shadowAnswer(m.RequestID, t.id)
	if err != nil {
		s.invalidMessage(in, unknownResult(m.RequestID, err))
		return
	}
	t.collector.AddResult(evolution.Shadow, m.Error != nil, took)
}

// unknownResult is the INVALID_MESSAGE for a result that answers nothing.
func unknownResult(id string, err error) error {
	why := "no process_request with this request_id is awaiting an answer (never sent, or forgotten after --request-retention)"
	if errors.Is(err, errRequestAnswered) {
		why = "this request was already answered; send one request_result per request"
	}
	return &schema.ValidationError{Type: schema.TypeRequestResult, Field: "request_id", Rule: schema.RuleFieldValue,
		Reason: fmt.Sprintf("%q: %s", clip(id, 64), why)}
}

// resultBody converts a result for the HTTP API: data as JSON, or the error
// with its text truncated.
func resultBody(m *schema.RequestResult) (json.RawMessage, *resultError, error) {
	if m.Error != nil {
		return nil, &resultError{Code: clip(m.Error.Code, 64), Message: clip(m.Error.Message, 4096)}, nil
	}
	data, err := msgpackToJSON(m.Data)
	if err != nil {
		return nil, nil, &schema.ValidationError{Type: schema.TypeRequestResult, Field: "data", Rule: schema.RuleFieldValue,
			Reason: "cannot be given to the HTTP client as JSON: " + err.Error()}
	}
	return data, nil, nil
}

// clip truncates attacker-controlled text before it reaches a log or reply.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// msgpackToJSON converts a MessagePack value (already bounds-walked by
// schema) to JSON: map keys that are not strings are formatted, bin becomes
// base64, ext becomes {"ext_type", "data"}, NaN and infinities strings.
func msgpackToJSON(raw []byte) (json.RawMessage, error) {
	d := msgpack.NewDecoder(bytes.NewReader(raw))
	v, err := jsonValue(d, 0)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > maxResultJSON {
		return nil, fmt.Errorf("%d bytes of JSON, limit %d", len(b), maxResultJSON)
	}
	return b, nil
}

func jsonValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > schema.MaxDepth {
		return nil, fmt.Errorf("nested deeper than %d", schema.MaxDepth)
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, err := jsonValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				kb, _ := json.Marshal(k)
				ks = string(kb)
			}
			if m[ks], err = jsonValue(d, depth+1); err != nil {
				return nil, err
			}
		}
		return m, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = jsonValue(d, depth+1); err != nil {
				return nil, err
			}
		}
		return a, nil
	case msgpcode.IsExt(c):
		id, n, err := d.DecodeExtHeader()
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		if err := d.ReadFull(b); err != nil {
			return nil, err
		}
		return map[string]any{"ext_type": id, "data": b}, nil
	case msgpcode.IsBin(c):
		return d.DecodeBytes() // []byte: base64 in JSON
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := d.DecodeFloat64()
		if err != nil {
			return nil, err
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Sprint(f), nil
		}
		return f, nil
	}
	return d.DecodeInterfaceLoose() // nil, bool, integers, str, bin
}

// ---- HTTP: waiting, GET, authentication

// parseWait reads ?wait=DURATION: 0 when absent.
func parseWait(r *http.Request) (time.Duration, error) {
	q := r.URL.Query().Get("wait")
	if q == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(q)
	if err != nil {
		return 0, fmt.Errorf("wait=%q is not a duration (use e.g. wait=30s)", clip(q, 32))
	}
	if d < 0 || d > maxRequestWait {
		return 0, fmt.Errorf("wait=%s is out of range: 0 to %s", d, maxRequestWait)
	}
	return d, nil
}

// forwardRequest sends msg to the primary (and its shadow during a trial)
// and, with wait > 0, waits for the answer: 200 with the result when it
// comes in time, else 202 {request_id}.
func (s *Supervisor) forwardRequest(w http.ResponseWriter, r *http.Request, in *conn.Instance, id string, frame []byte, wait time.Duration) (int, map[string]any) {
	t := s.current().trial
	trial := ""
	if t != nil && t.shadow != nil {
		trial = t.id
	}
	req := s.requests.add(id, trial)
	// Registered before it is sent, so an instant answer is never missed.
	if !in.SendFrame(schema.TypeProcessRequest, frame) {
		s.requests.forget(id)
		return http.StatusServiceUnavailable, map[string]any{"error": "the agent is not accepting input (its input queue is full)"}
	}
	if trial != "" {
		t.shadow.SendFrame(schema.TypeProcessRequest, frame) // during an evolution trial the shadow gets the same traffic
	}
	accepted := map[string]any{"request_id": id}
	if wait <= 0 {
		return http.StatusAccepted, accepted
	}
	// The server's write timeout must not cut a legitimate wait short.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
	// A request expires after --request-retention: no answer can come later.
	timer := time.NewTimer(min(wait, s.cfg.RequestRetention))
	defer timer.Stop()
	select {
	case <-req.done:
	case <-timer.C:
		return http.StatusAccepted, accepted
	case <-r.Context().Done():
		return http.StatusAccepted, accepted
	}
	v, ok := s.requests.view(id)
	switch {
	case ok && v.Status == statusAnswered:
		return http.StatusOK, map[string]any{"request_id": v.RequestID, "data": v.Data}
	case ok && v.Status == statusFailed:
		return http.StatusOK, map[string]any{"request_id": v.RequestID, "error": v.Error}
	}
	return http.StatusAccepted, accepted // expired (wait above --request-retention) or forgotten
}

// GET /v1/requests/{id}: the request's status and result.
func (s *Supervisor) handleGetRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	v, ok := s.requests.view(id)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no request %q: never sent, or forgotten after --request-retention (%s)",
			clip(id, 64), s.cfg.RequestRetention)})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// requireToken protects h with the --http-token-file bearer token (no token
// configured: h as is). The comparison takes the same time whatever the
// guess: both sides are hashed first, then compared in constant time.
func (s *Supervisor) requireToken(h http.Handler) http.Handler {
	if s.tokenHash == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.tokenHash) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="supervisor"`)
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "missing or wrong bearer token (Authorization: Bearer TOKEN, the content of --http-token-file)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loadToken reads the bearer token of --http-token-file: the file's content
// without surrounding whitespace, which must not be empty.
func loadToken(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --http-token-file: %w", ErrConfig, err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return nil, fmt.Errorf("%w: --http-token-file %s is empty; put the bearer token in it", ErrConfig, path)
	}
	sum := sha256.Sum256(tok)
	return sum[:], nil
}

// isLoopbackAddr reports whether a listen address binds only loopback:
// 127.0.0.0/8, ::1 or localhost. An empty host (all interfaces) is not.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
