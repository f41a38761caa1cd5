package schema_test

import (
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/schema"
)

// TestEveryTruncationRejected: every proper prefix of a valid payload (one
// message of each type, and the fuzz seeds) is rejected as malformed with a
// *ValidationError: the decoder never reads past the bytes it has, never
// panics, and never takes a cut value for a whole one.
func TestEveryTruncationRejected(t *testing.T) {
	for _, p := range validPayloads(t) {
		for n := range len(p.b) {
			m, err := schema.NewCodec(schema.Options{}).Decode(p.dir, p.b[:n])
			var ve *schema.ValidationError
			if m != nil || !errors.As(err, &ve) {
				t.Fatalf("%d of %d bytes of % x: got %v, %v; want a *ValidationError", n, len(p.b), p.b, m, err)
			}
			if ve.Rule != schema.RuleMalformed {
				t.Fatalf("%d of %d bytes of % x: rule %s (%v), want %s", n, len(p.b), p.b, ve.Rule, err, schema.RuleMalformed)
			}
		}
	}
}

type payload struct {
	dir schema.Direction
	b   []byte
}

// validPayloads are payloads Decode accepts: one message of every type, and
// the fuzz seeds that decode.
func validPayloads(t *testing.T) []payload {
	var out []payload
	for _, m := range allMessages() {
		b, err := schema.Encode(m.m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, payload{m.dir, b})
	}
	for _, s := range fuzzSeeds(t) {
		for _, dir := range []schema.Direction{schema.FromAgent, schema.ToAgent} {
			if _, err := schema.Decode(dir, s); err == nil {
				out = append(out, payload{dir, s})
			}
		}
	}
	return out
}

// FuzzDecodeAgreesWithMsgpack: whatever Decode accepts, msgpack/v5 reads as
// the same map: same type and timestamp, and every raw field the decoder
// returns is exactly the bytes of the value msgpack/v5 finds under that key.
func FuzzDecodeAgreesWithMsgpack(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(byte(schema.FromAgent), s)
		f.Add(byte(schema.ToAgent), s)
	}
	f.Fuzz(func(t *testing.T, dirByte byte, payload []byte) {
		dir := schema.FromAgent
		if dirByte&1 == 0 {
			dir = schema.ToAgent
		}
		m, err := schema.Decode(dir, payload)
		if err != nil {
			return
		}
		var top map[string]msgpack.RawMessage
		if err := msgpack.Unmarshal(payload, &top); err != nil {
			t.Fatalf("Decode accepted % x, msgpack/v5 does not: %v", payload, err)
		}
		var typ string
		if err := msgpack.Unmarshal(top["type"], &typ); err != nil || typ != m.MessageType() {
			t.Fatalf("type: msgpack/v5 reads %q (%v), Decode %q", typ, err, m.MessageType())
		}
		var ts int64
		if err := msgpack.Unmarshal(top["timestamp"], &ts); err != nil || ts != m.Head().Timestamp {
			t.Fatalf("timestamp: msgpack/v5 reads %d (%v), Decode %d", ts, err, m.Head().Timestamp)
		}
		if md := m.Head().Metadata; md != nil && string(md) != string(top["metadata"]) {
			t.Fatalf("metadata: Decode kept % x, msgpack/v5 finds % x", md, top["metadata"])
		}
		switch m := m.(type) {
		case *schema.WALEntry:
			if comp, _ := top["compressed"]; len(comp) == 1 && comp[0] == 0xc3 {
				return
			}
			if string(m.Entry.Raw) != string(top["data"]) {
				t.Fatalf("data: Decode kept % x, msgpack/v5 finds % x", m.Entry.Raw, top["data"])
			}
			var rec struct {
				Operation string             `msgpack:"operation"`
				Params    msgpack.RawMessage `msgpack:"params"`
				Sequence  uint64             `msgpack:"sequence"`
			}
			if err := msgpack.Unmarshal(m.Entry.Raw, &rec); err != nil {
				t.Fatalf("msgpack/v5 cannot read the record Decode accepted: %v", err)
			}
			if rec.Operation != m.Entry.Operation || rec.Sequence != m.Entry.Sequence || string(rec.Params) != string(m.Entry.Params) {
				t.Fatalf("record: msgpack/v5 reads %+v, Decode %+v", rec, m.Entry)
			}
		case *schema.Metrics:
			if comp, _ := top["compressed"]; len(comp) == 1 && comp[0] == 0xc3 {
				return
			}
			// Decoded as interface values, not straight into float64:
			// msgpack/v5 converts a uint64 (0xcf) above 2^63 into a
			// float64 through int64 and reads it negative. Its interface
			// decoding keeps the uint64, which is what the sender wrote.
			var data map[string]any
			if err := msgpack.Unmarshal(top["data"], &data); err != nil {
				t.Fatalf("msgpack/v5 cannot read the metrics Decode accepted: %v", err)
			}
			// Decode makes keys valid UTF-8 (clip.Valid), as Encode
			// writes them.
			clean := make(map[string]any, len(data))
			for k, v := range data {
				clean[clip.Valid(k)] = v
			}
			if len(clean) != len(m.Data) {
				t.Fatalf("metrics: msgpack/v5 reads %d keys, Decode %d", len(clean), len(m.Data))
			}
			for k, v := range m.Data {
				got, ok := asFloat(clean[k])
				if !ok || got != v {
					t.Fatalf("metrics %q: msgpack/v5 reads %v (%T), Decode %v", k, clean[k], clean[k], v)
				}
			}
		case *schema.Restore:
			var entries []msgpack.RawMessage
			if v := top["wal_entries"]; len(v) > 0 && v[0] != 0xc0 {
				if err := msgpack.Unmarshal(v, &entries); err != nil {
					t.Fatalf("msgpack/v5 cannot read the wal_entries Decode accepted: %v", err)
				}
			}
			if len(entries) != len(m.WALEntries) {
				t.Fatalf("wal_entries: msgpack/v5 reads %d, Decode %d", len(entries), len(m.WALEntries))
			}
			for i := range entries {
				if string(entries[i]) != string(m.WALEntries[i]) {
					t.Fatalf("wal_entries[%d]: Decode kept % x, msgpack/v5 finds % x", i, m.WALEntries[i], entries[i])
				}
			}
		}
	})
}

// asFloat converts a number msgpack/v5 decoded into an interface value
// to the float64 a metrics map holds.
func asFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int8:
		return float64(n), true
	case int16:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint8:
		return float64(n), true
	case uint16:
		return float64(n), true
	case uint32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float32:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}
