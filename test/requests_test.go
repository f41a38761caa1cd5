package test

// Durable requests (issue 29): the request journal, redelivery with
// attempt, Idempotency-Key, 429/507, expiry, journal damage, cancellation
// and poison requests, through the built binary and the request agent
// (reqagent_test.go).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reqSup starts a supervisor whose agent is the request agent, logging to
// the returned file.
func reqSup(t *testing.T, dataDir, agentLog string, env []string, flags ...string) *sup {
	t.Helper()
	return startSup(t, supOpts{dataDir: dataDir, command: []string{testAgentPath},
		env:   append([]string{envReqAgent + "=1", "REQAGENT_LOG=" + agentLog}, env...),
		flags: append([]string{"--backoff-initial", "100ms", "--heartbeat-timeout", "2s"}, flags...)})
}

// agentEvents reads the request agent's log.
func agentEvents(path string) []ev {
	return readEvents(path)
}

// deliveries returns the attempts with which id was delivered, in order.
func deliveries(path, id string) []int {
	var out []int
	for _, e := range agentEvents(path) {
		if e.str("ev") == "request" && e.str("id") == id {
			out = append(out, e.int("attempt"))
		}
	}
	return out
}

// do sends an HTTP request: status, body, Retry-After.
func do(t *testing.T, method, url, body string, hdr ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error(), ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Retry-After")
}

// postRequest POSTs message and wants 202: the request id.
func postRequest(t *testing.T, s *sup, message string, hdr ...string) string {
	t.Helper()
	code, body, _ := do(t, "POST", s.url("/v1/requests"), fmt.Sprintf(`{"message":%q}`, message), hdr...)
	if code != http.StatusAccepted {
		t.Fatalf("POST %q: %d %s, want 202", message, code, body)
	}
	var r struct {
		ID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.ID == "" {
		t.Fatalf("POST %q: %s", message, body)
	}
	return r.ID
}

type reqView struct {
	ID       string          `json:"request_id"`
	Status   string          `json:"status"`
	Data     json.RawMessage `json:"data"`
	Attempts int             `json:"attempts"`
	Error    *struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	} `json:"error"`
	Late *struct {
		Data json.RawMessage `json:"data"`
	} `json:"late_answer"`
}

func getRequest(t *testing.T, s *sup, id string) (int, reqView) {
	t.Helper()
	code, body := s.get("/v1/requests/" + id)
	var v reqView
	_ = json.Unmarshal([]byte(body), &v)
	return code, v
}

// waitStatus waits until GET shows id with status.
func waitStatus(t *testing.T, s *sup, id, status string, timeout time.Duration) reqView {
	t.Helper()
	var v reqView
	waitFor(t, timeout, "request "+id+" "+status, func() bool {
		_, v = getRequest(t, s, id)
		return v.Status == status
	})
	return v
}

func killSup(t *testing.T, s *sup) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// TestRequestSurvivesSupervisorKill: a 202'd request is journaled: after
// kill -9 of the supervisor (its agent holding the request unanswered) the
// restarted supervisor delivers it again (attempt 2), the answer is
// recorded, and GET answers it across a further restart.
func TestRequestSurvivesSupervisorKill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_HOLD=keep"})
	id := postRequest(t, s, "keep me")
	waitFor(t, 30*time.Second, "the first delivery", func() bool { return len(deliveries(log, id)) == 1 })
	killSup(t, s)

	s = reqSup(t, dir, log, nil)
	v := waitStatus(t, s, id, "answered", 30*time.Second)
	var data map[string]any
	_ = json.Unmarshal(v.Data, &data)
	if data["echo"] != "keep me" || data["attempt"] != 2.0 {
		t.Errorf("answer %s, want echo \"keep me\", attempt 2", v.Data)
	}
	if got := deliveries(log, id); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("deliveries %v, want attempts [1 2]", got)
	}
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)

	s = reqSup(t, dir, log, nil)
	if code, v := getRequest(t, s, id); code != 200 || v.Status != "answered" {
		t.Errorf("GET after a restart: %d %+v", code, v)
	}
	if got := deliveries(log, id); len(got) != 2 {
		t.Errorf("an answered request was delivered again: %v", got)
	}
	code, out, _ := cli(t, "requests", "show", id, "--data-dir", dir, "--json")
	if code != 0 || !strings.Contains(out, `"status": "answered"`) {
		t.Errorf("requests show: %d %s", code, out)
	}
}

