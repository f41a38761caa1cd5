package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// fakeSupervisor reads the flood agent's frames and acknowledges each
// checkpoint only once `every` entries after it have arrived (or the flood
// is over): an agent that sent another checkpoint before that ack would have
// two unacknowledged, which the test reports. reply answers a checkpoint.
func fakeSupervisor(t *testing.T, n, every int, agentOut io.Reader, agentIn io.WriteCloser, reply func() schema.Message) (entries, checkpoints int) {
	t.Helper()
	defer agentIn.Close()
	w := wire.NewWriter(agentIn, 0)
	r := wire.NewReader(agentOut, 0)
	outstanding, since := 0, 0
	answer := func() {
		b, err := schema.Encode(reply())
		if err != nil {
			t.Fatal(err)
		}
		// Not on this goroutine: an agent that does not read its input must
		// still be caught sending a second checkpoint.
		go func() { _ = w.WriteFrame(b) }()
		outstanding = 0
	}
	for entries < n || checkpoints < n/every || outstanding > 0 {
		if entries == n && outstanding > 0 { // the flood is over: answer what is left
			answer()
			continue
		}
		p, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("after %d entries and %d checkpoints: %v", entries, checkpoints, err)
		}
		m, err := schema.Decode(schema.FromAgent, p)
		if err != nil {
			t.Fatal(err)
		}
		switch m.(type) {
		case *schema.WALEntry:
			entries++
			if since++; outstanding > 0 && since == every {
				answer()
			}
		case *schema.Checkpoint:
			checkpoints++
			if outstanding > 0 {
				t.Fatalf("checkpoint %d sent while the previous one was not acknowledged", checkpoints)
			}
			outstanding, since = 1, 0
		}
	}
	return entries, checkpoints
}

// The flood agent reads the supervisor's checkpoint acks while it floods
// and delivers every entry and checkpoint to a supervisor that acknowledges
// late (after the next interval's entries), never with two checkpoints
// unacknowledged.
func TestFloodWithLateCheckpointAcks(t *testing.T) {
	const n, every = 1000, 100
	agentOut, supIn := io.Pipe()
	supOut, agentIn := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- floodAgent(n, every, supOut, supIn); supIn.Close() }()
	entries, checkpoints := fakeSupervisor(t, n, every, agentOut, agentIn, func() schema.Message {
		return &schema.CheckpointAck{CheckpointID: "c", Size: 1}
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if entries != n || checkpoints != n/every {
		t.Fatalf("got %d entries and %d checkpoints, want %d and %d", entries, checkpoints, n, n/every)
	}
}

// A refused checkpoint stops the flood with the supervisor's reason.
func TestFloodStopsWhenACheckpointIsRefused(t *testing.T) {
	const n, every = 1000, 100
	agentOut, supIn := io.Pipe()
	supOut, agentIn := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- floodAgent(n, every, supOut, supIn)
		supIn.CloseWithError(errors.New("agent stopped"))
	}()
	w, r := wire.NewWriter(agentIn, 0), wire.NewReader(agentOut, 0)
	for {
		p, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("the agent stopped writing without a refused checkpoint: %v", err)
		}
		if m, _ := schema.Decode(schema.FromAgent, p); m != nil && m.MessageType() == schema.TypeCheckpoint {
			b, _ := schema.Encode(&schema.Error{Error: schema.ErrorBody{Code: schema.CodeCheckpointFailed, Message: "disk full"}})
			go func() { // then the input ends: an agent that never read it returns
				_ = w.WriteFrame(b)
				agentIn.Close()
			}()
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, agentOut) }()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("floodAgent returned %v, want the refused checkpoint", err)
	}
}
