package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// testTimeout bounds every wait; generous for a loaded machine.
const testTimeout = 30 * time.Second

// supervisorEnd is the supervisor's side of a pair of pipes.
type supervisorEnd struct {
	t     testing.TB
	r     *wire.Reader
	w     *wire.Writer
	in    *os.File // reads what the agent writes
	out   *os.File // writes what the agent reads
	codec *schema.Codec
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newPair(t testing.TB, cfg agent.Config, opts agent.Options) (*agent.Conn, *supervisorEnd) {
	t.Helper()
	agentIn, supOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	supIn, agentOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	conn := agent.NewConn(agentIn, agentOut, cfg, opts)
	sup := &supervisorEnd{
		t: t, in: supIn, out: supOut,
		r:     wire.NewReader(supIn, 0),
		w:     wire.NewWriter(supOut, 0),
		codec: schema.NewCodec(schema.Options{}),
	}
	t.Cleanup(func() {
		conn.Close()
		supIn.Close()
		supOut.Close()
	})
	return conn, sup
}

func defaultConfig() agent.Config {
	return agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2, Transport: agent.TransportStdio}
}

func (s *supervisorEnd) send(m schema.Message) {
	s.t.Helper()
	b, err := s.codec.Encode(m)
	if err != nil {
		s.t.Fatalf("encode %s: %v", m.MessageType(), err)
	}
	if err := s.w.WriteFrame(b); err != nil {
		s.t.Fatalf("write %s: %v", m.MessageType(), err)
	}
}

// recv reads and decodes the agent's next frame; it fails the test on a
// framing error, and returns the validation error for an invalid message.
func (s *supervisorEnd) recv() (schema.Message, []byte, error) {
	s.t.Helper()
	s.in.SetReadDeadline(time.Now().Add(testTimeout))
	b, err := s.r.ReadFrame()
	if err != nil {
		s.t.Fatalf("read frame from the agent: %v", err)
	}
	m, err := s.codec.Decode(schema.FromAgent, b)
	return m, b, err
}

func (s *supervisorEnd) mustRecv() schema.Message {
	s.t.Helper()
	m, _, err := s.recv()
	if err != nil {
		s.t.Fatalf("the agent sent an invalid message: %v", err)
	}
	return m
}

func recvAs[T schema.Message](t *testing.T, s *supervisorEnd) T {
	t.Helper()
	m := s.mustRecv()
	v, ok := m.(T)
	if !ok {
		t.Fatalf("got %s (%T), want %T", m.MessageType(), m, *new(T))
	}
	return v
}

func decodeMap(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := msgpack.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode map: %v", err)
	}
	return m
}

