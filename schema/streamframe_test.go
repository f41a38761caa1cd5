package schema

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// frameOf encodes pairs (key, value) in order as one top-level map.
func frameOf(t *testing.T, pairs ...any) []byte {
	t.Helper()
	var b []byte
	b = append(b, 0x80|byte(len(pairs)/2))
	for i := 0; i < len(pairs); i += 2 {
		k, err := MarshalValue(pairs[i])
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, k...)
		switch v := pairs[i+1].(type) {
		case rawValue:
			b = append(b, v...)
		default:
			enc, err := MarshalValue(v)
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, enc...)
		}
	}
	return b
}

type rawValue []byte

// DecodeCheckpointStream says what Decode says of every frame, with the
// data of a valid checkpoint written out byte for byte and never kept.
func TestDecodeCheckpointStreamAgreesWithDecode(t *testing.T) {
	c := NewCodec(Options{StreamCheckpoints: true})
	blob := strings.Repeat("x", 2<<20)
	data := func(status any) map[string]any {
		return map[string]any{"agent_state": map[string]any{"status": status}, "blob": blob}
	}
	deep := rawValue(append(bytes.Repeat([]byte{0x91}, 70), 0xc0))
	cases := map[string][]byte{
		"valid":      frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data("idle")),
		"data first": frameOf(t, "data", data("acting"), "timestamp", 1, "type", "checkpoint", "version", 1),
		"bad status": frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data("sleeping")),
		"bad status, then malformed": append(frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data(7))[:0:0],
			frameOf(t, "type", "checkpoint", "data", data(7), "timestamp", rawValue{0xc1})...),
		"no timestamp":     frameOf(t, "type", "checkpoint", "data", data("idle")),
		"type after data":  frameOf(t, "data", data("idle"), "timestamp", 1, "type", "metrics"),
		"wrong type":       frameOf(t, "type", "heartbeat", "timestamp", 1, "data", data("idle")),
		"duplicate data":   frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data("idle"), "data", map[string]any{}),
		"compressed map":   frameOf(t, "type", "checkpoint", "timestamp", 1, "compressed", true, "compression", "zstd", "data", data("idle")),
		"data not a map":   frameOf(t, "type", "checkpoint", "timestamp", 1, "data", blob),
		"too deep in data": frameOf(t, "type", "checkpoint", "timestamp", 1, "data", rawValue(append([]byte{0x82, 0xa4, 'b', 'l', 'o', 'b'}, append(mustValue(t, blob), append([]byte{0xa1, 'd'}, deep...)...)...))),
		"trailing bytes":   append(frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data("idle")), 0xc0),
		"cut inside data":  frameOf(t, "type", "checkpoint", "timestamp", 1, "data", data("idle"))[:1<<20+100],
		"not a map":        mustValue(t, blob),
		"dup agent_state":  frameOf(t, "type", "checkpoint", "timestamp", 1, "data", rawValue(append([]byte{0x83, 0xab}, append([]byte("agent_state"), append([]byte{0x80, 0xab}, append([]byte("agent_state"), append([]byte{0x80, 0xa4, 'b', 'l', 'o', 'b'}, mustValue(t, blob)...)...)...)...)...))),
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			want, wantErr := c.Decode(FromAgent, frame)
			var out bytes.Buffer
			opened := false
			got, streamed, err := c.DecodeCheckpointStream(bytes.NewReader(frame), len(frame), func() (io.Writer, error) {
				opened = true
				return &out, nil
			})
			if streamed != opened {
				t.Fatalf("streamed %v, opened %v", streamed, opened)
			}
			if mustStream := !strings.Contains(name, "not a map") && !strings.Contains(name, "cut"); mustStream && !streamed {
				t.Fatal("the data map was kept, not streamed")
			}
			if streamed && out.Len() > 0 && wantErr == nil && len(frame)-out.Len() > 1024 {
				t.Fatalf("%d bytes of the frame kept besides the data", len(frame)-out.Len())
			}
			var we, ge *ValidationError
			errors.As(wantErr, &we)
			errors.As(err, &ge)
			if (wantErr == nil) != (err == nil) || (we != nil) != (ge != nil) || (we != nil && (we.Rule != ge.Rule || we.Field != ge.Field || we.Type != ge.Type)) {
				t.Fatalf("Decode: %v\nstream: %v", wantErr, err)
			}
			if wantErr != nil {
				return
			}
			wc, gc := want.(*Checkpoint), got.(*Checkpoint)
			if streamed {
				if gc.Data != nil || !bytes.Equal(out.Bytes(), wc.Data) || gc.Status != wc.Status || gc.Version != wc.Version {
					t.Fatalf("streamed %d bytes (equal %v), status %q want %q", out.Len(), bytes.Equal(out.Bytes(), wc.Data), gc.Status, wc.Status)
				}
			} else if !bytes.Equal(gc.Data, wc.Data) || !bytes.Equal(gc.Zstd, wc.Zstd) {
				t.Fatal("kept frame decodes differently")
			}
		})
	}
}

func mustValue(t *testing.T, v any) []byte {
	t.Helper()
	b, err := MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// MarshalValue encodes v with msgpack (tests only).
func MarshalValue(v any) ([]byte, error) { return msgpack.Marshal(v) }
