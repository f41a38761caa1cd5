package agent_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

var update = flag.Bool("update", false, "rewrite the seed corpus in testdata/fuzz/FuzzReceive")

// receiveSeeds are input streams for FuzzReceive: every supervisor message
// type framed, several in a row, and broken streams.
func receiveSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	var all []byte
	for _, m := range everySupervisorMessage() {
		b, err := schema.Encode(m)
		if err != nil {
			t.Fatalf("encode %s: %v", m.MessageType(), err)
		}
		seeds = append(seeds, wire.AppendFrame(nil, b))
		all = wire.AppendFrame(all, b)
	}
	ack, err := schema.Encode(&schema.CheckpointAck{CheckpointID: "cp", Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	req, err := schema.Encode(&schema.ProcessRequest{RequestID: "r", Data: schema.RequestData{Message: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	shutdown, err := schema.Encode(&schema.Shutdown{CreateCheckpoint: true})
	if err != nil {
		t.Fatal(err)
	}
	// shutdown, then a request overtaking the ack the handler waits for
	var waiting []byte
	for _, p := range [][]byte{shutdown, req, ack, req} {
		waiting = wire.AppendFrame(waiting, p)
	}
	seeds = append(seeds,
		all,
		waiting,
		nil,
		[]byte{0, 0, 0, 0},                // zero length
		[]byte{0xff, 0xff, 0xff, 0xff, 1}, // absurd length
		[]byte{0, 0, 0, 5, 0xdd, 0xff, 0xff, 0xff, 0xff}, // array32 claiming 4G elements
		[]byte{0, 0, 0, 1, 0x80},                         // an empty map: no type
		wire.AppendFrame(nil, []byte{0x93, 1, 2, 3}),     // not a map
		all[:len(all)-3],                                 // torn last frame
	)
	return seeds
}

func FuzzReceive(f *testing.F) {
	for _, s := range receiveSeeds(f) {
		f.Add(s)
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		conn := agent.NewConn(bytes.NewReader(b), io.Discard, defaultConfig(), agent.Options{Logger: discard, MaxFrameSize: 1 << 20})
		defer conn.Close()
		ctx := context.Background()
		h := agent.Handlers{
			Restore: func(m *schema.Restore) error {
				for _, e := range m.WALEntries {
					if len(e) == 0 {
						t.Fatal("empty WAL entry in a decoded restore")
					}
				}
				return nil
			},
			HotReload: func(*schema.HotReload) error { return errors.New("rejected") },
			Shutdown: func(m *schema.Shutdown) {
				if m.CreateCheckpoint {
					conn.AwaitCheckpointAck(ctx)
				}
			},
		}
		var err error
		for range 64 {
			if err = conn.Run(ctx, h); !errors.Is(err, agent.ErrShutdown) {
				break
			}
		}
		if !errors.Is(err, agent.ErrShutdown) && !errors.Is(err, agent.ErrSupervisorGone) && !wire.IsFramingError(err) {
			t.Fatalf("Run ended with %v: want shutdown, supervisor gone or a framing error", err)
		}
	})
}

// TestFuzzCorpus keeps testdata/fuzz/FuzzReceive in step with the seeds;
// go test -run TestFuzzCorpus -update rewrites it.
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzReceive")
	seeds := receiveSeeds(t)
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v (go test -run TestFuzzCorpus -update writes it)", err)
	}
	if len(entries) < len(seeds) {
		t.Errorf("%s holds %d files, want at least %d (go test -run TestFuzzCorpus -update)", dir, len(entries), len(seeds))
	}
}
