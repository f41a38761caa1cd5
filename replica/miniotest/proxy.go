package miniotest

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
)

// Fault is what a Proxy does with one request.
type Fault int

const (
	// Pass forwards the request to the server.
	Pass Fault = iota
	// Full answers 507 XMinioStorageFull, as MinIO does when its drives
	// are full.
	Full
	// Hang never answers (until the client gives up or the proxy stops).
	Hang
	// LoseAnswer passes the request to the server, which carries it out,
	// and answers the client 500 InternalError: an answer lost on the way
	// back (the client retries what was in fact stored).
	LoseAnswer
)

// Proxy is a fault-injecting HTTP proxy in front of a Server: point
// --replica-endpoint at Endpoint() and choose per request with Set. The
// Host header is passed through, so request signatures stay valid.
type Proxy struct {
	srv     *httptest.Server
	mu      sync.Mutex
	rule    func(*http.Request) Fault
	closing chan struct{}
}

// StartProxy starts a proxy to s that passes everything until Set; it is
// stopped at cleanup.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	target, err := url.Parse(s.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{closing: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(target)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		rule := p.rule
		p.mu.Unlock()
		f := Pass
		if rule != nil {
			f = rule(r)
		}
		switch f {
		case Full:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusInsufficientStorage)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>XMinioStorageFull</Code>` +
				`<Message>Storage backend has reached its minimum free drive threshold. Please delete a few objects to proceed.</Message></Error>`))
		case Hang:
			select {
			case <-r.Context().Done():
			case <-p.closing:
			}
		case LoseAnswer:
			rp.ServeHTTP(httptest.NewRecorder(), r)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>` +
				`<Message>We encountered an internal error, please try again.</Message></Error>`))
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(p.Close)
	return p
}

// Set chooses what happens to each request from now on (nil: pass all).
func (p *Proxy) Set(rule func(*http.Request) Fault) {
	p.mu.Lock()
	p.rule = rule
	p.mu.Unlock()
}

// Endpoint is the proxy's URL, for --replica-endpoint.
func (p *Proxy) Endpoint() string { return p.srv.URL }

// Close stops the proxy, releasing hung requests (a second Close is
// harmless).
func (p *Proxy) Close() {
	select {
	case <-p.closing:
		return
	default:
	}
	close(p.closing)
	p.srv.CloseClientConnections()
	p.srv.Close()
}
