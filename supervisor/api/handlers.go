package api

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
)

// parseWait reads ?wait=DURATION: 0 when absent.
func parseWait(r *http.Request) (time.Duration, error) {
	q := r.URL.Query().Get("wait")
	if q == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(q)
	if err != nil {
		return 0, fmt.Errorf("wait=%q is not a duration (use e.g. wait=30s)", clip.String(q, 32))
	}
	if d < 0 || d > maxRequestWait {
		return 0, fmt.Errorf("wait=%s is out of range: 0 to %s", d, maxRequestWait)
	}
	return d, nil
}

// busyRetryAfter is the Retry-After, in seconds, of a request refused because
// the agent's input queue is full.
const busyRetryAfter = 1

// forwardRequest sends msg to the primary (and its shadow during a trial)
// and, with wait > 0, waits for the answer: 200 with the result when it
// comes in time, else 202 {request_id}.
func (s *Server) forwardRequest(w http.ResponseWriter, r *http.Request, in Agent, mirror Mirror, trial, id string, frame []byte, wait time.Duration) (int, map[string]any) {
	if mirror == nil {
		trial = ""
	}
	req, err := s.requests.add(id, trial)
	if err != nil {
		w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
		return http.StatusTooManyRequests, map[string]any{"error": fmt.Sprintf("%v (%d, none answered yet); not accepted, retry after %ds", err, s.requests.maxCount, busyRetryAfter)}
	}
	// Registered before it is sent, so an instant answer is never missed.
	if trial != "" {
		mirror.Expect(id, req.sent)
	}
	if !in.SendRequest(frame) {
		s.requests.forget(id)
		if trial != "" {
			mirror.Cancel(id)
		}
		w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
		return http.StatusServiceUnavailable, map[string]any{"error": "the agent's input queue is full (it is reading slower than requests arrive); not accepted, retry after " + strconv.Itoa(busyRetryAfter) + "s"}
	}
	if trial != "" {
		mirror.Send(id, frame) // during an evolution trial the shadows get the same traffic
	}
	accepted := map[string]any{"request_id": id}
	if wait <= 0 {
		return http.StatusAccepted, accepted
	}
	// Waits are capped per client and in all (waiters.go): over a cap the
	// request is answered as if the wait had timed out.
	release, why, ok := s.waits.acquire(r)
	if !ok {
		s.waitsRefused.Inc()
		accepted["wait_refused"] = why + "; poll GET /v1/requests/" + id + " for the result"
		return http.StatusAccepted, accepted
	}
	defer release()
	// The server's write timeout must not cut a legitimate wait short.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
	// A request expires after --request-retention: no answer can come later.
	timer := time.NewTimer(min(wait, s.opts.Retention))
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
func (s *Server) handleGetRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	v, ok := s.requests.view(id)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no request %q: never sent, or forgotten after --request-retention (%s)",
			clip.String(id, 64), s.opts.Retention)})
		return
	}
	writeJSON(w, http.StatusOK, v)
}
