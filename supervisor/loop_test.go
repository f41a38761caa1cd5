package supervisor

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wire"
)

// The owner loop's unit tests. They run the real loop, stores and store
// worker on a temporary data directory, with agents that are goroutines
// speaking the protocol over in-memory pipes (fakeProc), inside a
// testing/synctest bubble: time is fake, so a 5 s heartbeat timeout takes
// no time, and every timing assertion is exact.

// fakeProc is an agentproc.Proc whose agent is a goroutine of the test.
type fakeProc struct {
	pid int

	toAgentR, fromAgentR *io.PipeReader
	toAgentW, fromAgentW *io.PipeWriter

	exitOnce sync.Once
	exited   chan struct{}
	status   agentproc.ExitStatus

	mu      sync.Mutex
	signals []syscall.Signal
	// ignoreTerm: the agent does not exit on SIGTERM (only SIGKILL stops it).
	ignoreTerm bool
	// holdOutput: the agent's output stays open after it exits, as when a
	// descendant that escaped its group holds the pipe.
	holdOutput bool
}

func newFakeProc(pid int) *fakeProc {
	p := &fakeProc{pid: pid, exited: make(chan struct{})}
	p.toAgentR, p.toAgentW = io.Pipe()
	p.fromAgentR, p.fromAgentW = io.Pipe()
	return p
}

func (p *fakeProc) ID() int                 { return p.pid }
func (p *fakeProc) Exited() <-chan struct{} { return p.exited }
func (p *fakeProc) Pipes() (io.Writer, io.Reader, []io.Reader) {
	return p.toAgentW, p.fromAgentR, nil
}

// exit ends the agent with st: its output reaches EOF, its input is closed.
func (p *fakeProc) exit(st agentproc.ExitStatus) {
	p.exitOnce.Do(func() {
		p.status = st
		p.mu.Lock()
		hold := p.holdOutput
		p.mu.Unlock()
		if !hold {
			p.fromAgentW.Close()
		}
		p.toAgentR.CloseWithError(io.ErrClosedPipe)
		close(p.exited)
	})
}

func (p *fakeProc) SignalGroup(sig syscall.Signal) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	ignore := p.ignoreTerm
	p.mu.Unlock()
	if sig == syscall.SIGKILL || !ignore {
		p.exit(agentproc.ExitStatus{Known: true, Signal: sig})
	}
	return nil
}

func (p *fakeProc) StopGroup(killTimeout time.Duration) bool {
	select {
	case <-p.exited:
		return false
	default:
	}
	_ = p.SignalGroup(syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(killTimeout):
		_ = p.SignalGroup(syscall.SIGKILL)
		return true
	}
}

func (p *fakeProc) Reap() agentproc.ExitStatus { <-p.exited; return p.status }
func (p *fakeProc) CloseReaders()              { p.fromAgentR.CloseWithError(io.ErrClosedPipe) }

func (p *fakeProc) signalsSeen() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]syscall.Signal(nil), p.signals...)
}

// fakeAgent is the agent's end of a fakeProc.
type fakeAgent struct {
	*fakeProc
	codec *schema.Codec
	w     *wire.Writer
	r     *wire.Reader
	// spawned: when the supervisor started it (fake time).
	spawned time.Time
	env     []string
}

func (a *fakeAgent) send(t *testing.T, m schema.Message) {
	b, err := a.codec.Encode(m)
	if err != nil {
		t.Errorf("encode %T: %v", m, err)
		return
	}
	_ = a.w.WriteFrame(b) // fails once the agent has exited: fine
}

// serve is the select loop of an agent with its own loop: tick every d,
// and each message the supervisor sends to handle, until the agent has
// exited, its input ended, or handle reports done.
func (a *fakeAgent) serve(t *testing.T, d time.Duration, tick func(), handle func(schema.Message) (done bool)) {
	msgs := make(chan schema.Message)
	// serve may return (the agent exited, handle is done) while a message
	// is being handed over: the forwarder then drops it and ends, instead
	// of blocking on msgs for ever (synctest reports that as a deadlock).
	served := make(chan struct{})
	defer close(served)
	go func() {
		defer close(msgs)
		for m := a.recv(t); m != nil; m = a.recv(t) {
			select {
			case msgs <- m:
			case <-served:
				return
			}
		}
	}()
	ticker := time.NewTicker(d)
	defer ticker.Stop()
	for {
		select {
		case <-a.exited:
			return
		case <-ticker.C:
			tick()
		case m, ok := <-msgs:
			if !ok || handle(m) {
				return
			}
		}
	}
}