// TestRequestRedeliveredAfterAgentKill: an agent killed with a request in
// flight gets it again after its restart, with attempt 2.
func TestRequestRedeliveredAfterAgentKill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_HOLD=hold"})
	id := postRequest(t, s, "hold this")
	waitFor(t, 30*time.Second, "the first delivery", func() bool { return len(deliveries(log, id)) == 1 })
	var pid int
	for _, e := range agentEvents(log) {
		if e.str("ev") == "start" {
			pid = e.int("pid")
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 30*time.Second, "the redelivery", func() bool { return len(deliveries(log, id)) == 2 })
	if got := deliveries(log, id); got[1] != 2 {
		t.Errorf("attempts %v, want [1 2]", got)
	}
	if _, v := getRequest(t, s, id); v.Status != "pending" || v.Attempts != 2 {
		t.Errorf("GET: %+v, want pending with 2 attempts", v)
	}
}

// TestIdempotencyKey: the same key and body is the same request (202 while
// pending, 200 with the answer after), delivered once; another body is 409;
// a key too long or not printable is 400.
func TestIdempotencyKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_DELAY=1500ms"})
	id := postRequest(t, s, "once", "Idempotency-Key", "key-1")
	if again := postRequest(t, s, "once", "Idempotency-Key", "key-1"); again != id {
		t.Fatalf("same key: request %s, want %s", again, id)
	}
	if code, body, _ := do(t, "POST", s.url("/v1/requests"), `{"message":"other"}`, "Idempotency-Key", "key-1"); code != http.StatusConflict {
		t.Errorf("same key, another body: %d %s, want 409", code, body)
	}
	waitStatus(t, s, id, "answered", 30*time.Second)
	code, body, _ := do(t, "POST", s.url("/v1/requests"), `{"message":"once"}`, "Idempotency-Key", "key-1")
	if code != http.StatusOK || !strings.Contains(body, id) || !strings.Contains(body, `"echo":"once"`) {
		t.Errorf("same key after the answer: %d %s, want 200 with the answer", code, body)
	}
	if got := deliveries(log, id); len(got) != 1 {
		t.Errorf("deliveries %v, want one", got)
	}
	for _, key := range []string{strings.Repeat("k", 256), "with space", "tab\tkey"} {
		if code, body, _ := do(t, "POST", s.url("/v1/requests"), `{"message":"x"}`, "Idempotency-Key", key); code != http.StatusBadRequest {
			t.Errorf("key %q: %d %s, want 400", key[:min(len(key), 20)], code, body)
		}
	}
	if n := len(agentEvents(log)); n > 3 {
		t.Logf("agent events: %d", n)
	}
}

// TestRequestJournalFull: with a tiny --request-journal-bytes, POST answers
// 429 with Retry-After once the pending requests fill it, and every request
// accepted before stays pending (never evicted).
func TestRequestJournalFull(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_HOLD=h"}, "--request-journal-bytes", "8192")
	big := "h" + strings.Repeat("x", 1500)
	var ids []string
	for i := 0; ; i++ {
		code, body, retry := do(t, "POST", s.url("/v1/requests"), fmt.Sprintf(`{"message":%q}`, big))
		if code == http.StatusTooManyRequests {
			if retry == "" {
				t.Errorf("429 without Retry-After: %s", body)
			}
			break
		}
		if code != http.StatusAccepted || i > 20 {
			t.Fatalf("POST %d: %d %s", i, code, body)
		}
		var r struct {
			ID string `json:"request_id"`
		}
		_ = json.Unmarshal([]byte(body), &r)
		ids = append(ids, r.ID)
	}
	if len(ids) == 0 {
		t.Fatal("not one request accepted")
	}
	for _, id := range ids {
		if code, v := getRequest(t, s, id); code != 200 || v.Status != "pending" {
			t.Errorf("accepted request %s: %d %+v", id, code, v)
		}
	}
	if v := s.metric("supervisor_requests_rejected_total", `reason="journal_full"`); v < 1 {
		t.Errorf("rejected metric %v", v)
	}
}

// TestRequestExpires: a request the agent never answers expires after
// --request-timeout: status expired, REQUEST_EXPIRED, audited.
func TestRequestExpires(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_HOLD=never"}, "--request-timeout", "1s")
	id := postRequest(t, s, "never answered")
	v := waitStatus(t, s, id, "expired", 30*time.Second)
	if v.Error == nil || v.Error.Code != "REQUEST_EXPIRED" {
		t.Errorf("expired request: %+v", v)
	}
	waitFor(t, 10*time.Second, "the audit record", func() bool {
		for _, r := range auditRecords(t, dir) {
			if f, _ := r["fields"].(map[string]any); r["kind"] == "request_expired" && f["request_id"] == id {
				return true
			}
		}
		return false
	})
}

