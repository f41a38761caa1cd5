package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

// runAsync runs conn.Run with h until the test ends.
func runAsync(t *testing.T, conn *agent.Conn, h agent.Handlers) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- conn.Run(ctx, h) }()
	return done
}

func request(id string, attempt uint64) *schema.ProcessRequest {
	return &schema.ProcessRequest{RequestID: id, Data: schema.RequestData{Message: "question"}, Attempt: attempt}
}

// stepParams decodes a request_step or request_done entry's params.
func stepParams(t *testing.T, e *schema.WALEntry) map[string]any {
	t.Helper()
	return decodeMap(t, e.Entry.Params)
}

func raw(t *testing.T, v any) msgpack.RawMessage {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func walEntryRaw(t *testing.T, op string, seq uint64, params map[string]any) msgpack.RawMessage {
	t.Helper()
	return schema.RawMap(map[string]any{"operation": op, "sequence": seq, "params": params})
}

func closedWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testTimeout):
		t.Fatalf("%s did not happen", what)
	}
}

func TestHeartbeatOptsInToCancel(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	if err := conn.SendHeartbeat(); err != nil {
		t.Fatal(err)
	}
	if hb := recvAs[*schema.Heartbeat](t, sup); len(hb.Accepts) != 1 || hb.Accepts[0] != schema.TypeCancelRequest {
		t.Fatalf("heartbeat accepts %q, want [cancel_request]", hb.Accepts)
	}
}

// TestStepLoggedBeforeItReturns: a step's result is sent as a request_step
// entry with ack: true, and Step returns only after the wal_ack; the answer
// is preceded by request_done.
func TestStepLoggedBeforeItReturns(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	stepped := make(chan struct{})
	var attempt int
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		attempt = req.Attempt
		out, err := agent.Step(ctx, req, "llm", func(context.Context) (string, error) { return "the answer", nil })
		close(stepped)
		if err != nil {
			return nil, err
		}
		return map[string]any{"text": out}, nil
	}})
	sup.send(&schema.Restore{LastSequence: 41})
	sup.send(request("r1", 0))
	e := recvAs[*schema.WALEntry](t, sup)
	p := stepParams(t, e)
	if e.Entry.Operation != agent.OpRequestStep || !e.Ack || e.Entry.Sequence != 42 ||
		p["request_id"] != "r1" || p["index"] != int8(0) || p["name"] != "llm" || p["result"] != "the answer" {
		t.Fatalf("step logged as %s seq %d ack %v params %v; want request_step 42 with ack and {r1, 0, llm, the answer}", e.Entry.Operation, e.Entry.Sequence, e.Ack, p)
	}
	select {
	case <-stepped:
		t.Fatal("Step returned before its wal_ack")
	case <-time.After(50 * time.Millisecond):
	}
	sup.send(&schema.WALAck{Sequence: 42})
	closedWithin(t, stepped, "Step's return after the wal_ack")
	res := recvAs[*schema.RequestResult](t, sup)
	done := recvAs[*schema.WALEntry](t, sup)
	if done.Entry.Operation != agent.OpRequestDone || done.Ack || done.Entry.Sequence != 43 || stepParams(t, done)["request_id"] != "r1" {
		t.Fatalf("after the answer (request_done follows the request_result): %s seq %d ack %v %v; want request_done 43 without ack", done.Entry.Operation, done.Entry.Sequence, done.Ack, stepParams(t, done))
	}
	if res.RequestID != "r1" || decodeMap(t, res.Data)["text"] != "the answer" {
		t.Fatalf("request_result %+v", res)
	}
	if attempt != 1 {
		t.Errorf("attempt %d for a process_request without attempt; want 1", attempt)
	}
}

