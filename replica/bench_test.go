package replica_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/wal"
)

// Benchmarks against a real MinIO on loopback (docs/benchmarks.md):
//
//	go test -run '^$' -bench . -benchtime 1x ./replica/          (restore, upload)
//	go test -run '^$' -bench Lag -benchtime 5000x ./replica/     (5 s at 1,000 entries/s)

// BenchmarkReplicationLag: an agent logging a steady 1,000 entries/s of
// 200 bytes (group commit, as the supervisor runs it) with the default 1 s
// sync interval. The lag of an entry is the time from its
// durability to its chunk's upload; p50 and p99 over b.N entries.
func BenchmarkReplicationLag(b *testing.B) {
	_, c := setup(b, "lag")
	local := benchLocal(b)
	w := local.WAL
	r := replica.New(c, local, replica.Options{SyncInterval: time.Second})
	r.Start()
	defer r.Close(10 * time.Second)

	n := b.N
	durable := make([]time.Time, n+1)
	uploaded := make([]time.Time, n+1)
	done := make(chan struct{})
	go func() { // when each sequence was first seen durable, and uploaded
		defer close(done)
		var dSeen, uSeen uint64
		for uSeen < uint64(n) {
			d, u := w.DurableSequence(), r.Status().UploadedSequence
			now := time.Now()
			for ; dSeen < d && dSeen < uint64(n); dSeen++ {
				durable[dSeen+1] = now
			}
			for ; uSeen < u && uSeen < uint64(n); uSeen++ {
				uploaded[uSeen+1] = now
			}
			time.Sleep(time.Millisecond)
		}
	}()
	data := []byte(strings.Repeat("m", 200))
	b.ResetTimer()
	start := time.Now()
	for i := 1; i <= n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		if _, err := w.Append(wal.Entry{Sequence: uint64(i), Data: data}); err != nil {
			b.Fatal(err)
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	<-done
	b.StopTimer()
	lags := make([]float64, 0, n)
	for i := 1; i <= n; i++ {
		lags = append(lags, uploaded[i].Sub(durable[i]).Seconds())
	}
	slices.Sort(lags)
	b.ReportMetric(lags[len(lags)/2]*1000, "p50-lag-ms")
	b.ReportMetric(lags[len(lags)*99/100]*1000, "p99-lag-ms")
	b.ReportMetric(lags[len(lags)-1]*1000, "max-lag-ms")
	b.ReportMetric(rate, "entries/s")
}

// state100MiB is a realistic 100 MiB checkpoint: float embeddings (which
// barely compress) and text, as checkpoint's own benchmarks use.
func state100MiB() []byte {
	rng := rand.New(rand.NewPCG(7, 7))
	words := strings.Fields("the agent remembered a tool call with its result and the user asked again about memory retrieval context window")
	out := make([]byte, 0, 100<<20)
	for len(out) < 100<<20 {
		for i := 0; i < 256; i++ { // one embedding
			out = binary.BigEndian.AppendUint32(out, math.Float32bits(float32(rng.NormFloat64())))
		}
		for i := 0; i < 200; i++ {
			out = append(out, words[rng.IntN(len(words))]...)
			out = append(out, ' ')
		}
	}
	return out[:100<<20]
}

// prepared makes a data directory with a 100 MiB checkpoint and 10,000 WAL
// entries after it.
func prepared(b *testing.B) replica.Local {
	b.Helper()
	local := benchLocal(b)
	w, ck := local.WAL, local.Checkpoints
	for i := 1; i <= 100; i++ {
		if _, err := w.Append(wal.Entry{Sequence: uint64(i), Data: []byte(fmt.Sprint("early ", i))}); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := ck.Save(state100MiB(), 100); err != nil {
		b.Fatal(err)
	}
	for i := 101; i <= 10100; i++ {
		if _, err := w.Append(wal.Entry{Sequence: uint64(i), Data: []byte(strings.Repeat("e", 300))}); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Sync(); err != nil {
		b.Fatal(err)
	}
	return local
}

// benchLocal is an empty data directory with the stores' defaults.
func benchLocal(b *testing.B) replica.Local {
	b.Helper()
	dir := b.TempDir()
	ck, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), NoPreallocate: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	return replica.Local{DataDir: dir, WAL: w, Checkpoints: ck, HoldTruncation: func() func() { return func() {} }}
}

// replicate uploads local as a new generation and returns the bytes sent.
func replicate(b *testing.B, c *replica.Client, local replica.Local) float64 {
	b.Helper()
	_ = os.Remove(filepath.Join(local.DataDir, "replica.json")) // a new generation: everything again
	reg := prometheus.NewRegistry()
	r := replica.New(c, local, replica.Options{SyncInterval: 10 * time.Millisecond, Registerer: reg})
	r.Start()
	defer r.Close(time.Minute)
	waitUploaded(b, r, 10100)
	for r.Status().Checkpoints != 1 {
		time.Sleep(time.Millisecond)
	}
	return testutil.ToFloat64(counter(b, reg, "supervisor_replica_uploaded_bytes_total"))
}

// BenchmarkRestore100MiB: a 100 MiB state (checkpoint plus 10,000 WAL
// entries) from MinIO into an empty data directory, verified (SPEC §8:
// under 3 s).
func BenchmarkRestore100MiB(b *testing.B) {
	_, c := setup(b, "restore")
	replicate(b, c, prepared(b))
	b.SetBytes(100 << 20)
	b.ResetTimer()
	for b.Loop() {
		res, err := c.Restore(context.Background(), filepath.Join(b.TempDir(), "data"), replica.Target{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if res.LastSequence != 10100 || res.Watermark != 100 {
			b.Fatalf("restore %+v", res)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/restore")
}

// BenchmarkUpload100MiB: that directory uploaded from scratch as a new
// generation (the checkpoint's stored bytes and the WAL in chunks): the
// replicator's throughput against MinIO, in bytes sent.
func BenchmarkUpload100MiB(b *testing.B) {
	_, c := setup(b, "upload")
	local := prepared(b)
	var sent float64
	b.ResetTimer()
	for b.Loop() {
		sent += replicate(b, c, local)
	}
	b.ReportMetric(sent/b.Elapsed().Seconds()/(1<<20), "MiB/s-uploaded")
}

// BenchmarkRestore100MiBCommand: the same restore through the built binary,
// `supervisor replica restore`, reporting the process's peak resident
// memory (VmHWM, from wait4's rusage).
func BenchmarkRestore100MiBCommand(b *testing.B) {
	srv, c := setup(b, "restore-cmd")
	replicate(b, c, prepared(b))
	bin := filepath.Join(b.TempDir(), "supervisor")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/supervisor").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	var hwm int64
	b.ResetTimer()
	for b.Loop() {
		cmd := exec.Command(bin, "replica", "restore", "--replica", "s3://bkt/restore-cmd", "--replica-endpoint", srv.Endpoint(),
			"--data-dir", filepath.Join(b.TempDir(), "data"))
		cmd.Env = append(os.Environ(), srv.Env()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("replica restore: %v\n%s", err, out)
		}
		hwm = max(hwm, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)
	}
	b.ReportMetric(float64(hwm)/1024, "MiB-VmHWM")
}
