// Command powerlossagent is the agent of the power-loss tests in test/
// (powerloss_test.go): a Go agent (package agent) that logs entries with
// wal_ack, checkpoints often, and writes what it was told — the restore it
// started from, every acknowledged sequence, every refusal, every
// checkpoint sent and acknowledged — to a record file the test keeps off the
// crashing disk. Its state is the set of sequences acknowledged to it (a
// checkpoint holds that set as ranges), so the test can compare each
// restore with what was acknowledged before it.
//
// It logs bursts of PL_INFLIGHT entries in flight at once, waits for all of
// them, and checkpoints every PL_CHECKPOINT_EVERY. An entry answered with an
// error (WAL_FAILED, WAL_FULL) is left out of the state, as the protocol
// says; the agent then checkpoints (trying again while the supervisor
// answers CHECKPOINT_FAILED) and logs the same entry again, byte for byte —
// what a careful agent does, and what exposes a log that kept an entry it
// reported failed.
//
// Environment:
//
//	PL_RECORD            the record file (JSON lines, appended)
//	PL_INFLIGHT          entries in flight per burst (default 8)
//	PL_ENTRY_SIZE        bytes of padding per entry (default 200)
//	PL_CHECKPOINT_EVERY  time between checkpoints (default 150ms)
//	PL_CHECKPOINT_PAD    bytes of padding per checkpoint (default 12000)
//	PL_PAUSE             pause between bursts (default 5ms)
//	PL_EVOLVE_EVERY      with a duration, the primary proposes an evolution
//	                     that often (the supervisor pins a backup and runs a
//	                     shadow); a shadow (SUPERVISOR_ROLE=shadow) only
//	                     heartbeats and records nothing
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, agent.ErrShutdown) && !errors.Is(err, agent.ErrSupervisorGone) &&
		!errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "powerlossagent:", err)
		os.Exit(1)
	}
}

// params is an entry's params: a struct, so the same sequence always
// encodes to the same bytes (a retry is a replay).
type params struct {
	Seq uint64 `msgpack:"seq"`
	Pad string `msgpack:"pad"`
}

// snapshot is the checkpoint's data.
type snapshot struct {
	Ranges [][2]uint64 `msgpack:"ranges"`
	Pad    string      `msgpack:"pad"`
}

// recorder appends events to the record file, one line per write.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func (r *recorder) rec(ev map[string]any) {
	ev["pid"] = os.Getpid()
	ev["t"] = time.Now().UnixNano()
	b, _ := json.Marshal(ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "powerlossagent: record:", err)
		os.Exit(3)
	}
}

// set is a set of sequences.
type set map[uint64]bool

// ranges renders s as sorted [lo, hi] runs.
func (s set) ranges() [][2]uint64 {
	seqs := make([]uint64, 0, len(s))
	for q := range s {
		seqs = append(seqs, q)
	}
	slices.Sort(seqs)
	return runs(seqs)
}

func runs(seqs []uint64) [][2]uint64 {
	var out [][2]uint64
	for _, q := range seqs {
		if n := len(out); n > 0 && out[n-1][1]+1 == q {
			out[n-1][1] = q
		} else {
			out = append(out, [2]uint64{q, q})
		}
	}
	return out
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

type cpResult struct {
	id  string
	err error
}

func run() error {
	if os.Getenv("SUPERVISOR_ROLE") == "shadow" {
		return shadow()
	}
	f, err := os.OpenFile(os.Getenv("PL_RECORD"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	r := &recorder{f: f}
	conn, err := agent.Connect(agent.Options{})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go conn.Heartbeats(ctx, 300*time.Millisecond)

	state := set{}
	var last uint64
	start := map[string]any{"e": "start"}
	if conn.Config().RestorePending {
		m, err := conn.Receive(ctx)
		if err != nil {
			return err
		}
		rs, ok := m.(*schema.Restore)
		if !ok {
			return fmt.Errorf("first message %s, want restore", m.MessageType())
		}
		var snap snapshot
		if rs.CheckpointID != "" {
			if err := msgpack.Unmarshal(rs.Snapshot, &snap); err != nil {
				return fmt.Errorf("restore snapshot: %w", err)
			}
			for _, rg := range snap.Ranges {
				for q := rg[0]; q <= rg[1]; q++ {
					state[q] = true
				}
			}
		}
		var wal []uint64
		for _, raw := range rs.WALEntries {
			var e struct {
				Sequence uint64 `msgpack:"sequence"`
			}
			if err := msgpack.Unmarshal(raw, &e); err != nil {
				return fmt.Errorf("restore WAL entry: %w", err)
			}
			wal = append(wal, e.Sequence)
			state[e.Sequence] = true
		}
		last = rs.LastSequence
		start["restore"] = map[string]any{"cp": rs.CheckpointID, "snap": snap.Ranges, "wal": runs(wal),
			"ordered": slices.IsSorted(wal), "last": rs.LastSequence}
	}
	r.rec(start)

	cps := make(chan cpResult, 4)
	workDone := make(chan error, 1)
	wctx, stopWork := context.WithCancel(ctx)
	go func() { workDone <- work(wctx, conn, r, state, last, cps) }()
	if every := envDur("PL_EVOLVE_EVERY", 0); every > 0 {
		go func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
					_ = conn.SendEvolutionIntent(schema.Hypothesis{Reason: "power-loss test", Target: "planner", NewCode: "pass"})
				}
			}
		}()
	}
	err = conn.Run(ctx, agent.Handlers{
		CheckpointAck: func(m *schema.CheckpointAck) { cps <- cpResult{id: m.CheckpointID} },
		Error: func(m *schema.Error) {
			if m.Error.Code == schema.CodeCheckpointFailed {
				cps <- cpResult{err: fmt.Errorf("%s: %s", m.Error.Code, m.Error.Message)}
			}
		},
		Shutdown: func(*schema.Shutdown) { stopWork(); <-workDone },
	})
	stopWork()
	return err
}

