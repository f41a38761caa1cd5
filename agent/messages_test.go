package agent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// memPair is newPair over in-memory pipes, so that a synctest bubble sees
// every goroutine blocked on them as durably blocked.
func memPair(t *testing.T) (*agent.Conn, *supervisorEnd, *io.PipeWriter) {
	t.Helper()
	agentIn, supOut := io.Pipe()
	supIn, agentOut := io.Pipe()
	conn := agent.NewConn(agentIn, agentOut, defaultConfig(), agent.Options{Logger: slog.New(slog.DiscardHandler)})
	sup := &supervisorEnd{t: t, r: wire.NewReader(supIn, 0), w: wire.NewWriter(supOut, 0), codec: schema.NewCodec(schema.Options{})}
	t.Cleanup(func() {
		conn.Close()
		supIn.Close()
		supOut.Close()
	})
	return conn, sup, supOut
}

// next reads the agent's next frame from an in-memory pipe.
func (s *supervisorEnd) next() schema.Message {
	s.t.Helper()
	b, err := s.r.ReadFrame()
	if err != nil {
		s.t.Fatalf("read frame from the agent: %v", err)
	}
	m, err := s.codec.Decode(schema.FromAgent, b)
	if err != nil {
		s.t.Fatalf("the agent sent an invalid message: %v", err)
	}
	return m
}

// Every message arrives on the channel in order; a shutdown does not close
// it (the final checkpoint's ack comes after); the end of input does, and
// Err says why.
func TestMessagesDeliversEveryTypeThenCloses(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	msgs := append(everySupervisorMessage(), &schema.CheckpointAck{CheckpointID: "after-shutdown", Size: 1})
	for _, m := range msgs {
		sup.send(m)
	}
	if err := conn.Err(); err != nil {
		t.Fatalf("Err = %v before the end of input", err)
	}
	sup.out.Close()
	var got []string
	timeout := time.After(testTimeout)
	for done := false; !done; {
		select {
		case m, ok := <-conn.Messages():
			if !ok {
				done = true
				break
			}
			got = append(got, m.MessageType())
		case <-timeout:
			t.Fatalf("the channel was not closed at the end of input; got %v", got)
		}
	}
	var want []string
	for _, m := range msgs {
		want = append(want, m.MessageType())
	}
	if len(got) != len(want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("received %v, want %v", got, want)
		}
	}
	if err := conn.Err(); !errors.Is(err, agent.ErrSupervisorGone) {
		t.Errorf("Err = %v, want ErrSupervisorGone", err)
	}
}

// The channel is the only way to receive once it is asked for.
func TestMessagesExcludesTheOtherReceivers(t *testing.T) {
	conn, _ := newPair(t, defaultConfig(), agent.Options{})
	conn.Messages()
	if _, err := conn.Receive(t.Context()); !errors.Is(err, agent.ErrMessagesInUse) {
		t.Errorf("Receive = %v, want ErrMessagesInUse", err)
	}
	if err := conn.Run(t.Context(), agent.Handlers{}); !errors.Is(err, agent.ErrMessagesInUse) {
		t.Errorf("Run = %v, want ErrMessagesInUse", err)
	}
	if _, err := conn.AwaitCheckpointAck(t.Context()); !errors.Is(err, agent.ErrMessagesInUse) {
		t.Errorf("AwaitCheckpointAck = %v, want ErrMessagesInUse", err)
	}
}

// An invalid message is reported to the supervisor and skipped; what follows
// it is delivered.
func TestMessagesSkipsInvalid(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	msgs := conn.Messages()
	sup.send(&schema.Heartbeat{}) // travels from the agent, never to it
	sup.send(&schema.ProcessRequest{RequestID: "after", Data: schema.RequestData{Message: "m"}})
	e := recvAs[*schema.Error](t, sup)
	if e.Error.Code != schema.CodeInvalidMessage {
		t.Errorf("reported %+v, want INVALID_MESSAGE", e.Error)
	}
	select {
	case m := <-msgs:
		if pr, ok := m.(*schema.ProcessRequest); !ok || pr.RequestID != "after" {
			t.Errorf("delivered %+v, want the request after the invalid message", m)
		}
	case <-time.After(testTimeout):
		t.Fatal("the request after the invalid message was not delivered")
	}
}

