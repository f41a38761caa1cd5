package test

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ackAgent builds test/ackagent once (benchmarks only).
func ackAgent(b *testing.B) string { return goBuild(b, "ackagent", "./ackagent", nil) }

// runAckAgent runs the supervisor over test/ackagent in mode and returns the
// figures the agent wrote, and the data directory.
func runAckAgent(b *testing.B, flags []string, env ...string) (map[string]float64, string) {
	b.Helper()
	out := filepath.Join(b.TempDir(), "figures.json")
	// ACKBENCH_SAMPLES=prefix: each benchmark's round trips, in the order
	// timed, into prefix.<benchmark>.csv (test/ackagent's writeSamples).
	if prefix := os.Getenv("ACKBENCH_SAMPLES"); prefix != "" {
		env = append(env, "ACKBENCH_SAMPLES="+prefix+"."+strings.NewReplacer("/", "_", "=", "-").Replace(b.Name())+".csv")
	}
	// SUP_BIN: another supervisor binary (an old build, for a comparison in one window).
	s := startSup(b, supOpts{bin: os.Getenv("SUP_BIN"), command: []string{ackAgent(b)}, flags: flags, env: append(env, "ACKBENCH_OUT="+out)})
	var figures map[string]float64
	waitFor(b, 10*time.Minute, "the agent's figures", func() bool {
		data, err := os.ReadFile(out)
		return err == nil && json.Unmarshal(data, &figures) == nil
	})
	// The WAL's own fsyncs, as the supervisor timed them.
	if n := s.metric("supervisor_wal_fsync_duration_seconds_count"); n > 0 {
		figures["wal_fsync_mean_ns"] = s.metric("supervisor_wal_fsync_duration_seconds_sum") / n * 1e9
		figures["wal_fsyncs"] = n
	}
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	return figures, s.dataDir
}

// BenchmarkWALAck: an agent (test/ackagent, the Go client) logs 1 KiB
// entries with ack: true through the real binary and times each until its
// wal_ack (Conn.Log), under the default --wal-sync batch.
//
//   - single: one entry at a time; p50/p99 of the round trip beside the
//     machine's own fdatasync latency (1 KiB into a preallocated file on the
//     same filesystem), one probe after each round trip, so both see the
//     same disk (SPEC §8 target: within 1.5×);
//   - inflight=K: K entries in flight (Conn.StartLog), throughput.
//
// One op is one entry; use -benchtime=2000x (start-up is not amortised).
func BenchmarkWALAck(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		syncDir := b.TempDir() // beside the data directory: the same filesystem
		fig, _ := runAckAgent(b, nil, "ACKBENCH_MODE=latency", "ACKBENCH_N="+strconv.Itoa(b.N), "ACKBENCH_SYNCDIR="+syncDir)
		reportRoundTrips(b, fig)
		// The WAL's own fdatasync, as the supervisor timed it (mean).
		b.ReportMetric(fig["wal_fsync_mean_ns"]/1e3, "wal-fsync-mean-µs")
	})
	// The same round trip from an agent with its own frames (no client
	// package), written and read on one goroutine — how issue 31 measured
	// it: the supervisor's figure alone. raw reads its stdin as inherited
	// (blocking); raw/poller through Go's poller, as the client does;
	// raw/poller/handoff reads the wal_acks on a second goroutine that
	// hands each over a channel, as the client's reader does.
	for _, mode := range []struct{ name, poll, handoff string }{
		{"single/raw", "0", "0"}, {"single/raw/poller", "1", "0"}, {"single/raw/poller/handoff", "1", "1"},
	} {
		b.Run(mode.name, func(b *testing.B) {
			fig, _ := runAckAgent(b, nil, "ACKBENCH_MODE=raw", "ACKBENCH_POLL="+mode.poll, "ACKBENCH_HANDOFF="+mode.handoff,
				"ACKBENCH_N="+strconv.Itoa(b.N), "ACKBENCH_SYNCDIR="+b.TempDir())
			reportRoundTrips(b, fig)
		})
	}
	// The same round trip with --wal-sync none: the cost of the messages
	// alone (two pipe hops, decoding, the acker), without an fsync.
	b.Run("single/wal-sync=none", func(b *testing.B) {
		fig, _ := runAckAgent(b, []string{"--wal-sync", "none"}, "ACKBENCH_MODE=latency", "ACKBENCH_N="+strconv.Itoa(b.N), "ACKBENCH_SYNCDIR="+b.TempDir())
		b.ReportMetric(fig["mean_ns"], "ns/op")
		b.ReportMetric(fig["p50_ns"]/1e3, "ack-p50-µs")
		b.ReportMetric(fig["p99_ns"]/1e3, "ack-p99-µs")
	})
	for _, k := range []int{1, 8, 64} {
		b.Run("inflight="+strconv.Itoa(k), func(b *testing.B) {
			fig, _ := runAckAgent(b, nil, "ACKBENCH_MODE=inflight", "ACKBENCH_N="+strconv.Itoa(b.N), "ACKBENCH_K="+strconv.Itoa(k))
			b.ReportMetric(1e9/fig["entries_per_second"], "ns/op")
			b.ReportMetric(fig["entries_per_second"], "entries/s")
		})
	}
}