// TestRequestJournalDamage: a torn tail is cut away; a flipped byte in a
// record loses that record only — the requests before and after it are
// served — and the supervisor starts (no crash loop), saying so loudly.
func TestRequestJournalDamage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, []string{"REQAGENT_HOLD=h"})
	var ids []string
	for i := range 3 {
		ids = append(ids, postRequest(t, s, fmt.Sprintf("h%d", i)))
	}
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	path := filepath.Join(dir, "requests", "journal")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A torn tail: half a record.
	if err := os.WriteFile(path, append(b, 0x40, 0, 0, 0, 1, 2, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	s = reqSup(t, dir, log, []string{"REQAGENT_HOLD=h"})
	for _, id := range ids {
		if code, v := getRequest(t, s, id); code != 200 || v.Status != "pending" {
			t.Errorf("after a torn tail, %s: %d %+v", id, code, v)
		}
	}
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)

	// A flipped byte inside the second request's accepted record.
	b, _ = os.ReadFile(path)
	i := strings.Index(string(b), ids[1])
	if i < 0 {
		t.Fatal("second request not found in the journal")
	}
	b[i+3] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = reqSup(t, dir, log, []string{"REQAGENT_HOLD=h"})
	for k, id := range ids {
		code, v := getRequest(t, s, id)
		if k == 1 {
			if code != 404 {
				t.Errorf("the damaged record's request: %d %+v, want 404", code, v)
			}
			continue
		}
		if code != 200 || v.Status != "pending" {
			t.Errorf("intact request %s after damage: %d %+v", id, code, v)
		}
	}
	if code, _ := s.get("/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
	waitFor(t, 10*time.Second, "the damage audited", func() bool {
		for _, r := range auditRecords(t, dir) {
			if r["kind"] == "request_journal_damaged" {
				return true
			}
		}
		return false
	})
	if m, _ := filepath.Glob(filepath.Join(dir, "requests", "journal.damaged-*")); len(m) == 0 {
		t.Error("the damaged journal was not kept for inspection")
	}
	// The journal was rewritten clean: another restart reads it whole.
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	s = reqSup(t, dir, log, []string{"REQAGENT_HOLD=h"})
	if code, v := getRequest(t, s, ids[2]); code != 200 || v.Status != "pending" {
		t.Errorf("after a second restart: %d %+v", code, v)
	}
}

// TestCancelRequest: DELETE (and `supervisor requests cancel`) cancels a
// request: one not yet delivered (POSTed while the agent restarts) is never
// delivered; one in flight is sent cancel_request (the agent opted in);
// cancelling an answered request is 409, an unknown one 404; the
// cancellation is journaled (it holds across a supervisor restart).
func TestCancelRequest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	env := []string{"REQAGENT_HOLD=hold", "REQAGENT_ACCEPTS_CANCEL=1", "REQAGENT_EXIT_FIRST=die"}
	s := reqSup(t, dir, log, env, "--backoff-initial", "3s")
	waitFor(t, 30*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })

	// In flight: the agent gets cancel_request.
	inflight := postRequest(t, s, "hold in flight")
	waitFor(t, 30*time.Second, "its delivery", func() bool { return len(deliveries(log, inflight)) == 1 })
	code, body, _ := do(t, "DELETE", s.url("/v1/requests/"+inflight), "")
	if code != 200 || !strings.Contains(body, `"status":"cancelled"`) {
		t.Fatalf("DELETE in flight: %d %s", code, body)
	}
	waitFor(t, 30*time.Second, "cancel_request at the agent", func() bool {
		for _, e := range agentEvents(log) {
			if e.str("ev") == "cancel" && e.str("id") == inflight {
				return true
			}
		}
		return false
	})

	// Not yet delivered: POSTed while the agent is backing off after it
	// died on "die"; cancelled with the CLI; never delivered.
	die := postRequest(t, s, "die")
	waitFor(t, 30*time.Second, "the agent down", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 0 })
	never := postRequest(t, s, "hold never delivered")
	if c, out, errOut := cli(t, "requests", "cancel", never, "--data-dir", dir); c != 0 {
		t.Fatalf("requests cancel: %d %s %s", c, out, errOut)
	}
	waitStatus(t, s, die, "answered", 60*time.Second) // the agent is back and past it
	after := postRequest(t, s, "after")
	waitStatus(t, s, after, "answered", 30*time.Second)
	if got := deliveries(log, never); len(got) != 0 {
		t.Errorf("a request cancelled before delivery was delivered: %v", got)
	}
	if got := deliveries(log, inflight); len(got) != 1 {
		t.Errorf("the cancelled in-flight request was delivered again after the restart: %v", got)
	}

	// Answered: 409. Unknown: 404.
	if code, body, _ := do(t, "DELETE", s.url("/v1/requests/"+after), ""); code != http.StatusConflict {
		t.Errorf("DELETE answered: %d %s, want 409", code, body)
	}
	if code, body, _ := do(t, "DELETE", s.url("/v1/requests/no-such-id"), ""); code != http.StatusNotFound {
		t.Errorf("DELETE unknown: %d %s, want 404", code, body)
	}

	// Across a supervisor restart: still cancelled, never redelivered.
	killSup(t, s)
	s = reqSup(t, dir, log, env)
	sentinel := postRequest(t, s, "sentinel")
	waitStatus(t, s, sentinel, "answered", 30*time.Second)
	for _, id := range []string{inflight, never} {
		if _, v := getRequest(t, s, id); v.Status != "cancelled" {
			t.Errorf("%s after a restart: %+v, want cancelled", id, v)
		}
	}
	if got := deliveries(log, inflight); len(got) != 1 {
		t.Errorf("a cancelled request was delivered after the supervisor's restart: %v", got)
	}
}

