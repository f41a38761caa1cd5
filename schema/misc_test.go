package schema_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

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

// Every str the codec writes is valid UTF-8, whatever bytes the Go strings
// it was given hold (an error reply quotes the agent's own bytes): strict
// decoders refuse anything else.
func TestEncodedStrsAreValidUTF8(t *testing.T) {
	c := schema.NewCodec(schema.Options{})
	msgs := []schema.Message{
		schema.NewError("CODE\xff", "message \xc3 here", map[string]any{"field": "data.k\xfe", "k\xff": []string{"\xed\xa0\x80"}, "n": 3}),
		schema.ErrorReply(&schema.ValidationError{Type: "metrics", Field: "data.\xff", Rule: schema.RuleFieldType, Reason: "bad \xff"}),
		&schema.HotReload{Code: "print('\xff')", Module: "m\xfe", BackupCheckpointID: "x"},
		&schema.ProcessRequest{RequestID: "r\xff", Data: schema.RequestData{Message: "hi\xff"}},
	}
	for _, m := range msgs {
		b, err := c.Encode(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		var v any
		if err := msgpack.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		var check func(v any)
		check = func(v any) {
			switch v := v.(type) {
			case string:
				if !utf8.ValidString(v) {
					t.Errorf("%T: str %q is not UTF-8", m, v)
				}
			case map[string]any:
				for k, e := range v {
					check(k)
					check(e)
				}
			case []any:
				for _, e := range v {
					check(e)
				}
			}
		}
		check(v)
		if !bytes.Contains(b, []byte(`\xff`)) {
			t.Errorf("%T: the invalid byte is not shown escaped: %q", m, b)
		}
	}
}
