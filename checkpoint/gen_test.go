package checkpoint

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// words is the vocabulary of the generated texts: a few hundred words with
// a skewed frequency, so text compresses about as well as prose does.
var words = strings.Fields(`the a of to and in is it that for on with as was be by this are or
from at an not have has had but which their they you we he she his her its were been can will
would should could may might must do does did done memory agent tool state request response user
assistant model embedding vector search index query result error retry latency throughput cache
checkpoint restore log entry sequence window token context prompt plan step action observation
reflection goal task subtask file path directory process thread signal timeout deadline budget
summary note fact preference profile session history turn message reply question answer reason
because therefore however although while until before after during since when where why how what
who whom whose each every some any many few more most less least first last next previous other
same different new old good bad high low large small long short early late fast slow open close
read write send receive store load save delete update create remove add list show find match sort
filter group count sum average median percentile distribution sample measure metric gauge counter
histogram label value key name id type kind version status idle thinking acting evolving success
failure warning info debug trace span event audit decision promote reject shadow primary backup`)

// genCheckpoint builds a realistic checkpoint of about size bytes: a
// MessagePack map shaped like the seed schema's checkpoint data, most of it
// memory_blocks with texts and float32 or float64 embeddings, plus a tool
// registry, a conversation history and metrics. It is deterministic in seed.
func genCheckpoint(size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	text := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			// Zipf-like: low indexes are much more frequent.
			i := int(float64(len(words)) * math.Pow(r.Float64(), 3))
			sb.WriteString(words[i])
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			panic(err)
		}
		return b
	}

	tools := make([]map[string]any, 20)
	for i := range tools {
		tools[i] = map[string]any{"name": fmt.Sprintf("tool_%d", i), "params": []string{"query", "limit"},
			"doc": text(200), "unsafe": i%7 == 0}
	}
	var history []map[string]any
	for i := 0; i < max(size/(64<<10), 4); i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		history = append(history, map[string]any{"role": role, "content": text(100 + r.IntN(600)),
			"timestamp": 1705392000 + i*7})
	}
	head := map[string]any{
		"agent_state":          map[string]any{"id": "agent-7f3c", "version": "1.4.2", "status": "idle"},
		"tool_registry":        map[string]any{"tools": tools},
		"conversation_history": history,
		"metrics":              map[string]any{"total_requests": 123456, "avg_latency": 10.5, "error_count": 5},
	}

	// memory_blocks fills the rest.
	var blocks bytes.Buffer
	n := 0
	budget := size - len(enc(head)) - 32
	for blocks.Len() < budget {
		var emb any
		if n%3 == 2 {
			e := make([]float64, 256)
			for i := range e {
				e[i] = r.NormFloat64() * 0.05
			}
			emb = e
		} else {
			e := make([]float32, 384)
			for i := range e {
				e[i] = float32(r.NormFloat64() * 0.05)
			}
			emb = e
		}
		b := enc(map[string]any{
			"id":           fmt.Sprintf("mem-%08d", n),
			"text":         text(200 + r.IntN(1200)),
			"embedding":    emb,
			"metadata":     map[string]any{"source": "conversation", "turn": n % 97, "tags": []string{"fact", "user"}},
			"importance":   math.Round(r.Float64()*100) / 100,
			"access_count": r.IntN(1000),
			"created":      1705392000 + n,
		})
		if blocks.Len()+len(b) > budget && n > 0 {
			break
		}
		blocks.Write(b)
		n++
	}

	var out bytes.Buffer
	e := msgpack.NewEncoder(&out)
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(e.EncodeMapLen(len(head) + 1))
	for _, k := range []string{"agent_state", "tool_registry", "conversation_history", "metrics"} {
		must(e.EncodeString(k))
		must(e.Encode(head[k]))
	}
	must(e.EncodeString("memory_blocks"))
	must(e.EncodeArrayLen(n))
	out.Write(blocks.Bytes())
	return out.Bytes()
}

var (
	data100MiBOnce sync.Once
	data100MiB     []byte
)

// checkpoint100MiB is the 100 MiB benchmark checkpoint, built once.
func checkpoint100MiB(tb testing.TB) []byte {
	tb.Helper()
	data100MiBOnce.Do(func() { data100MiB = genCheckpoint(100<<20, 1) })
	return data100MiB
}

func TestGenCheckpoint(t *testing.T) {
	b := genCheckpoint(256<<10, 7)
	if len(b) > 256<<10 || len(b) < 200<<10 {
		t.Fatalf("generated %d bytes, want about %d", len(b), 256<<10)
	}
	var m map[string]msgpack.RawMessage
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatalf("generated checkpoint is not a MessagePack map: %v", err)
	}
	for _, k := range []string{"agent_state", "memory_blocks", "tool_registry", "conversation_history", "metrics"} {
		if _, ok := m[k]; !ok {
			t.Errorf("generated checkpoint lacks %q", k)
		}
	}
}