// reportRoundTrips reports test/ackagent's timed round trips beside the
// fdatasync probe and the ideal supervisor (two pipe hops around an fsync
// on one thread), all timed in the same rounds.
func reportRoundTrips(b *testing.B, fig map[string]float64) {
	b.ReportMetric(fig["mean_ns"], "ns/op")
	b.ReportMetric(fig["p50_ns"]/1e3, "ack-p50-µs")
	b.ReportMetric(fig["p99_ns"]/1e3, "ack-p99-µs")
	b.ReportMetric(fig["fdatasync_p50_ns"]/1e3, "fdatasync-p50-µs")
	b.ReportMetric(fig["fdatasync_p99_ns"]/1e3, "fdatasync-p99-µs")
	b.ReportMetric(fig["p50_ns"]/fig["fdatasync_p50_ns"], "p50-ratio")
	b.ReportMetric(fig["p99_ns"]/fig["fdatasync_p99_ns"], "p99-ratio")
	b.ReportMetric(fig["ideal_p50_ns"]/1e3, "ideal-p50-µs")
	b.ReportMetric(fig["p50_ns"]/fig["ideal_p50_ns"], "p50-ideal-ratio")
	b.ReportMetric(fig["ideal_p50_ns"]/fig["fdatasync_p50_ns"], "ideal-ratio")
	// The p99 target's floor: the ideal supervisor's own p99 over the
	// fdatasync's, sampled in the same rounds.
	b.ReportMetric(fig["ideal_p99_ns"]/fig["fdatasync_p99_ns"], "ideal-p99-ratio")
	b.ReportMetric(fig["p99_ns"]/fig["ideal_p99_ns"], "p99-ideal-ratio")
}

// BenchmarkPipeWakeFloor: what one round trip between two processes costs
// on this machine, without the supervisor: 64 bytes to a child process
// (test/ackagent in echo mode) and back over two pipes, back to back and
// after a pause (an fsync's length and longer), p50 of each. A wal_ack
// always follows such a pause on both sides; the difference between the
// two is the cost of waking threads whose CPUs went idle.
func BenchmarkPipeWakeFloor(b *testing.B) {
	for _, pause := range []time.Duration{0, 200 * time.Microsecond, time.Millisecond} {
		b.Run("pause="+pause.String(), func(b *testing.B) {
			cmd := exec.Command(ackAgent(b))
			cmd.Env = append(os.Environ(), "ACKBENCH_MODE=echo")
			w, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			r, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() { w.Close(); cmd.Wait() }()
			msg := make([]byte, 64)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				if pause > 0 {
					time.Sleep(pause)
				}
				t0 := time.Now()
				if _, err := w.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(r, msg); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// BenchmarkStep: the Go client's Request.Step with a trivial function —
// its result logged as a request_step entry with ack: true, acknowledged,
// returned — through the real binary under the default --wal-sync batch,
// one step at a time, beside the machine's fdatasync (one probe after each
// step, as in BenchmarkWALAck/single). Issue target: p50 within 1.3× of the
// fdatasync p50. One op is one step; use -benchtime=2000x.
func BenchmarkStep(b *testing.B) {
	fig, _ := runAckAgent(b, []string{"--wal-sync", "batch"}, "ACKBENCH_MODE=step", "ACKBENCH_N="+strconv.Itoa(b.N), "ACKBENCH_SYNCDIR="+b.TempDir())
	b.ReportMetric(fig["mean_ns"], "ns/op")
	b.ReportMetric(fig["p50_ns"]/1e3, "step-p50-µs")
	b.ReportMetric(fig["p99_ns"]/1e3, "step-p99-µs")
	b.ReportMetric(fig["fdatasync_p50_ns"]/1e3, "fdatasync-p50-µs")
	b.ReportMetric(fig["fdatasync_p99_ns"]/1e3, "fdatasync-p99-µs")
	b.ReportMetric(fig["p50_ns"]/fig["fdatasync_p50_ns"], "p50-ratio")
	b.ReportMetric(fig["p99_ns"]/fig["fdatasync_p99_ns"], "p99-ratio")
}

// BenchmarkRequestWait: POST /v1/requests?wait=10s over loopback → the
// agent (test/ackagent, answering at once) → request_result → 200, one
// request at a time; p50/p99 of the HTTP round trip.
func BenchmarkRequestWait(b *testing.B) {
	s := startSup(b, supOpts{command: []string{ackAgent(b)}, env: []string{"ACKBENCH_MODE=serve"}})
	s.waitReady()
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		code, body := s.post("/v1/requests?wait=10s", `{"message":"ping"}`)
		lat[i] = time.Since(t0)
		if code != 200 {
			b.Fatalf("POST ?wait: %d %s", code, body)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[b.N/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[min(b.N-1, b.N*99/100)].Microseconds()), "p99-µs")
}