func TestSendEveryType(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})

	if err := conn.SendHeartbeat(); err != nil {
		t.Fatal(err)
	}
	hb := recvAs[*schema.Heartbeat](t, sup)
	if hb.Version != 2 || hb.Timestamp == 0 {
		t.Errorf("heartbeat header = %+v, want version 2 and a timestamp", hb.Header)
	}

	if err := conn.SendWAL(schema.OpMemoryAdd, map[string]any{"content": "hello", "importance": 0.7}, 7); err != nil {
		t.Fatal(err)
	}
	we := recvAs[*schema.WALEntry](t, sup)
	if we.Entry.Operation != schema.OpMemoryAdd || we.Entry.Sequence != 7 {
		t.Errorf("wal_entry = %s/%d, want memory_add/7", we.Entry.Operation, we.Entry.Sequence)
	}
	if p := decodeMap(t, we.Entry.Params); p["content"] != "hello" || p["importance"] != 0.7 {
		t.Errorf("wal params = %v", p)
	}

	if err := conn.SendWAL(schema.OpStateUpdate, nil, 8); err != nil {
		t.Fatal(err)
	}
	if we := recvAs[*schema.WALEntry](t, sup); !bytes.Equal(we.Entry.Params, []byte{0x80}) {
		t.Errorf("nil params encoded as %x, want an empty map", []byte(we.Entry.Params))
	}

	batch := []agent.WALOp{
		{Operation: schema.OpToolRegister, Params: map[string]any{"name": "calc"}, Sequence: 9},
		{Operation: schema.OpStateUpdate, Params: msgpack.RawMessage{0x81, 0xa6, 's', 't', 'a', 't', 'u', 's', 0xa4, 'i', 'd', 'l', 'e'}, Sequence: 10},
	}
	if err := conn.SendWALBatch(batch); err != nil {
		t.Fatal(err)
	}
	wb := recvAs[*schema.WALBatch](t, sup)
	if len(wb.Entries) != 2 || wb.Entries[0].Sequence != 9 || wb.Entries[1].Sequence != 10 ||
		wb.Entries[1].Operation != schema.OpStateUpdate {
		t.Errorf("wal_batch entries = %+v", wb.Entries)
	}

	state := map[string]any{"agent_state": map[string]any{"status": "thinking"}, "n": 3}
	if err := conn.SendCheckpoint(state); err != nil {
		t.Fatal(err)
	}
	cp := recvAs[*schema.Checkpoint](t, sup)
	if cp.Compress || cp.Status != "thinking" || decodeMap(t, cp.Data)["n"] != int8(3) {
		t.Errorf("checkpoint = compress %v status %q data %v", cp.Compress, cp.Status, decodeMap(t, cp.Data))
	}

	if err := conn.SendMetrics(map[string]float64{"avg_latency": 4.5, "memory_blocks": 10}); err != nil {
		t.Fatal(err)
	}
	if m := recvAs[*schema.Metrics](t, sup); m.Data["avg_latency"] != 4.5 || m.Data["memory_blocks"] != 10 {
		t.Errorf("metrics = %v", m.Data)
	}

	h := schema.Hypothesis{Reason: "faster", Target: "memory", NewCode: "latency_ms=1", ExpectedImprovement: map[string]float64{"latency": -0.2}}
	if err := conn.SendEvolutionIntent(h); err != nil {
		t.Fatal(err)
	}
	if ei := recvAs[*schema.EvolutionIntent](t, sup); ei.Hypothesis.Target != "memory" || ei.Hypothesis.NewCode != "latency_ms=1" ||
		ei.Hypothesis.ExpectedImprovement["latency"] != -0.2 {
		t.Errorf("evolution_intent = %+v", ei.Hypothesis)
	}

	if err := conn.SendError("TOOL_FAILED", "calculator crashed"); err != nil {
		t.Fatal(err)
	}
	if e := recvAs[*schema.Error](t, sup); e.Error.Code != "TOOL_FAILED" || e.Error.Message != "calculator crashed" {
		t.Errorf("error = %+v", e.Error)
	}

	// Send fills Version and Timestamp only where the caller left them zero.
	if err := conn.Send(&schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	if hb := recvAs[*schema.Heartbeat](t, sup); hb.Timestamp != 1705392000 || hb.Version != 1 {
		t.Errorf("explicit header = %+v", hb.Header)
	}
}

