package schema_test

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
	"github.com/vmihailenco/msgpack/v5"
)

func mustEncode(b *testing.B, m schema.Message) []byte {
	b.Helper()
	p, err := schema.Encode(m)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// walEntry1K is a realistic 1 KiB wal_entry: a memory_add with text,
// metadata and an importance score.
func walEntry1K(b *testing.B) []byte {
	mk := func(n int) []byte {
		params := schema.RawMap(map[string]any{
			"content":    strings.Repeat("User asked about the weather in Lisbon. ", n/40+1)[:n],
			"metadata":   map[string]any{"source": "conversation", "turn": 42, "tags": []string{"weather", "travel"}},
			"importance": 0.7,
		})
		return mustEncode(b, &schema.WALEntry{Header: schema.Header{Timestamp: 1705392000, Version: 2},
			Entry: schema.WALRecord{Operation: schema.OpMemoryAdd, Sequence: 123456, Params: params}})
	}
	p := mk(900)
	return mk(900 + 1024 - len(p))
}

func BenchmarkDecodeHeartbeat(b *testing.B) {
	p := mustEncode(b, &schema.Heartbeat{Header: schema.Header{Timestamp: 1705392000}})
	c := schema.NewCodec(schema.Options{})
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := c.Decode(schema.FromAgent, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeWALEntry1K(b *testing.B) {
	p := walEntry1K(b)
	if len(p) != 1024 {
		b.Fatalf("payload is %d bytes", len(p))
	}
	c := schema.NewCodec(schema.Options{})
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := c.Decode(schema.FromAgent, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeWALBatch100x1K: a full batch, 100 entries of about 1 KiB.
func BenchmarkDecodeWALBatch100x1K(b *testing.B) {
	m, err := schema.Decode(schema.FromAgent, walEntry1K(b))
	if err != nil {
		b.Fatal(err)
	}
	rec := m.(*schema.WALEntry).Entry
	entries := make([]schema.WALRecord, 100)
	for i := range entries {
		entries[i] = schema.WALRecord{Operation: rec.Operation, Sequence: uint64(i + 1), Params: rec.Params}
	}
	p := mustEncode(b, &schema.WALBatch{Header: schema.Header{Timestamp: 1705392000}, Entries: entries})
	c := schema.NewCodec(schema.Options{})
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := c.Decode(schema.FromAgent, p); err != nil {
			b.Fatal(err)
		}
	}
}

func restoreParts() (msgpack.RawMessage, []msgpack.RawMessage) {
	snap := schema.RawMap(map[string]any{
		"agent_state": map[string]any{"id": "a1", "status": "idle"},
		"blob":        []byte(strings.Repeat("memory block text ", (1<<20)/18)),
	})
	wal := make([]msgpack.RawMessage, 100)
	for i := range wal {
		wal[i] = schema.RawMap(map[string]any{"operation": "memory_add", "params": map[string]any{"content": strings.Repeat("x", 900)}, "sequence": i + 1})
	}
	return snap, wal
}

// BenchmarkEncodeRestore: a 1 MiB snapshot and 100 WAL entries of ~1 KiB,
// spliced raw (bounds-walked, copied once).
func BenchmarkEncodeRestore(b *testing.B) {
	snap, wal := restoreParts()
	m := &schema.Restore{Header: schema.Header{Timestamp: 1705392000}, CheckpointID: "01890a5d-ac96-774b-bcce-b302099a8057", Snapshot: snap, WALEntries: wal}
	b.ReportAllocs()
	b.SetBytes(int64(len(mustEncode(b, m))))
	for b.Loop() {
		if _, err := schema.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeRestoreCompressed(b *testing.B) {
	snap, wal := restoreParts()
	m := &schema.Restore{Header: schema.Header{Timestamp: 1705392000, Version: 2}, CheckpointID: "c", Snapshot: snap, WALEntries: wal, Compress: true}
	b.ReportAllocs()
	b.SetBytes(int64(len(snap)))
	for b.Loop() {
		if _, err := schema.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeCheckpoint1MiBCompressed(b *testing.B) {
	snap, _ := restoreParts()
	p := mustEncode(b, &schema.Checkpoint{Header: schema.Header{Timestamp: 1705392000, Version: 2}, Data: snap, Compress: true})
	c := schema.NewCodec(schema.Options{})
	b.ReportAllocs()
	b.SetBytes(int64(len(snap)))
	for b.Loop() {
		if _, err := c.Decode(schema.FromAgent, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeWALEntry1K(b *testing.B) {
	m, err := schema.Decode(schema.FromAgent, walEntry1K(b))
	if err != nil {
		b.Fatal(err)
	}
	e := m.(*schema.WALEntry)
	e.Entry.Raw = nil
	b.ReportAllocs()
	b.SetBytes(1024)
	for b.Loop() {
		if _, err := schema.Encode(e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPipeFramesWALEntry1K is the supervisor's inbound path for one
// agent: 1 KiB wal_entry frames written to an os.Pipe by one goroutine,
// read, bounds-walked, decoded and validated by another.
func BenchmarkPipeFramesWALEntry1K(b *testing.B) {
	p := walEntry1K(b)
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer pr.Close()
	c := schema.NewCodec(schema.Options{})
	b.ReportAllocs()
	b.SetBytes(int64(len(p) + wire.HeaderSize))
	b.ResetTimer()
	errc := make(chan error, 1)
	go func() {
		w := wire.NewWriter(pw, c.MaxFrameSize())
		for range b.N {
			if err := w.WriteFrame(p); err != nil {
				errc <- err
				pw.Close()
				return
			}
		}
		errc <- pw.Close()
	}()
	r := wire.NewReader(pr, c.MaxFrameSizeFor(schema.FromAgent))
	for {
		f, err := r.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Decode(schema.FromAgent, f); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