// TestStepReplayedFromRestore: the step table is rebuilt from the restore's
// snapshot (__supervisor_steps__) and WAL tail; a redelivered request's
// completed steps return their logged results without running fn, the next
// one runs and is numbered above the restore. The agent's code never sees
// the client's key or entries.
func TestStepReplayedFromRestore(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	snapshot := schema.RawMap(map[string]any{
		"user": "state",
		agent.StepsKey: map[string]any{
			"r1": []any{map[string]any{"index": 0, "name": "llm", "result": "from the checkpoint"}},
			"r0": []any{map[string]any{"index": 0, "name": "old", "result": 1}},
		},
	})
	tail := []msgpack.RawMessage{
		walEntryRaw(t, agent.OpRequestDone, 10, map[string]any{"request_id": "r0"}),
		walEntryRaw(t, schema.OpMemoryAdd, 11, map[string]any{"content": "mine"}),
		walEntryRaw(t, agent.OpRequestStep, 12, map[string]any{"request_id": "r1", "index": 1, "name": "tool", "result": map[string]any{"n": 7}}),
	}
	var restored *schema.Restore
	var calls atomic.Int32
	type toolResult struct {
		N int `msgpack:"n"`
	}
	results := make(chan []any, 1)
	runAsync(t, conn, agent.Handlers{
		Restore: func(m *schema.Restore) error { restored = m; return nil },
		Handle: func(ctx context.Context, req *agent.Request) (any, error) {
			a, err := agent.Step(ctx, req, "llm", func(context.Context) (string, error) { calls.Add(1); return "again", nil })
			if err != nil {
				return nil, err
			}
			b, err := agent.Step(ctx, req, "tool", func(context.Context) (toolResult, error) { calls.Add(1); return toolResult{}, nil })
			if err != nil {
				return nil, err
			}
			c, err := req.Step(ctx, "reply", func(context.Context) (any, error) { return "new", nil })
			if err != nil {
				return nil, err
			}
			results <- []any{a, b.N, string(c), req.Attempt}
			return map[string]any{}, nil
		},
	})
	sup.send(&schema.Restore{CheckpointID: "c1", Snapshot: snapshot, WALEntries: tail, LastSequence: 12})
	sup.send(request("r1", 2))
	e := recvAs[*schema.WALEntry](t, sup)
	if p := stepParams(t, e); e.Entry.Sequence != 13 || p["index"] != int8(2) || p["name"] != "reply" {
		t.Fatalf("third step logged as seq %d %v; want sequence 13, index 2, reply", e.Entry.Sequence, p)
	}
	sup.send(&schema.WALAck{Sequence: 13})
	var got []any
	select {
	case got = <-results:
	case <-time.After(testTimeout):
		t.Fatal("the handler did not finish")
	}
	if calls.Load() != 0 {
		t.Errorf("fn of a completed step ran %d times; want 0", calls.Load())
	}
	wantReply, _ := msgpack.Marshal("new")
	if got[0] != "from the checkpoint" || got[1] != 7 || got[2] != string(wantReply) || got[3] != 2 {
		t.Errorf("step results %v; want [from the checkpoint 7 <new> 2]", got)
	}
	snap := decodeMap(t, restored.Snapshot)
	if _, ok := snap[agent.StepsKey]; ok || snap["user"] != "state" || len(snap) != 1 {
		t.Errorf("the agent's restore snapshot is %v; want only the agent's own state", snap)
	}
	if len(restored.WALEntries) != 1 || decodeMap(t, restored.WALEntries[0])["operation"] != schema.OpMemoryAdd {
		t.Errorf("the agent's restore has %d WAL entries; want only its memory_add", len(restored.WALEntries))
	}
	recvAs[*schema.RequestResult](t, sup)
	recvAs[*schema.WALEntry](t, sup) // request_done, after the answer
	// r0 was done in the tail: a request r0 now runs its step.
	if err := conn.SendCheckpoint(map[string]any{"user": "state"}); err != nil {
		t.Fatal(err)
	}
	if cp := decodeMap(t, recvAs[*schema.Checkpoint](t, sup).Data); len(cp) != 1 {
		t.Errorf("checkpoint after every request was answered: %v; want no step table", cp)
	}
}

