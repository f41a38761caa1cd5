package testagent

import (
	"bytes"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

func benchAgent(b *testing.B, entrySize, batch int) *refAgent {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn := agent.NewConn(bytes.NewReader(nil), io.Discard,
		agent.Config{Role: agent.RolePrimary, ProtocolVersion: 2, Transport: agent.TransportStdio}, agent.Options{Logger: discard})
	cfg := DefaultConfig()
	cfg.EntrySize = entrySize
	cfg.WALBatch = batch
	a := &refAgent{conn: conn, cfg: cfg, log: discard, st: NewState(), beh: DefaultBehaviour(), base: DefaultBehaviour(),
		lim: Limits{MemoryBlocks: cfg.MemoryLimit, History: cfg.MemoryLimit}, ready: true}
	a.padding = a.paddingFor(entrySize)
	return a
}

// BenchmarkSelfDriven measures the agent's side of a WAL flood: make 1 KiB
// memory_add entries, send them (to io.Discard), apply them. The supervisor's
// end-to-end target is 100k entries/s; the producer must be well above it.
func BenchmarkSelfDriven(b *testing.B) {
	for _, bc := range []struct {
		name  string
		batch int
	}{{"Batch100x1K", 100}, {"Single1K", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			a := benchAgent(b, 1024, bc.batch)
			now := time.Now()
			b.ReportAllocs()
			b.SetBytes(int64(bc.batch) * 1024)
			for b.Loop() {
				changes := make([]change, bc.batch)
				for i := range changes {
					changes[i] = a.selfChange(a.st.LastSeq+uint64(i)+1, now)
				}
				if err := a.commit(changes, bc.batch > 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*bc.batch)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}

// BenchmarkApply1K is one replayed 1 KiB entry: decode its params, apply,
// advance the chain (what a restore does per WAL entry).
func BenchmarkApply1K(b *testing.B) {
	a := benchAgent(b, 1024, 1)
	raw := a.selfChange(1, time.Now()).raw
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	seq := uint64(0)
	for b.Loop() {
		seq++
		if err := a.applyRaw(schema.OpMemoryAdd, seq, raw, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpoint is the full state of 10,000 1 KiB memory blocks
// encoded and digested, as the agent does for every checkpoint.
func BenchmarkCheckpoint(b *testing.B) {
	a := benchAgent(b, 1024, 100)
	for range 100 {
		changes := make([]change, 100)
		for i := range changes {
			changes[i] = a.selfChange(a.st.LastSeq+uint64(i)+1, time.Now())
		}
		if err := a.commit(changes, true); err != nil {
			b.Fatal(err)
		}
	}
	raw, _ := a.st.MarshalCanonical()
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := a.st.Digest(); err != nil {
			b.Fatal(err)
		}
	}
}
