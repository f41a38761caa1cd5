package interop

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
	"github.com/vmihailenco/msgpack/v5"
)

// exampleAgent extracts the Python agent from docs/protocol.md.
func exampleAgent(t *testing.T) []byte {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- example-agent:begin -->\n```python\n", "```\n<!-- example-agent:end -->"
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatal("docs/protocol.md lacks the example-agent block")
	}
	return doc[i+len(begin) : j]
}

// TestProtocolDocExampleAgent runs the minimal Python agent of
// docs/protocol.md against our encoder and decoder, playing the supervisor:
// restore, a request, shutdown with a checkpoint.
func TestProtocolDocExampleAgent(t *testing.T) {
	requirePython(t, "msgpack")
	script := filepath.Join(t.TempDir(), "agent.py")
	if err := os.WriteFile(script, exampleAgent(t), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script)
	cmd.Env = append(os.Environ(), "SUPERVISOR_TRANSPORT=stdio", "SUPERVISOR_ROLE=primary", "SUPERVISOR_PROTOCOL_VERSION=2", "SUPERVISOR_RESTORE_PENDING=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// One goroutine reads and decodes every frame the agent sends; it ends
	// at EOF, when the agent exits (or is killed), or when the test is over.
	type result struct {
		m   schema.Message
		err error
	}
	frames := make(chan result)
	done := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(frames)
		r := wire.NewReader(stdout, 0)
		for {
			p, err := r.ReadFrame()
			if err == io.EOF {
				return
			}
			var res result
			if err != nil {
				res.err = err
			} else {
				res.m, res.err = schema.Decode(schema.FromAgent, p)
			}
			select {
			case frames <- res:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// Cleanup: stop the agent if still running, let the reader finish
	// (Wait closes the pipe, so it must come after), then reap.
	waited := false
	defer func() {
		if waited {
			return
		}
		_ = cmd.Process.Kill()
		close(done)
		<-readerDone
		_ = cmd.Wait()
	}()

	w := wire.NewWriter(stdin, 0)
	send := func(m schema.Message) {
		t.Helper()
		p, err := schema.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteFrame(p); err != nil {
			t.Fatalf("writing %s: %v\nagent stderr:\n%s", m.MessageType(), err, stderr.String())
		}
	}
	// await returns the next message of type typ, checking every frame on
	// the way (heartbeats) is valid.
	await := func(typ string) schema.Message {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case r, ok := <-frames:
				if !ok {
					t.Fatalf("agent closed its output while we waited for %s\nstderr:\n%s", typ, stderr.String())
				}
				if r.err != nil {
					t.Fatalf("invalid frame from the example agent: %v", r.err)
				}
				if r.m.MessageType() == typ {
					return r.m
				}
			case <-timeout:
				t.Fatalf("no %s from the agent within 20s\nstderr:\n%s", typ, stderr.String())
			}
		}
	}

	await(schema.TypeHeartbeat)
	replayed := schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": "from the log"}, "sequence": 1})
	send(&schema.Restore{CheckpointID: "", WALEntries: []msgpack.RawMessage{replayed}})
	send(&schema.ProcessRequest{RequestID: "r-1", Data: schema.RequestData{Message: "hello"}})
	e := await(schema.TypeWALEntry).(*schema.WALEntry).Entry
	if e.Operation != schema.OpMemoryAdd || e.Sequence != 2 {
		t.Fatalf("wal_entry %s/%d, want memory_add/2 (after the restored sequence 1)", e.Operation, e.Sequence)
	}
	send(&schema.Shutdown{Reason: "test", CreateCheckpoint: true})
	cp := await(schema.TypeCheckpoint).(*schema.Checkpoint)
	var data struct {
		LastSeq      int              `msgpack:"last_seq"`
		MemoryBlocks []map[string]any `msgpack:"memory_blocks"`
	}
	if err := msgpack.Unmarshal(cp.Data, &data); err != nil {
		t.Fatal(err)
	}
	if cp.Status != schema.StatusIdle || data.LastSeq != 2 || len(data.MemoryBlocks) != 2 {
		t.Fatalf("checkpoint status %q last_seq %d blocks %v", cp.Status, data.LastSeq, data.MemoryBlocks)
	}
	send(&schema.CheckpointAck{CheckpointID: "c-1", Size: int64(len(cp.Data))})
	// The agent exits: its output ends (heartbeats may come first).
	timeout := time.After(20 * time.Second)
	for open := true; open; {
		select {
		case r, ok := <-frames:
			open = ok
			if ok && r.err != nil {
				t.Fatalf("invalid frame from the example agent: %v", r.err)
			}
		case <-timeout:
			t.Fatalf("agent did not exit after the checkpoint_ack\nstderr:\n%s", stderr.String())
		}
	}
	waited = true
	close(done)
	<-readerDone
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exited with %v\nstderr:\n%s", err, stderr.String())
	}
}
