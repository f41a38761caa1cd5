package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// requestServer is an API server with a request book (no agent: the test
// answers through the book).
func requestServer(t *testing.T, dir string) (*Server, *requests.Book) {
	t.Helper()
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	s, err := New(Options{Log: slog.New(slog.DiscardHandler), Metrics: met, Bounds: observe.NewBoundsMetrics(met.Reg, nil),
		Codec: schema.NewCodec(schema.Options{}), Retention: time.Hour}, pageOwner{rec: observe.NewRecorder(slog.New(slog.DiscardHandler)), dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := requests.OpenBook(dir, requests.Config{Retention: time.Hour, Timeout: time.Hour, MaxBytes: 1 << 30,
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
	s, b := requestServer(t, t.TempDir())
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

// TestAnswerShownOnlyOnceDurable: the answer POST ?wait returns (and GET
// shows) is in the request journal when the client gets it, so that a
// supervisor killed right after brings back the same answer, never the
// request pending again to be answered anew. Before, the answer's record
// was written lazily (within 10 ms), after the 200 had gone out.
func TestAnswerShownOnlyOnceDurable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		s, b := requestServer(t, dir)
		h := s.Handler()
		done := make(chan httpResult, 1)
		go func() { done <- serveReq(h, "POST", "/v1/requests?wait=5m", `{"message":"hi"}`) }()
		synctest.Wait() // journaled and waiting for the answer
		l := b.List()
		if len(l) != 1 {
			t.Fatalf("%d requests accepted, want 1", len(l))
		}
		id := l[0].ID
		if _, _, err := b.Answer(id, json.RawMessage(`{"answer":42}`), nil); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.code != http.StatusOK || !strings.Contains(res.body, `"answer":42`) {
			t.Fatalf("POST ?wait: %d %s, want 200 with the answer", res.code, res.body)
		}
		// What a supervisor killed now leaves: the journal as it is.
		durable := func(what string) {
			t.Helper()
			views, _, err := requests.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(views) != 1 || views[0].Status != requests.StatusAnswered || string(views[0].Data) != `{"answer":42}` {
				t.Fatalf("%s was sent; the journal then holds %+v, want the request answered with it", what, views)
			}
		}
		durable("POST ?wait's 200")

		// GET, likewise.
		go func() { done <- serveReq(h, "POST", "/v1/requests", `{"message":"again"}`) }()
		if res := <-done; res.code != http.StatusAccepted {
			t.Fatalf("POST: %d %s", res.code, res.body)
		}
		var r struct {
			ID string `json:"request_id"`
		}
		for _, v := range b.List() {
			if v.ID != id {
				r.ID = v.ID
			}
		}
		if _, _, err := b.Answer(r.ID, json.RawMessage(`{"answer":43}`), nil); err != nil {
			t.Fatal(err)
		}
		if res := serveReq(h, "GET", "/v1/requests/"+r.ID, ""); res.code != http.StatusOK || !strings.Contains(res.body, `"answer":43`) {
			t.Fatalf("GET: %d %s, want 200 with the answer", res.code, res.body)
		}
		views, _, err := requests.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range views {
			if v.ID == r.ID && v.Status != requests.StatusAnswered {
				t.Fatalf("GET showed the answer; the journal then holds the request %s", v.Status)
			}
		}
	})
}