// TestStepMismatch: a redelivered handler that calls another step at a
// logged index gets ErrStepMismatch naming both, fn does not run, and the
// request fails with STEP_MISMATCH.
func TestStepMismatch(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	tail := []msgpack.RawMessage{walEntryRaw(t, agent.OpRequestStep, 3, map[string]any{"request_id": "r1", "index": 0, "name": "llm", "result": "x"})}
	var stepErr error
	var ran bool
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		_, stepErr = req.Step(ctx, "search", func(context.Context) (any, error) { ran = true; return 1, nil })
		return nil, stepErr
	}})
	sup.send(&schema.Restore{WALEntries: tail, LastSequence: 3})
	sup.send(request("r1", 2))
	res := recvAs[*schema.RequestResult](t, sup)
	if e := recvAs[*schema.WALEntry](t, sup); e.Entry.Operation != agent.OpRequestDone {
		t.Errorf("frame after the answer: %s; want request_done (the request had logged steps)", e.Entry.Operation)
	}
	if !errors.Is(stepErr, agent.ErrStepMismatch) || !strings.Contains(stepErr.Error(), `"llm"`) || !strings.Contains(stepErr.Error(), `"search"`) {
		t.Errorf("Step = %v; want ErrStepMismatch naming llm and search", stepErr)
	}
	if ran {
		t.Error("fn ran for a mismatched step")
	}
	if res.Error == nil || res.Error.Code != agent.CodeStepMismatch {
		t.Errorf("request_result %+v; want error %s", res, agent.CodeStepMismatch)
	}
}

// TestStepResultTooLarge: a result above the wal_entry limit is an error
// naming the limit and advising where to put it; nothing is logged.
func TestStepResultTooLarge(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	var stepErr error
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		_, stepErr = req.Step(ctx, "llm", func(context.Context) (any, error) { return strings.Repeat("w", 20<<10), nil })
		return nil, stepErr
	}})
	sup.send(request("r1", 0))
	m := sup.mustRecv() // the answer, not a WAL entry
	res, ok := m.(*schema.RequestResult)
	if !ok {
		t.Fatalf("the agent sent %s; want the request_result and no request_step", m.MessageType())
	}
	if !errors.Is(stepErr, agent.ErrStepResultTooLarge) || !strings.Contains(stepErr.Error(), "10240 bytes") || !strings.Contains(stepErr.Error(), "store big results elsewhere") {
		t.Errorf("Step = %v; want ErrStepResultTooLarge naming the 10240-byte limit and the advice", stepErr)
	}
	if res.Error == nil || res.Error.Code != agent.CodeStepResultTooLarge {
		t.Errorf("request_result %+v; want error %s", res, agent.CodeStepResultTooLarge)
	}
}

// TestCancelRequestCancelsTheHandler: cancel_request cancels the handler's
// context (cause ErrRequestCancelled) while a step runs; the steps after it
// never run, and the request fails with REQUEST_CANCELLED. A cancel_request
// that arrives before its request started (queued behind a busy handler)
// starts it cancelled.
func TestCancelRequestCancelsTheHandler(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	running := make(chan struct{})
	var second atomic.Bool
	var cause error
	var queuedCancelled atomic.Bool
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		if req.ID == "r2" {
			queuedCancelled.Store(ctx.Err() != nil && req.Cancelled())
			return nil, ctx.Err()
		}
		_, err := req.Step(ctx, "llm", func(ctx context.Context) (any, error) {
			close(running)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		cause = context.Cause(ctx)
		if _, err2 := req.Step(ctx, "tool", func(context.Context) (any, error) { second.Store(true); return 1, nil }); err2 == nil {
			t.Error("a step after the cancel succeeded")
		}
		return nil, err
	}})
	sup.send(request("r1", 0))
	closedWithin(t, running, "the first step")
	sup.send(request("r2", 0)) // queued behind r1
	sup.send(&schema.CancelRequest{RequestID: "r2"})
	sup.send(&schema.CancelRequest{RequestID: "unknown"})
	sup.send(&schema.CancelRequest{RequestID: "r1"})
	res := recvAs[*schema.RequestResult](t, sup)
	if res.RequestID != "r1" || res.Error == nil || res.Error.Code != agent.CodeRequestCancelled {
		t.Fatalf("request_result %+v; want r1 failed with %s", res, agent.CodeRequestCancelled)
	}
	if !errors.Is(cause, agent.ErrRequestCancelled) {
		t.Errorf("context.Cause = %v; want ErrRequestCancelled", cause)
	}
	if second.Load() {
		t.Error("the step after the cancel ran")
	}
	res = recvAs[*schema.RequestResult](t, sup)
	if res.RequestID != "r2" || res.Error == nil || res.Error.Code != agent.CodeRequestCancelled || !queuedCancelled.Load() {
		t.Errorf("request r2, cancelled while queued: %+v (started cancelled: %v); want it started cancelled", res, queuedCancelled.Load())
	}
}