// recv returns the next message the supervisor sent, or nil at EOF.
func (a *fakeAgent) recv(t *testing.T) schema.Message {
	b, err := a.r.ReadFrame()
	if err != nil {
		return nil
	}
	m, err := a.codec.Decode(schema.ToAgent, b)
	if err != nil {
		t.Errorf("decode a frame from the supervisor: %v", err)
		return nil
	}
	return m
}

// loopHarness runs one Supervisor's owner loop with fake agents.
type loopHarness struct {
	t      *testing.T
	s      *Supervisor
	agents chan *fakeAgent // each spawn, in order
	// behave runs as each agent's goroutine.
	behave func(a *fakeAgent)
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop and the store worker have returned
	result error         // the loop's, once done is closed
}

func testConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Command = []string{"fake-agent"}
	cfg.HTTPAddr = ""
	cfg.HeartbeatTimeout = 5 * time.Second
	cfg.StartTimeout = 10 * time.Second
	cfg.KillTimeout = time.Second
	cfg.ShutdownTimeout = 3 * time.Second
	cfg.BackoffInitial = time.Second
	cfg.BackoffMax = 8 * time.Second
	cfg.HealthyReset = time.Hour
	cfg.WALSync = "none"
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cfg
}

// startLoop opens the stores and runs the store worker and the owner loop
// (what Run does, without the OS parts: the reaper, the HTTP and control
// listeners). Call inside the bubble.
func startLoop(t *testing.T, cfg Config, behave func(a *fakeAgent), before ...func(*Supervisor)) *loopHarness {
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &loopHarness{t: t, s: s, agents: make(chan *fakeAgent, 64), behave: behave, done: make(chan struct{})}
	var pid atomic.Int64
	pid.Store(1000)
	s.spawn = func(spec agentproc.Spec) (agentproc.Proc, error) {
		p := newFakeProc(int(pid.Add(1)))
		a := &fakeAgent{fakeProc: p, codec: schema.NewCodec(schema.Options{}),
			w: wire.NewWriter(p.fromAgentW, 0), r: wire.NewReader(p.toAgentR, 0), spawned: time.Now(), env: spec.Env}
		h.agents <- a
		go behave(a)
		return p, nil
	}
	if err := s.open(); err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		workerDone := make(chan struct{})
		go func() { defer close(workerDone); s.work.Run(s.storeCheckpoint) }()
		h.result = s.loop(ctx)
		close(s.inbox.loopDone)
		s.spawns.Wait()
		s.work.Stop()
		<-workerDone
		s.settleStored()
		close(h.done)
	}()
	return h
}

// next is the next spawned agent.
func (h *loopHarness) next() *fakeAgent {
	h.t.Helper()
	select {
	case a := <-h.agents:
		return a
	case <-time.After(time.Hour):
		h.t.Fatal("no agent spawned within an hour of fake time")
		return nil
	}
}

// wait is the loop's result.
func (h *loopHarness) wait() error {
	h.t.Helper()
	select {
	case <-h.done:
		return h.result
	case <-time.After(time.Hour):
		h.t.Fatal("the owner loop did not return within an hour of fake time")
		return nil
	}
}

// stop stops the loop (a graceful stop, if it still runs) and closes the
// stores: every goroutine of the bubble ends.
func (h *loopHarness) stop() {
	h.cancel()
	<-h.done
	h.s.close()
}

// heartbeatEvery sends a heartbeat at the start and every d until the
// supervisor closes the agent's input (or stop is closed), then exits 0 as
// a graceful agent would after a shutdown message.
func heartbeatEvery(t *testing.T, d time.Duration) func(a *fakeAgent) {
	return func(a *fakeAgent) {
		heartbeat := func() { a.send(t, &schema.Heartbeat{}) }
		heartbeat()
		a.serve(t, d, heartbeat, func(m schema.Message) bool {
			if _, ok := m.(*schema.Shutdown); ok {
				a.exit(agentproc.ExitStatus{Known: true})
				return true
			}
			return false
		})
	}
}

