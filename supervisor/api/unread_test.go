package api

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// hostileBody opens a connection to addr and sends a request for path that
// declares a body of 100,000 bytes and sends one; it returns the
// connection and the status answered (0: none within 5 s).
func hostileBody(t *testing.T, addr, method, path string) (net.Conn, int) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nx", method, path)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, 0
	}
	resp.Body.Close()
	return c, resp.StatusCode
}

// closedSoon: the server closes c within 5 s (it is not kept open until
// the read timeout, 30 s, for the rest of a body it will never use).
func closedSoon(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

// TestUnreadBodiesDoNotHoldSlots: clients that declare a body, send one
// byte of it and are answered without it being read — 401 without the
// token, 503 on a reserve slot, a probe path with a body — have their
// connection closed at once, so the listener's slots come back and the
// probes answer (before, each held its slot until the 30 s read timeout
// and five of them starved /healthz on a listener of 4 + 1 slots).
func TestUnreadBodiesDoNotHoldSlots(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	s, err := New(Options{Log: slog.New(slog.DiscardHandler), Metrics: met, Bounds: observe.NewBoundsMetrics(met.Reg, nil),
		Retention: time.Minute, TokenFile: tok}, pageOwner{dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.general, s.reserve = 4, 1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	go s.ServeProbes(pln)
	defer s.Shutdown(t.Context())
	addr, paddr := ln.Addr().String(), pln.Addr().String()

	for round := range 2 { // the slots come back: a second wave is answered the same
		var conns []net.Conn
		for i := range 4 {
			c, code := hostileBody(t, addr, "POST", "/v1/requests")
			if code != http.StatusUnauthorized {
				t.Fatalf("round %d, client %d without the token: status %d, want 401", round, i, code)
			}
			conns = append(conns, c)
		}
		c, code := hostileBody(t, addr, "GET", "/healthz") // the reserve slot, a probe path with a body
		if code != http.StatusOK {
			t.Fatalf("round %d: a probe with a body on the reserve slot: status %d, want 200", round, code)
		}
		conns = append(conns, c)
		for i, c := range conns {
			if !closedSoon(c) {
				t.Fatalf("round %d: connection %d is still open 5 s after its answer: it holds a slot for the rest of a body nobody reads", round, i)
			}
		}
		if code := rawGet(t, addr, "/healthz", 2*time.Second); code != http.StatusOK {
			t.Fatalf("round %d: /healthz on the main listener: %d (0: no answer within 2 s)", round, code)
		}
	}

	// The probe listener: every one of its slots taken by a probe with a
	// body, then a probe.
	var conns []net.Conn
	for i := range probeConns {
		c, code := hostileBody(t, paddr, "GET", "/readyz")
		if code == 0 {
			t.Fatalf("probe listener, client %d: no answer", i)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		if !closedSoon(c) {
			t.Fatalf("probe listener: connection %d is still open 5 s after its answer", i)
		}
	}
	if code := rawGet(t, paddr, "/healthz", 2*time.Second); code != http.StatusOK {
		t.Fatalf("/healthz on the probe listener: %d (0: no answer within 2 s)", code)
	}
}