// poisonRun posts 50 requests with the poison among them while several are
// in flight, and checks the outcome: the poison set aside as REQUEST_POISON
// after exactly --request-max-attempts deliveries, every other request
// answered, the agent up, the supervisor still running.
func poisonRun(t *testing.T, env []string, flags ...string) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, append([]string{"REQAGENT_DELAY=300ms"}, env...), flags...)
	waitFor(t, 30*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	var ids []string
	poison := ""
	for i := range 50 {
		msg := fmt.Sprintf("ordinary %d", i)
		if i == 10 {
			msg = "poison"
		}
		id := postRequest(t, s, msg)
		if i == 10 {
			poison = id
		} else {
			ids = append(ids, id)
		}
	}
	v := waitStatus(t, s, poison, "failed", 3*time.Minute)
	if v.Error == nil || v.Error.Code != "REQUEST_POISON" {
		t.Errorf("poison: %+v, want REQUEST_POISON", v)
	} else {
		t.Logf("poison: %s", v.Error.Message)
	}
	for _, id := range ids {
		if v := waitStatus(t, s, id, "answered", 3*time.Minute); v.Status != "answered" {
			t.Errorf("bystander %s: %+v", id, v)
		}
	}
	if got := deliveries(log, poison); len(got) != 3 {
		t.Errorf("the poison was delivered %d times (attempts %v), want exactly --request-max-attempts (3)", len(got), got)
	}
	waitFor(t, 30*time.Second, "the agent up at the end", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	select {
	case <-s.done:
		t.Fatalf("the supervisor exited (code %d): it gave up", s.code)
	default:
	}
	if code, _ := s.get("/healthz"); code != 200 {
		t.Errorf("healthz %d: the supervisor gave up", code)
	}
	if n := s.metric("supervisor_requests_poison_total"); n != 1 {
		t.Errorf("poison metric %v, want 1", n)
	}
	if c, out, _ := cli(t, "requests", "show", poison, "--data-dir", dir); c != 0 || !strings.Contains(out, "death 3:") {
		t.Errorf("requests show: %d %s", c, out)
	}
}

// TestPoisonRequestExits: an agent that exits on one message.
func TestPoisonRequestExits(t *testing.T) {
	poisonRun(t, []string{"REQAGENT_POISON_EXIT=poison"})
}

// TestPoisonRequestExitsCleanly: an agent that exits with code 0 on one
// message (exit() in its handler) under the default --restart always: the
// request is set aside after --request-max-attempts deliveries, and the
// supervisor does not give up (before, a clean exit was charged nothing,
// and the sixth restart ended the supervisor with exit 1).
func TestPoisonRequestExitsCleanly(t *testing.T) {
	poisonRun(t, []string{"REQAGENT_POISON_EXIT=poison", "REQAGENT_POISON_EXIT_CODE=0"})
}

// TestPoisonRequestHangs: an agent that hangs (no heartbeat, no reads) on
// one message.
func TestPoisonRequestHangs(t *testing.T) {
	poisonRun(t, []string{"REQAGENT_POISON_HANG=poison"}, "--heartbeat-timeout", "1s")
}

// TestRequestDiskFull: with the data directory's filesystem full, POST
// answers 507 and nothing is accepted (GET knows no such request); once
// there is room again, requests are accepted. Needs root (a size-limited
// tmpfs).
func TestRequestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a size-limited tmpfs")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	dir := filepath.Join(mnt, "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	s := reqSup(t, dir, log, nil)
	waitFor(t, 30*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	ok := postRequest(t, s, "before the disk fills")
	waitStatus(t, s, ok, "answered", 30*time.Second)

	// Fill the filesystem.
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	// The journal grows its file ahead of its records (1 MiB of zeros at a
	// time): requests that fit in what it already holds are still
	// accepted — durably — and the first that does not is refused.
	body := fmt.Sprintf(`{"message":%q}`, strings.Repeat("x", 200<<10))
	accepted := 0
	for {
		code, resp, _ := do(t, "POST", s.url("/v1/requests"), body)
		if code == http.StatusInsufficientStorage {
			break
		}
		if code != http.StatusAccepted || accepted == 6 {
			t.Fatalf("POST %d on a full disk: %d %s, want 507 once the journal's 1 MiB reserve is used", accepted+1, code, resp)
		}
		accepted++
	}
	if n := s.metric("supervisor_requests_rejected_total", `reason="disk_full"`); n != 1 {
		t.Errorf("disk_full rejections %v, want 1", n)
	}
	c, out, _ := cli(t, "requests", "list", "--data-dir", dir, "--json")
	if c != 0 || strings.Count(out, `"request_id"`) != 1+accepted {
		t.Errorf("the journal after a 507 holds: %d %s; want the %d requests accepted before", c, out, 1+accepted)
	}

	// Room again: accepted.
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	id := postRequest(t, s, "after the disk has room again")
	waitStatus(t, s, id, "answered", 30*time.Second)
}

// TestLateAnswerToExpiredRequestKept: an answer that comes after its
// request expired is kept beside it (late_answer in GET), as
// docs/operations.md and --request-timeout say; the request stays expired.
func TestLateAnswerToExpiredRequestKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	// The agent does not opt in to cancel_request: it answers after 3 s,
	// the request expires after 1 s.
	s := reqSup(t, dir, log, []string{"REQAGENT_DELAY=3s"}, "--request-timeout", "1s")
	id := postRequest(t, s, "slow")
	waitStatus(t, s, id, "expired", 30*time.Second)
	waitFor(t, 30*time.Second, "the agent's answer", func() bool {
		for _, e := range agentEvents(log) {
			if e.str("ev") == "request" && e.str("id") == id {
				return true
			}
		}
		return false
	})
	var v reqView
	waitFor(t, 30*time.Second, "the late answer kept beside the expired request", func() bool {
		_, v = getRequest(t, s, id)
		return v.Late != nil
	})
	if v.Status != "expired" || v.Error == nil || v.Error.Code != "REQUEST_EXPIRED" || !strings.Contains(string(v.Late.Data), `"echo":"slow"`) {
		t.Errorf("GET: %+v (late %s), want expired with the agent's answer as late_answer", v, v.Late.Data)
	}
}

