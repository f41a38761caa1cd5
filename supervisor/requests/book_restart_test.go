package requests

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
)

// recordingAgent takes every delivery and hands it to the test, decoded.
type recordingAgent struct {
	nopAgent
	codec *schema.Codec
	got   chan *schema.ProcessRequest
}

func newRecordingAgent() *recordingAgent {
	return &recordingAgent{codec: schema.NewCodec(schema.Options{}), got: make(chan *schema.ProcessRequest, 64)}
}

func (a *recordingAgent) SendRequest(frame []byte) bool {
	m, err := a.codec.Decode(schema.ToAgent, frame)
	if err != nil {
		panic(err)
	}
	a.got <- m.(*schema.ProcessRequest)
	return true
}

// next is the next delivery (failing the test when none comes).
func (a *recordingAgent) next(t *testing.T) *schema.ProcessRequest {
	t.Helper()
	select {
	case m := <-a.got:
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
		return nil
	}
}

// none checks that nothing more is delivered (after what the book had to
// deliver: it delivers what is due in one pass).
func (a *recordingAgent) none(t *testing.T) {
	t.Helper()
	select {
	case m := <-a.got:
		t.Fatalf("delivered %s (attempt %d), want nothing more", m.RequestID, m.Attempt)
	default:
	}
}

// TestBookAfterRestart: what a supervisor started again on the journal
// rebuilds and does. Pending requests are delivered again, in acceptance
// order, as the next attempt (the accepted record stands for the first
// delivery), the suspects of a death one at a time; finished ones are not;
// idempotency keys still map to their requests; a record of a request the
// journal no longer holds is passed over.
func TestBookAfterRestart(t *testing.T) {
	dir := t.TempDir()
	body := func(m string) json.RawMessage { return json.RawMessage(`{"message":"` + m + `"}`) }
	b := testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Hour})
	for _, id := range []string{"r1", "r2", "r3", "r4", "r5"} {
		if _, _, err := b.Accept("key-"+id, "digest-"+id, body(id), id, false); err != nil {
			t.Fatal(err)
		}
	}
	a := newRecordingAgent()
	b.AgentUp(a)
	for range 5 {
		if m := a.next(t); m.Attempt != 1 {
			t.Fatalf("first delivery of %s: attempt %d", m.RequestID, m.Attempt)
		}
	}
	if _, _, err := b.Answer("r2", json.RawMessage(`"two"`), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Cancel("r3"); err != nil {
		t.Fatal(err)
	}
	b.AgentGone("crashed") // r1, r4 and r5 in flight: each charged a death, all suspects
	if err := b.FinishedDurably("r2"); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A record of a request the journal no longer holds (its state
	// compacted away, the record written after the compaction).
	j, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*Record { return nil }, nil)
	if err := j.Append(&Record{Kind: KindAnswered, ID: "forgotten", Data: json.RawMessage(`"x"`), At: time.Now().UnixNano()},
		&Record{Kind: KindDeath, ID: "forgotten", At: time.Now().UnixNano(), Reason: "crashed"}).Wait(); err != nil {
		t.Fatal(err)
	}
	j.Close()

	b = testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Hour})
	want := map[string]string{"r1": StatusPending, "r2": StatusAnswered, "r3": StatusCancelled, "r4": StatusPending, "r5": StatusPending}
	for id, st := range want {
		v, ok := b.Get(id)
		if !ok || v.Status != st {
			t.Fatalf("%s after the restart: %+v (found %v), want %s", id, v.Request, ok, st)
		}
		if st == StatusPending && (len(v.Deaths) != 1 || !v.Suspect) {
			t.Fatalf("%s after the restart: %d deaths, suspect %v; want the death charged before, a suspect", id, len(v.Deaths), v.Suspect)
		}
	}
	if _, ok := b.Get("forgotten"); ok {
		t.Fatal("a record of a request the journal does not hold made one")
	}
	// The same key and body: the request already accepted; another body:
	// a conflict.
	if v, created, err := b.Accept("key-r1", "digest-r1", body("r1"), "r1-again", false); err != nil || created || v.ID != "r1" {
		t.Fatalf("the key of r1 with its body after the restart: %s, created %v, %v; want r1, not created", v.ID, created, err)
	}
	if _, _, err := b.Accept("key-r1", "another digest", body("other"), "r1-other", false); !errors.Is(err, ErrKeyConflict) {
		t.Fatalf("the key of r1 with another body after the restart: %v, want ErrKeyConflict", err)
	}
	if v, created, err := b.Accept("key-r2", "digest-r2", body("r2"), "r2-again", false); err != nil || created || v.ID != "r2" || v.Status != StatusAnswered {
		t.Fatalf("the key of the answered r2: %s %s, created %v, %v; want r2 answered", v.ID, v.Status, created, err)
	}

	// Suspects are delivered alone, one at a time, in acceptance order, as
	// their next attempt; the answered and the cancelled are not.
	a = newRecordingAgent()
	b.AgentUp(a)
	var order []string
	for _, id := range []string{"r1", "r4", "r5"} {
		m := a.next(t)
		if m.Attempt != 2 {
			t.Fatalf("%s delivered again as attempt %d, want 2", m.RequestID, m.Attempt)
		}
		order = append(order, m.RequestID)
		if m.RequestID != id {
			break
		}
		a.none(t) // alone: the next only once this one is answered
		if _, _, err := b.Answer(id, json.RawMessage(`"ok"`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(order, []string{"r1", "r4", "r5"}) {
		t.Fatalf("delivered after the restart: %v, want r1, r4, r5 one at a time", order)
	}
	a.none(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// A redelivery's attempt number is journaled before the agent sees it. When
// that write failed, the number was kept in memory anyway, and the next
// tick sent the request with it, unjournaled: after a restart the replay
// did not know it, and the agent saw the same attempt number twice. Now a
// failed write gives the number back: the delivery waits until it is
// journaled, and numbers never repeat.
func TestAttemptNotJournaledIsNotSent(t *testing.T) {
	dir := t.TempDir()
	var logs logCapture
	failures := func() int { return logs.count("cannot journal request deliveries") }
	b := testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Hour, Log: logs.logger()})
	if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), "r1", false); err != nil {
		t.Fatal(err)
	}
	a1 := newRecordingAgent()
	b.AgentUp(a1)
	seen := []uint64{a1.next(t).Attempt}
	b.AgentGone("crashed")

	heal := failJournal(t, b) // the disk fails
	a2 := newRecordingAgent()
	b.AgentUp(a2)
	for deadline := time.Now().Add(30 * time.Second); failures() < 2; time.Sleep(10 * time.Millisecond) {
		select {
		case m := <-a2.got:
			t.Fatalf("attempt %d was sent while its record could not be written", m.Attempt)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the delivery's journal write was not retried")
		}
	}
	a2.none(t)

	// The disk works again: the delivery is journaled and sent.
	heal()
	seen = append(seen, a2.next(t).Attempt)
	b.AgentGone("crashed")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = testBook(t, dir, Config{MaxBytes: 1 << 30, Retention: time.Hour})
	a3 := newRecordingAgent()
	b.AgentUp(a3)
	seen = append(seen, a3.next(t).Attempt)
	if !slices.Equal(seen, []uint64{1, 2, 3}) {
		t.Fatalf("attempt numbers the agent saw across the failure and a restart: %v, want 1, 2, 3", seen)
	}
}
