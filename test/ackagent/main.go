// Command ackagent is the agent of the durability benchmarks in test/: a Go
// agent (package agent) that measures wal_ack round trips from its side, or
// answers requests at once. Its mode and figures travel through the
// environment and a JSON file:
//
//	ACKBENCH_MODE=latency  ACKBENCH_N=n                 n Logs one after another
//	ACKBENCH_MODE=inflight ACKBENCH_N=n ACKBENCH_K=k    n Logs, k in flight at a time
//	ACKBENCH_MODE=step     ACKBENCH_N=n                 n steps of one request one after another
//	ACKBENCH_MODE=serve                                 answer every request at once
//	ACKBENCH_OUT=FILE                                   where the figures go
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, agent.ErrShutdown) && !errors.Is(err, agent.ErrSupervisorGone) {
		fmt.Fprintln(os.Stderr, "ackagent:", err)
		os.Exit(1)
	}
}

func run() error {
	conn, err := agent.Connect(agent.Options{})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go conn.Heartbeats(ctx, time.Second)
	restored := make(chan struct{})
	if !conn.Config().RestorePending {
		close(restored)
	}
	var once sync.Once
	runErr := make(chan error, 1)
	go func() {
		runErr <- conn.Run(ctx, agent.Handlers{
			Restore: func(*schema.Restore) error { once.Do(func() { close(restored) }); return nil },
			Request: func(m *schema.ProcessRequest) (any, error) { return map[string]any{"echo": m.Data.Message}, nil },
		})
	}()
	<-restored
	n, _ := strconv.Atoi(os.Getenv("ACKBENCH_N"))
	k, _ := strconv.Atoi(os.Getenv("ACKBENCH_K"))
	params := map[string]any{"content": strings.Repeat("x", 1000)}
	switch os.Getenv("ACKBENCH_MODE") {
	case "latency":
		// Each round trip is followed by one raw fdatasync of 1 KiB in
		// ACKBENCH_SYNCDIR (the data directory's filesystem), so both are
		// measured under the same disk conditions.
		sync, err := newSyncProbe(os.Getenv("ACKBENCH_SYNCDIR"))
		if err != nil {
			return err
		}
		defer sync.close()
		lat := make([]time.Duration, 0, n)
		raw := make([]time.Duration, 0, n)
		for seq := uint64(1); seq <= uint64(n); seq++ {
			t0 := time.Now()
			if err := conn.Log(ctx, schema.OpMemoryAdd, params, seq); err != nil {
				return err
			}
			lat = append(lat, time.Since(t0))
			d, err := sync.once()
			if err != nil {
				return err
			}
			raw = append(raw, d)
		}
		slices.Sort(lat)
		slices.Sort(raw)
		if err := report(map[string]any{"n": n, "p50_ns": pct(lat, 0.50), "p99_ns": pct(lat, 0.99), "mean_ns": mean(lat),
			"fdatasync_p50_ns": pct(raw, 0.50), "fdatasync_p99_ns": pct(raw, 0.99)}); err != nil {
			return err
		}
	case "step":
		// A step with a trivial function: its result logged (request_step,
		// ack: true), acknowledged, returned; each followed by one raw
		// fdatasync probe, as in latency mode.
		sync, err := newSyncProbe(os.Getenv("ACKBENCH_SYNCDIR"))
		if err != nil {
			return err
		}
		defer sync.close()
		req, rctx := conn.StartRequest(ctx, &schema.ProcessRequest{RequestID: "bench-steps", Data: schema.RequestData{Message: "bench"}})
		trivial := func(context.Context) (any, error) { return "ok", nil }
		lat := make([]time.Duration, 0, n)
		raw := make([]time.Duration, 0, n)
		for i := range n {
			t0 := time.Now()
			if _, err := req.Step(rctx, "s"+strconv.Itoa(i), trivial); err != nil {
				return err
			}
			lat = append(lat, time.Since(t0))
			d, err := sync.once()
			if err != nil {
				return err
			}
			raw = append(raw, d)
		}
		slices.Sort(lat)
		slices.Sort(raw)
		if err := report(map[string]any{"n": n, "p50_ns": pct(lat, 0.50), "p99_ns": pct(lat, 0.99), "mean_ns": mean(lat),
			"fdatasync_p50_ns": pct(raw, 0.50), "fdatasync_p99_ns": pct(raw, 0.99)}); err != nil {
			return err
		}
	case "inflight":
		var mu sync.Mutex
		seq := uint64(0)
		var wg sync.WaitGroup
		errs := make(chan error, k)
		t0 := time.Now()
		for range k {
			wg.Go(func() {
				for {
					mu.Lock()
					if seq >= uint64(n) {
						mu.Unlock()
						return
					}
					seq++
					wait, err := conn.StartLog(schema.OpMemoryAdd, params, seq)
					mu.Unlock()
					if err == nil {
						err = wait(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(t0)
		select {
		case err := <-errs:
			return err
		default:
		}
		if err := report(map[string]any{"n": n, "k": k, "seconds": el.Seconds(), "entries_per_second": float64(n) / el.Seconds()}); err != nil {
			return err
		}
	}
	return <-runErr // until shutdown: a restarted agent must not measure again
}

// syncProbe times the machine's floor for a durable append: 1 KiB written
// into a preallocated file, then fdatasync.
type syncProbe struct {
	f   *os.File
	off int64
	buf []byte
}

const probeSize = 4 << 20

func newSyncProbe(dir string) (*syncProbe, error) {
	f, err := os.CreateTemp(dir, "fdatasync-probe-*")
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(make([]byte, probeSize), 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &syncProbe{f: f, buf: make([]byte, 1024)}, nil
}

func (p *syncProbe) once() (time.Duration, error) {
	p.buf[0]++
	t0 := time.Now()
	if _, err := p.f.WriteAt(p.buf, p.off); err != nil {
		return 0, err
	}
	if err := syscall.Fdatasync(int(p.f.Fd())); err != nil {
		return 0, err
	}
	p.off = (p.off + int64(len(p.buf))) % probeSize
	return time.Since(t0), nil
}

func (p *syncProbe) close() {
	p.f.Close()
	os.Remove(p.f.Name())
}

func pct(s []time.Duration, p float64) int64 {
	if len(s) == 0 {
		return 0
	}
	return int64(s[min(len(s)-1, int(p*float64(len(s))))])
}

func mean(s []time.Duration) int64 {
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return int64(sum) / int64(max(len(s), 1))
}

func report(v map[string]any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := os.Getenv("ACKBENCH_OUT") + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, os.Getenv("ACKBENCH_OUT"))
}
