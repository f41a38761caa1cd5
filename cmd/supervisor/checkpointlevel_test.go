package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
)

// --checkpoint-level is documented as "1 fastest … 4 best compression"
// (klauspost's four encoder levels). Level N must store a checkpoint exactly
// as the checkpoint store does at zstd.EncoderLevel(N): the same stored size.
func TestCheckpointLevelMeansTheDocumentedEncoderLevel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	words := []string{"alpha", "beta", "gamma", "delta", "note", "memory", "tool", "state", "agent", "embedding"}
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		fmt.Fprintf(&sb, "%s %d ", words[rng.Intn(len(words))], rng.Intn(100000))
	}
	data := []byte(sb.String())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for n := 1; n <= 4; n++ {
		want, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoints"), checkpoint.Options{Level: zstd.EncoderLevel(n)})
		if err != nil {
			t.Fatal(err)
		}
		wm, err := want.Save(data, 0)
		if err != nil {
			t.Fatal(err)
		}
		st, err := durable.Open(durable.Options{Dir: t.TempDir(), Codec: schema.NewCodec(schema.Options{}), Log: quiet,
			MaxFrameSize: 1 << 27, CheckpointLevel: n, WALSegmentSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Checkpoints().Save(data, 0)
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got.StoredSize != wm.StoredSize {
			t.Errorf("--checkpoint-level %d stored %d bytes; zstd.EncoderLevel(%d) (%v) stores %d", n, got.StoredSize, n, zstd.EncoderLevel(n), wm.StoredSize)
		}
	}
}

// A --checkpoint-level outside 0..4 is a configuration error (exit 2), not
// silently some other level.
func TestCheckpointLevelOutOfRangeIsRefused(t *testing.T) {
	for _, v := range []string{"5", "99", "-1"} {
		cfg, _, err := parseRun(env{}, []string{"--checkpoint-level", v, "--data-dir", t.TempDir()})
		if err != nil {
			t.Fatalf("parse --checkpoint-level %s: %v", v, err)
		}
		cfg.Command = []string{"/bin/true"}
		_, err = supervisor.New(cfg)
		if !errors.Is(err, supervisor.ErrConfig) {
			t.Errorf("--checkpoint-level %s: New returned %v, want a configuration error", v, err)
		}
	}
}