func TestSendRawFrameAndWriteRaw(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	payload, err := msgpack.Marshal(map[string]any{"type": "no_such_type", "timestamp": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.SendRawFrame(payload); err != nil {
		t.Fatal(err)
	}
	_, got, err := sup.recv()
	if !bytes.Equal(got, payload) {
		t.Errorf("raw frame payload = %x, want %x", got, payload)
	}
	if !errors.Is(err, schema.ErrInvalidMessage) {
		t.Errorf("decoding an unknown type: err = %v, want ErrInvalidMessage", err)
	}
	if err := conn.WriteRaw([]byte{0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	sup.in.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := sup.r.ReadFrame(); !errors.Is(err, wire.ErrZeroLength) {
		t.Errorf("after WriteRaw of a zero length: err = %v, want wire.ErrZeroLength", err)
	}
}

func TestSendCheckpointCompression(t *testing.T) {
	big := map[string]any{"blob": strings.Repeat("checkpoint ", schema.CompressThreshold/8)}
	tests := []struct {
		name         string
		cfg          agent.Config
		opts         agent.Options
		data         map[string]any
		wantCompress bool
	}{
		{"v2 large is compressed", defaultConfig(), agent.Options{}, big, true},
		{"v2 small is plain", defaultConfig(), agent.Options{}, map[string]any{"a": 1}, false},
		{"v1 agent never compresses", defaultConfig(), agent.Options{Version: 1}, big, false},
		{"v1 supervisor is not sent compression", agent.Config{ProtocolVersion: 1, Transport: agent.TransportStdio}, agent.Options{}, big, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, sup := newPair(t, tt.cfg, tt.opts)
			errc := make(chan error, 1)
			go func() { errc <- conn.SendCheckpoint(tt.data) }()
			cp := recvAs[*schema.Checkpoint](t, sup)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if cp.Compress != tt.wantCompress {
				t.Errorf("compressed = %v, want %v", cp.Compress, tt.wantCompress)
			}
			want, err := msgpack.Marshal(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeMap(t, cp.Data); len(cp.Data) != len(want) || got["blob"] != tt.data["blob"] {
				t.Errorf("data round trip: %d bytes, want %d", len(cp.Data), len(want))
			}
			if tt.wantCompress == false && conn.Version() == 1 && cp.Version > 1 {
				t.Errorf("v1 connection sent version %d", cp.Version)
			}
		})
	}
}

func TestSendRejectsInvalid(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	tooMany := make([]agent.WALOp, schema.DefaultLimits().BatchEntries+1)
	for i := range tooMany {
		tooMany[i] = agent.WALOp{Operation: schema.OpMemoryAdd, Sequence: uint64(i + 1)}
	}
	tests := []struct {
		name string
		send func() error
	}{
		{"wal_entry with sequence 0", func() error { return conn.SendWAL(schema.OpMemoryAdd, nil, 0) }},
		{"wal_entry without operation", func() error { return conn.SendWAL("", nil, 1) }},
		{"wal_entry params not a map", func() error { return conn.SendWAL(schema.OpMemoryAdd, []int{1, 2}, 1) }},
		{"wal_entry params a string", func() error { return conn.SendWAL(schema.OpMemoryAdd, "content", 1) }},
		{"wal_batch empty", func() error { return conn.SendWALBatch(nil) }},
		{"wal_batch with 101 entries", func() error { return conn.SendWALBatch(tooMany) }},
		{"wal_batch entry with sequence 0", func() error {
			return conn.SendWALBatch([]agent.WALOp{{Operation: schema.OpMemoryAdd, Sequence: 1}, {Operation: schema.OpMemoryAdd}})
		}},
		{"checkpoint data not a map", func() error { return conn.SendCheckpoint([]string{"state"}) }},
		{"checkpoint data unencodable", func() error { return conn.SendCheckpoint(map[string]any{"f": func() {}}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.send(); !errors.Is(err, agent.ErrBadMessage) {
				t.Errorf("err = %v, want ErrBadMessage", err)
			}
		})
	}
	// Nothing reached the pipe: the next frame is the heartbeat below.
	if err := conn.SendHeartbeat(); err != nil {
		t.Fatal(err)
	}
	recvAs[*schema.Heartbeat](t, sup)
}

func TestConcurrentSends(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	const senders, each = 8, 50
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				seq := uint64(g*each + i + 1)
				if err := conn.SendWAL(schema.OpMemoryAdd, map[string]any{"content": strings.Repeat("x", 300)}, seq); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	seen := map[uint64]bool{}
	for range senders * each {
		we := recvAs[*schema.WALEntry](t, sup)
		seen[we.Entry.Sequence] = true
	}
	wg.Wait()
	if len(seen) != senders*each {
		t.Errorf("distinct sequences received = %d, want %d", len(seen), senders*each)
	}
}

// recorder collects what the handlers saw, in order.
type recorder struct {
	mu   sync.Mutex
	got  []string
	last map[string]schema.Message
}

func (r *recorder) add(m schema.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, m.MessageType())
	if r.last == nil {
		r.last = map[string]schema.Message{}
	}
	r.last[m.MessageType()] = m
}

func (r *recorder) handlers() agent.Handlers {
	return agent.Handlers{
		Restore:         func(m *schema.Restore) error { r.add(m); return nil },
		CheckpointAck:   func(m *schema.CheckpointAck) { r.add(m) },
		HotReload:       func(m *schema.HotReload) error { r.add(m); return nil },
		EvolutionResult: func(m *schema.EvolutionResult) { r.add(m) },
		ProcessRequest:  func(m *schema.ProcessRequest) { r.add(m) },
		CancelRequest:   func(m *schema.CancelRequest) { r.add(m) },
		Shutdown:        func(m *schema.Shutdown) { r.add(m) },
		Error:           func(m *schema.Error) { r.add(m) },
	}
}

func everySupervisorMessage() []schema.Message {
	walEntry := schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": "x"}, "sequence": 3})
	// The client's own parts of a restore (its step table), which the
	// agent's handlers never see.
	step := schema.RawMap(map[string]any{"operation": "request_step", "params": map[string]any{"request_id": "req-0", "index": 1, "name": "tool", "result": "r"}, "sequence": 4})
	snapshot := schema.RawMap(map[string]any{"last_seq": 2, agent.StepsKey: map[string]any{"req-0": []any{map[string]any{"index": 0, "name": "llm", "result": []any{1, "x"}}}}})
	return []schema.Message{
		&schema.Restore{CheckpointID: "0190a1b2-0000-7000-8000-000000000001", Snapshot: snapshot, WALEntries: []msgpack.RawMessage{walEntry, step}},
		&schema.CheckpointAck{CheckpointID: "0190a1b2-0000-7000-8000-000000000002", Size: 1234},
		&schema.HotReload{Code: "latency_ms=3", Module: "memory", BackupCheckpointID: "0190a1b2-0000-7000-8000-000000000002"},
		&schema.EvolutionResult{Success: true, Decision: schema.DecisionPromoted, Metrics: map[string]float64{"latency_improvement": -0.2}, Reason: "faster"},
		&schema.ProcessRequest{RequestID: "req-1", Data: schema.RequestData{Message: "hello", UserID: "u1"}},
		&schema.CancelRequest{RequestID: "req-1"},
		schema.NewError(schema.CodeWALFull, "disk full", nil),
		&schema.Shutdown{Reason: "SIGTERM", CreateCheckpoint: true},
	}
}

func TestRunDispatchesEveryType(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	msgs := everySupervisorMessage()
	for _, m := range msgs {
		sup.send(m)
	}
	var rec recorder
	err := conn.Run(t.Context(), rec.handlers())
	if !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("Run = %v, want ErrShutdown", err)
	}
	if !strings.Contains(err.Error(), "SIGTERM") {
		t.Errorf("Run error %q does not carry the shutdown reason", err)
	}
	var want []string
	for _, m := range msgs {
		want = append(want, m.MessageType())
	}
	if strings.Join(rec.got, ",") != strings.Join(want, ",") {
		t.Errorf("dispatched %v, want %v", rec.got, want)
	}
	r := rec.last[schema.TypeRestore].(*schema.Restore)
	if snap := decodeMap(t, r.Snapshot); r.CheckpointID != "0190a1b2-0000-7000-8000-000000000001" || len(r.WALEntries) != 1 || snap["last_seq"] != int8(2) || len(snap) != 1 {
		t.Errorf("restore = %+v", r)
	}
	if p := rec.last[schema.TypeProcessRequest].(*schema.ProcessRequest); p.RequestID != "req-1" || p.Data.Message != "hello" || p.Data.UserID != "u1" {
		t.Errorf("process_request = %+v", p)
	}
	if s := rec.last[schema.TypeShutdown].(*schema.Shutdown); !s.CreateCheckpoint {
		t.Errorf("shutdown = %+v", s)
	}
}

func TestRunNilHandlers(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	for _, m := range everySupervisorMessage() {
		sup.send(m)
	}
	if err := conn.Run(t.Context(), agent.Handlers{}); !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("Run = %v, want ErrShutdown", err)
	}
}

func TestRunEndOfInput(t *testing.T) {
	tests := []struct {
		name    string
		write   []byte
		wantIs  error
		notGone bool
	}{
		{"clean EOF between frames", nil, agent.ErrSupervisorGone, false},
		{"EOF inside a frame", []byte{0, 0, 0, 10, 0x81}, wire.ErrTruncated, true},
		{"EOF inside the length", []byte{0, 0}, wire.ErrTruncated, true},
		{"zero length", []byte{0, 0, 0, 0}, wire.ErrZeroLength, true},
		{"oversized length", []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, wire.ErrFrameTooLarge, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, sup := newPair(t, defaultConfig(), agent.Options{})
			sup.send(&schema.ProcessRequest{RequestID: "before", Data: schema.RequestData{Message: "m"}})
			if _, err := sup.out.Write(tt.write); err != nil {
				t.Fatal(err)
			}
			sup.out.Close()
			var rec recorder
			err := conn.Run(t.Context(), rec.handlers())
			if !errors.Is(err, tt.wantIs) {
				t.Fatalf("Run = %v, want %v", err, tt.wantIs)
			}
			if tt.notGone && errors.Is(err, agent.ErrSupervisorGone) {
				t.Errorf("Run = %v: a broken stream is not a clean goodbye", err)
			}
			if len(rec.got) != 1 {
				t.Errorf("handled %v before the end, want the one request", rec.got)
			}
			// Final: the next receive says the same.
			if _, err2 := conn.Receive(t.Context()); !errors.Is(err2, tt.wantIs) {
				t.Errorf("Receive after the end = %v, want %v", err2, tt.wantIs)
			}
		})
	}
}

func TestRunInvalidMessageIsReportedAndSkipped(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	// A heartbeat travels from the agent, never to it.
	sup.send(&schema.Heartbeat{})
	sup.send(&schema.Shutdown{Reason: "done"})
	errc := make(chan error, 1)
	go func() { errc <- conn.Run(t.Context(), agent.Handlers{}) }()
	e := recvAs[*schema.Error](t, sup)
	if e.Error.Code != schema.CodeInvalidMessage || !strings.Contains(e.Error.Message, "heartbeat") {
		t.Errorf("reply = %+v, want INVALID_MESSAGE naming the heartbeat", e.Error)
	}
	if err := <-errc; !errors.Is(err, agent.ErrShutdown) {
		t.Errorf("Run = %v, want ErrShutdown after skipping the invalid message", err)
	}
}

func TestRunRestoreFailureEndsRun(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	sup.send(&schema.Restore{CheckpointID: "cp-1", Snapshot: schema.RawMap(map[string]any{})})
	sup.send(&schema.Shutdown{})
	boom := errors.New("snapshot from the future")
	errc := make(chan error, 1)
	go func() {
		errc <- conn.Run(t.Context(), agent.Handlers{Restore: func(*schema.Restore) error { return boom }})
	}()
	e := recvAs[*schema.Error](t, sup)
	if e.Error.Code != agent.CodeRestoreFailed || !strings.Contains(e.Error.Message, "snapshot from the future") {
		t.Errorf("reply = %+v, want RESTORE_FAILED with the cause", e.Error)
	}
	if err := <-errc; !errors.Is(err, boom) {
		t.Errorf("Run = %v, want the restore error", err)
	}
}

func TestRunHotReloadFailureCarriesOn(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	sup.send(&schema.HotReload{Module: "memory", Code: "nonsense"})
	sup.send(&schema.Shutdown{})
	errc := make(chan error, 1)
	go func() {
		errc <- conn.Run(t.Context(), agent.Handlers{HotReload: func(*schema.HotReload) error { return errors.New("does not parse") }})
	}()
	e := recvAs[*schema.Error](t, sup)
	if e.Error.Code != agent.CodeHotReloadFailed || !strings.Contains(e.Error.Message, "memory") {
		t.Errorf("reply = %+v, want HOT_RELOAD_FAILED naming the module", e.Error)
	}
	if err := <-errc; !errors.Is(err, agent.ErrShutdown) {
		t.Errorf("Run = %v, want ErrShutdown (a failed hot reload is not fatal)", err)
	}
}

func TestRunContextCancelThenResume(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- conn.Run(ctx, agent.Handlers{}) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	sup.send(&schema.ProcessRequest{RequestID: "after-cancel", Data: schema.RequestData{Message: "m"}})
	sup.send(&schema.Shutdown{})
	var rec recorder
	if err := conn.Run(t.Context(), rec.handlers()); !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("second Run = %v, want ErrShutdown", err)
	}
	if len(rec.got) != 2 {
		t.Errorf("second Run handled %v, want the request and the shutdown", rec.got)
	}
}

