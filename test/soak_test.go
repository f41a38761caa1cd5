package test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestRestoreInvariantSoak is a kill loop that mixes crash loops, agent and
// supervisor kill -9s and checkpoints, and checks after every restart that
// the restore is an acknowledged checkpoint plus every WAL entry after it:
// a gap-free run 1..k that holds everything an acknowledged checkpoint
// covered, everything the agent wrote before dying while the supervisor
// lived, and nothing the agent never sent. SOAK=N runs N epochs (default 6
// in CI); each epoch is one supervisor run of several incarnations, ended by
// kill -9 of the supervisor or by SIGTERM.
func TestRestoreInvariantSoak(t *testing.T) {
	epochs := 6
	if v, err := strconv.Atoi(os.Getenv("SOAK")); err == nil && v > 0 {
		epochs = v
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d, %d epochs", seed, epochs)
	dir := filepath.Join(t.TempDir(), "data")
	flags := append(slices.Clone(fastFlags), "--max-restarts", "0", "--checkpoint-retain", "2",
		"--wal-segment-size", "65536", "--heartbeat-timeout", "3s")
	var (
		floor      uint64 // every restore from now on must reach at least this
		restarts   int
		agentKills int
		supKills   int
		// earlyEpochs ran with --spawn-during-recovery.
		earlyEpochs int
	)
	var report string
	keep := func() {
		if d := os.Getenv("SOAK_KEEP"); d != "" && t.Failed() {
			_ = exec.Command("cp", "-a", dir, report, d).Run()
		}
	}
	t.Cleanup(keep)
	check := func(s *sup, e ev, what string) uint64 {
		t.Helper()
		st := restored(t, e).state()
		if len(st) > 0 && (st[0] != 1 || st[len(st)-1] != uint64(len(st))) {
			t.Fatalf("%s: restore has a gap: %s", what, summary(st))
		}
		k := uint64(len(st))
		if k < floor {
			t.Fatalf("%s: restore reaches %d, but %d was acknowledged or written with the supervisor alive: %s", what, k, floor, summary(st))
		}
		return k
	}
	for epoch := range epochs {
		// Incarnation plans: log, maybe checkpoint, log, then crash, stay (to
		// be killed -9), or crash at once (a crash loop).
		var plans []plan
		for range 8 {
			switch rng.IntN(4) {
			case 0:
				plans = append(plans, plan{{"crash": 3}})
			default:
				p := plan{{"log": 20 + rng.IntN(200), "size": 300, "rate": 3000}}
				if rng.IntN(2) == 0 {
					p = append(p, map[string]any{"checkpoint": true})
				}
				p = append(p, map[string]any{"log": rng.IntN(150), "size": 300, "rate": 3000})
				if rng.IntN(2) == 0 {
					p = append(p, map[string]any{"crash": 1})
				} else {
					p = append(p, map[string]any{"stay": true})
				}
				plans = append(plans, p)
			}
		}
		report = filepath.Join(t.TempDir(), "report.jsonl")
		// Half the epochs start their first agent during recovery.
		epochFlags := flags
		if rng.IntN(2) == 0 {
			epochFlags = append(slices.Clone(flags), "--spawn-during-recovery")
			earlyEpochs++
		}
		o := scripted(t, dir, epochFlags, []string{"AGENT_REPORT=" + report, "AGENT_NO_FINAL_CHECKPOINT=1"}, plans...)
		o.keepAlive = true
		s := startSup(t, o)
		seen := 0
		deadline := time.Now().Add(60 * time.Second)
		for seen < len(plans) && time.Now().Before(deadline) {
			// One snapshot of the report: every start in it is checked
			// before a kill decision raises the floor with what that very
			// incarnation wrote.
			events := s.allEvents()
			var starts []ev
			for _, e := range events {
				if e.str("event") == "start" {
					starts = append(starts, e)
				}
			}
			for ; seen < len(starts); seen++ {
				k := check(s, starts[seen], fmt.Sprintf("epoch %d start %d", epoch, seen))
				floor = max(floor, k)
				if seen > 0 {
					restarts++
				}
			}
			if len(events) == 0 {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			last := events[len(events)-1]
			if last.str("event") == "staying" || (last.str("event") == "sent" && rng.IntN(40) == 0) {
				pid := last.int("pid")
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					agentKills++
				}
				// The supervisor lives: everything the agent reported
				// writing before its death must come back.
				floor = max(floor, maxWritten(events, pid))
				waitFor(t, 30*time.Second, "the next start", func() bool { return len(s.eventsOf("start")) > seen })
				continue
			}
			time.Sleep(10 * time.Millisecond)
		}
		events := s.allEvents()
		floor = max(floor, maxAcked(events))
		if rng.IntN(2) == 0 {
			s.signal(syscall.SIGKILL)
			supKills++
			s.wait(30 * time.Second)
		} else {
			s.signal(syscall.SIGTERM)
			if code := s.wait(30 * time.Second); code != 0 {
				t.Fatalf("epoch %d: exit %d", epoch, code)
			}
			// A clean stop syncs the WAL: everything written by the
			// agents that exited is there.
			floor = max(floor, maxWrittenExited(events))
		}
	}
	t.Logf("%d epochs (%d with --spawn-during-recovery), %d restarts checked, %d agent kill -9s, %d supervisor kill -9s: every restore was gap-free and complete",
		epochs, earlyEpochs, restarts, agentKills, supKills)
}

// maxWritten is the highest sequence pid reported sending.
func maxWritten(events []ev, pid int) uint64 {
	var m uint64
	for _, e := range events {
		if e.str("event") == "sent" && e.int("pid") == pid {
			for _, v := range e["seqs"].([]any) {
				m = max(m, uint64(v.(float64)))
			}
		}
	}
	return m
}

// maxWrittenExited is the highest sequence sent by any incarnation.
func maxWrittenExited(events []ev) uint64 {
	var m uint64
	for _, e := range events {
		if e.str("event") == "sent" {
			for _, v := range e["seqs"].([]any) {
				m = max(m, uint64(v.(float64)))
			}
		}
	}
	return m
}

// maxAcked is the highest sequence an acknowledged checkpoint covers.
func maxAcked(events []ev) uint64 {
	var m uint64
	for _, e := range events {
		if e.str("event") == "ack" {
			m = max(m, uint64(e.num("covers")))
		}
	}
	return m
}
