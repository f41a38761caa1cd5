package test

// The kill loop of issue 29: requests with idempotency keys, an agent whose
// steps bill a file outside the data directory (examples/llmsteps), and
// SIGKILLs of the agent and of the supervisor at random while requests are
// POSTed and answered. What a user sees at the end: every key gave one
// request id, every request is answered once with the answer its steps
// compute, and a step ran twice only when the process running it was killed.

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// killloopEnvInt reads a positive integer from the environment.
func killloopEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// freePort returns a port of 127.0.0.1 nothing listens on now: the
// supervisor is restarted on the same address, as an operator's is.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// childPIDs lists the children of pid (the supervisor's agent).
func childPIDs(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestRequestKillLoop: KILLLOOP_REQUESTS requests (100; 1000 with SOAK=1)
// are POSTed by a pool of clients, each with its own Idempotency-Key, and
// retried with the same key on connection errors, timeouts, 503 and 429,
// while the agent and the supervisor are killed with SIGKILL at random
// (KILLLOOP_KILLS times: 6; 60 with SOAK=1), the supervisor restarted on
// the same data directory and address each time. The agent is
// examples/llmsteps: three steps per request, each a fake LLM call that
// appends "call PID REQUEST_ID STEP ATTEMPT" to a file outside the data
// directory before it runs. At the end, with the supervisor up:
//   - each key got one request id, in every 202/200 it was answered;
//   - the journal holds exactly those requests (none lost, none extra);
//   - each is answered, with the answer its three steps compute;
//   - each step of each request ran at least once, and a step that ran more
//     than once ran in a different process each time, every earlier run in a
//     process that was killed (the agent, or the agent of a killed
//     supervisor) and as that process's last call: the step in flight at
//     the kill. Those repeats are counted and logged.
func TestRequestKillLoop(t *testing.T) {
	soak := os.Getenv("SOAK") != ""
	nReq, nKills := 100, 6
	if soak {
		nReq, nKills = 1000, 60
	}
	nReq = killloopEnvInt(t, "KILLLOOP_REQUESTS", nReq)
	nKills = killloopEnvInt(t, "KILLLOOP_KILLS", nKills)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("KILLLOOP_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("%d requests, %d kills, KILLLOOP_SEED=%d", nReq, nKills, seed)
	rng := rand.New(rand.NewPCG(seed, 29))

	calls := filepath.Join(t.TempDir(), "llm-calls.txt")
	addr := freePort(t)
	opts := supOpts{
		dataDir: filepath.Join(t.TempDir(), "data"),
		// Kills are the test, not poison: a request in flight at several
		// agent kills must not be set aside, nor the agent given up on.
		flags: append(append([]string(nil), fastFlags...), "--http-addr", addr,
			"--max-restarts", "0", "--request-max-attempts", "1000000", "--heartbeat-timeout", "30s"),
		command: []string{llmstepsAgent(t), "-checkpoint-every", "150ms"},
		env:     []string{"LLMSTEPS_CALLS=" + calls, "LLMSTEPS_DELAY=20ms", "LLMSTEPS_STEPS=3"},
	}
	s := startSup(t, opts)
	s.waitReady()
	base := "http://" + addr

	// The clients.
	type outcome struct {
		ids     map[string]bool // every request id a 200/202 named for the key
		retries int
	}
	results := make([]outcome, nReq)
	for i := range results {
		results[i].ids = map[string]bool{}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(i int) (int, string, error) {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/requests", strings.NewReader(fmt.Sprintf(`{"message":"kl-%05d"}`, i)))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("killloop-%05d", i))
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// submit POSTs request i until a 202 or 200 names its id (retrying
	// with the same key); it reports anything else as an error.
	submit := func(i int) {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			code, body, err := post(i)
			switch {
			case err == nil && (code == http.StatusAccepted || code == http.StatusOK):
				var r struct {
					ID string `json:"request_id"`
				}
				if json.Unmarshal([]byte(body), &r) != nil || r.ID == "" {
					t.Errorf("request %d: %d without a request id: %s", i, code, body)
					return
				}
				results[i].ids[r.ID] = true
				return
			case err != nil, code == http.StatusServiceUnavailable, code == http.StatusTooManyRequests:
				// A killed or restarting supervisor: retry with the same key.
			default:
				t.Errorf("request %d: POST answered %d %s; want 202/200 (or a retryable 503/429)", i, code, body)
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("request %d: no 202/200 within 5 minutes of retries (last: %d %v)", i, code, err)
				return
			}
			results[i].retries++
			time.Sleep(50 * time.Millisecond)
		}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			for i := range work {
				submit(i)
				if r.IntN(4) == 0 {
					submit(i) // the caller retries a POST that had succeeded: same id
				}
				time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond) // POSTs spread over the kills
			}
		}()
	}
	go func() {
		for i := range nReq {
			work <- i
		}
		close(work)
	}()
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()

	// The killer, on the test goroutine.
	killed := map[int]string{} // agent pid → how it died
	agentKills, supKills := 0, 0
	for k := range nKills {
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		cur := s
		if rng.IntN(2) == 0 {
			var pids []int
			waitFor(t, 60*time.Second, "the supervisor's agent to kill", func() bool {
				pids = childPIDs(cur.cmd.Process.Pid)
				return len(pids) > 0
			})
			for _, p := range pids {
				killed[p] = fmt.Sprintf("kill %d: agent SIGKILLed", k)
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			agentKills++
			continue
		}
		orphans := childPIDs(cur.cmd.Process.Pid)
		for _, p := range orphans {
			killed[p] = fmt.Sprintf("kill %d: its supervisor SIGKILLed", k)
		}
		killSup(t, cur)
		supKills++
		for _, p := range orphans {
			waitFor(t, 60*time.Second, "the orphaned agent's exit", func() bool { return !alive(p) })
		}
		// One agent pid may still be found after the kill (a child forked
		// but not yet listed): the agent of the killed supervisor then
		// appears in the calls file under a pid not in killed, and the
		// checks below say so.
		s = startSup(t, opts)
	}
	select {
	case <-clientsDone:
	case <-time.After(10 * time.Minute):
		t.Fatal("the clients did not finish within 10 minutes")
	}
	t.Logf("%d agent kills, %d supervisor kills", agentKills, supKills)

	// Every key named one request id.
	ids := map[string]int{} // request id → request number
	retries := 0
	for i, r := range results {
		retries += r.retries
		if len(r.ids) != 1 {
			t.Errorf("key killloop-%05d named %d request ids %v; want exactly one", i, len(r.ids), r.ids)
		}
		for id := range r.ids {
			if j, dup := ids[id]; dup {
				t.Errorf("request id %s was given to keys %d and %d", id, j, i)
			}
			ids[id] = i
		}
	}
	if t.Failed() {
		return
	}

	// All settle: the agent answers each (after redeliveries).
	s.waitReady()
	status := map[string]reqView{}
	waitFor(t, 10*time.Minute, "every request answered", func() bool {
		for id := range ids {
			if v, ok := status[id]; ok && v.Status != "pending" {
				continue
			}
			_, v := getRequest(t, s, id)
			status[id] = v
			if v.Status == "" || v.Status == "pending" {
				return false
			}
		}
		return true
	})
	repeatsAttempt := 0
	for id, i := range ids {
		v := status[id]
		if v.Status != "answered" {
			t.Errorf("request %d (%s) ended %q %+v; want answered", i, id, v.Status, v.Error)
			continue
		}
		var data struct {
			Answer  string `json:"answer"`
			Attempt int    `json:"attempt"`
		}
		if err := json.Unmarshal(v.Data, &data); err != nil {
			t.Errorf("request %d: answer %s: %v", i, v.Data, err)
			continue
		}
		if want := fmt.Sprintf("llm-2(llm-1(llm-0(kl-%05d)))", i); data.Answer != want {
			t.Errorf("request %d answered %q; want %q (its three steps)", i, data.Answer, want)
		}
		if data.Attempt > 1 {
			repeatsAttempt++
		}
	}

	// The journal holds exactly these requests.
	code, out, stderr := cli(t, "requests", "list", "--data-dir", opts.dataDir, "--json")
	var listed []struct {
		ID     string `json:"request_id"`
		Status string `json:"status"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil {
		t.Fatalf("supervisor requests list --json: exit %d: %s %s", code, out, stderr)
	}
	if len(listed) != len(ids) {
		t.Errorf("the journal holds %d requests; the clients were given %d ids", len(listed), len(ids))
	}
	for _, l := range listed {
		if _, ok := ids[l.ID]; !ok {
			t.Errorf("the journal holds request %s (%s) no client was given", l.ID, l.Status)
		}
	}

	// Steps: every step of every request ran; a repeat is the step in
	// flight at a kill.
	all := llmCalls(t, calls)
	lastOfPID := map[int]int{} // pid → index in all of its last call
	for n, c := range all {
		lastOfPID[c.pid] = n
	}
	type stepKey struct {
		id   string
		step string
	}
	runs := map[stepKey][]int{} // → indexes in all
	for n, c := range all {
		if _, ok := ids[c.requestID]; !ok {
			t.Errorf("a call for request %s, which no client was given: %+v", c.requestID, c)
			continue
		}
		k := stepKey{c.requestID, c.step}
		runs[k] = append(runs[k], n)
	}
	repeats := 0
	var repeated []string
	for id, i := range ids {
		for st := range 3 {
			k := stepKey{id, "llm-" + strconv.Itoa(st)}
			rs := runs[k]
			if len(rs) == 0 {
				t.Errorf("request %d (%s): step %s never ran, yet the request is answered", i, id, k.step)
				continue
			}
			seen := map[int]bool{}
			for _, n := range rs {
				c := all[n]
				if seen[c.pid] {
					t.Errorf("request %d step %s ran twice in agent %d (no kill between): a completed step ran again", i, k.step, c.pid)
				}
				seen[c.pid] = true
			}
			for _, n := range rs[:len(rs)-1] {
				c := all[n]
				repeats++
				how, wasKilled := killed[c.pid]
				switch {
				case !wasKilled:
					t.Errorf("request %d step %s ran again after agent %d ran it, and that agent was never killed: a completed step ran twice", i, k.step, c.pid)
				case lastOfPID[c.pid] != n:
					// Seen with a supervisor kill: the agent answered (request_done
					// in the WAL, its steps forgotten) but the answer was not yet
					// in the request journal (journaled lazily, up to 10 ms later),
					// so the request was redelivered and every step ran again.
					t.Errorf("request %d step %s ran again after agent %d ran it (%s), but that agent went on to other calls: the step had completed", i, k.step, c.pid, how)
				default:
					repeated = append(repeated, fmt.Sprintf("request %d %s: pid %d (%s)", i, k.step, c.pid, how))
				}
			}
		}
	}
	sort.Strings(repeated)
	t.Logf("%d requests answered; %d answered by a redelivery (attempt > 1); %d POST retries; %d step calls for %d steps; %d steps ran again, each in flight at a kill:\n  %s",
		len(ids), repeatsAttempt, retries, len(all), 3*len(ids), repeats, strings.Join(repeated, "\n  "))
	t.Logf("supervisor_request_results_duplicate_total (since the last restart) = %v", s.metric("supervisor_request_results_duplicate_total"))
}
