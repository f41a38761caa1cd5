package api

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
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
// the request journal is full.
const busyRetryAfter = 1

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 255

// idempotencyKey reads and checks the Idempotency-Key header ("" when absent).
func idempotencyKey(r *http.Request) (string, error) {
	k := r.Header.Get("Idempotency-Key")
	if len(k) > maxIdempotencyKey {
		return "", fmt.Errorf("Idempotency-Key is %d bytes long; at most %d", len(k), maxIdempotencyKey)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", fmt.Errorf("Idempotency-Key must be printable ASCII without spaces (byte %d is 0x%02x)", i, k[i])
		}
	}
	return k, nil
}

// bodyDigest is the SHA-256 of a request's body (Idempotency-Key reuse).
func bodyDigest(raw []byte) string {
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])
}

// journalRequest journals the request (202 only once it is on disk), mirrors
// it to the shadow during a trial, and with wait > 0 waits for the answer:
// 200 with the result when it comes in time, else 202 {request_id}.
func (s *Server) journalRequest(w http.ResponseWriter, r *http.Request, key, digest string, body []byte, frame []byte, id string, wait time.Duration) (int, map[string]any) {
	b := s.requests.Book()
	if b == nil {
		w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
		return http.StatusServiceUnavailable, map[string]any{"error": "the request journal is not open yet; retry in a moment"}
	}
	// Without ?wait the request is handed to the agent once the 202 is
	// written (handleRequest): its delivery, and the agent's answer, would
	// otherwise compete with the response for the CPU.
	v, created, err := b.Accept(key, digest, body, id, wait <= 0)
	switch {
	case errors.Is(err, requests.ErrKeyConflict):
		return http.StatusConflict, map[string]any{"error": fmt.Sprintf("Idempotency-Key %q was used for a request with a different body; use a new key for a new request", clip.String(key, 64))}
	case errors.Is(err, requests.ErrFull):
		w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
		return http.StatusTooManyRequests, map[string]any{"error": fmt.Sprintf("the request journal is full (--request-journal-bytes, or %d MiB of pending requests' bodies held for delivery): pending requests are never dropped to make room; not accepted, retry after %ds", requests.MaxPendingBodyBytes>>20, busyRetryAfter)}
	case errors.Is(err, requests.ErrDiskFull):
		return http.StatusInsufficientStorage, map[string]any{"error": "the request could not be journaled: the disk under --data-dir is full; not accepted (free space, then retry)"}
	case err != nil:
		w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
		return http.StatusServiceUnavailable, map[string]any{"error": "the request could not be journaled; not accepted: " + err.Error()}
	}
	if created {
		if _, mirror, trial := s.owner.Target(); mirror != nil && trial != "" {
			// During an evolution trial the shadows get the same traffic,
			// never journaled; the trial pairs their answers with the
			// primary's (Expect before the primary can answer).
			s.requests.addMirror(id, trial)
			mirror.Expect(id, time.Now())
			mirror.Send(id, frame)
		}
	}
	// A retry under an Idempotency-Key (a client whose first wait was cut
	// short) waits for a request still pending as a first POST does.
	if wait <= 0 || !created && v.Status != requests.StatusPending {
		if !created && v.Final() {
			if dv, ok := durableView(b, v.ID); ok {
				v = dv
			}
		}
		return viewAnswer(v, created)
	}
	accepted := map[string]any{"request_id": v.ID}
	// Waits are capped per client and in all (waiters.go): over a cap the
	// request is answered as if the wait had timed out.
	release, why, ok := s.waits.acquire(r)
	if !ok {
		s.waitsRefused.Inc()
		accepted["wait_refused"] = why + "; poll GET /v1/requests/" + v.ID + " for the result"
		return http.StatusAccepted, accepted
	}
	defer release()
	// The server's write timeout must not cut a legitimate wait short.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-b.Done(v.ID):
	case <-timer.C:
		return http.StatusAccepted, accepted
	case <-r.Context().Done():
		return http.StatusAccepted, accepted
	}
	if v, ok := durableView(b, v.ID); ok && (v.Status == requests.StatusAnswered || v.Status == requests.StatusFailed) {
		return viewAnswer(v, false)
	} else if ok {
		accepted["status"] = v.Status // expired or cancelled while waiting
	}
	return http.StatusAccepted, accepted
}