// A hung agent (it heartbeats once, then goes silent and ignores SIGTERM) is
// stopped exactly --heartbeat-timeout after its heartbeat, SIGKILLed
// --kill-timeout later, and started again after the back-off.
func TestLoopRestartsHungAgentAfterBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		h := startLoop(t, cfg, func(a *fakeAgent) {
			a.mu.Lock()
			a.ignoreTerm = true // SignalGroup reads it under mu (a spawn discarded at stop)
			a.mu.Unlock()
			a.send(t, &schema.Heartbeat{})
			for a.recv(t) != nil { // reads its input, never heartbeats again
			}
		})
		defer h.stop()
		first := h.next()
		second := h.next()
		if got := first.signalsSeen(); len(got) != 2 || got[0] != syscall.SIGTERM || got[1] != syscall.SIGKILL {
			t.Fatalf("signals to the hung agent: %v, want [SIGTERM SIGKILL]", got)
		}
		// heartbeat timeout (5s) + kill timeout (1s) + the first back-off
		// (1s, jittered into [0.5s, 1s]).
		if gap := second.spawned.Sub(first.spawned); gap < 6500*time.Millisecond || gap > 7*time.Second {
			t.Fatalf("restart %s after the first start, want 6.5s..7s (5s hung + 1s SIGTERM grace + back-off)", gap)
		}
		synctest.Wait() // the owner has published the spawn
		st := h.s.Status()
		if st.Restarts != 1 || st.LastRestartReason != "hung" || st.PID != second.pid {
			t.Fatalf("status after the restart: restarts %d reason %q pid %d; want 1, hung, %d", st.Restarts, st.LastRestartReason, st.PID, second.pid)
		}
	})
}

// An agent that heartbeats once and hangs is not healthy: the 10 s it
// spends hung and being killed (5 s heartbeat timeout + 5 s kill timeout)
// do not reset the back-off, which keeps doubling. Before, the time from
// the first heartbeat to the exit counted, and every restart waited the
// first back-off.
func TestHungAgentDoesNotResetBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.HeartbeatTimeout = 5 * time.Second
		cfg.KillTimeout = 5 * time.Second
		cfg.HealthyReset = 10 * time.Second
		cfg.BackoffInitial = time.Second
		cfg.BackoffMax = 30 * time.Second
		cfg.MaxRestarts = 0
		h := startLoop(t, cfg, func(a *fakeAgent) {
			a.mu.Lock()
			a.ignoreTerm = true // SignalGroup reads it under mu (a spawn discarded at stop)
			a.mu.Unlock()
			a.send(t, &schema.Heartbeat{})
			for a.recv(t) != nil {
			}
		})
		defer h.stop()
		var starts []time.Time
		for range 4 {
			starts = append(starts, h.next().spawned)
		}
		for i, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
			// 10 s hung and killed, then the back-off, jittered into [d/2, d].
			if gap := starts[i+1].Sub(starts[i]) - 10*time.Second; gap < d/2 || gap > d {
				t.Errorf("back-off before start %d: %s, want %s..%s (a hung agent is not a healthy run)", i+2, gap, d/2, d)
			}
		}
	})
}

// An operator's restore that arrives while a crashed agent's output is
// still being drained does not relabel the crash as the operator's: with
// --restart never the supervisor still ends with ErrAgentFailed, and the
// restore is answered as one for the next start. Before, the restore
// stopped the exited agent "for the operator", which restarted it at once,
// past --restart and the crash-loop count.
func TestRestoreDuringDrainKeepsTheCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Restart = RestartNever
		acked := make(chan string, 1)
		first := true
		h := startLoop(t, cfg, func(a *fakeAgent) {
			if !first { // a restarted agent would be healthy
				heartbeatEvery(t, time.Second)(a)
				return
			}
			first = false
			a.send(t, &schema.Heartbeat{})
			a.send(t, &schema.Checkpoint{Data: []byte{0x81, 0xa1, 'k', 0x01}})
			for m := a.recv(t); m != nil; m = a.recv(t) {
				if ack, ok := m.(*schema.CheckpointAck); ok {
					acked <- ack.CheckpointID
					break
				}
			}
			a.mu.Lock()
			a.holdOutput = true // the crash is drained for drainTimeout
			a.mu.Unlock()
			a.exit(agentproc.ExitStatus{Known: true, Code: 1})
		})
		defer h.stop()
		h.next()
		id := <-acked
		synctest.Wait() // the crash is seen; its output is being drained
		meta, err := h.s.st.Checkpoints().Stat(id)
		if err != nil {
			t.Fatal(err)
		}
		call := controlCall{req: ControlRequest{Op: OpRestore, CheckpointID: id}, reply: make(chan ControlResponse, 1), meta: meta}
		h.s.inbox.control <- call
		select {
		case <-h.done:
			if !errors.Is(h.result, ErrAgentFailed) {
				t.Fatalf("loop returned %v, want ErrAgentFailed (--restart never, the agent crashed)", h.result)
			}
		case <-time.After(time.Minute):
			st := h.s.Status()
			t.Fatalf("--restart never and the agent crashed, but a minute later the supervisor still runs: state %q, restarts %d (the crash was taken for an operator restore)", st.State, st.Restarts)
		}
		if r := <-call.reply; !r.OK || !strings.Contains(r.Message, "next starts") {
			t.Fatalf("the restore during the drain was answered %+v", r)
		}
	})
}

