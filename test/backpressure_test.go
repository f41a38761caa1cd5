package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// floodDuration is how long TestRequestFloodIsBackPressure floods: 10 s by
// default, FLOOD_SECONDS to change it (the figure is 60).
func floodDuration(t *testing.T) time.Duration {
	if v := os.Getenv("FLOOD_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("FLOOD_SECONDS=%q: want a positive number of seconds", v)
		}
		return time.Duration(n) * time.Second
	}
	return 10 * time.Second
}

// A flood of requests against a slow agent that heartbeats is the
// supervisor's back-pressure, never the agent's death: 64 clients post as
// fast as they can to an agent that takes 10 ms a request: no restart, every
// refusal a 503 with Retry-After, and every 202 answered in the end. (Before:
// the full queue towards the agent made the supervisor restart it as
// "unresponsive" within a second, losing the requests it had accepted.)
func TestRequestFloodIsBackPressure(t *testing.T) {
	s := startSup(t, supOpts{noEvents: true,
		// Requests are journaled: the back-pressure is the journal's bound
		// (429), small here so that the flood reaches it.
		flags: []string{"--heartbeat-timeout", "2s", "--start-timeout", "10s", "--request-journal-bytes", "4194304"},
		agent: []string{"--heartbeat-interval", "100ms", "--behaviour", "latency_ms=10", "--answer"}})
	waitFor(t, 30*time.Second, "the agent to be up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	_, ready := s.get("/readyz")
	pid0 := readyPID(t, ready)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	url := s.url("/v1/requests")
	var (
		mu       sync.Mutex
		accepted []string
		codes    = map[int]int{}
		bad      []string
	)
	// 64 KiB requests: the test agent's library reads up to 64 MiB ahead of
	// its handler, so it is this, not the request count, that fills the
	// pipe and then the supervisor's queue.
	pad := strings.Repeat("x", 64<<10)
	deadline := time.Now().Add(floodDuration(t))
	var wg sync.WaitGroup
	for c := 0; c < 64; c++ {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				resp, err := client.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"message":"flood %d/%d %s"}`, c, i, pad)))
				if err != nil {
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				switch resp.StatusCode {
				case http.StatusAccepted:
					var r struct {
						ID string `json:"request_id"`
					}
					if err := json.Unmarshal(b, &r); err != nil || r.ID == "" {
						bad = append(bad, fmt.Sprintf("202 without a request_id: %.200s", b))
					}
					accepted = append(accepted, r.ID)
				case http.StatusServiceUnavailable, http.StatusTooManyRequests:
					if resp.Header.Get("Retry-After") == "" {
						bad = append(bad, fmt.Sprintf("HTTP %d without Retry-After: %.200s", resp.StatusCode, b))
					}
				default:
					bad = append(bad, fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, b))
				}
				refused := resp.StatusCode != http.StatusAccepted
				mu.Unlock()
				if refused {
					time.Sleep(20 * time.Millisecond) // impatient: far sooner than Retry-After
				}
			}
		})
	}
	wg.Wait()
	t.Logf("flood: HTTP codes %v, %d accepted", codes, len(accepted))
	for i, b := range bad {
		if i == 5 {
			t.Errorf("... %d more", len(bad)-5)
			break
		}
		t.Error(b)
	}
	if codes[http.StatusServiceUnavailable]+codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("no request was refused: the flood never filled the queue, so this test proves nothing")
	}

	// Every accepted request is answered, by the agent that was there all
	// along.
	pending := accepted
	waitFor(t, 3*time.Minute, "every accepted request answered", func() bool {
		var still []string
		for _, id := range pending {
			code, body := s.get("/v1/requests/" + id)
			if code != http.StatusOK || !strings.Contains(body, `"status":"answered"`) {
				still = append(still, id)
				if code != http.StatusOK || !strings.Contains(body, `"status":"pending"`) {
					t.Fatalf("request %s: HTTP %d %s", id, code, body)
				}
			}
		}
		pending = still
		return len(pending) == 0
	})
	_, metrics := s.get("/metrics")
	if n := metricSum(metrics, "supervisor_agent_restarts_total"); n > 0 {
		t.Errorf("%v agent restarts during the flood, want 0\n%s", n, tail(s.out.String(), 3000))
	}
	_, ready = s.get("/readyz")
	if pid := readyPID(t, ready); pid != pid0 {
		t.Errorf("the agent's pid changed from %d to %d", pid0, pid)
	}
}

func readyPID(t *testing.T, body string) int {
	t.Helper()
	var r struct {
		PID int `json:"agent_pid"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.PID == 0 {
		t.Fatalf("/readyz: %q", body)
	}
	return r.PID
}