func TestAwaitCheckpointAckFromShutdown(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	var ack *schema.CheckpointAck
	var awaitErr error
	h := agent.Handlers{Shutdown: func(m *schema.Shutdown) {
		if err := conn.SendCheckpoint(map[string]any{"final": true}); err != nil {
			awaitErr = err
			return
		}
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		defer cancel()
		ack, awaitErr = conn.AwaitCheckpointAck(ctx)
	}}
	sup.send(&schema.Shutdown{Reason: "stop", CreateCheckpoint: true})
	errc := make(chan error, 1)
	go func() { errc <- conn.Run(t.Context(), h) }()

	cp := recvAs[*schema.Checkpoint](t, sup)
	if decodeMap(t, cp.Data)["final"] != true {
		t.Errorf("final checkpoint data = %v", decodeMap(t, cp.Data))
	}
	// A request overtakes the ack; it must be kept, not lost.
	sup.send(&schema.ProcessRequest{RequestID: "queued", Data: schema.RequestData{Message: "m"}})
	sup.send(&schema.CheckpointAck{CheckpointID: "cp-final", Size: 42})
	if err := <-errc; !errors.Is(err, agent.ErrShutdown) {
		t.Fatalf("Run = %v, want ErrShutdown", err)
	}
	if awaitErr != nil || ack == nil || ack.CheckpointID != "cp-final" || ack.Size != 42 {
		t.Fatalf("AwaitCheckpointAck = %+v, %v", ack, awaitErr)
	}
	m, err := conn.Receive(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if pr, ok := m.(*schema.ProcessRequest); !ok || pr.RequestID != "queued" {
		t.Errorf("message kept while waiting = %+v, want the queued request", m)
	}
}

func TestAwaitCheckpointAckFailure(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	sup.send(schema.NewError(schema.CodeCheckpointFailed, "disk full", nil))
	_, err := conn.AwaitCheckpointAck(t.Context())
	if !errors.Is(err, agent.ErrCheckpointFailed) || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("AwaitCheckpointAck = %v, want ErrCheckpointFailed with the supervisor's message", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := conn.AwaitCheckpointAck(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AwaitCheckpointAck with nothing coming = %v, want DeadlineExceeded", err)
	}
}

func TestHeartbeats(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn.Heartbeats(ctx, 5*time.Millisecond)
	}()
	for range 3 {
		recvAs[*schema.Heartbeat](t, sup)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("Heartbeats did not return after its context ended")
	}
}

func TestHeartbeatsStopWhenClosed(t *testing.T) {
	conn, sup := newPair(t, defaultConfig(), agent.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn.Heartbeats(t.Context(), 5*time.Millisecond)
	}()
	recvAs[*schema.Heartbeat](t, sup)
	conn.Close()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("Heartbeats did not return after Close")
	}
	if err := conn.SendHeartbeat(); !errors.Is(err, agent.ErrClosed) {
		t.Errorf("send after Close = %v, want ErrClosed", err)
	}
	if _, err := conn.Receive(t.Context()); !errors.Is(err, agent.ErrClosed) {
		t.Errorf("Receive after Close = %v, want ErrClosed", err)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestVersion(t *testing.T) {
	tests := []struct {
		name       string
		supervisor int
		ours       int
		want       int
	}{
		{"defaults", 0, 0, 2},
		{"both 2", 2, 2, 2},
		{"agent speaks 1", 2, 1, 1},
		{"supervisor speaks 1", 1, 2, 1},
		{"supervisor newer", 3, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := agent.NewConn(bytes.NewReader(nil), io.Discard, agent.Config{ProtocolVersion: tt.supervisor}, agent.Options{Version: tt.ours})
			if got := c.Version(); got != tt.want {
				t.Errorf("Version() = %d, want %d", got, tt.want)
			}
		})
	}
}
