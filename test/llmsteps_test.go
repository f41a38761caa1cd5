package test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Go client's durable steps and cancellation through the binary, with
// examples/llmsteps: an agent that answers a request with a chain of fake
// LLM calls, each a step, and bills every call in a file outside the data
// directory ("call PID REQUEST_ID STEP ATTEMPT").

func llmstepsAgent(t testing.TB) string {
	t.Helper()
	var flags []string
	if raceEnabled {
		flags = append(flags, "-race")
	}
	return goBuild(t, "llmsteps", "../examples/llmsteps", nil, flags...)
}

// llmCall is one line of the calls file.
type llmCall struct {
	pid       int
	requestID string
	step      string
	attempt   int
}

func llmCalls(t testing.TB, path string) []llmCall {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []llmCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 5 || f[0] != "call" {
			continue
		}
		pid, _ := strconv.Atoi(f[1])
		attempt, _ := strconv.Atoi(f[4])
		out = append(out, llmCall{pid, f[2], f[3], attempt})
	}
	return out
}

// callsOf counts the calls of request id by step.
func callsOf(calls []llmCall, id string) map[string]int {
	n := map[string]int{}
	for _, c := range calls {
		if c.requestID == id {
			n[c.step]++
		}
	}
	return n
}

// waitCall waits for a call of step by request id and returns it.
func waitCall(t testing.TB, path, id, step string) llmCall {
	t.Helper()
	var got llmCall
	waitFor(t, 60*time.Second, "an LLM call "+step+" of request "+id, func() bool {
		for _, c := range llmCalls(t, path) {
			if c.requestID == id && c.step == step {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

func llmPostRequest(t testing.TB, s *sup, message string) string {
	t.Helper()
	code, body := s.post("/v1/requests", `{"message":"`+message+`"}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST /v1/requests: %d %s", code, body)
	}
	var acc struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(body), &acc); err != nil || acc.RequestID == "" {
		t.Fatalf("POST /v1/requests answered %s", body)
	}
	return acc.RequestID
}

type llmRequestView struct {
	Status string         `json:"status"`
	Data   map[string]any `json:"data"`
	Error  map[string]any `json:"error"`
}

func llmRequestStatus(t testing.TB, s *sup, id string) (int, llmRequestView) {
	t.Helper()
	code, body := s.get("/v1/requests/" + id)
	var st llmRequestView
	_ = json.Unmarshal([]byte(body), &st)
	return code, st
}

func llmDeleteRequest(t testing.TB, s *sup, id string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, s.url("/v1/requests/"+id), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// TestLLMStepsSurviveKill9: the example agent is killed with SIGKILL while
// its second LLM call of a request is in flight. After the restart the
// supervisor delivers the request again (attempt 2); the first step's answer
// comes from the log, so the LLM is called once for it, twice for the step
// in flight at the kill, once for the last — and the request is answered.
//
// Checkpoints stored after the first step was logged come before the kill,
// so the restore's WAL tail no longer holds that step: its result comes
// from __supervisor_steps__ in the checkpoint's snapshot.
func TestLLMStepsSurviveKill9(t *testing.T) {
	calls := filepath.Join(t.TempDir(), "llm-calls.txt")
	s := startSup(t, supOpts{
		flags:   fastFlags,
		command: []string{llmstepsAgent(t), "-checkpoint-every", "100ms"},
		env:     []string{"LLMSTEPS_CALLS=" + calls, "LLMSTEPS_DELAY=3s", "LLMSTEPS_STEPS=3"},
	})
	s.waitReady()
	id := llmPostRequest(t, s, "plan a trip")
	inFlight := waitCall(t, calls, id, "llm-1") // llm-0 is logged and acknowledged: Step returned
	stored := s.metric("supervisor_checkpoints_total")
	waitFor(t, 60*time.Second, "three checkpoints stored after the first step", func() bool {
		return s.metric("supervisor_checkpoints_total") >= stored+3
	})
	if got := callsOf(llmCalls(t, calls), id); got["llm-2"] != 0 {
		t.Fatalf("the second call ended before the kill (%v); the test needs it in flight", got)
	}
	if err := syscall.Kill(inFlight.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the agent (pid %d): %v", inFlight.pid, err)
	}
	var st llmRequestView
	waitFor(t, 90*time.Second, "the request answered after the restart", func() bool {
		_, st = llmRequestStatus(t, s, id)
		return st.Status == "answered" || st.Status == "failed" || st.Status == "expired"
	})
	if st.Status != "answered" {
		t.Fatalf("request %s ended %q (%v); want answered after the redelivery", id, st.Status, st.Error)
	}
	got := callsOf(llmCalls(t, calls), id)
	if got["llm-0"] != 1 || got["llm-1"] != 2 || got["llm-2"] != 1 {
		t.Errorf("LLM calls by step %v; want llm-0 once (completed before the kill), llm-1 twice (in flight at the kill), llm-2 once", got)
	}
	if a, _ := st.Data["attempt"].(float64); a != 2 {
		t.Errorf("answered by attempt %v; want 2", st.Data["attempt"])
	}
}

// TestLLMStepsCancelStopsTheRemainingSteps: DELETE /v1/requests/ID while the
// first LLM call runs; the agent's handler sees its context cancelled, and
// the request's later steps never call the LLM.
func TestLLMStepsCancelStopsTheRemainingSteps(t *testing.T) {
	calls := filepath.Join(t.TempDir(), "llm-calls.txt")
	s := startSup(t, supOpts{
		flags:   fastFlags,
		command: []string{llmstepsAgent(t)},
		env:     []string{"LLMSTEPS_CALLS=" + calls, "LLMSTEPS_DELAY=5s", "LLMSTEPS_STEPS=3"},
	})
	s.waitReady()
	id := llmPostRequest(t, s, "write a novel")
	waitCall(t, calls, id, "llm-0")
	if code, body := llmDeleteRequest(t, s, id); code != http.StatusOK && code != http.StatusAccepted && code != http.StatusNoContent {
		t.Fatalf("DELETE /v1/requests/%s: %d %s", id, code, body)
	}
	// The agent logs this line when its handler returns because of the
	// cancel (it would otherwise run two more 5 s steps).
	s.waitOutput("request cancelled; remaining steps skipped", 60*time.Second)
	if _, st := llmRequestStatus(t, s, id); st.Status != "cancelled" {
		t.Errorf("request status %q; want cancelled", st.Status)
	}
	// A second request runs to its end: the agent is fine, and its answer
	// comes after anything the cancelled handler could still have done.
	s2 := llmPostRequest(t, s, "short")
	waitFor(t, 90*time.Second, "the next request answered", func() bool {
		_, st := llmRequestStatus(t, s, s2)
		return st.Status == "answered"
	})
	if got := callsOf(llmCalls(t, calls), id); got["llm-0"] != 1 || got["llm-1"] != 0 || got["llm-2"] != 0 {
		t.Errorf("LLM calls of the cancelled request by step %v; want only llm-0, once", got)
	}
}

// TestLLMStepsAnswered: without faults, each step calls the LLM once and is
// logged (request_step with ack: true, acknowledged by the supervisor)
// before the next; the request is answered with the chain's result.
func TestLLMStepsAnswered(t *testing.T) {
	calls := filepath.Join(t.TempDir(), "llm-calls.txt")
	s := startSup(t, supOpts{
		flags:   fastFlags,
		command: []string{llmstepsAgent(t), "-checkpoint-every", "100ms"},
		env:     []string{"LLMSTEPS_CALLS=" + calls, "LLMSTEPS_DELAY=200ms", "LLMSTEPS_STEPS=3"},
	})
	s.waitReady()
	code, body := s.post("/v1/requests?wait=60s", `{"message":"hello"}`)
	if code != http.StatusOK {
		t.Fatalf("POST ?wait: %d %s", code, body)
	}
	var res struct {
		RequestID string         `json:"request_id"`
		Data      map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if ans, _ := res.Data["answer"].(string); ans != "llm-2(llm-1(llm-0(hello)))" {
		t.Errorf("answer %q; want the chain llm-2(llm-1(llm-0(hello)))", res.Data["answer"])
	}
	if got := callsOf(llmCalls(t, calls), res.RequestID); got["llm-0"] != 1 || got["llm-1"] != 1 || got["llm-2"] != 1 {
		t.Errorf("LLM calls by step %v; want one each", got)
	}
	// The request_done entry is sent just before the result: once the
	// answer is here, the WAL holds all four.
	waitFor(t, 30*time.Second, "the WAL's last sequence at 4", func() bool { return s.metric("supervisor_wal_last_sequence") == 4 })
	if n := s.metric("supervisor_wal_acks_total"); n < 3 {
		t.Errorf("supervisor_wal_acks_total = %v; want at least one wal_ack per step (3)", n)
	}
}

// TestLLMStepsSurviveSupervisorKill9: the supervisor itself is killed with
// SIGKILL while the agent's second LLM call of a request runs; the agent
// sees its pipe close and stops (its context is cancelled). The restarted
// supervisor delivers the request again from its journal, and the first
// step's result comes from the WAL and checkpoints: the LLM is not called
// again for it.
func TestLLMStepsSurviveSupervisorKill9(t *testing.T) {
	calls := filepath.Join(t.TempDir(), "llm-calls.txt")
	dir := filepath.Join(t.TempDir(), "data")
	opts := supOpts{
		dataDir: dir,
		flags:   fastFlags,
		command: []string{llmstepsAgent(t), "-checkpoint-every", "100ms"},
		env:     []string{"LLMSTEPS_CALLS=" + calls, "LLMSTEPS_DELAY=2s", "LLMSTEPS_STEPS=3"},
	}
	s := startSup(t, opts)
	s.waitReady()
	id := llmPostRequest(t, s, "survive")
	first := waitCall(t, calls, id, "llm-1")
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	waitFor(t, 30*time.Second, "the orphaned agent's exit", func() bool { return syscall.Kill(first.pid, 0) != nil })

	s = startSup(t, opts)
	s.waitReady()
	var st llmRequestView
	waitFor(t, 90*time.Second, "the request answered after the supervisor's restart", func() bool {
		_, st = llmRequestStatus(t, s, id)
		return st.Status == "answered" || st.Status == "failed" || st.Status == "expired"
	})
	if st.Status != "answered" {
		t.Fatalf("request %s ended %q (%v); want answered", id, st.Status, st.Error)
	}
	if got := callsOf(llmCalls(t, calls), id); got["llm-0"] != 1 || got["llm-1"] != 2 || got["llm-2"] != 1 {
		t.Errorf("LLM calls by step %v; want llm-0 once, llm-1 twice (in flight at the kill), llm-2 once", got)
	}
}
