package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

// logAsync runs conn.Log on its own goroutine and returns its result channel.
func logAsync(conn *agent.Conn, seq uint64) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- conn.Log(context.Background(), schema.OpMemoryAdd, map[string]any{"content": "x"}, seq)
	}()
	return done
}

func pending(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned %v before its wal_ack", what, err)
	default:
	}
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(testTimeout):
		t.Fatal("Log did not return")
		return nil
	}
}

func TestLogReturnsOnceAcked(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	done := logAsync(conn, 5)
	e := recvAs[*schema.WALEntry](t, sup)
	if !e.Ack || e.Entry.Sequence != 5 {
		t.Fatalf("Log sent %+v, want ack: true and sequence 5", e)
	}
	sup.send(&schema.WALAck{Sequence: 4}) // does not cover 5
	// A heartbeat is invalid to the agent: once Receive reports it, the ack
	// before it has been read.
	sup.send(&schema.Heartbeat{})
	if _, err := conn.Receive(context.Background()); !errors.Is(err, schema.ErrInvalidMessage) {
		t.Fatalf("Receive = %v, want the invalid heartbeat", err)
	}
	pending(t, done, "Log(5)")
	sup.send(&schema.WALAck{Sequence: 9}) // cumulative: covers 5
	if err := result(t, done); err != nil {
		t.Fatalf("Log = %v, want nil", err)
	}
}

// TestLogIgnoresAnAckBelowIt: a wal_ack for an earlier sequence does not
// complete Log. The supervisor then leaves, and Log must say so; the ack is
// read before the end of the stream, so a Log it had wrongly completed would
// have returned nil by then. (TestLogReturnsOnceAcked's pending check can
// only catch that if the Log goroutine happens to run first.)
func TestLogIgnoresAnAckBelowIt(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	done := logAsync(conn, 5)
	recvAs[*schema.WALEntry](t, sup)
	sup.send(&schema.WALAck{Sequence: 4})
	sup.out.Close()
	if err := result(t, done); !errors.Is(err, agent.ErrSupervisorGone) {
		t.Fatalf("Log(5) after a wal_ack for 4 = %v, want ErrSupervisorGone: the ack does not cover it", err)
	}
}

func TestLogFailsOnStorageError(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	other := logAsync(conn, 3)
	recvAs[*schema.WALEntry](t, sup)
	done := logAsync(conn, 7)
	recvAs[*schema.WALEntry](t, sup)
	sup.send(schema.NewError(schema.CodeWALFull, "disk full", map[string]any{"first_sequence": 7, "last_sequence": 7}))
	err := result(t, done)
	if !errors.Is(err, agent.ErrNotDurable) {
		t.Fatalf("Log = %v, want ErrNotDurable", err)
	}
	pending(t, other, "Log(3), not named by the error,")
	sup.send(&schema.WALAck{Sequence: 3})
	if err := result(t, other); err != nil {
		t.Fatal(err)
	}
}

func TestLogFailsWhenSupervisorGoes(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	done := logAsync(conn, 1)
	recvAs[*schema.WALEntry](t, sup)
	sup.out.Close()
	if err := result(t, done); !errors.Is(err, agent.ErrSupervisorGone) {
		t.Fatalf("Log = %v, want ErrSupervisorGone", err)
	}
}

// TestLogInsideRequestHandler: a Request handler that waits for durability
// while more requests are queued behind it does not deadlock, and its
// return value becomes the request_result.
func TestLogInsideRequestHandler(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	var seq uint64
	runDone := make(chan error, 1)
	go func() {
		runDone <- conn.Run(context.Background(), agent.Handlers{
			Request: func(m *schema.ProcessRequest) (any, error) {
				seq++
				if err := conn.Log(context.Background(), schema.OpMemoryAdd, map[string]any{"content": m.Data.Message}, seq); err != nil {
					return nil, err
				}
				if m.Data.Message == "fail" {
					return nil, &agent.RequestError{Code: "TOOL_FAILED", Message: "no tool"}
				}
				return map[string]any{"stored": m.Data.Message}, nil
			},
		})
	}()
	for _, id := range []string{"a", "b", "c"} {
		msg := id
		if id == "c" {
			msg = "fail"
		}
		sup.send(&schema.ProcessRequest{RequestID: id, Data: schema.RequestData{Message: msg}})
	}
	for i, id := range []string{"a", "b", "c"} {
		e := recvAs[*schema.WALEntry](t, sup)
		if !e.Ack || e.Entry.Sequence != uint64(i+1) {
			t.Fatalf("entry %+v", e)
		}
		sup.send(&schema.WALAck{Sequence: e.Entry.Sequence})
		r := recvAs[*schema.RequestResult](t, sup)
		if r.RequestID != id {
			t.Fatalf("result for %q, want %q", r.RequestID, id)
		}
		if id == "c" {
			if r.Error == nil || r.Error.Code != "TOOL_FAILED" || r.Data != nil {
				t.Errorf("failed request's result %+v", r)
			}
			continue
		}
		if r.Error != nil || decodeMap(t, r.Data)["stored"] != id {
			t.Errorf("result %+v", r)
		}
	}
	sup.send(&schema.Shutdown{Reason: "done"})
	if err := <-runDone; !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("Run = %v", err)
	}
}

// TestStartLogPipelines: entries in flight are all answered by one
// cumulative ack.
func TestStartLogPipelines(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	var waits []func(context.Context) error
	for seq := uint64(1); seq <= 8; seq++ {
		w, err := conn.StartLog(schema.OpStateUpdate, nil, seq)
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, w)
	}
	for seq := uint64(1); seq <= 8; seq++ {
		if e := recvAs[*schema.WALEntry](t, sup); e.Entry.Sequence != seq || !e.Ack {
			t.Fatalf("entry %+v, want sequence %d with ack", e, seq)
		}
	}
	sup.send(&schema.WALAck{Sequence: 8})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i, w := range waits {
		if err := w(ctx); err != nil {
			t.Fatalf("entry %d: %v", i+1, err)
		}
	}
}
