package agent_test

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

func benchConn() *agent.Conn {
	return agent.NewConn(bytes.NewReader(nil), io.Discard, defaultConfig(),
		agent.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// BenchmarkSendWAL1K is the client's cost of one 1 KiB wal_entry: params
// encoding, message encoding, one framed write (to io.Discard).
func BenchmarkSendWAL1K(b *testing.B) {
	conn := benchConn()
	params := map[string]any{"content": strings.Repeat("x", 960), "importance": 0.5, "metadata": map[string]any{"source": "bench"}}
	b.ReportAllocs()
	b.SetBytes(1024)
	seq := uint64(0)
	for b.Loop() {
		seq++
		if err := conn.SendWAL(schema.OpMemoryAdd, params, seq); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendWALBatch100x1K sends pre-encoded params (msgpack.RawMessage),
// as an agent that keeps its entries' bytes does.
func BenchmarkSendWALBatch100x1K(b *testing.B) {
	conn := benchConn()
	raw, err := msgpack.Marshal(map[string]any{"content": strings.Repeat("x", 990)})
	if err != nil {
		b.Fatal(err)
	}
	ops := make([]agent.WALOp, 100)
	b.ReportAllocs()
	b.SetBytes(100 * 1024)
	seq := uint64(0)
	for b.Loop() {
		for i := range ops {
			seq++
			ops[i] = agent.WALOp{Operation: schema.OpMemoryAdd, Params: msgpack.RawMessage(raw), Sequence: seq}
		}
		if err := conn.SendWALBatch(ops); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSendHeartbeat(b *testing.B) {
	conn := benchConn()
	b.ReportAllocs()
	for b.Loop() {
		if err := conn.SendHeartbeat(); err != nil {
			b.Fatal(err)
		}
	}
}