// TestPoisonLimitLoweredAcrossRestart: the docs' remedy when a poison
// request made the supervisor give up (--request-max-attempts not below
// --max-restarts): start it again with a lower --request-max-attempts. A
// request that already killed the agent alone that many times is set
// aside at once, never delivered again; before, it was delivered once
// more and killed the agent once more first.
func TestPoisonLimitLoweredAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	log := filepath.Join(t.TempDir(), "agent.jsonl")
	env := []string{"REQAGENT_POISON_EXIT=poison"}
	s := reqSup(t, dir, log, env, "--request-max-attempts", "5", "--max-restarts", "2")
	waitFor(t, 30*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	id := postRequest(t, s, "poison")
	if code := s.wait(60 * time.Second); code != 1 {
		t.Fatalf("the supervisor exited %d, want 1 (gave up on the crash loop)", code)
	}
	before := len(deliveries(log, id))
	if before < 3 {
		t.Fatalf("delivered %d times before the supervisor gave up, want at least 3", before)
	}

	s = reqSup(t, dir, log, env, "--request-max-attempts", "3")
	v := waitStatus(t, s, id, "failed", 30*time.Second)
	if v.Error == nil || v.Error.Code != "REQUEST_POISON" {
		t.Errorf("after the restart: %+v, want REQUEST_POISON", v)
	}
	sentinel := postRequest(t, s, "sentinel")
	waitStatus(t, s, sentinel, "answered", 30*time.Second)
	if got := deliveries(log, id); len(got) != before {
		t.Errorf("delivered %d times after the restart with --request-max-attempts 3, having killed the agent alone %d times (attempts %v); want never again",
			len(got)-before, before, got)
	}
}
