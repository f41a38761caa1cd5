package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// requestServer is an API server with a request book (no agent: the test
// answers through the book).
func requestServer(t *testing.T) (*Server, *requests.Book) {
	t.Helper()
	s := newPageServer(t)
	s.opts.Codec = schema.NewCodec(schema.Options{})
	b, _, err := requests.OpenBook(t.TempDir(), requests.Config{Retention: time.Hour, Timeout: time.Hour, MaxBytes: 1 << 30,
		Metrics: requests.NewMetrics(prometheus.NewRegistry()), Encode: s.opts.Codec.Encode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	s.requests.SetBook(b)
	return s, b
}

type httpResult struct {
	code int
	body string
}

func serveReq(h http.Handler, method, target, body string, hdr ...string) httpResult {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, req)
	return httpResult{rw.Code, rw.Body.String()}
}

// TestIdempotentRetryWaits: a POST retried with the same Idempotency-Key
// and body and ?wait=D (a client whose first wait was cut short) waits up
// to D for the answer of the request already accepted, as a first POST
// with ?wait does, and answers 200 with it; before, it answered 202 at
// once, whatever ?wait said.
func TestIdempotentRetryWaits(t *testing.T) {
	s, b := requestServer(t)
	h := s.Handler()
	first := serveReq(h, "POST", "/v1/requests", `{"message":"hi"}`, "Idempotency-Key", "k1")
	if first.code != http.StatusAccepted {
		t.Fatalf("first POST: %d %s", first.code, first.body)
	}
	var r struct {
		ID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(first.body), &r); err != nil || r.ID == "" {
		t.Fatalf("first POST: %s", first.body)
	}
	done := make(chan httpResult, 1)
	go func() {
		done <- serveReq(h, "POST", "/v1/requests?wait=5m", `{"message":"hi"}`, "Idempotency-Key", "k1")
	}()
	// The retry waits (a wait slot taken) before the agent answers.
	for waiting := false; !waiting; {
		select {
		case res := <-done:
			t.Fatalf("the retry with ?wait=5m answered %d %s before the request was answered; want it to wait for the answer", res.code, res.body)
		default:
		}
		s.waits.mu.Lock()
		waiting = s.waits.n > 0
		s.waits.mu.Unlock()
		if !waiting {
			time.Sleep(time.Millisecond)
		}
	}
	if _, _, err := b.Answer(r.ID, json.RawMessage(`{"answer":42}`), nil); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.code != http.StatusOK || !strings.Contains(res.body, r.ID) || !strings.Contains(res.body, `"answer":42`) {
		t.Fatalf("the retry: %d %s, want 200 with the answer", res.code, res.body)
	}
}
