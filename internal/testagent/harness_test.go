package testagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// testTimeout bounds every wait; generous for a loaded machine.
const testTimeout = 60 * time.Second

// fakeSupervisor is the supervisor's end of an in-process reference agent:
// it reads and records every frame the agent sends, acknowledges its
// checkpoints (unless told not to), and sends what a test asks.
type fakeSupervisor struct {
	t          *testing.T
	conn       *agent.Conn
	cfg        Config
	w          *wire.Writer
	codec      *schema.Codec
	supIn      *os.File
	supOut     *os.File
	done       chan error // Run's result
	cancel     context.CancelFunc
	readerDone chan struct{}

	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every frame
	wal         []schema.WALRecord
	checkpoints []*schema.Checkpoint
	acks        []string // ids sent, index-aligned with checkpoints when auto-acking
	errs        []*schema.Error
	metrics     []*schema.Metrics
	intents     []*schema.EvolutionIntent
	heartbeats  int
	invalid     [][]byte // payloads that failed validation
	frameErr    error    // framing error that ended the reader
	noAck       bool
}

type agentOpts struct {
	restorePending bool
	role           string
	noAck          bool
}

func startAgent(t *testing.T, cfg Config, o agentOpts) *fakeSupervisor {
	t.Helper()
	if cfg.EventsPath == "" {
		cfg.EventsPath = filepath.Join(t.TempDir(), "events.jsonl")
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.Logger = log
	if cfg.Stderr == nil {
		cfg.Stderr = t.Output()
	}
	if o.role == "" {
		o.role = agent.RolePrimary
	}
	agentIn, supOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	supIn, agentOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &walOrderWriter{t: t, w: agentOut, events: cfg.EventsPath}
	conn := agent.NewConn(agentIn, out,
		agent.Config{Role: o.role, ProtocolVersion: 2, Transport: agent.TransportStdio, RestorePending: o.restorePending},
		agent.Options{Version: cfg.ProtocolVersion, Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	s := &fakeSupervisor{
		t: t, conn: conn, cfg: cfg, codec: schema.NewCodec(schema.Options{}),
		w: wire.NewWriter(supOut, 0), supIn: supIn, supOut: supOut,
		done: make(chan error, 1), cancel: cancel, changed: make(chan struct{}),
		readerDone: make(chan struct{}), noAck: o.noAck,
	}
	go s.read()
	go func() { s.done <- Run(ctx, conn, cfg) }()
	t.Cleanup(func() {
		cancel()
		supOut.Close()
		select {
		case <-s.done:
		case <-time.After(testTimeout):
			t.Error("the agent did not stop")
		}
		conn.Close()
		agentOut.Close()
		<-s.readerDone
		supIn.Close()
	})
	return s
}

func (s *fakeSupervisor) read() {
	defer close(s.readerDone)
	r := wire.NewReader(s.supIn, 0)
	for {
		b, err := r.ReadFrame()
		if err != nil {
			s.update(func() { s.frameErr = err })
			return
		}
		m, err := s.codec.Decode(schema.FromAgent, b)
		if err != nil {
			s.update(func() { s.invalid = append(s.invalid, b) })
			continue
		}
		var ack *schema.CheckpointAck
		s.update(func() {
			switch m := m.(type) {
			case *schema.Heartbeat:
				s.heartbeats++
			case *schema.WALEntry:
				s.wal = append(s.wal, m.Entry)
			case *schema.WALBatch:
				s.wal = append(s.wal, m.Entries...)
			case *schema.Checkpoint:
				s.checkpoints = append(s.checkpoints, m)
				if !s.noAck {
					id := fmt.Sprintf("cp-%d", len(s.checkpoints))
					s.acks = append(s.acks, id)
					ack = &schema.CheckpointAck{CheckpointID: id, Size: int64(len(m.Data))}
				}
			case *schema.Error:
				s.errs = append(s.errs, m)
			case *schema.Metrics:
				s.metrics = append(s.metrics, m)
			case *schema.EvolutionIntent:
				s.intents = append(s.intents, m)
			}
		})
		if ack != nil {
			s.sendQuiet(ack)
		}
	}
}

func (s *fakeSupervisor) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitUntil waits until cond, called under the lock, holds.
func (s *fakeSupervisor) waitUntil(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.After(testTimeout)
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			s.t.Fatalf("timed out waiting until %s", what)
		}
	}
}

func (s *fakeSupervisor) send(m schema.Message) {
	s.t.Helper()
	if err := s.sendQuiet(m); err != nil {
		s.t.Fatalf("send %s: %v", m.MessageType(), err)
	}
}

func (s *fakeSupervisor) sendQuiet(m schema.Message) error {
	b, err := s.codec.Encode(m)
	if err != nil {
		return err
	}
	return s.w.WriteFrame(b)
}

// result waits for Run to return.
func (s *fakeSupervisor) result() error {
	s.t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // keep it for Cleanup
		return err
	case <-time.After(testTimeout):
		s.t.Fatal("Run did not return")
		return nil
	}
}

// locked returns f's result computed under the lock, for reading the
// recorded frames while the reader may still be appending.
func locked[T any](s *fakeSupervisor, f func() T) T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return f()
}

func (s *fakeSupervisor) firstError() schema.ErrorBody {
	return locked(s, func() schema.ErrorBody { return s.errs[0].Error })
}

func (s *fakeSupervisor) walCopy() []schema.WALRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]schema.WALRecord(nil), s.wal...)
}

// event is one line of the events file.
type event map[string]any

func (e event) str(k string) string { s, _ := e[k].(string); return s }
func (e event) num(k string) uint64 { f, _ := e[k].(float64); return uint64(f) }

func readEvents(t *testing.T, path string) []event {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	var out []event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events file line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// waitEvent polls the events file until an event named name satisfies
// match (nil matches any), and returns it.
func (s *fakeSupervisor) waitEvent(name string, match func(event) bool) event {
	s.t.Helper()
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		for _, e := range readEvents(s.t, s.cfg.EventsPath) {
			if e.str("event") == name && (match == nil || match(e)) {
				return e
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.t.Fatalf("timed out waiting for event %q", name)
	return nil
}

func (s *fakeSupervisor) events(name string) []event {
	var out []event
	for _, e := range readEvents(s.t, s.cfg.EventsPath) {
		if e.str("event") == name {
			out = append(out, e)
		}
	}
	return out
}

// walOrderWriter checks, at the moment each WAL frame is written, that no
// entry it carries has been applied yet: the agent logs before it acts.
type walOrderWriter struct {
	t      *testing.T
	w      *os.File
	events string
}

func (w *walOrderWriter) Write(b []byte) (int, error) {
	if len(b) > wire.HeaderSize && int(binary.BigEndian.Uint32(b)) == len(b)-wire.HeaderSize {
		if m, err := schema.Decode(schema.FromAgent, b[wire.HeaderSize:]); err == nil {
			var seqs []uint64
			switch m := m.(type) {
			case *schema.WALEntry:
				seqs = append(seqs, m.Entry.Sequence)
			case *schema.WALBatch:
				for _, e := range m.Entries {
					seqs = append(seqs, e.Sequence)
				}
			}
			if len(seqs) > 0 {
				applied := map[uint64]bool{}
				for _, e := range readEvents(w.t, w.events) {
					if e.str("event") == "applied" && e["replay"] == nil {
						applied[e.num("seq")] = true
					}
				}
				for _, seq := range seqs {
					if applied[seq] {
						w.t.Errorf("entry %d was applied before its WAL frame was written", seq)
					}
				}
			}
		}
	}
	return w.w.Write(b)
}