// An agent that exits at once every time is restarted with doubling
// back-off, then given up on after --max-restarts: Run's error wraps
// ErrCrashLoop, the state is given_up and /healthz's view is failed.
func TestLoopGivesUpOnCrashLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.MaxRestarts = 3
		cfg.RestartWindow = time.Minute
		h := startLoop(t, cfg, func(a *fakeAgent) { a.exit(agentproc.ExitStatus{Known: true, Code: 1}) })
		defer h.stop()
		var starts []time.Time
		for range 4 {
			starts = append(starts, h.next().spawned)
		}
		err := h.wait()
		if !errors.Is(err, ErrCrashLoop) {
			t.Fatalf("loop returned %v, want ErrCrashLoop", err)
		}
		// Doubling from --backoff-initial, each jittered into [d/2, d].
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
		for i, w := range want {
			if gap := starts[i+1].Sub(starts[i]); gap < w/2 || gap > w {
				t.Fatalf("back-off before start %d: %s, want %s..%s", i+2, gap, w/2, w)
			}
		}
		select {
		case a := <-h.agents:
			t.Fatalf("an agent was started after giving up (pid %d)", a.pid)
		default:
		}
		if v := h.s.current(); !v.failed || v.status.State != string(StateGivenUp) {
			t.Fatalf("after giving up: failed %v state %q", v.failed, v.status.State)
		}
	})
}

// While the stores are busy (a frozen disk: the store worker is blocked),
// the owner loop still answers the control socket: the start waits for the
// worker, the owner does not. Once the disk is back, the agent starts.
func TestLoopAnswersWhileStoresAreBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := startLoop(t, testConfig(t), heartbeatEvery(t, time.Second), func(s *Supervisor) {
			s.work.Post(func() { <-release }) // the first start's restore queues behind this
		})
		defer h.stop()
		time.Sleep(time.Minute) // a minute of frozen disk
		synctest.Wait()
		if len(h.agents) != 0 {
			t.Fatal("an agent was started before its restore could be assembled")
		}
		resp := h.control(ControlRequest{Op: OpStatus})
		if !resp.OK || resp.Status.State != string(StateStarting) {
			t.Fatalf("status while the stores are busy: %+v", resp)
		}
		if beat := time.Unix(0, h.s.loopBeat.Load()); time.Since(beat) > time.Second {
			t.Fatalf("the owner loop has not turned for %s", time.Since(beat))
		}
		close(release)
		a := h.next()
		if got := time.Since(a.spawned); got != 0 {
			t.Fatalf("spawned %s after the disk came back", got)
		}
		h.cancel()
		if err := h.wait(); err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
	})
}

// A stop asks the agent to shut down; one that ignores it (and SIGTERM) is
// SIGKILLed exactly --shutdown-timeout later, and the loop returns nil.
func TestLoopShutdownKillsAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		var shutdownAt time.Time
		got := make(chan time.Time, 1)
		h := startLoop(t, cfg, func(a *fakeAgent) {
			a.mu.Lock()
			a.ignoreTerm = true // SignalGroup reads it under mu (a spawn discarded at stop)
			a.mu.Unlock()
			a.send(t, &schema.Heartbeat{})
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			go func() {
				for m := a.recv(t); m != nil; m = a.recv(t) {
					if _, ok := m.(*schema.Shutdown); ok {
						got <- time.Now()
					}
				}
			}()
			for {
				select {
				case <-a.exited:
					return
				case <-tick.C:
					a.send(t, &schema.Heartbeat{})
				}
			}
		})
		defer h.stop()
		a := h.next()
		time.Sleep(10 * time.Second) // running and heartbeating
		stopAt := time.Now()
		h.cancel()
		shutdownAt = <-got
		if err := h.wait(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if shutdownAt != stopAt {
			t.Fatalf("shutdown message sent %s after the stop, want at once", shutdownAt.Sub(stopAt))
		}
		if took := time.Since(stopAt); took != cfg.ShutdownTimeout {
			t.Fatalf("the loop returned %s after the stop, want --shutdown-timeout (%s)", took, cfg.ShutdownTimeout)
		}
		if sig := a.signalsSeen(); len(sig) != 1 || sig[0] != syscall.SIGKILL {
			t.Fatalf("signals: %v, want [SIGKILL]", sig)
		}
		if st := h.s.Status(); st.State != string(StateStopped) {
			t.Fatalf("state after the stop: %s", st.State)
		}
	})
}

