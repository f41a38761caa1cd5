package agent_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

// BenchmarkLogRoundTrip: Conn.Log against an in-process fake supervisor that
// acknowledges every entry at once, over real pipes: the client's own cost
// of waiting for durability (encode, two pipe hops, the reader's hand-off).
func BenchmarkLogRoundTrip(b *testing.B) {
	conn, sup := newPair(b, defaultConfig(), agent.Options{Logger: slog.New(slog.DiscardHandler)})
	go func() {
		for {
			p, err := sup.r.ReadFrame()
			if err != nil {
				return
			}
			m, err := sup.codec.Decode(schema.FromAgent, p)
			if err != nil {
				return
			}
			ack, _ := sup.codec.Encode(&schema.WALAck{Sequence: m.(*schema.WALEntry).Entry.Sequence})
			if sup.w.WriteFrame(ack) != nil {
				return
			}
		}
	}()
	params := map[string]any{"content": string(make([]byte, 1000))}
	lat := make([]time.Duration, b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if err := conn.Log(ctx, schema.OpMemoryAdd, params, uint64(i+1)); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[b.N/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[b.N*99/100].Microseconds()), "p99-µs")
}

// BenchmarkStepRoundTrip: Request.Step with a trivial function against the
// same acknowledging fake supervisor: the client's own cost of a step
// (encode the result and the entry, take the sequence, update the table,
// two pipe hops, the reader's hand-off), to set beside BenchmarkLogRoundTrip.
func BenchmarkStepRoundTrip(b *testing.B) {
	conn, sup := newPair(b, defaultConfig(), agent.Options{Logger: slog.New(slog.DiscardHandler)})
	go func() {
		for {
			p, err := sup.r.ReadFrame()
			if err != nil {
				return
			}
			m, err := sup.codec.Decode(schema.FromAgent, p)
			if err != nil {
				return
			}
			ack, _ := sup.codec.Encode(&schema.WALAck{Sequence: m.(*schema.WALEntry).Entry.Sequence})
			if sup.w.WriteFrame(ack) != nil {
				return
			}
		}
	}()
	ctx := context.Background()
	req, rctx := conn.StartRequest(ctx, &schema.ProcessRequest{RequestID: "bench", Data: schema.RequestData{Message: "m"}})
	trivial := func(context.Context) (any, error) { return "ok", nil }
	lat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if _, err := req.Step(rctx, "step", trivial); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[b.N/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[b.N*99/100].Microseconds()), "p99-µs")
}
