package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// maxRequestBody caps POST /v1/requests bodies.
const maxRequestBody = 1 << 20

// Handler is the HTTP API (docs/cli.md lists the endpoints).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.probeRoutes(mux)
	mux.Handle("POST /v1/requests", s.requireToken(http.HandlerFunc(s.handleRequest)))
	mux.Handle("GET /v1/requests/{id}", s.requireToken(http.HandlerFunc(s.handleGetRequest)))
	mux.Handle("DELETE /v1/requests/{id}", s.requireToken(http.HandlerFunc(s.handleCancelRequest)))
	mux.Handle("GET /v1/evolutions", s.requireToken(http.HandlerFunc(s.handleEvolutions)))
	mux.Handle("GET /v1/evolutions/{id}", s.requireToken(http.HandlerFunc(s.handleEvolution)))
	s.pageRoutes(mux) // GET /, /v1/status, the page's stylesheet and script (page.go)
	// A connection in a reserve slot is answered on the probe paths only.
	return reserveGuard(mux)
}

// ProbeHandler is what the probe listener (--probe-addr) serves: the
// probes and /metrics, never the request API.
func (s *Server) ProbeHandler() http.Handler {
	mux := http.NewServeMux()
	s.probeRoutes(mux)
	return mux
}

// probeRoutes are probePaths' handlers.
func (s *Server) probeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opts.Metrics.Reg, promhttp.HandlerOpts{
		ErrorLog: slogPrinter{s.opts.Log}, Registry: s.opts.Metrics.Reg,
	}))
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Error("metrics endpoint", "err", fmt.Sprint(v...)) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// /healthz is the sidecar's own liveness: 200 while it supervises (even while
// the agent restarts), 503 once it has given up on a crash loop.
func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	st := s.owner.Status()
	givenUp, stalled, age, limit := s.owner.Health(time.Now())
	if givenUp {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "given_up", "state": st.State})
		return
	}
	if stalled {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "stalled", "state": st.State,
			"reason": fmt.Sprintf("the supervisor's event loop has made no progress for %s (limit %s); it may be blocked on its own storage", age.Round(time.Second), limit)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "state": st.State})
}

// /readyz is 200 while the primary agent is up and heartbeating.
func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request) {
	ready, reason, st := s.owner.Readiness()
	body := map[string]any{"ready": ready, "state": st.State}
	if st.PID != 0 {
		body["agent_pid"] = st.PID
	}
	if !ready {
		body["reason"] = reason
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

type requestBody struct {
	Message *string        `json:"message"`
	Context map[string]any `json:"context"`
	UserID  string         `json:"user_id"`
}

// POST /v1/requests forwards work to the agent as process_request; with
// ?wait=D it waits up to D for the agent's request_result.
func (s *Server) handleRequest(w http.ResponseWriter, r *http.Request) {
	code, body := s.acceptRequest(w, r)
	s.opts.Metrics.Requests.WithLabelValues(strconv.Itoa(code)).Inc()
	writeJSON(w, code, body)
	if code == http.StatusAccepted || code == http.StatusOK {
		// Accepted without ?wait: delivered after the response is on its
		// way (journalRequest). The book's tick delivers whatever a kick
		// missed; a kick with nothing due does nothing.
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if b := s.requests.Book(); b != nil {
			b.Deliver()
		}
	}
}

func (s *Server) acceptRequest(w http.ResponseWriter, r *http.Request) (int, map[string]any) {
	wait, err := parseWait(r)
	if err != nil {
		return http.StatusBadRequest, map[string]any{"error": err.Error()}
	}
	key, err := idempotencyKey(r)
	if err != nil {
		return http.StatusBadRequest, map[string]any{"error": err.Error()}
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return http.StatusRequestEntityTooLarge, map[string]any{"error": fmt.Sprintf("body larger than %d bytes", maxRequestBody)}
		}
		return http.StatusBadRequest, map[string]any{"error": "cannot read the body: " + err.Error()}
	}
	var req requestBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&req); err != nil {
		return http.StatusBadRequest, map[string]any{"error": "body is not a JSON object {message, context, user_id}: " + err.Error()}
	}
	if dec.More() {
		return http.StatusBadRequest, map[string]any{"error": "body has data after the JSON object"}
	}
	if req.Message == nil {
		return http.StatusBadRequest, map[string]any{"error": "missing required field \"message\" (a string)"}
	}
	if d := jsonDepth(req.Context, maxContextDepth+1); d > maxContextDepth {
		return http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("context is nested more than %d levels deep; the agent protocol does not carry it", maxContextDepth)}
	}
	var ctxRaw msgpack.RawMessage
	if req.Context != nil {
		b, err := msgpack.Marshal(req.Context)
		if err != nil {
			return http.StatusBadRequest, map[string]any{"error": "context cannot be encoded: " + err.Error()}
		}
		ctxRaw = b
	}
	id := observe.NewUUID()
	msg := &schema.ProcessRequest{RequestID: id, Attempt: 1, Data: schema.RequestData{Message: *req.Message, Context: ctxRaw, UserID: req.UserID}}
	// Encoded here, so that a request the protocol cannot carry is the
	// client's error (4xx), not an ERROR line per request and a 503.
	frame, err := s.opts.Codec.Encode(msg)
	if err != nil {
		code := http.StatusBadRequest
		if schema.RuleOf(err) == schema.RuleTooLarge {
			code = http.StatusRequestEntityTooLarge
		}
		return code, map[string]any{"error": "the request cannot be sent to the agent: " + err.Error()}
	}
	// What the journal keeps and the agent gets: the body as it was read
	// (fields it does not know dropped).
	body, err := marshalNoHTMLEscape(requests.Body{Message: *req.Message, Context: req.Context, UserID: req.UserID})
	if err != nil {
		return http.StatusBadRequest, map[string]any{"error": "the body cannot be journaled: " + err.Error()}
	}
	return s.journalRequest(w, r, key, bodyDigest(raw), body, frame, id, wait) // handlers.go
}

// maxContextDepth is the deepest nesting of a request's context that fits a
// process_request (the message map and its data map hold it).
const maxContextDepth = schema.MaxDepth - 2

// jsonDepth returns the nesting depth of a decoded JSON value (a scalar is
// 0, {} is 1), counting no further than limit.
func jsonDepth(v any, limit int) int {
	if limit <= 0 {
		return 0
	}
	d := 0
	switch x := v.(type) {
	case map[string]any:
		if x == nil {
			return 0
		}
		for _, e := range x {
			d = max(d, jsonDepth(e, limit-1))
		}
	case []any:
		for _, e := range x {
			d = max(d, jsonDepth(e, limit-1))
		}
	default:
		return 0
	}
	return d + 1
}

// marshalNoHTMLEscape is json.Marshal without its HTML escaping: '<', '>'
// and '&' stay one byte each, not six (\u003c). A body of HTML or code
// kept that way in the request journal and in memory weighs what the
// client sent, not up to six times as much against the pending bodies'
// bound and --request-journal-bytes.
func marshalNoHTMLEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