// control sends one control request through the owner loop.
func (h *loopHarness) control(req ControlRequest) ControlResponse {
	h.t.Helper()
	call := controlCall{req: req, reply: make(chan ControlResponse, 1)}
	select {
	case h.s.inbox.control <- call:
	case <-time.After(time.Second):
		h.t.Fatal("the owner loop did not take a control request within a second")
	}
	select {
	case r := <-call.reply:
		return r
	case <-time.After(time.Second):
		h.t.Fatal("the owner loop did not answer a control request within a second")
		return ControlResponse{}
	}
}

// Stopping the supervisor during an evolution trial does not hold the owner
// loop while the shadow drains (here its output stays open after SIGKILL, so
// draining it takes drainTimeout): the loop answers at once. The shadow's
// checkpoint took the primary's path — queued to the store worker, stored
// (in its scratch store, never the primary's) and acknowledged — and the
// scratch stores are gone once the supervisor has stopped.
func TestLoopStopDuringTrialDoesNotWaitForTheShadow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShadowDuration = time.Hour
		shadowAcks := make(chan *schema.CheckpointAck, 4)
		h := startLoop(t, cfg, func(a *fakeAgent) {
			shadow := slices.Contains(a.env, "SUPERVISOR_ROLE="+RoleShadow)
			if shadow {
				a.mu.Lock()
				a.holdOutput = true
				a.mu.Unlock()
			}
			heartbeat := func() { a.send(t, &schema.Heartbeat{}) }
			heartbeat()
			a.send(t, &schema.Checkpoint{Data: []byte{0x81, 0xa1, 'k', 0x01}})
			a.serve(t, time.Second, heartbeat, func(m schema.Message) bool {
				switch m := m.(type) {
				case *schema.CheckpointAck:
					if shadow {
						shadowAcks <- m
					} else {
						a.send(t, &schema.EvolutionIntent{Hypothesis: schema.Hypothesis{Reason: "faster", Target: "planner", NewCode: "pass"}})
					}
				case *schema.Shutdown:
					time.Sleep(1500 * time.Millisecond) // a graceful agent's last checkpoint
					a.exit(agentproc.ExitStatus{Known: true})
					return true
				}
				return false
			})
		})
		defer h.stop()
		h.next() // the primary
		shadow := h.next()
		var ack *schema.CheckpointAck
		select {
		case ack = <-shadowAcks:
		case <-time.After(time.Minute):
			t.Fatal("the shadow's checkpoint was not acknowledged")
		}
		primaryCkpts, err := h.s.st.Checkpoints().List()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range primaryCkpts {
			if m.ID == ack.CheckpointID {
				t.Fatalf("the shadow's checkpoint %s is in the primary's store", m.ID)
			}
		}
		if len(primaryCkpts) != 1 {
			t.Fatalf("the primary's store holds %d checkpoints, want the primary's one", len(primaryCkpts))
		}

		h.cancel()
		// The owner takes the stop before the status call: both are ready
		// to its select at once otherwise, and it may pick either.
		synctest.Wait()
		resp := h.control(ControlRequest{Op: OpStatus}) // fails unless taken within a second
		if !resp.OK || resp.Status.State != string(StateStopping) {
			t.Fatalf("status while stopping during a trial: %+v", resp)
		}
		if err := h.wait(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if sig := shadow.signalsSeen(); !slices.Contains(sig, syscall.SIGKILL) {
			t.Fatalf("signals to the shadow: %v, want SIGKILL among them", sig)
		}
		left, err := os.ReadDir(filepath.Join(cfg.DataDir, "shadow"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Fatalf("scratch stores left behind after the stop: %v", left)
		}
	})
}