// work logs and checkpoints until ctx ends or the connection does.
func work(ctx context.Context, conn *agent.Conn, r *recorder, state set, last uint64, cps <-chan cpResult) error {
	inflight := envInt("PL_INFLIGHT", 8)
	pad := strings.Repeat("e", envInt("PL_ENTRY_SIZE", 200))
	every := envDur("PL_CHECKPOINT_EVERY", 150*time.Millisecond)
	pause := envDur("PL_PAUSE", 5*time.Millisecond)
	cpPad := make([]byte, envInt("PL_CHECKPOINT_PAD", 12000)/2)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	next := last + 1
	lastCP := time.Now()
	cpN := 0
	checkpoint := func() (bool, error) {
		for i := range cpPad {
			cpPad[i] = byte(rng.Uint32())
		}
		rg := state.ranges()
		cpN++
		r.rec(map[string]any{"e": "cp_sent", "n": cpN, "state": rg})
		if err := conn.SendCheckpoint(snapshot{Ranges: rg, Pad: fmt.Sprintf("%x", cpPad)}); err != nil {
			return false, err
		}
		lastCP = time.Now()
		select {
		case res := <-cps:
			if res.err != nil {
				r.rec(map[string]any{"e": "cp_fail", "n": cpN, "err": res.err.Error()})
				return false, nil
			}
			r.rec(map[string]any{"e": "cp_ack", "n": cpN, "id": res.id, "state": rg})
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(60 * time.Second):
			r.rec(map[string]any{"e": "cp_timeout", "n": cpN})
			return false, nil
		}
	}
	// logged waits for one entry's answer: acknowledged (into the state),
	// refused (returned in failed), or the end of the connection.
	logged := func(seq uint64, wait func(context.Context) error, retry bool, failed *[]uint64) error {
		err := wait(ctx)
		switch {
		case err == nil:
			state[seq] = true
			r.rec(map[string]any{"e": "ack", "s": seq, "retry": retry})
		case errors.Is(err, agent.ErrNotDurable):
			r.rec(map[string]any{"e": "fail", "s": seq, "err": err.Error(), "retry": retry})
			if failed != nil {
				*failed = append(*failed, seq)
			}
		default:
			return err
		}
		return nil
	}
	for ctx.Err() == nil {
		type pending struct {
			seq  uint64
			wait func(context.Context) error
		}
		var ps []pending
		for range inflight {
			wait, err := conn.StartLog(schema.OpMemoryAdd, params{Seq: next, Pad: pad}, next)
			if err != nil {
				return err
			}
			ps = append(ps, pending{next, wait})
			next++
		}
		var failed []uint64
		for _, p := range ps {
			if err := logged(p.seq, p.wait, false, &failed); err != nil {
				return err
			}
		}
		if len(failed) > 0 {
			// Told not to act on them: checkpoint without them (once the
			// supervisor stores checkpoints again), then log them again.
			for try := 0; try < 50; try++ {
				ok, err := checkpoint()
				if err != nil {
					return err
				}
				if ok {
					break
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		} else if time.Since(lastCP) >= every {
			if _, err := checkpoint(); err != nil {
				return err
			}
		}
		for _, seq := range failed {
			// Recorded before it is sent: from here the entry may be in the
			// log again (appended, and the power cut before its ack).
			r.rec(map[string]any{"e": "resend", "s": seq})
			wait, err := conn.StartLog(schema.OpMemoryAdd, params{Seq: seq, Pad: pad}, seq)
			if err != nil {
				return err
			}
			if err := logged(seq, wait, true, nil); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	return ctx.Err()
}

// shadow is an evolution trial's shadow: it heartbeats and answers nothing
// until the supervisor stops it; it records nothing (the record is the
// primary's).
func shadow() error {
	conn, err := agent.Connect(agent.Options{})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go conn.Heartbeats(ctx, 300*time.Millisecond)
	return conn.Run(ctx, agent.Handlers{})
}
