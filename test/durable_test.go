package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// python is Debian's interpreter, where apt installs python3-msgpack.
const python = "/usr/bin/python3"

func requirePythonMsgpack(t testing.TB) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import msgpack").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s cannot import msgpack (%v: %s); CI must install python3-msgpack", python, err, bytes.TrimSpace(out))
		}
		t.Skipf("%s cannot import msgpack; apt-get install python3-msgpack", python)
	}
}

// docBlock returns the fenced code between the named markers of
// docs/protocol.md, written to a file in dir.
func docBlock(t testing.TB, name, dir string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+":begin -->\n```python\n", "```\n<!-- "+name+":end -->"
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("docs/protocol.md lacks the %s block", name)
	}
	path := filepath.Join(dir, name+".py")
	if err := os.WriteFile(path, doc[i+len(begin):j], 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// httpDo sends a request with an optional bearer token.
func (s *sup) httpDo(method, path, token, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url(path), strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *sup) waitReady() {
	s.t.Helper()
	waitFor(s.t, 60*time.Second, "the agent to be ready", func() bool { code, _ := s.get("/readyz"); return code == 200 })
}

// walSequences dumps the WAL of a stopped supervisor: sequence → content.
func walSequences(t testing.TB, dataDir string) map[uint64]string {
	t.Helper()
	code, out, errOut := cli(t, "wal", "dump", "--data-dir", dataDir, "--json")
	if code != 0 {
		t.Fatalf("wal dump: exit %d: %s", code, errOut)
	}
	got := map[uint64]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			Sequence uint64 `json:"sequence"`
			Entry    struct {
				Params struct {
					Content string `json:"content"`
				} `json:"params"`
			} `json:"entry"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("wal dump line %q: %v", sc.Text(), err)
		}
		got[rec.Sequence] = rec.Entry.Params.Content
	}
	return got
}

// sideEffects reads the durable agent's SIDE_EFFECT_LOG: "SEQ TEXT" lines.
// floodRequests POSTs requests from workers goroutines, messages
// "PREFIX-wW-I", until the returned stop is called (it waits for them).
func floodRequests(s *sup, workers int, prefix string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				s.post("/v1/requests", fmt.Sprintf(`{"message":"%s-w%d-%d"}`, prefix, w, i))
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

func sideEffects(t testing.TB, path string) map[uint64]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, line := range strings.Split(string(b), "\n") {
		seq, text, ok := strings.Cut(line, " ")
		if !ok {
			continue // a torn last line: the agent died writing it
		}
		n, err := strconv.ParseUint(seq, 10, 64)
		if err != nil {
			t.Fatalf("side effect line %q", line)
		}
		out[n] = text
	}
	return out
}

// TestDurablePythonAgentAnswersRequests runs the durable agent of
// docs/protocol.md (written from the document alone) under the real binary
// behind a bearer token: a request is answered through POST ?wait, acted on
// only once its entry is durable, and the entry is in the WAL.
func TestDurablePythonAgentAnswersRequests(t *testing.T) {
	requirePythonMsgpack(t)
	dir := t.TempDir()
	agentPy := docBlock(t, "example-durable-agent", dir)
	effects := filepath.Join(dir, "effects.log")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("let-me-in\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startSup(t, supOpts{command: []string{python, agentPy}, env: []string{"SIDE_EFFECT_LOG=" + effects},
		flags: []string{"--http-token-file", tokenFile}})
	s.waitReady()

	// The token: requests need it, probes and metrics do not.
	for _, tok := range []string{"", "let-me-out"} {
		if code, body := s.httpDo("POST", "/v1/requests?wait=5s", tok, `{"message":"x"}`); code != 401 {
			t.Errorf("POST with token %q: %d %s, want 401", tok, code, body)
		}
	}
	if code, _ := s.get("/metrics"); code != 200 {
		t.Errorf("/metrics answered %d without a token", code)
	}
	// wait that is not a duration, or above the cap.
	for _, w := range []string{"soon", "10m"} {
		if code, body := s.httpDo("POST", "/v1/requests?wait="+w, "let-me-in", `{"message":"x"}`); code != 400 {
			t.Errorf("wait=%s: %d %s, want 400", w, code, body)
		}
	}

	code, body := s.httpDo("POST", "/v1/requests?wait=20s", "let-me-in", `{"message":"remember the milk","user_id":"u1"}`)
	if code != 200 {
		t.Fatalf("POST ?wait: %d %s, want 200 with the answer", code, body)
	}
	var answer struct {
		RequestID string `json:"request_id"`
		Data      struct {
			Stored   string `json:"stored"`
			Sequence uint64 `json:"sequence"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.RequestID == "" || answer.Data.Stored != "remember the milk" || answer.Data.Sequence != 1 {
		t.Fatalf("answer %s (%v)", body, err)
	}
	code, body = s.httpDo("GET", "/v1/requests/"+answer.RequestID, "let-me-in", "")
	if code != 200 || !strings.Contains(body, `"status":"answered"`) || !strings.Contains(body, `"stored":"remember the milk"`) {
		t.Errorf("GET: %d %s", code, body)
	}
	code, body = s.httpDo("POST", "/v1/requests?wait=20s", "let-me-in", `{"message":""}`)
	if code != 200 || !strings.Contains(body, `"error":{"code":"EMPTY_MESSAGE","message":"nothing to remember"}`) {
		t.Errorf("failed request: %d %s", code, body)
	}
	if got := sideEffects(t, effects); got[1] != "remember the milk" || len(got) != 1 {
		t.Errorf("side effects %v", got)
	}
	if n := s.metric("supervisor_wal_acks_total"); n < 1 {
		t.Errorf("supervisor_wal_acks_total = %v", n)
	}
	if n := s.metric("supervisor_request_duration_seconds_count", `outcome="answered"`); n != 1 {
		t.Errorf("request latency histogram count = %v, want 1", n)
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got := walSequences(t, s.dataDir); got[1] != "remember the milk" {
		t.Errorf("WAL %v, want entry 1", got)
	}
}

// badResultsAgent answers each request by the rule its message names, and
// writes every error the supervisor sends it to ERRORS_LOG as a JSON line.
const badResultsAgent = `
import json, os, struct, sys, threading, time
import msgpack
rfile, wfile = sys.stdin.buffer, sys.stdout.buffer
lock = threading.Lock()
def send(msg):
    msg.setdefault("timestamp", int(time.time()))
    p = msgpack.packb(msg, use_bin_type=True)
    with lock:
        wfile.write(struct.pack(">I", len(p)) + p); wfile.flush()
def read_exact(n):
    b = b""
    while len(b) < n:
        c = rfile.read(n - len(b))
        if not c: sys.exit(0)
        b += c
    return b
def beat():
    while True:
        send({"type": "heartbeat"}); time.sleep(0.5)
threading.Thread(target=beat, daemon=True).start()
while True:
    (n,) = struct.unpack(">I", read_exact(4))
    msg = msgpack.unpackb(read_exact(n), raw=False)
    if msg["type"] == "error":
        with open(os.environ["ERRORS_LOG"], "a") as f:
            f.write(json.dumps(msg["error"]) + "\n")
        continue
    if msg["type"] == "shutdown":
        sys.exit(0)
    if msg["type"] != "process_request":
        continue
    rid, how = msg["request_id"], msg["data"]["message"]
    ok = {"type": "request_result", "request_id": rid, "data": {"ok": True}}
    if how == "unknown":
        send({"type": "request_result", "request_id": "not-a-request", "data": {}})
    elif how == "twice":
        send(ok); send(ok)
    elif how == "no-id":
        send({"type": "request_result", "data": {}})
    elif how == "both":
        send({"type": "request_result", "request_id": rid, "data": {}, "error": {"code": "X", "message": "y"}})
    elif how == "huge":
        send({"type": "request_result", "request_id": rid, "data": {"blob": "x" * (1 << 20)}})
    elif how == "late":
        threading.Timer(float(os.environ["LATE_AFTER"]), lambda: send(ok)).start()
        continue
    if how != "twice":
        send(ok)  # the valid answer after the bad one
`

// TestBadRequestResults: every malformed or misdirected request_result is
// answered with INVALID_MESSAGE naming the rule; a result after its request
// expired is dropped and counted, with no error.
func TestBadRequestResults(t *testing.T) {
	requirePythonMsgpack(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "bad.py")
	if err := os.WriteFile(script, []byte(badResultsAgent), 0o644); err != nil {
		t.Fatal(err)
	}
	errorsLog := filepath.Join(dir, "errors.jsonl")
	s := startSup(t, supOpts{command: []string{python, script}, flags: []string{"--request-timeout", "1s"},
		env: []string{"ERRORS_LOG=" + errorsLog, "LATE_AFTER=1.5"}})
	s.waitReady()
	type agentErr struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	}
	readErrors := func() []agentErr {
		b, _ := os.ReadFile(errorsLog)
		var out []agentErr
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e agentErr
			if json.Unmarshal([]byte(line), &e) == nil {
				out = append(out, e)
			}
		}
		return out
	}
	for _, c := range []struct {
		how, field, rule, message string
	}{
		{"unknown", "request_id", "field_value", "no process_request with this request_id"},
		{"no-id", "request_id", "missing_field", "required field is missing"},
		{"both", "", "field_value", "both data and error"},
		{"huge", "", "too_large", "over its 1048576-byte limit"},
	} {
		before := len(readErrors())
		code, body := s.post("/v1/requests?wait=10s", `{"message":"`+c.how+`"}`)
		if code != 200 {
			t.Errorf("%s: the valid answer after the bad one: %d %s", c.how, code, body)
		}
		var got []agentErr
		waitFor(t, 20*time.Second, c.how+": an error sent to the agent", func() bool { got = readErrors(); return len(got) > before })
		e := got[before]
		field, _ := e.Details["field"].(string)
		if e.Code != "INVALID_MESSAGE" || field != c.field || e.Details["rule"] != c.rule || e.Details["type"] != "request_result" ||
			!strings.Contains(e.Message, c.message) {
			t.Errorf("%s: agent got %+v; want INVALID_MESSAGE field %q rule %q mentioning %q", c.how, e, c.field, c.rule, c.message)
		}
	}

	// A result after its request expired: the caller got 202 and then
	// sees "expired"; the late result is counted and kept beside it, not an error.
	before := len(readErrors())
	code, body := s.post("/v1/requests?wait=5s", `{"message":"late"}`)
	if code != 202 {
		t.Fatalf("late request: %d %s, want 202 once it expired", code, body)
	}
	var accepted struct {
		RequestID string `json:"request_id"`
	}
	json.Unmarshal([]byte(body), &accepted)
	if code, body := s.get("/v1/requests/" + accepted.RequestID); code != 200 || !strings.Contains(body, `"status":"expired"`) {
		t.Errorf("GET of the expired request: %d %s", code, body)
	}
	waitFor(t, 20*time.Second, "the late result to be counted", func() bool {
		return s.metric("supervisor_request_results_total", `outcome="late"`) == 1
	})
	// Anything the supervisor said about the late result was sent before
	// the next request, whose answer the agent has seen once it answers.
	if code, body := s.post("/v1/requests?wait=10s", `{"message":"ping"}`); code != 200 {
		t.Fatalf("ping: %d %s", code, body)
	}
	if got := readErrors(); len(got) != before {
		t.Errorf("the late result drew errors: %+v", got[before:])
	}
	if n := s.metric("supervisor_invalid_frames_total", `code="INVALID_MESSAGE"`, `rule="field_value"`); n != 2 {
		t.Errorf("invalid field_value frames %v, want 2 (unknown, both)", n)
	}
	// A second answer to an answered request (what a redelivered request
	// that finished twice produces) is ignored and counted, not an error.
	before = len(readErrors())
	if code, body := s.post("/v1/requests?wait=10s", `{"message":"twice"}`); code != 200 {
		t.Fatalf("twice: %d %s", code, body)
	}
	waitFor(t, 20*time.Second, "the duplicate answer counted", func() bool {
		return s.metric("supervisor_request_results_duplicate_total") == 1
	})
	if code, body := s.post("/v1/requests?wait=10s", `{"message":"ping"}`); code != 200 {
		t.Fatalf("ping: %d %s", code, body)
	}
	if got := readErrors(); len(got) != before {
		t.Errorf("the duplicate answer drew errors: %+v", got[before:])
	}
}