// Messages that AwaitCheckpointAck set aside before the channel was asked for
// come first on it.
func TestMessagesAfterAwaitCheckpointAck(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	sup.send(&schema.ProcessRequest{RequestID: "set-aside", Data: schema.RequestData{Message: "m"}})
	sup.send(&schema.CheckpointAck{CheckpointID: "cp", Size: 1})
	sup.send(&schema.ProcessRequest{RequestID: "later", Data: schema.RequestData{Message: "m"}})
	if _, err := conn.AwaitCheckpointAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"set-aside", "later"} {
		select {
		case m := <-conn.Messages():
			if pr, ok := m.(*schema.ProcessRequest); !ok || pr.RequestID != want {
				t.Fatalf("delivered %+v, want request %s", m, want)
			}
		case <-time.After(testTimeout):
			t.Fatalf("request %s was not delivered", want)
		}
	}
}

// Close ends the goroutine behind the channel and closes it, with ErrClosed;
// synctest fails the test if the goroutine outlives the bubble.
func TestMessagesClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn, _, _ := memPair(t)
		ch := conn.Messages()
		synctest.Wait() // the pump waits for a frame
		conn.Close()
		if _, ok := <-ch; ok {
			t.Fatal("a message arrived; want the channel closed")
		}
		if err := conn.Err(); !errors.Is(err, agent.ErrClosed) {
			t.Errorf("Err = %v, want ErrClosed", err)
		}
	})
}

// A select loop that logs durably (Log waits for the wal_ack) while requests
// queue behind it: the ack is read past the queued requests, so Log returns
// and the loop goes on, in fake time, with no message lost or reordered.
func TestMessagesSelectLoopLogsWhileRequestsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn, sup, _ := memPair(t)
		const requests = 5
		loopDone := make(chan error, 1)
		var handled []string
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			seq := uint64(0)
			for len(handled) < requests {
				select {
				case m, ok := <-conn.Messages():
					if !ok {
						loopDone <- conn.Err()
						return
					}
					pr := m.(*schema.ProcessRequest)
					seq++
					if err := conn.Log(context.Background(), schema.OpMemoryAdd, map[string]any{"content": pr.Data.Message}, seq); err != nil {
						loopDone <- err
						return
					}
					handled = append(handled, pr.RequestID)
				case <-tick.C:
					if err := conn.SendHeartbeat(); err != nil {
						loopDone <- err
						return
					}
				}
			}
			loopDone <- nil
		}()
		// The supervisor: every request at once, then an ack per entry, as
		// it reads them; heartbeats come in between on the ticker.
		go func() {
			for i := range requests {
				sup.send(&schema.ProcessRequest{RequestID: string(rune('a' + i)), Data: schema.RequestData{Message: "m"}})
			}
		}()
		for acked := 0; acked < requests; {
			switch m := sup.next().(type) {
			case *schema.WALEntry:
				if !m.Ack {
					t.Fatalf("Log sent %+v without ack", m)
				}
				time.Sleep(1500 * time.Millisecond) // fake time: a slow disk; the loop's ticker fires meanwhile
				sup.send(&schema.WALAck{Sequence: m.Entry.Sequence})
				acked++
			case *schema.Heartbeat:
			default:
				t.Fatalf("unexpected %T", m)
			}
		}
		if err := <-loopDone; err != nil {
			t.Fatalf("select loop: %v", err)
		}
		if got := strings.Join(handled, ""); got != "abcde" {
			t.Errorf("handled %v, want a..e in order", handled)
		}
		conn.Close()
	})
}