// durableView is request id as the book holds it, once the record that
// finished it (its answer, expiry, cancellation, setting aside) is in the
// journal: a client is never shown an answer that a supervisor killed a
// moment later would not have — the request pending again, delivered again
// and answered anew. (The book writes those records lazily, within 10 ms;
// this writes them now.) A record that could not be written is shown as
// held: nothing better can be said.
func durableView(b *requests.Book, id string) (requests.View, bool) {
	_ = b.FinishedDurably(id)
	return b.Get(id)
}

// viewAnswer is POST's answer for a request: 200 with its result once
// answered or failed, 202 otherwise (pending; or just created).
func viewAnswer(v requests.View, created bool) (int, map[string]any) {
	body := map[string]any{"request_id": v.ID}
	if created {
		return http.StatusAccepted, body
	}
	switch v.Status {
	case requests.StatusAnswered:
		body["data"] = v.Data
		return http.StatusOK, body
	case requests.StatusPending:
		return http.StatusAccepted, body
	}
	body["status"] = v.Status
	if v.Error != nil {
		body["error"] = v.Error
	}
	return http.StatusOK, body
}

// requestView is what GET /v1/requests/ID answers.
type requestView struct {
	RequestID string              `json:"request_id"`
	Status    string              `json:"status"`
	Data      any                 `json:"data,omitempty"`
	Error     *requests.ErrorBody `json:"error,omitempty"`
	Attempts  int                 `json:"attempts"`
	InFlight  bool                `json:"in_flight,omitempty"`
	Accepted  time.Time           `json:"accepted"`
	Deaths    []requests.Death    `json:"deaths,omitempty"`
	Late      *lateAnswer         `json:"late_answer,omitempty"`
}

type lateAnswer struct {
	Data  any                 `json:"data,omitempty"`
	Error *requests.ErrorBody `json:"error,omitempty"`
}

func toView(v requests.View) requestView {
	out := requestView{RequestID: v.ID, Status: v.Status, Error: v.Error, Attempts: v.Attempts, InFlight: v.InFlight,
		Accepted: v.Accepted.UTC(), Deaths: v.Deaths}
	if v.Data != nil {
		out.Data = v.Data
	}
	if v.LateData != nil || v.LateError != nil {
		out.Late = &lateAnswer{Error: v.LateError}
		if v.LateData != nil {
			out.Late.Data = v.LateData
		}
	}
	return out
}

// GET /v1/requests/{id}: the request's status and result, from the journal.
func (s *Server) handleGetRequest(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var v requests.View
	ok := false
	if b := s.requests.Book(); b != nil {
		v, ok = durableView(b, id)
	}
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no request %q: never accepted, or forgotten after --request-retention (%s)",
			clip.String(id, 64), s.opts.Retention)})
		return
	}
	writeJSON(w, http.StatusOK, toView(v))
}

// DELETE /v1/requests/{id}: cancel the request.
func (s *Server) handleCancelRequest(w http.ResponseWriter, r *http.Request) {
	code, body := s.cancelRequest(r.PathValue("id"))
	writeJSON(w, code, body)
}

// cancelRequest cancels id: 200 with its view, 404 unknown, 409 finished.
func (s *Server) cancelRequest(id string) (int, any) {
	b := s.requests.Book()
	if b == nil {
		return http.StatusServiceUnavailable, map[string]any{"error": "the request journal is not open yet; retry in a moment"}
	}
	v, err := b.Cancel(id)
	switch {
	case errors.Is(err, requests.ErrUnknown):
		return http.StatusNotFound, map[string]any{"error": fmt.Sprintf("no request %q: never accepted, or forgotten after --request-retention (%s)",
			clip.String(id, 64), s.opts.Retention)}
	case errors.Is(err, requests.ErrFinished):
		return http.StatusConflict, map[string]any{"error": fmt.Sprintf("request %q is already %s; only a pending request can be cancelled", clip.String(id, 64), v.Status),
			"request_id": v.ID, "status": v.Status}
	case err != nil:
		return http.StatusServiceUnavailable, map[string]any{"error": "the request is cancelled in this supervisor (an agent working on it was told), " +
			"but the cancellation could not be written to the request journal, so a crash would bring the request back: retry the DELETE to write it again (" + err.Error() + ")",
			"request_id": v.ID, "status": v.Status}
	}
	return http.StatusOK, toView(v)
}