// TestConnectionEndCancelsTheHandler: when the supervisor goes away, the
// request's context ends with ErrSupervisorGone.
func TestConnectionEndCancelsTheHandler(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	running := make(chan struct{})
	cause := make(chan error, 1)
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		close(running)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}})
	sup.send(request("r1", 0))
	closedWithin(t, running, "the handler's start")
	sup.out.Close()
	select {
	case err := <-cause:
		if !errors.Is(err, agent.ErrSupervisorGone) {
			t.Errorf("cause %v; want ErrSupervisorGone", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the handler's context was not cancelled when the supervisor left")
	}
}

// TestCheckpointCarriesTheStepTable: while a request with a logged step is
// unanswered, SendCheckpoint adds the table under __supervisor_steps__ next
// to the agent's own state; once it is answered, the key is gone.
func TestCheckpointCarriesTheStepTable(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	stepped, release := make(chan struct{}), make(chan struct{})
	runAsync(t, conn, agent.Handlers{Handle: func(ctx context.Context, req *agent.Request) (any, error) {
		if _, err := req.Step(ctx, "llm", func(context.Context) (any, error) { return map[string]any{"tokens": 3}, nil }); err != nil {
			return nil, err
		}
		close(stepped)
		<-release
		return map[string]any{}, nil
	}})
	sup.send(request("r1", 0))
	e := recvAs[*schema.WALEntry](t, sup)
	sup.send(&schema.WALAck{Sequence: e.Entry.Sequence})
	closedWithin(t, stepped, "the step")
	if err := conn.SendCheckpoint(map[string]any{"user": 1, "more": "x"}); err != nil {
		t.Fatal(err)
	}
	cp := recvAs[*schema.Checkpoint](t, sup)
	var data struct {
		User  int `msgpack:"user"`
		More  string
		Steps map[string][]struct {
			Index  int            `msgpack:"index"`
			Name   string         `msgpack:"name"`
			Result map[string]int `msgpack:"result"`
		} `msgpack:"__supervisor_steps__"`
	}
	if err := msgpack.Unmarshal(cp.Data, &data); err != nil {
		t.Fatal(err)
	}
	if s := data.Steps["r1"]; data.User != 1 || len(s) != 1 || s[0].Index != 0 || s[0].Name != "llm" || s[0].Result["tokens"] != 3 {
		t.Fatalf("checkpoint data %+v; want the agent's state and r1's step", data)
	}
	if n := len(decodeMap(t, cp.Data)); n != 3 {
		t.Errorf("checkpoint has %d keys; want 3", n)
	}
	// The same data handed back in a restore reaches the agent without it.
	close(release)
	recvAs[*schema.RequestResult](t, sup)
	recvAs[*schema.WALEntry](t, sup) // request_done, after the answer
	if err := conn.SendCheckpoint(map[string]any{"user": 1}); err != nil {
		t.Fatal(err)
	}
	if m := decodeMap(t, recvAs[*schema.Checkpoint](t, sup).Data); len(m) != 1 {
		t.Errorf("checkpoint after the answer: %v; want no step table", m)
	}
}

// TestSequencesSharedWithSteps: the Conn numbers steps and LogNext entries
// above the restore and above every entry the agent sent itself, so the
// agent's own entries and its steps never collide; a request started with
// StartRequest (an agent with its own loop) steps and answers the same way.
func TestSequencesSharedWithSteps(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	msgs := conn.Messages()
	sup.send(&schema.Restore{LastSequence: 10})
	m := <-msgs
	if _, ok := m.(*schema.Restore); !ok {
		t.Fatalf("got %s, want the restore", m.MessageType())
	}
	if n := conn.NextSequence(); n != 11 {
		t.Fatalf("NextSequence after a restore at 10 = %d, want 11", n)
	}
	if err := conn.SendWAL(schema.OpMemoryAdd, nil, 15); err != nil {
		t.Fatal(err)
	}
	recvAs[*schema.WALEntry](t, sup)
	logged := make(chan uint64, 1)
	go func() {
		seq, err := conn.LogNext(context.Background(), schema.OpStateUpdate, map[string]any{"k": 1})
		if err != nil {
			t.Error(err)
		}
		logged <- seq
	}()
	e := recvAs[*schema.WALEntry](t, sup)
	if e.Entry.Sequence != 16 || !e.Ack {
		t.Fatalf("LogNext sent sequence %d ack %v; want 16 with ack", e.Entry.Sequence, e.Ack)
	}
	sup.send(&schema.WALAck{Sequence: 16})
	if seq := <-logged; seq != 16 {
		t.Fatalf("LogNext = %d, want 16", seq)
	}
	sup.send(request("r9", 0))
	pr := (<-msgs).(*schema.ProcessRequest)
	req, ctx := conn.StartRequest(context.Background(), pr)
	done := make(chan error, 1)
	go func() {
		_, err := req.Step(ctx, "only", func(context.Context) (any, error) { return 5, nil })
		done <- err
	}()
	if e := recvAs[*schema.WALEntry](t, sup); e.Entry.Sequence != 17 || e.Entry.Operation != agent.OpRequestStep {
		t.Fatalf("step sent %s %d; want request_step 17", e.Entry.Operation, e.Entry.Sequence)
	}
	sup.send(&schema.WALAck{Sequence: 17})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := req.Answer(map[string]any{"ok": true}, nil); err != nil {
		t.Fatal(err)
	}
	if res := recvAs[*schema.RequestResult](t, sup); res.RequestID != "r9" || res.Error != nil {
		t.Fatalf("request_result %+v", res)
	}
	if e := recvAs[*schema.WALEntry](t, sup); e.Entry.Sequence != 18 || e.Entry.Operation != agent.OpRequestDone {
		t.Fatalf("after Answer: %s %d; want request_done 18", e.Entry.Operation, e.Entry.Sequence)
	}
	if err := req.Answer(nil, errors.New("again")); err != nil {
		t.Fatal(err)
	}
	if err := conn.SendHeartbeat(); err != nil { // nothing from the second Answer before it
		t.Fatal(err)
	}
	recvAs[*schema.Heartbeat](t, sup)
}

// TestConcurrentRequestsSteps: requests handled on goroutines of their own
// (StartRequest) log their steps with distinct sequences, in increasing
// order on the wire, and each gets its own results back.
func TestConcurrentRequestsSteps(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	go func() {
		last := uint64(0)
		for {
			p, err := sup.r.ReadFrame()
			if err != nil {
				return
			}
			m, err := sup.codec.Decode(schema.FromAgent, p)
			if err != nil {
				t.Errorf("invalid frame: %v", err)
				return
			}
			e, ok := m.(*schema.WALEntry)
			if !ok {
				continue
			}
			if e.Entry.Sequence <= last {
				t.Errorf("sequence %d after %d", e.Entry.Sequence, last)
			}
			last = e.Entry.Sequence
			if e.Ack {
				ack, _ := sup.codec.Encode(&schema.WALAck{Sequence: last})
				if sup.w.WriteFrame(ack) != nil {
					return
				}
			}
		}
	}()
	const workers, steps = 8, 20
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			id := "r" + string(rune('a'+w))
			req, ctx := conn.StartRequest(context.Background(), request(id, 0))
			for i := range steps {
				got, err := agent.Step(ctx, req, "s", func(context.Context) (string, error) { return id + "/" + string(rune('A'+i)), nil })
				if err != nil {
					errs <- err
					return
				}
				if want := id + "/" + string(rune('A'+i)); got != want {
					errs <- errors.New("got " + got + ", want " + want)
					return
				}
			}
			errs <- req.Answer(map[string]any{}, nil)
		}()
	}
	for range workers {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(testTimeout):
			t.Fatal("the requests did not finish")
		}
	}
	if n := conn.NextSequence(); n != workers*(steps+1)+1 {
		t.Errorf("NextSequence = %d, want %d (every step and request_done numbered once)", n, workers*(steps+1)+1)
	}
}
