package schema_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
)

func TestLogValueOmitsContent(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	for _, m := range allMessages() {
		log.Info("msg", "m", m.m)
	}
	out := buf.String()
	for _, secret := range []string{"hi", "latency_ms=3", "zzzz", "hello"} {
		if strings.Contains(out, "="+secret) || strings.Contains(out, secret+"\"") {
			t.Errorf("log output contains payload content %q:\n%s", secret, out)
		}
	}
	for _, want := range []string{"m.type=wal_entry", "m.sequence=12345", "m.operation=memory_add", "m.type=restore", "m.wal_entries=1", "m.code=WAL_FULL"} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %q:\n%s", want, out)
		}
	}
}

// TestCodecConcurrentUse: one Codec shared by many goroutines (run with
// -race): pooled decoder state and zstd decoders must not leak between calls.
func TestCodecConcurrentUse(t *testing.T) {
	c := schema.NewCodec(schema.Options{})
	msgs := allMessages()
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		p, err := c.Encode(m.m)
		if err != nil {
			t.Fatal(err)
		}
		payloads[i] = p
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(msgs)
				m, err := c.Decode(msgs[k].dir, payloads[k])
				if err != nil {
					t.Errorf("%s: %v", msgs[k].m.MessageType(), err)
					return
				}
				if m.MessageType() != msgs[k].m.MessageType() {
					t.Errorf("decoded %s as %s", msgs[k].m.MessageType(), m.MessageType())
					return
				}
				if _, err := c.Encode(m); err != nil {
					t.Errorf("re-encode %s: %v", m.MessageType(), err)
					return
				}
			}
		})
	}
	wg.Wait()
}
