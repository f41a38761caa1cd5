package requests

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/schema"
)

func testBook(t *testing.T, dir string, cfg Config) *Book {
	t.Helper()
	if cfg.Retention == 0 {
		cfg.Retention = time.Minute
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
	cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	codec := schema.NewCodec(schema.Options{})
	cfg.Encode = codec.Encode
	b, _, err := OpenBook(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestResultsBounded: answers beyond MaxResultBytes drop the oldest
// answers' data, never the newest, never a pending request.
func TestResultsBounded(t *testing.T) {
	b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30})
	data, _ := json.Marshal(strings.Repeat("r", 1<<20))
	var ids []string
	for i := range 40 {
		id := fmt.Sprintf("r%02d", i)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids[:39] {
		if _, _, err := b.Answer(id, data, nil); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := b.Get(ids[38]); v.Status != StatusAnswered {
		t.Errorf("newest answer: %s", v.Status)
	}
	if v, _ := b.Get(ids[0]); v.Status != StatusDropped {
		t.Errorf("oldest answer: %s", v.Status)
	}
	if v, _ := b.Get(ids[39]); v.Status != StatusPending {
		t.Errorf("pending: %s", v.Status)
	}
	if b.resultBytes > MaxResultBytes {
		t.Errorf("result bytes %d", b.resultBytes)
	}
}

// TestResultsBoundedConcurrent: with answers racing, the results held stay
// within MaxResultBytes and the answer recorded last is always kept.
func TestResultsBoundedConcurrent(t *testing.T) {
	b := testBook(t, t.TempDir(), Config{MaxBytes: 64 << 20})
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	done := make(chan struct{})
	var mu sync.Mutex
	last := ""
	for c := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := c; i < 200; i += 8 {
				id := fmt.Sprintf("r%03d", i)
				if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if _, _, err := b.Answer(id, data, nil); err != nil {
					t.Error(err)
				}
				last = id
				mu.Unlock()
			}
		}()
	}
	for range 8 {
		<-done
	}
	if v, _ := b.Get(last); v.Status != StatusAnswered {
		t.Errorf("the last answer: %s", v.Status)
	}
	if b.resultBytes > MaxResultBytes {
		t.Errorf("result bytes %d over %d", b.resultBytes, MaxResultBytes)
	}
}

// TestPendingBodiesBounded: the bodies of pending requests, held in memory
// for their deliveries, stay within MaxPendingBodyBytes however large
// --request-journal-bytes is: over it Accept refuses (429), and a finished
// request's body is let go, making room again. Across a reopen the bodies
// of finished requests are not held.
func TestPendingBodiesBounded(t *testing.T) {
	dir := t.TempDir()
	b := testBook(t, dir, Config{MaxBytes: 1 << 30})
	body, _ := json.Marshal(Body{Message: strings.Repeat("m", 900<<10)})
	var ids []string
	for i := 0; ; i++ {
		id := fmt.Sprintf("r%03d", i)
		_, _, err := b.Accept("", "", body, id, false)
		if err == ErrFull {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if i > 100 {
			t.Fatal("100 requests of 900 KiB accepted: pending bodies are not bounded")
		}
	}
	if n := len(ids) * len(body); n > MaxPendingBodyBytes || b.bodyBytes > MaxPendingBodyBytes {
		t.Fatalf("%d pending bodies of %d bytes (%d held)", len(ids), len(body), b.bodyBytes)
	}
	if _, _, err := b.Answer(ids[0], json.RawMessage(`{"ok":true}`), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Cancel(ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Accept("", "", body, "after", false); err != nil {
		t.Fatalf("a finished request's body still counted: %v", err)
	}
	held := b.bodyBytes
	b.Close()
	b2 := testBook(t, dir, Config{MaxBytes: 1 << 30})
	if b2.bodyBytes != held {
		t.Errorf("after a reopen %d bytes of bodies held, want %d (the pending ones)", b2.bodyBytes, held)
	}
}

// TestDeliveryLooksOnlyAtOpenRequests: a delivery looks through the
// requests still open, not every answer the book retains — with thousands
// answered, each POST's delivery scanned them all under the book's lock
// (a fifth of the supervisor's CPU in BenchmarkRequestJournal with 64
// clients). Answered requests leave the delivery's list at its next look;
// a request accepted after them is the only one it holds, and is due.
func TestDeliveryLooksOnlyAtOpenRequests(t *testing.T) {
	b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30})
	for i := range 3000 {
		id := fmt.Sprintf("a%04d", i)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Answer(id, json.RawMessage(`"done"`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"y"}`), "open", false); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.agent, b.gen = nopAgent{}, b.gen+1 // as AgentUp does
	due := b.dueLocked(64)
	if len(due) != 1 || due[0].ID != "open" {
		t.Fatalf("due: %d requests, want the open one", len(due))
	}
	if len(b.open) != 1 || len(b.order) < 3001 {
		t.Fatalf("after a look: %d requests in the delivery's list (want 1), %d retained", len(b.open), len(b.order))
	}
}

// nopAgent takes every message and does nothing.
type nopAgent struct{}

func (nopAgent) SendRequest([]byte) bool     { return true }
func (nopAgent) SendMsg(schema.Message) bool { return true }
func (nopAgent) AcceptsCancel() bool         { return false }

// TestIdleBookSleeps: a book with no open request wakes only to sweep
// (every 5 s under a minute's retention), not every bookTick: an idle
// supervisor's timers are its CPU (issue 31, item 4; the book used to wake
// 20 times a second for nothing). A request the agent's full queue refused
// is still retried every bookTick, and the gauges say the last request
// closed before the book goes back to sleep.
func TestIdleBookSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30})
		agent := &fullAgent{}
		b.AgentUp(agent)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := b.ticks.Load(); n > 3 {
			t.Fatalf("an idle book woke %d times in 10 s, want at most 3 (every 5 s)", n)
		}
		// A request arrives; the agent's queue refuses it: retried at the
		// fast pace although the book was asleep.
		agent.refuse.Store(true)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := agent.tries.Load(); n != 1 {
			t.Fatalf("delivery attempts on arrival: %d, want 1", n)
		}
		agent.refuse.Store(false)
		time.Sleep(bookTick)
		synctest.Wait()
		if n := agent.tries.Load(); n != 2 {
			t.Fatalf("a refused delivery was tried %d times one bookTick later, want 2 (retried at the fast pace)", n)
		}
		time.Sleep(2 * time.Second) // a sweep while it is open
		synctest.Wait()
		if v := testutil.ToFloat64(b.cfg.Metrics.pending); v != 1 {
			t.Fatalf("supervisor_requests_pending %v while the request is open, want 1", v)
		}
		// Answered: one tick later the gauges say so, and the book goes
		// back to sleep.
		if _, _, err := b.Answer("r1", json.RawMessage(`"done"`), nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(bookTick)
		synctest.Wait()
		if v := testutil.ToFloat64(b.cfg.Metrics.pending); v != 0 {
			t.Fatalf("supervisor_requests_pending %v one tick after the answer, want 0", v)
		}
		before := b.ticks.Load()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := b.ticks.Load() - before; n > 3 {
			t.Fatalf("after the answer the book woke %d times in 10 s, want at most 3", n)
		}
	})
}

// fullAgent refuses requests (a full queue) while refuse is set.
type fullAgent struct {
	nopAgent
	refuse atomic.Bool
	tries  atomic.Int64
}

func (a *fullAgent) SendRequest([]byte) bool {
	a.tries.Add(1)
	return !a.refuse.Load()
}

// TestOnlyTheAgentsDeathsAreCharged: a request in flight when the
// supervisor stops the agent — shutting down, an operator's restore, the WAL
// failing — is redelivered and charged nothing; so however often that
// happens it is never set aside as poison. Deaths of the agent with it (a
// crash, a kill, and an exit with code 0 it was not asked for: an agent that
// calls exit() on the request is restarted and counted against
// --max-restarts like one that crashes) are charged, and MaxAttempts of them
// alone set it aside.
func TestOnlyTheAgentsDeathsAreCharged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30, MaxAttempts: 2})
		agent := &fullAgent{}
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
			t.Fatal(err)
		}
		deliveredAgain := func(what string) {
			t.Helper()
			before := agent.tries.Load()
			b.AgentUp(agent)
			synctest.Wait()
			if agent.tries.Load() != before+1 {
				t.Fatalf("%s: the request was not delivered to the new agent", what)
			}
		}
		for _, reason := range []string{"shutdown", "operator_restore", "wal_failed", "", "shutdown"} {
			deliveredAgain("before " + reason)
			b.AgentGone(reason)
			if v, _ := b.Get("r1"); v.Status != StatusPending || len(v.Deaths) != 0 {
				t.Fatalf("after the agent went (%q): status %s, %d deaths charged; want pending, none", reason, v.Status, len(v.Deaths))
			}
		}
		for i, reason := range []string{"crashed", "exited"} {
			i++
			deliveredAgain("before " + reason)
			b.AgentGone(reason)
			v, _ := b.Get("r1")
			if len(v.Deaths) != i {
				t.Fatalf("after death %d (%s): %d deaths charged", i, reason, len(v.Deaths))
			}
			if want := map[int]string{1: StatusPending, 2: StatusFailed}[i]; v.Status != want {
				t.Fatalf("after death %d (%s): status %s, want %s", i, reason, v.Status, want)
			}
		}
	})
}

// TestLateAnswers: what an answer after the request closed does. To a
// request set aside as poison, or cancelled, it is late (outcome "late"):
// the cancelled request keeps the first late answer for the client to see,
// and a second one is a duplicate, as is any answer to an answered request.
func TestLateAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30, MaxAttempts: 1})
		agent := &fullAgent{}
		for _, id := range []string{"poison", "cancelled", "answered"} {
			if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
				t.Fatal(err)
			}
		}
		b.AgentUp(agent)
		synctest.Wait()
		// All three in flight; two answered or cancelled first, so that the
		// death is the poison request's alone.
		if _, _, err := b.Answer("answered", json.RawMessage(`"first"`), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Cancel("cancelled"); err != nil {
			t.Fatal(err)
		}
		if v, err := b.Cancel("cancelled"); err != nil || v.Status != StatusCancelled {
			t.Fatalf("a second cancel: %s, %v; want the cancelled request as it is, no error", v.Status, err)
		}
		b.AgentGone("crashed")
		if v, _ := b.Get("poison"); v.Status != StatusFailed || v.Error == nil || v.Error.Code != CodePoison {
			t.Fatalf("the request in flight alone at the crash: %+v, want it set aside as poison", v.Request)
		}
		for _, c := range []struct {
			id, data string
			outcome  string
			err      error
		}{
			{"poison", `"late"`, OutcomeLate, nil},
			{"cancelled", `"late one"`, OutcomeLate, nil},
			{"cancelled", `"late two"`, "", ErrDuplicate},
			{"answered", `"second"`, "", ErrDuplicate},
		} {
			outcome, _, err := b.Answer(c.id, json.RawMessage(c.data), nil)
			if outcome != c.outcome || err != c.err {
				t.Fatalf("answer %s to %s: %q, %v; want %q, %v", c.data, c.id, outcome, err, c.outcome, c.err)
			}
		}
		if v, _ := b.Get("cancelled"); string(v.LateData) != `"late one"` {
			t.Fatalf("the cancelled request's late answer: %s, want the first one kept", v.LateData)
		}
		if v, _ := b.Get("answered"); string(v.Data) != `"first"` {
			t.Fatalf("the answered request's data: %s, want the first answer", v.Data)
		}
	})
}

// TestReplayIsIdempotent: a journal may hold a request's whole state
// (compacted) and records about it after, or two final records (an answer
// and an expiry that crossed): the book rebuilt from it keeps the first
// final state, never reopens or re-closes a request (closing its done
// channel twice would panic the start), and a finished request's waiters
// are released at once.
func TestReplayIsIdempotent(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*Record { return nil }, nil)
	now := time.Now().UnixNano()
	compacted := &Request{ID: "s", Status: StatusAnswered, Data: json.RawMessage(`"from the state"`), Accepted: time.Unix(0, now), Finished: time.Unix(0, now)}
	if err := j.Append(
		&Record{Kind: KindAccepted, ID: "r", Body: []byte(`{"message":"x"}`), At: now, Deadline: now + int64(time.Hour)},
		&Record{Kind: KindAnswered, ID: "r", Data: json.RawMessage(`"first"`), At: now + 1},
		&Record{Kind: KindExpired, ID: "r", At: now + 2},
		&Record{Kind: KindCancelled, ID: "r", At: now + 3},
		&Record{Kind: KindAccepted, ID: "r", Body: []byte(`{"message":"again"}`), At: now + 4},
		&Record{Kind: KindAccepted, ID: "s", Body: []byte(`{"message":"y"}`), At: now, Deadline: now + int64(time.Hour)},
		&Record{Kind: KindState, ID: "s", State: compacted},
		&Record{Kind: KindExpired, ID: "s", At: now + 5},
	).Wait(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	b := testBook(t, dir, Config{MaxBytes: 1 << 30})
	if l := b.List(); len(l) != 2 {
		t.Fatalf("after replay the book lists %d requests, want r and s once each", len(l))
	}
	for id, want := range map[string]string{"r": `"first"`, "s": `"from the state"`} {
		v, ok := b.Get(id)
		if !ok || v.Status != StatusAnswered || string(v.Data) != want {
			t.Fatalf("%s after replay: %+v, want answered with %s", id, v.Request, want)
		}
		select {
		case <-b.Done(id):
		default:
			t.Fatalf("%s after replay: its waiters are not released", id)
		}
	}
}

// TestExpiredWhileDownIsNeverDelivered: a request whose --request-timeout
// ran out while the supervisor was down is expired when the book meets
// it, not delivered to the agent first (an LLM call whose answer would be
// refused as late): the first delivery after a restart runs before the
// first sweep.
func TestExpiredWhileDownIsNeverDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		b := testBook(t, dir, Config{MaxBytes: 1 << 30, Timeout: time.Minute})
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(2 * time.Minute) // the supervisor was down meanwhile
		b = testBook(t, dir, Config{MaxBytes: 1 << 30, Timeout: time.Minute, Now: func() time.Time { return later }})
		agent := &fullAgent{}
		b.AgentUp(agent)
		synctest.Wait()
		if n := agent.tries.Load(); n != 0 {
			t.Fatalf("the request that expired while the supervisor was down was delivered %d times", n)
		}
		if v, _ := b.Get("r1"); v.Status != StatusExpired {
			t.Fatalf("r1 after the restart: %s, want expired", v.Status)
		}
	})
}

// A DELETE of a request whose --request-timeout has passed, before the
// sweep (at most a second later) has expired it, answered 200 "cancelled":
// the same request was "expired" a moment later to a GET that came first,
// and the audit log recorded a cancellation of a request that had timed
// out. It is expired now, as Answer does, and the cancel is refused
// (ErrFinished: 409) with the request expired.
func TestCancelAfterTheDeadlineFindsItExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var skew atomic.Int64 // read by the book's sweeper too
		now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
		b := testBook(t, t.TempDir(), Config{MaxBytes: 1 << 30, Timeout: time.Minute, Now: now})
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
			t.Fatal(err)
		}
		skew.Store(int64(2 * time.Minute)) // past the deadline; the sweep has not run
		v, err := b.Cancel("r1")
		if !errors.Is(err, ErrFinished) || v.Status != StatusExpired {
			t.Fatalf("cancel after the deadline: %s, %v; want expired, ErrFinished", v.Status, err)
		}
		if v, _ := b.Get("r1"); v.Status != StatusExpired {
			t.Fatalf("r1 after the cancel: %s, want expired", v.Status)
		}
	})
}

// A request forgotten after --request-retention while the supervisor was
// down came back at the next start until the first sweep (the journal
// keeps its records until a compaction): GET answered it, and its
// Idempotency-Key still matched, so the same key with a new body was
// refused (409) where a moment later it was a new request. It is forgotten
// when the book is opened.
func TestRetentionPassedWhileDownForgetsAtOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		b := testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Minute})
		if _, _, err := b.Accept("k1", "d1", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Answer("r1", json.RawMessage(`{"ok":true}`), nil); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(2 * time.Minute) // the supervisor was down meanwhile
		b = testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Minute, Now: func() time.Time { return later }})
		if v, ok := b.Get("r1"); ok {
			t.Fatalf("r1, forgotten a minute before this start, is served: %s", v.Status)
		}
		v, created, err := b.Accept("k1", "d2", json.RawMessage(`{"message":"y"}`), "r2", false)
		if err != nil || !created || v.ID != "r2" {
			t.Fatalf("the same key with a new body after the retention: %+v created=%v err=%v; want a new request", v, created, err)
		}
	})
}

// A lazily written record (an answer) whose write failed was dropped with
// nothing said: the log stayed quiet, and once the disk worked again the
// answer was still not on disk, so a restart brought the request back
// pending and delivered it to the agent again. The failure is logged
// once, and the first write that succeeds after it rewrites the journal
// with the book's state, the lost answer in it.
func TestLazyWriteFailureIsLoggedAndRepaired(t *testing.T) {
	dir := t.TempDir()
	var logs logCapture
	b := testBook(t, dir, Config{MaxBytes: 1 << 30, Log: logs.logger()})
	if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
		t.Fatal(err)
	}
	heal := failJournal(t, b) // the disk fails
	if _, _, err := b.Answer("r1", json.RawMessage(`{"ok":true}`), nil); err != nil {
		t.Fatal(err)
	}
	if err := b.FinishedDurably("r1"); err == nil {
		t.Fatal("the answer's write did not fail")
	}
	if n := logs.count("REQUEST JOURNAL WRITE FAILED"); n != 1 {
		t.Fatalf("the failed write is logged %d times, want once:\n%s", n, logs.String())
	}
	// The disk works again; the next request's write succeeds.
	heal()
	if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"y"}`), "r2", false); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = testBook(t, dir, Config{MaxBytes: 1 << 30})
	if v, ok := b.Get("r1"); !ok || v.Status != StatusAnswered {
		t.Fatalf("r1 after a restart: %s (found %v); want answered: its answer was lost to the failed write", v.Status, ok)
	}
}

// logCapture is a logger whose output a test can count lines in.
type logCapture struct {
	mu   sync.Mutex
	logs strings.Builder
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.Write(p)
}

func (c *logCapture) logger() *slog.Logger { return slog.New(slog.NewTextHandler(c, nil)) }

// count is how many times sub was logged.
func (c *logCapture) count(sub string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.logs.String(), sub)
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

// failJournal makes every write of b's journal file fail (a read-only file
// in its place) until the returned function puts the file back.
func failJournal(t *testing.T, b *Book) (heal func()) {
	t.Helper()
	bad, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bad.Close() })
	b.j.mu.Lock()
	real := b.j.f
	b.j.f = bad
	b.j.mu.Unlock()
	return func() {
		b.j.mu.Lock()
		b.j.f = real
		b.j.mu.Unlock()
	}
}