// A promotion whose ledger write finishes after the owner loop has returned
// (the supervisor was stopped while the disk was slow) is still recorded in
// the audit log: the ledger holds it, and the operator must be able to see
// why the next run's agent gets new code.
func TestLoopPromotionAnsweredAfterStopIsAudited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShadowDuration = 10 * time.Second
		h := startLoop(t, cfg, func(a *fakeAgent) {
			latency := 100.0
			if slices.Contains(a.env, "SUPERVISOR_ROLE="+RoleShadow) {
				latency = 50 // the evolution is twice as fast
			} else {
				a.send(t, &schema.Checkpoint{Data: []byte{0x81, 0xa1, 'k', 0x01}})
			}
			report := func() {
				a.send(t, &schema.Heartbeat{})
				a.send(t, &schema.Metrics{Data: map[string]float64{schema.MetricAvgLatency: latency,
					schema.MetricErrorRate: 0, schema.MetricMemoryUsage: 1 << 20}})
			}
			report()
			a.serve(t, time.Second, report, func(m schema.Message) bool {
				switch m.(type) {
				case *schema.CheckpointAck:
					a.send(t, &schema.EvolutionIntent{Hypothesis: schema.Hypothesis{Reason: "faster", Target: "planner", NewCode: "pass"}})
				case *schema.Shutdown:
					a.exit(agentproc.ExitStatus{Known: true})
					return true
				}
				return false
			})
		})
		defer h.stop()
		h.next()
		h.next() // the shadow: the trial runs
		time.Sleep(9 * time.Second)
		release := make(chan struct{})
		h.s.work.Post(func() { <-release }) // the disk stalls before the decision's ledger write
		time.Sleep(2 * time.Second)         // the trial is decided; its promotion waits for the ledger
		h.cancel()
		<-h.s.inbox.loopDone // the loop returned before the ledger write finished
		close(release)
		if err := h.wait(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if got := h.s.ledger.Since(time.Time{}); len(got) != 1 || got[0].Module != "planner" {
			t.Fatalf("ledger after the stop: %+v, want the planner promotion", got)
		}
		h.s.rec.AuditLog().Sync()
		f, err := os.Open(filepath.Join(cfg.DataDir, "audit.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var decisions []observe.AuditRecord
		if _, err := observe.ReadAudit(f, time.Time{}, func(r observe.AuditRecord) error {
			if r.Kind == observe.AuditEvolution {
				decisions = append(decisions, r)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(decisions) != 1 || decisions[0].Fields["decision"] != evolution.DecisionPromoted {
			t.Fatalf("evolution decisions in the audit log: %+v, want one promoted", decisions)
		}
	})
}

// Starting the agent does not hold the owner loop: while fork/exec waits
// (the agent's binary on a hung filesystem), the loop answers the control
// socket; a stop meanwhile returns at once, and the process that comes up
// after it is killed, never left running.
func TestLoopSpawnDoesNotHoldTheOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := startLoop(t, testConfig(t), heartbeatEvery(t, time.Second), func(s *Supervisor) {
			spawn := s.spawn
			s.spawn = func(spec agentproc.Spec) (agentproc.Proc, error) {
				<-release // exec is stuck on the binary's filesystem
				return spawn(spec)
			}
		})
		defer h.stop()
		time.Sleep(time.Minute)
		synctest.Wait()
		resp := h.control(ControlRequest{Op: OpStatus})
		if !resp.OK || resp.Status.State != string(StateStarting) || resp.Status.PID != 0 {
			t.Fatalf("status while the agent is being spawned: %+v", resp)
		}
		stopAt := time.Now()
		h.cancel()
		if err := h.waitLoop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if took := time.Since(stopAt); took != 0 {
			t.Fatalf("the loop returned %s after the stop, want at once", took)
		}
		close(release)
		a := h.next()
		if err := h.wait(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if sig := a.signalsSeen(); len(sig) != 1 || sig[0] != syscall.SIGKILL {
			t.Fatalf("signals to the agent spawned after the stop: %v, want [SIGKILL]", sig)
		}
		if st := h.s.Status(); st.State != string(StateStopped) || st.PID != 0 {
			t.Fatalf("status after the stop: %s pid %d", st.State, st.PID)
		}
	})
}

// waitLoop waits until the owner loop has returned (the harness may still
// be finishing: spawns out, the store worker's queue).
func (h *loopHarness) waitLoop() error {
	h.t.Helper()
	select {
	case <-h.s.inbox.loopDone:
		return h.result
	case <-time.After(time.Hour):
		h.t.Fatal("the owner loop did not return within an hour of fake time")
		return nil
	}
}
