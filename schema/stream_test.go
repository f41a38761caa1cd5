package schema_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
)

// CheckpointData must accept and refuse exactly what Decode accepts and
// refuses for a checkpoint's data, and write the exact bytes.
func TestCheckpointDataMatchesDecode(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 100), 0xc0)
	tests := []struct {
		name string
		data raw
	}{
		{"plain map", obj(kv{"memory", arr("a", "b")}, kv{"n", 3})},
		{"empty map", obj()},
		{"status idle", obj(kv{"agent_state", obj(kv{"status", "idle"})})},
		{"status evolving among other keys", obj(kv{"x", 1}, kv{"agent_state", obj(kv{"other", 1}, kv{"status", "evolving"})}, kv{"y", str32("long")})},
		{"status nil", obj(kv{"agent_state", obj(kv{"status", nil})})},
		{"agent_state nil", obj(kv{"agent_state", nil})},
		{"non-string keys skipped", obj(kv{int64(7), "agent_state"}, kv{"agent_state", obj(kv{"status", "acting"})})},
		{"data not a map", enc([]int{1, 2})},
		{"data a string", enc("hello")},
		{"status unknown", obj(kv{"agent_state", obj(kv{"status", "sleeping"})})},
		{"status a long string", obj(kv{"agent_state", obj(kv{"status", string(bytes.Repeat([]byte("i"), 5000))})})},
		{"status not a string", obj(kv{"agent_state", obj(kv{"status", 3})})},
		{"agent_state not a map", obj(kv{"agent_state", "idle"})},
		{"agent_state twice", obj(kv{"agent_state", obj()}, kv{"agent_state", obj()})},
		{"status twice", obj(kv{"agent_state", obj(kv{"status", "idle"}, kv{"status", "idle"})})},
		{"nested too deep", obj(kv{"x", raw(deep)})},
		{"truncated value", raw{0x82, 0xa1, 'a', 0x01}},
		{"trailing bytes", append(obj(kv{"a", 1}), 0x01)},
		{"reserved code", raw{0x81, 0xa1, 'a', 0xc1}},
	}
	c := schema.NewCodec(schema.Options{})
	sc := schema.NewCodec(schema.Options{StreamCheckpoints: true})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plain := msg("checkpoint", kv{"data", tt.data})
			want, werr := c.Decode(schema.FromAgent, plain)
			comp := msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(zstdStream(t, tt.data))})
			m, err := sc.Decode(schema.FromAgent, comp)
			if err != nil {
				t.Fatalf("streaming Decode refused the envelope: %v", err)
			}
			cp := m.(*schema.Checkpoint)
			if cp.Data != nil || cp.Zstd == nil {
				t.Fatalf("streaming Decode materialised the body")
			}
			var out bytes.Buffer
			status, n, err := sc.CheckpointData(cp.Zstd, &out)
			if (werr == nil) != (err == nil) {
				t.Fatalf("Decode: %v; CheckpointData: %v", werr, err)
			}
			if werr != nil {
				if !errors.Is(err, schema.ErrInvalidMessage) {
					t.Fatalf("CheckpointData error %v is not a payload error", err)
				}
				if len(err.Error()) > 1024 {
					t.Errorf("error text of %d bytes: attacker text is not clipped", len(err.Error()))
				}
				return
			}
			if status != want.(*schema.Checkpoint).Status {
				t.Errorf("status %q, Decode says %q", status, want.(*schema.Checkpoint).Status)
			}
			if !bytes.Equal(out.Bytes(), tt.data) || n != int64(len(tt.data)) {
				t.Errorf("wrote %d bytes %x, want %x", n, out.Bytes(), []byte(tt.data))
			}
		})
	}
}

func TestCheckpointDataLimits(t *testing.T) {
	sc := schema.NewCodec(schema.Options{StreamCheckpoints: true, Limits: schema.Limits{Checkpoint: 1 << 20}})
	big := obj(kv{"z", make([]byte, 2<<20)})
	var out bytes.Buffer
	if _, _, err := sc.CheckpointData(zstdStream(t, big), &out); schema.RuleOf(err) != schema.RuleTooLarge {
		t.Errorf("over the limit: got %v, want too_large", err)
	}
	// A window larger than StreamWindow is refused before anything is
	// allocated for it.
	hugeWindow := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 21 << 3, 0x03, 0x00, 0x02, 0x00}
	if _, _, err := sc.CheckpointData(hugeWindow, &out); schema.RuleOf(err) != schema.RuleCompression {
		t.Errorf("huge window: got %v, want a compression error", err)
	}
	// A write error is the writer's, not a payload error.
	boom := errors.New("disk on fire")
	_, _, err := sc.CheckpointData(zstdStream(t, obj(kv{"a", 1})), failWriter{boom})
	if !errors.Is(err, boom) || errors.Is(err, schema.ErrInvalidMessage) {
		t.Errorf("write error: got %v", err)
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

// lyingFrame is a single-segment zstd frame that declares fcs bytes of
// content and holds one raw block of body.
func lyingFrame(fcs uint64, body []byte) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0}
	b = binary.LittleEndian.AppendUint64(b, fcs)
	h := uint32(len(body))<<3 | 1
	b = append(b, byte(h), byte(h>>8), byte(h>>16))
	return append(b, body...)
}

// A frame that lies about its content size costs what it really decodes,
// not what it claims (it was a 100 MiB allocation per 30-byte message).
func TestLyingContentSizeAllocatesWhatIsDecoded(t *testing.T) {
	body := enc(map[string]any{"operation": "memory_add", "params": map[string]any{}, "sequence": 1})
	for _, tc := range []struct {
		typ string
		fcs uint64
	}{
		{"checkpoint", 100<<20 - 1},
		{"wal_entry", 10<<10 - 100},
		{"metrics", 10<<10 - 100},
	} {
		p := msg(tc.typ, kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(lyingFrame(tc.fcs, body))})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 10 {
			_, _ = schema.Decode(schema.FromAgent, p)
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / 10; per > 1<<20 {
			t.Errorf("%s declaring %d bytes: %d bytes allocated per decode, want under 1 MiB", tc.typ, tc.fcs, per)
		}
	}
}

// A restore can carry a stored zstd frame as it is; the agent decodes the
// same snapshot.
func TestRestoreWithPrecompressedSnapshot(t *testing.T) {
	data := obj(kv{"memory", arr("a", "b")}, kv{"blob", make([]byte, 3<<20)})
	z := zstdBytes(t, data) // declares its content size
	b, err := schema.Encode(&schema.Restore{CheckpointID: "c", SnapshotZstd: z, WALEntries: nil})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > len(z)+200 {
		t.Fatalf("restore of %d bytes for a %d-byte frame: recompressed?", len(b), len(z))
	}
	m, err := schema.Decode(schema.ToAgent, b)
	if err != nil {
		t.Fatal(err)
	}
	r := m.(*schema.Restore)
	if !r.Compress || !bytes.Equal(r.Snapshot, data) {
		t.Fatalf("decoded compress=%v, %d bytes; want the %d-byte snapshot", r.Compress, len(r.Snapshot), len(data))
	}
	// A frame that does not declare its size is refused (one-shot decoders
	// in other languages need it).
	if _, err := schema.Encode(&schema.Restore{SnapshotZstd: zstdStream(t, data)}); err == nil {
		t.Fatal("encoded a precompressed snapshot without a content size")
	}
}
