package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

func TestJSONDepth(t *testing.T) {
	for _, tc := range []struct {
		json string
		want int
	}{
		{`{}`, 1}, {`{"a":1}`, 1}, {`{"a":{"b":[1,{"c":2}]}}`, 4}, {`{"a":[]}`, 2},
	} {
		var v any
		json.Unmarshal([]byte(tc.json), &v)
		if got := jsonDepth(v, 100); got != tc.want {
			t.Errorf("%s: depth %d, want %d", tc.json, got, tc.want)
		}
	}
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	var v any
	json.Unmarshal([]byte(deep), &v)
	if got := jsonDepth(v, maxContextDepth+1); got != maxContextDepth+1 {
		t.Fatalf("5000 deep counted as %d", got)
	}
}

// get sends a GET on a new connection and returns the status, or 0.
func rawGet(t *testing.T, addr, path string, timeout time.Duration) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Connections that send nothing give their slots to new ones; when every
// general slot serves a request, the reserve answers the probe paths only;
// the cap holds throughout.
func TestConnPoolKeepsRoomForProbes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var open, peak, evicted atomic.Int64
	pool := newConnPool(ln, 2, 1, 50*time.Millisecond)
	pool.onOpen = func(d int) {
		n := open.Add(int64(d))
		for {
			if p := peak.Load(); n <= p || peak.CompareAndSwap(p, n) {
				return
			}
		}
	}
	pool.onEvict = func() { evicted.Add(1) }
	block := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) { <-block })
	srv := &http.Server{Handler: reserveGuard(mux), ReadHeaderTimeout: time.Minute, ConnState: pool.connState, ConnContext: connContext}
	go srv.Serve(pool)
	defer srv.Close()
	addr := ln.Addr().String()

	// Twenty silent clients: each newcomer takes the slot of an old one.
	var silent []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	for i := range 5 {
		start := time.Now()
		if code := rawGet(t, addr, "/healthz", 2*time.Second); code != 200 {
			t.Fatalf("probe %d among silent clients: %d", i, code)
		}
		t.Logf("probe %d among silent clients: %v", i, time.Since(start))
	}
	if evicted.Load() == 0 {
		t.Error("no silent connection was evicted")
	}
	for _, c := range silent {
		c.Close()
	}
	waitUntil := time.Now().Add(5 * time.Second)
	for open.Load() != 0 {
		if time.Now().After(waitUntil) {
			t.Fatalf("%d connections still open after their clients left", open.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Both general slots serve slow requests: the reserve answers probes
	// and refuses the rest.
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	waitUntil = time.Now().Add(5 * time.Second)
	for {
		pool.mu.Lock()
		busy := 0
		for c := range pool.conns {
			if c.state == connBusy && !c.probeOnly {
				busy++
			}
		}
		pool.mu.Unlock()
		if busy == 2 {
			break
		}
		if time.Now().After(waitUntil) {
			t.Fatal("the slow requests never took both general slots")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := rawGet(t, addr, "/healthz", 2*time.Second); code != 200 {
		t.Fatalf("probe with every general slot busy: %d", code)
	}
	if code := rawGet(t, addr, "/slow", 2*time.Second); code != http.StatusServiceUnavailable {
		t.Fatalf("another request in the reserve: %d, want 503", code)
	}
	close(block)
	if n := peak.Load(); n > 3 {
		t.Fatalf("%d connections open at once, cap 2 + 1 reserved", n)
	}
}

func TestBearerSchemeCaseInsensitive(t *testing.T) {
	for h, want := range map[string]bool{
		"Bearer tok": true, "bearer tok": true, "BEARER  tok ": true, "Basic tok": false, "Bearertok": false, "": false,
	} {
		got, ok := bearerToken(h)
		if ok != want || (ok && got != "tok") {
			t.Errorf("%q: %q %v", h, got, ok)
		}
	}
}

func TestTokenModeRule(t *testing.T) {
	for _, tc := range []struct {
		mode      fs.FileMode
		owner, me uint32
		ok        bool
	}{
		{0o600, 1000, 1000, true}, {0o400, 1000, 1000, true},
		{0o640, 1000, 1000, false}, {0o644, 1000, 1000, false}, {0o604, 1000, 1000, false},
		{0o440, 0, 65532, true},  // a Kubernetes Secret under fsGroup
		{0o460, 0, 65532, false}, // group-writable
		{0o444, 0, 65532, false}, // others may read
		{0o440, 0, 0, false},     // root's own file: chmod 600 is root's to do
		{0o440, 1000, 65532, false},
	} {
		if got := tokenModeOK(tc.mode, tc.owner, tc.me); got != tc.ok {
			t.Errorf("mode %04o owner %d read by %d: ok %v, want %v", tc.mode, tc.owner, tc.me, got, tc.ok)
		}
	}
}

// The API's own metrics follow the Prometheus conventions.
func TestAPIMetricsFollowConventions(t *testing.T) {
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	s, err := New(Options{Log: slog.New(slog.DiscardHandler), Metrics: met, Bounds: observe.NewBoundsMetrics(met.Reg, nil), Retention: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.waitsRefused.Inc()
	s.evictions.WithLabelValues("http").Inc()
	problems, err := testutil.GatherAndLint(met.Reg, "supervisor_http_waits_refused_total", "supervisor_http_connections_evicted_total")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

func TestWaitLimiter(t *testing.T) {
	l := newWaitLimiter(2, 3)
	req := func(addr string) *http.Request { return &http.Request{RemoteAddr: addr} }
	var releases []func()
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"10.0.0.1:1000", true}, {"10.0.0.1:1001", true},
		{"10.0.0.1:1002", false}, // a third from one client
		{"10.0.0.2:1000", true},
		{"10.0.0.3:1000", false}, // a fourth in all
	} {
		release, why, ok := l.acquire(req(c.addr))
		if ok != c.ok {
			t.Fatalf("%s: ok %v (%s), want %v", c.addr, ok, why, c.ok)
		}
		if ok {
			releases = append(releases, release)
		} else if why == "" {
			t.Errorf("%s: refused without a reason", c.addr)
		}
	}
	releases[0]()
	if _, why, ok := l.acquire(req("10.0.0.1:1003")); !ok {
		t.Errorf("after a release: refused: %s", why)
	}
}
