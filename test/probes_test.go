package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The probes answer within a second, and authenticated requests get
// through, while 1,000 hostile clients hold connections to the HTTP
// listener: silent ones, ones that send a header a line every half second,
// ones without the token, and ones that wait for results that never come
// (SPEC §9). Evicted clients come back. Once with the probes on the main
// listener, once on --probe-addr.
func TestProbesAnswerUnderHostileClients(t *testing.T) {
	raiseNoFile(t, 4096)
	for _, tc := range []struct {
		name      string
		probeAddr bool
	}{
		{"main-listener", false},
		{"probe-addr", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			token := "hostile-test-token"
			flags := []string{"--http-token-file", writeTokenFile(t, token, 0o600)}
			if tc.probeAddr {
				flags = append(flags, "--probe-addr", "127.0.0.1:0")
			}
			s := startSup(t, supOpts{flags: flags, noEvents: true})
			s.waitReady()
			addr := s.httpAddr()
			probes := addr
			if tc.probeAddr {
				probes = s.probeAddr()
			}
			pid := s.cmd.Process.Pid

			h := startHostileClients(t, addr, token, 1000)
			defer h.stop()
			waitFor(t, 30*time.Second, "1,000 hostile clients to connect", func() bool { return h.dialed.Load() >= 1000 })

			probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			var slowest time.Duration
			maxFDs := 0
			for i := range 20 {
				for _, path := range []string{"/healthz", "/readyz"} {
					start := time.Now()
					resp, err := probe.Get("http://" + probes + path)
					took := time.Since(start)
					slowest = max(slowest, took)
					if err != nil {
						t.Errorf("probe %d %s: no answer within 1 s: %v", i, path, err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("probe %d %s: %d after %v", i, path, resp.StatusCode, took)
					}
				}
				maxFDs = max(maxFDs, fdCount(pid))
				time.Sleep(100 * time.Millisecond)
			}

			// Authenticated requests get through, and are answered.
			client := &http.Client{Timeout: 5 * time.Second}
			for i := range 5 {
				code, body := doHTTP(client, "POST", "http://"+addr+"/v1/requests", token, `{"message":"legit"}`)
				if code != http.StatusAccepted {
					t.Errorf("authenticated request %d under attack: %d %s, want 202", i, code, body)
				}
			}
			if code, body := doHTTP(client, "POST", "http://"+addr+"/v1/requests", "", `{"message":"x"}`); code != http.StatusUnauthorized {
				t.Errorf("request without the token: %d %s, want 401", code, body)
			}
			if tc.probeAddr {
				// The probe listener serves the probes and /metrics, never the request API.
				if code, body := doHTTP(client, "GET", "http://"+probes+"/metrics", "", ""); code != 200 || !strings.Contains(body, "supervisor_http_connections_evicted_total") {
					t.Errorf("/metrics on --probe-addr: %d", code)
				}
				if code, _ := doHTTP(client, "POST", "http://"+probes+"/v1/requests", token, `{"message":"x"}`); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
					t.Errorf("POST /v1/requests on --probe-addr: %d, want 404", code)
				}
			}
			h.stop()
			t.Logf("slowest probe %v; hostile clients: %d connections made, %d waits refused at once, %d answered 401; supervisor descriptors at most %d",
				slowest, h.dialed.Load(), h.waitRefused.Load(), h.unauthorized.Load(), maxFDs)
			if h.waitRefused.Load() == 0 {
				t.Error("no ?wait= request was refused its wait: waits are not capped per client")
			}
			if maxFDs > 256+150 {
				t.Errorf("%d descriptors open: the connection cap does not hold", maxFDs)
			}
			if v := s.metric("supervisor_http_waits_refused_total"); v <= 0 {
				t.Errorf("supervisor_http_waits_refused_total %v, want > 0", v)
			}
			if v := s.metric("supervisor_http_connections_evicted_total", `listener="http"`); v <= 0 {
				t.Errorf(`supervisor_http_connections_evicted_total{listener="http"} %v, want > 0`, v)
			}
		})
	}
}

// raiseNoFile raises this process's RLIMIT_NOFILE to at least n (the
// hostile clients' descriptors are ours), or skips.
func raiseNoFile(t *testing.T, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	if rl.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d is below the %d this test needs", rl.Max, n)
	}
	old := rl.Cur
	rl.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Cur = old; syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl) })
}

// writeTokenFile writes a bearer token file with mode.
func writeTokenFile(t *testing.T, token string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // not filtered by the umask
		t.Fatal(err)
	}
	return path
}

// probeAddr reads the --probe-addr listener's address from the log.
func (s *sup) probeAddr() string {
	s.t.Helper()
	re := regexp.MustCompile(`msg="probe listener up" addr=(\S+)`)
	var addr string
	waitFor(s.t, 30*time.Second, "the probe listener", func() bool {
		if m := re.FindStringSubmatch(s.out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

func doHTTP(c *http.Client, method, url, token, body string) (int, string) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// hostile is a crowd of clients that each hold one connection to addr and
// open another, after a short pause, whenever the server closes theirs.
type hostile struct {
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	once         sync.Once
	dialed       atomic.Int64 // connections made
	waitRefused  atomic.Int64 // ?wait= answered 202 with wait_refused
	unauthorized atomic.Int64 // 401s
}

func startHostileClients(t *testing.T, addr, token string, n int) *hostile {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hostile{cancel: cancel}
	kinds := []func(ctx context.Context, c net.Conn){
		// Silent: connects and sends nothing.
		func(ctx context.Context, c net.Conn) { holdOpen(ctx, c) },
		// Slow header: a header line every half second, never the end.
		func(ctx context.Context, c net.Conn) {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
				return
			}
			go holdOpen(ctx, c)
			for i := 0; ctx.Err() == nil; i++ {
				time.Sleep(500 * time.Millisecond)
				if _, err := fmt.Fprintf(c, "X-Slow-%d: y\r\n", i); err != nil {
					return
				}
			}
		},
		// No token: one request, then keeps the connection.
		func(ctx context.Context, c net.Conn) {
			if code, _ := rawRequest(c, "POST /v1/requests?wait=5m", ""); code == http.StatusUnauthorized {
				h.unauthorized.Add(1)
			}
			holdOpen(ctx, c)
		},
		// A wait for a result that never comes (the test agent does not
		// answer requests), then keeps the connection.
		func(ctx context.Context, c net.Conn) {
			if code, body := rawRequest(c, "POST /v1/requests?wait=5m", token); code == http.StatusAccepted && strings.Contains(body, "wait_refused") {
				h.waitRefused.Add(1)
			}
			holdOpen(ctx, c)
		},
	}
	for i := range n {
		kind := kinds[i%len(kinds)]
		h.wg.Go(func() {
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err == nil {
					h.dialed.Add(1)
					stop := context.AfterFunc(ctx, func() { c.Close() })
					kind(ctx, c)
					stop()
					c.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(200*time.Millisecond + rand.N(100*time.Millisecond)):
				}
			}
		})
	}
	t.Cleanup(h.stop)
	return h
}

func (h *hostile) stop() {
	h.once.Do(func() {
		h.cancel()
		h.wg.Wait()
	})
}

// holdOpen reads c until the server closes it or ctx ends.
func holdOpen(ctx context.Context, c net.Conn) {
	buf := make([]byte, 4096)
	for ctx.Err() == nil {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// rawRequest sends a JSON request on c and reads the response.
func rawRequest(c net.Conn, line, token string) (int, string) {
	body := `{"message":"hostile"}`
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", line, auth, len(body), body); err != nil {
		return 0, ""
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
