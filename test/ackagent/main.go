// Command ackagent is the agent of the durability benchmarks in test/: a Go
// agent (package agent) that measures wal_ack round trips from its side, or
// answers requests at once. Its mode and figures travel through the
// environment and a JSON file:
//
//	ACKBENCH_MODE=latency  ACKBENCH_N=n                 n Logs one after another
//	ACKBENCH_MODE=inflight ACKBENCH_N=n ACKBENCH_K=k    n Logs, k in flight at a time
//	ACKBENCH_MODE=step     ACKBENCH_N=n                 n steps of one request one after another
//	ACKBENCH_MODE=serve                                 answer every request at once
//	ACKBENCH_MODE=echo                                  (not under a supervisor) echo 64-byte messages
//	ACKBENCH_MODE=raw      ACKBENCH_N=n                 latency mode without the client package
//	                       ACKBENCH_POLL=1              ... reading through Go's poller
//	                       ACKBENCH_HANDOFF=1           ... its wal_acks read on a second goroutine
//	ACKBENCH_OUT=FILE                                   where the figures go
//
// In latency mode it also times, after each round trip, the same exchange
// with an ideal supervisor: a child process of its own (ACKBENCH_IDEAL=1)
// that reads 1 KiB from a pipe, writes it into a preallocated file with
// fdatasync on the same thread, and answers 16 bytes on another pipe. That
// is the floor of a wal_ack round trip on this machine: two pipe hops, the
// wake-ups of two processes that went idle during the fsync, and the fsync.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	if os.Getenv("ACKBENCH_IDEAL") == "1" {
		if err := idealSupervisor(); err != nil {
			fmt.Fprintln(os.Stderr, "ackagent (ideal supervisor):", err)
			os.Exit(1)
		}
		return
	}
	if os.Getenv("ACKBENCH_MODE") == "echo" {
		// The pipe wake-up floor (BenchmarkPipeWakeFloor): answer every
		// 64 bytes read from stdin with the same bytes on stdout.
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(os.Stdin, buf); err != nil {
				return
			}
			if _, err := os.Stdout.Write(buf); err != nil {
				return
			}
		}
	}
	if os.Getenv("ACKBENCH_MODE") == "raw" {
		n, _ := strconv.Atoi(os.Getenv("ACKBENCH_N"))
		if err := rawLatency(n, os.Getenv("ACKBENCH_POLL") == "1", os.Getenv("ACKBENCH_HANDOFF") == "1"); err != nil {
			fmt.Fprintln(os.Stderr, "ackagent (raw):", err)
			os.Exit(1)
		}
		return
	}
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
		if err := timeRoundTrips(n, func(seq uint64) error {
			return conn.Log(ctx, schema.OpMemoryAdd, params, seq)
		}); err != nil {
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

// timeRoundTrips times n round trips (seq 1..n), each followed by one raw
// fdatasync of 1 KiB in ACKBENCH_SYNCDIR (the data directory's filesystem,
// so both are measured under the same disk conditions) and by the same
// exchange with the ideal supervisor, and reports the three.
func timeRoundTrips(n int, roundTrip func(seq uint64) error) error {
	sync, err := newSyncProbe(os.Getenv("ACKBENCH_SYNCDIR"))
	if err != nil {
		return err
	}
	defer sync.close()
	ideal, err := startIdeal(os.Getenv("ACKBENCH_SYNCDIR"))
	if err != nil {
		return err
	}
	defer ideal.close()
	lat := make([]time.Duration, 0, n)
	raw := make([]time.Duration, 0, n)
	best := make([]time.Duration, 0, n)
	for seq := uint64(1); seq <= uint64(n); seq++ {
		t0 := time.Now()
		if err := roundTrip(seq); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
		d, err := sync.once()
		if err != nil {
			return err
		}
		raw = append(raw, d)
		if d, err = ideal.once(); err != nil {
			return err
		}
		best = append(best, d)
	}
	if path := os.Getenv("ACKBENCH_SAMPLES"); path != "" {
		if err := writeSamples(path, lat, raw, best); err != nil {
			return err
		}
	}
	slices.Sort(lat)
	slices.Sort(raw)
	slices.Sort(best)
	return report(map[string]any{"n": n, "p50_ns": pct(lat, 0.50), "p99_ns": pct(lat, 0.99), "mean_ns": mean(lat),
		"fdatasync_p50_ns": pct(raw, 0.50), "fdatasync_p99_ns": pct(raw, 0.99),
		"ideal_p50_ns": pct(best, 0.50), "ideal_p99_ns": pct(best, 0.99)})
}

// writeSamples writes the round trips in the order they were timed, one
// line each (ACKBENCH_SAMPLES): round trip, fdatasync probe and ideal, in
// nanoseconds — to see when the slow ones came, not only how many.
func writeSamples(path string, lat, raw, best []time.Duration) error {
	var b strings.Builder
	b.WriteString("round_trip_ns,fdatasync_ns,ideal_ns\n")
	for i := range lat {
		fmt.Fprintf(&b, "%d,%d,%d\n", lat[i].Nanoseconds(), raw[i].Nanoseconds(), best[i].Nanoseconds())
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing the samples: %w", err)
	}
	return nil
}

// ideal is the ideal supervisor child (see the package comment).
type ideal struct {
	cmd  *exec.Cmd
	w    *os.File // to the child
	r    *os.File // from the child
	req  []byte
	resp []byte
}

func startIdeal(dir string) (*ideal, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	toR, toW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	fromR, fromW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "ACKBENCH_IDEAL=1", "ACKBENCH_SYNCDIR="+dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = toR, fromW, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	toR.Close()
	fromW.Close()
	return &ideal{cmd: cmd, w: toW, r: fromR, req: make([]byte, 1024), resp: make([]byte, 16)}, nil
}

func (p *ideal) once() (time.Duration, error) {
	p.req[0]++
	t0 := time.Now()
	if _, err := p.w.Write(p.req); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(p.r, p.resp); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func (p *ideal) close() {
	p.w.Close()
	p.cmd.Wait()
	p.r.Close()
}

// idealSupervisor serves the ideal exchange on stdin/stdout, both put in
// non-blocking mode as the supervisor's pipes are (Go's poller serves them).
func idealSupervisor() error {
	for _, fd := range []int{0, 1} {
		if err := syscall.SetNonblock(fd, true); err != nil {
			return err
		}
	}
	in, out := os.NewFile(0, "stdin"), os.NewFile(1, "stdout")
	probe, err := newSyncProbe(os.Getenv("ACKBENCH_SYNCDIR"))
	if err != nil {
		return err
	}
	defer probe.close()
	req, resp := make([]byte, 1024), make([]byte, 16)
	for {
		if _, err := io.ReadFull(in, req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		copy(probe.buf, req)
		if _, err := probe.once(); err != nil {
			return err
		}
		if _, err := out.Write(resp); err != nil {
			return err
		}
	}
}

// rawLatency is latency mode without the client package, as issue 31
// measured it: the agent's own frames, written and read on one goroutine
// through one reused 1 MiB buffer, so the round trip is the supervisor's
// alone. With handoff, a second goroutine reads the frames and hands each
// wal_ack over a channel, as the client's reader goroutine does: the
// difference is the cost of that one wake-up.
func rawLatency(n int, poll, handoff bool) error {
	in, out := os.Stdin, os.Stdout // blocking: the reading thread sleeps in read(2)
	if poll {
		// Through Go's poller (a non-blocking descriptor), as the client
		// reads: a goroutine blocked in read(2) holds its P until sysmon
		// takes it back, and a hand-off from it waits for that.
		if err := syscall.SetNonblock(0, true); err != nil {
			return err
		}
		in = os.NewFile(0, "stdin")
	}
	var wmu sync.Mutex
	write := func(m schema.Message) error {
		p, err := schema.Encode(m)
		if err != nil {
			return err
		}
		wmu.Lock()
		defer wmu.Unlock()
		_, err = out.Write(append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(p)), uint32(len(p))), p...))
		return err
	}
	if err := write(&schema.Heartbeat{}); err != nil {
		return err
	}
	go func() {
		for range time.Tick(time.Second) {
			if write(&schema.Heartbeat{}) != nil {
				return
			}
		}
	}()
	buf := make([]byte, 1<<20)
	// nextAck reads frames until a wal_ack (a restore or a request is
	// read and passed over).
	nextAck := func() error {
		for {
			if _, err := io.ReadFull(in, buf[:4]); err != nil {
				return err
			}
			size := int(binary.BigEndian.Uint32(buf[:4]))
			if size > len(buf) {
				if _, err := io.CopyN(io.Discard, in, int64(size)); err != nil {
					return err
				}
				continue
			}
			if _, err := io.ReadFull(in, buf[:size]); err != nil {
				return err
			}
			m, err := schema.Decode(schema.ToAgent, buf[:size])
			switch {
			case err != nil:
			case m.MessageType() == schema.TypeWALAck:
				return nil
			case m.MessageType() == schema.TypeShutdown:
				return errShutdown
			}
		}
	}
	var acks chan error
	if handoff {
		acks = make(chan error, 1)
		go func() {
			for {
				err := nextAck()
				acks <- err
				if err != nil {
					return
				}
			}
		}()
	}
	params, err := schema.MarshalMap(map[string]any{"content": strings.Repeat("x", 1000)})
	if err != nil {
		return err
	}
	err = timeRoundTrips(n, func(seq uint64) error {
		m := &schema.WALEntry{Entry: schema.WALRecord{Operation: schema.OpMemoryAdd, Sequence: seq, Params: params}, Ack: true}
		if err := write(m); err != nil {
			return err
		}
		if handoff {
			return <-acks
		}
		return nextAck()
	})
	// Until the supervisor says shutdown (or closes our input).
	for err == nil {
		if handoff {
			err = <-acks
		} else {
			err = nextAck()
		}
	}
	if errors.Is(err, errShutdown) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

var errShutdown = errors.New("shutdown")
