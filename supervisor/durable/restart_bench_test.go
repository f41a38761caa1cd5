package durable

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wal"
	"github.com/agent-sidecar/supervisor/wire"
)

// BenchmarkRestartPhases splits a restart on a long WAL tail (110,000
// entries of 1 KiB above no checkpoint, warm page cache) into the stores'
// Open (WAL recovery), BuildRestore and the restore written through a pipe
// to a reader:
// where test/BenchmarkRestartLongTail's time inside the supervisor goes.
func BenchmarkRestartPhases(b *testing.B) {
	dir := b.TempDir()
	codec := schema.NewCodec(schema.Options{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func() *Stores {
		st, err := Open(Options{Dir: dir, Codec: codec, Log: log, MaxFrameSize: wire.DefaultMaxFrameSize, WALSync: wal.SyncNone})
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	st := open()
	pad := strings.Repeat("p", 1000)
	const n = 110_000
	batch := make([]wal.Entry, 0, 1) // one record per entry, as an agent logging step by step writes them
	for i := 1; i <= n; i++ {
		raw, err := schema.MarshalMap(map[string]any{"operation": "memory_add", "params": map[string]any{"pad": pad}, "sequence": i})
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, wal.Entry{Sequence: uint64(i), Data: raw})
		if len(batch) == cap(batch) || i == n {
			if _, err := st.Append(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	var tOpen, tBuild, tStream time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		st := open()
		t1 := time.Now()
		plan, err := st.BuildRestore(Point{})
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if plan.Tail == nil {
			b.Fatal("want a streamed tail")
		}
		// Through a pipe, as to an agent that reads 1 MiB at a time.
		pr, pw, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		// 1 MiB, as agentproc makes the agent's input pipe.
		if rc, err := pw.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
		}
		read := make(chan int64)
		go func() {
			n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{pr}, make([]byte, 1<<20))
			read <- n
		}()
		werr := wire.NewWriter(pw, 0).WriteFrameStream(plan.Frame, plan.Tail.Size(), plan.Tail.Stream)
		pw.Close()
		n := <-read
		pr.Close()
		if werr != nil || n != 4+int64(len(plan.Frame))+plan.Tail.Size() {
			b.Fatalf("restore of %d bytes read, want %d: %v", n, 4+int64(len(plan.Frame))+plan.Tail.Size(), werr)
		}
		t3 := time.Now()
		tOpen += t1.Sub(t0)
		tBuild += t2.Sub(t1)
		tStream += t3.Sub(t2)
		st.Close()
	}
	b.ReportMetric(float64(tOpen.Milliseconds())/float64(b.N), "open-ms")
	b.ReportMetric(float64(tBuild.Milliseconds())/float64(b.N), "build-ms")
	b.ReportMetric(float64(tStream.Milliseconds())/float64(b.N), "stream-ms")
}
