package schema_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
)

// fuzzSeeds are the payloads FuzzDecode starts from, besides the corpus in
// testdata/fuzz/FuzzDecode: one valid message of every type, and inputs that
// once were or could be trouble.
func fuzzSeeds(t testing.TB) [][]byte {
	seeds := [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},
		{0xdf, 0xff, 0xff, 0xff, 0xff},
		{0xc6, 0xff, 0xff, 0xff, 0xff},
		append(bytes.Repeat([]byte{0x91}, 70), 0xc0),
		append(msg("heartbeat"), 0x00),
		msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdBytes(t, obj(kv{"agent_state", obj(kv{"status", "idle"})})))}),
		msg("wal_batch", kv{"data", arr(walRec("memory_add", 1, obj()), walRec("tool_register", uint64(2), obj(kv{"name", "calc"})))}),
		msg("checkpoint_ack", kv{"checkpoint_id", "x"}, kv{"size", 1}),
	}
	for _, m := range allMessages() {
		b, err := schema.Encode(m.m)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

// FuzzDecode: Decode never panics, fails only with a *ValidationError, and
// whatever it accepts encodes and decodes again to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(byte(schema.FromAgent), s)
		f.Add(byte(schema.ToAgent), s)
	}
	c := schema.NewCodec(schema.Options{Limits: schema.Limits{Checkpoint: 1 << 20}, ExtraWALOperations: []string{"custom"}})
	f.Fuzz(func(t *testing.T, dirByte byte, payload []byte) {
		dir := schema.FromAgent
		if dirByte&1 == 0 {
			dir = schema.ToAgent
		}
		m, err := c.Decode(dir, payload)
		if err != nil {
			var ve *schema.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, schema.ErrInvalidMessage) {
				t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
			}
			if m != nil {
				t.Fatal("a message returned with an error")
			}
			return
		}
		if m.Head().Timestamp == 0 {
			m.Head().Timestamp = 1 // 0 would encode as now
		}
		b, err := c.Encode(m)
		if err != nil {
			// Encode writes version explicitly, so a message at its size
			// limit may grow past it; nothing else may fail.
			if schema.RuleOf(err) == schema.RuleTooLarge {
				return
			}
			t.Fatalf("decoded %#v but cannot encode it: %v", m, err)
		}
		m2, err := c.Decode(dir, b)
		if err != nil {
			t.Fatalf("our own encoding of %#v does not decode: %v\n% x", m, err, b)
		}
		b2, err := c.Encode(m2)
		if err != nil {
			t.Fatalf("re-encoding: %v", err)
		}
		if !bytes.Equal(b, b2) && !isCompressed(m) {
			t.Fatalf("encode∘decode is not stable:\n% x\n% x", b, b2)
		}
	})
}