// TestKill9AfterWalAckLosesNothing kills the supervisor with SIGKILL right
// after the durable agent acted on acknowledged entries, again and again on
// one data directory: every entry the agent acted on is in the WAL.
// SOAK=1 (or SUPERVISOR_SOAK=1) runs 40 rounds instead of 4.
func TestKill9AfterWalAckLosesNothing(t *testing.T) {
	requirePythonMsgpack(t)
	rounds := 4
	if os.Getenv("SOAK") != "" || os.Getenv("SUPERVISOR_SOAK") != "" {
		rounds = 40
	}
	dir := t.TempDir()
	agentPy := docBlock(t, "example-durable-agent", dir)
	effects := filepath.Join(dir, "effects.log")
	dataDir := filepath.Join(dir, "data")
	acted := 0
	for round := range rounds {
		s := startSup(t, supOpts{dataDir: dataDir, command: []string{python, agentPy}, env: []string{"SIDE_EFFECT_LOG=" + effects}, keepAlive: true})
		s.waitReady()
		_, ready := s.get("/readyz")
		pid := readyPID(t, ready)
		// Flood requests until the agent has acted on a random number more.
		target := acted + 1 + rand.IntN(30)
		stop := floodRequests(s, 4, fmt.Sprintf("r%d", round))
		waitFor(t, 60*time.Second, "side effects", func() bool { return len(sideEffects(t, effects)) >= target })
		s.signal(syscall.SIGKILL) // right after an ack was acted on
		stop()
		s.wait(30 * time.Second)
		waitFor(t, 10*time.Second, "the agent to die with its supervisor", func() bool { return !alive(pid) })

		effectsNow := sideEffects(t, effects)
		wal := walSequences(t, dataDir)
		for seq, text := range effectsNow {
			if got, ok := wal[seq]; !ok || got != text {
				t.Fatalf("round %d: the agent acted on entry %d (%q) after its wal_ack, but the WAL has %q (present %v)", round, seq, text, got, ok)
			}
		}
		acted = len(effectsNow)
		t.Logf("round %d: %d entries acted on, all in the WAL (%d entries)", round, acted, len(wal))
	}
}
