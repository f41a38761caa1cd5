package test

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// incarnations splits the agent's events by its "start" events.
func incarnations(evs []ev) [][]ev {
	var out [][]ev
	for _, e := range evs {
		if e.str("event") == "start" {
			out = append(out, nil)
		}
		if len(out) > 0 {
			out[len(out)-1] = append(out[len(out)-1], e)
		}
	}
	return out
}

// chainAt finds the chain the agent logged when it applied seq, searching all
// incarnations before index upTo.
func chainAt(incs [][]ev, upTo int, seq int) (string, bool) {
	for i := upTo - 1; i >= 0; i-- {
		for j := len(incs[i]) - 1; j >= 0; j-- {
			e := incs[i][j]
			if e.str("event") == "applied" && e.int("seq") == seq {
				return e.str("chain"), true
			}
			if e.str("event") == "restored" && e.int("last_seq") == seq {
				return e.str("chain"), true
			}
		}
	}
	return "", false
}

// digestOfCheckpoint finds the state digest the agent logged for a checkpoint
// acknowledged with id.
func digestOfCheckpoint(evs []ev, id string) (string, bool) {
	for _, e := range evs {
		if e.str("event") == "checkpoint_acked" && e.str("checkpoint_id") == id {
			return e.str("state_digest"), true
		}
	}
	return "", false
}

func lastOf(evs []ev, kind string) (ev, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].str("event") == kind {
			return evs[i], true
		}
	}
	return nil, false
}

// verifyRestore checks incarnation i's restore against the history before it:
// nothing the previous incarnation applied is missing, the snapshot is exactly
// a checkpoint the agent had sent, and the replayed chain equals the chain
// the agent had at that sequence.
func verifyRestore(t *testing.T, all []ev, incs [][]ev, i int) (exactChain bool) {
	t.Helper()
	r, ok := lastOf(incs[i], "restored")
	if !ok {
		t.Fatalf("incarnation %d got no restore", i)
	}
	prevApplied := 0
	for j := i - 1; j >= 0 && prevApplied == 0; j-- {
		if a, ok := lastOf(incs[j], "applied"); ok {
			prevApplied = a.int("seq")
		}
		if rr, ok := lastOf(incs[j], "restored"); ok && rr.int("last_seq") > prevApplied {
			prevApplied = rr.int("last_seq")
		}
	}
	got := r.int("last_seq")
	// Entries are logged before they are applied: the restore holds everything
	// applied, and at most the one entry sent but not yet applied at the kill.
	if got != prevApplied && got != prevApplied+1 {
		t.Fatalf("incarnation %d restored up to seq %d, but the previous one had applied up to %d", i, got, prevApplied)
	}
	if id := r.str("checkpoint_id"); id != "" {
		if want, ok := digestOfCheckpoint(all, id); ok && r.str("snapshot_digest") != want {
			t.Fatalf("incarnation %d: snapshot of %s has digest %s, the agent checkpointed %s", i, id, r.str("snapshot_digest"), want)
		}
	}
	if want, ok := chainAt(incs, i, got); ok {
		if r.str("chain") != want {
			t.Fatalf("incarnation %d: chain after restore to seq %d is %s, the agent had %s", i, got, r.str("chain"), want)
		}
		return true
	}
	return false
}

func TestKill9AgentRestoreIsExact(t *testing.T) {
	iterations := 100
	if v := os.Getenv("KILL_ITERATIONS"); v != "" {
		iterations, _ = strconv.Atoi(v)
	} else if os.Getenv("SOAK") != "" {
		iterations = 1000
	}
	s := startSup(t, supOpts{
		flags: []string{"--backoff-initial", "5ms", "--backoff-max", "20ms", "--max-restarts", "0", "--checkpoint-retain", "3"},
		agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "2000", "--checkpoint-every", "31", "--entry-size", "256"},
	})
	s.waitEvents("applied", 50, 30*time.Second)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for k := 0; k < iterations; k++ {
		starts := s.eventsOf("start")
		pid := starts[len(starts)-1].int("pid")
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: %v", pid, err)
		}
		s.waitEvents("restored", k+1, 30*time.Second)
	}
	all := s.allEvents()
	incs := incarnations(all)
	exact := 0
	for i := 1; i < len(incs); i++ {
		if _, ok := lastOf(incs[i], "restored"); !ok {
			continue
		}
		if verifyRestore(t, all, incs, i) {
			exact++
		}
	}
	acked := len(s.eventsOf("checkpoint_acked"))
	t.Logf("%d kill -9s; %d restores verified chain-exact, the rest held one sent-but-unapplied entry; %d checkpoints acknowledged", iterations, exact, acked)
	if acked == 0 {
		t.Fatal("no checkpoint was acknowledged during the run")
	}
}

func TestSupervisorRestartRestoresAgent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	agent := []string{"--heartbeat-interval", "50ms", "--wal-rate", "500", "--checkpoint-every", "40"}
	s1 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: agent})
	s1.waitEvents("checkpoint_acked", 2, 30*time.Second)
	s1.signal(syscall.SIGTERM)
	if code := s1.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	before := s1.allEvents()
	last, _ := lastOf(before, "applied")
	finalAck, _ := lastOf(before, "checkpoint_acked")

	s2 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	r := s2.waitEvents("restored", 1, 30*time.Second)[0]
	if r.str("checkpoint_id") != finalAck.str("checkpoint_id") {
		t.Fatalf("restored from %s, want the final checkpoint %s", r.str("checkpoint_id"), finalAck.str("checkpoint_id"))
	}
	if r.int("last_seq") != last.int("seq") || r.str("chain") != last.str("chain") {
		t.Fatalf("restored to seq %d chain %s; before the stop seq %d chain %s", r.int("last_seq"), r.str("chain"), last.int("seq"), last.str("chain"))
	}
	if r.str("snapshot_digest") != finalAck.str("state_digest") {
		t.Fatal("snapshot differs from the checkpoint the agent sent")
	}
}

func TestRestoreByOperatorCommand(t *testing.T) {
	// Retention high enough that the first checkpoint survives the whole test.
	s := startSup(t, supOpts{flags: append(fastFlags, "--checkpoint-retain", "1000"),
		agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "300", "--checkpoint-every", "30"}})
	acks := s.waitEvents("checkpoint_acked", 3, 30*time.Second)
	a := acks[0]

	t.Run("with WAL", func(t *testing.T) {
		code, out, stderr := cli(t, "restore", "--data-dir", s.dataDir, "--checkpoint", a.str("checkpoint_id"))
		if code != 0 || !strings.Contains(out, "restore sent") {
			t.Fatalf("restore: %d %s %s", code, out, stderr)
		}
		r := s.waitEvents("restored", 1, 30*time.Second)[0]
		if r.str("checkpoint_id") != a.str("checkpoint_id") || r.str("snapshot_digest") != a.str("state_digest") {
			t.Fatalf("restored %v, want checkpoint %v", r, a)
		}
		if r.int("wal_entries") == 0 {
			t.Fatal("WAL after the checkpoint was not replayed")
		}
		// Recorded before the agent was stopped for it, cleared once sent:
		// a later restart does not roll back again.
		waitFor(t, 10*time.Second, "restore-point.json cleared", func() bool {
			_, err := os.Stat(filepath.Join(s.dataDir, "checkpoints", "restore-point.json"))
			return errors.Is(err, fs.ErrNotExist)
		})
		// Replayed up to where the agent was: chain equals its own at that seq.
		found := false
		for _, e := range s.eventsOf("applied") {
			if e.int("seq") == r.int("last_seq") {
				found = true
				if e.str("chain") != r.str("chain") {
					t.Fatalf("chain after operator restore differs at seq %d", r.int("last_seq"))
				}
			}
		}
		if !found {
			t.Fatalf("restored to seq %d the agent never applied", r.int("last_seq"))
		}
	})

	t.Run("no WAL rolls back", func(t *testing.T) {
		code, out, stderr := cli(t, "restore", "--data-dir", s.dataDir, "--checkpoint", a.str("checkpoint_id"), "--no-wal")
		if code != 0 {
			t.Fatalf("restore --no-wal: %d %s %s", code, out, stderr)
		}
		rs := s.waitEvents("restored", 2, 30*time.Second)
		r := rs[1]
		if r.int("wal_entries") != 0 || r.int("last_seq") != a.int("last_seq") || r.str("state_digest") != a.str("state_digest") {
			t.Fatalf("no-wal restore %v, want exactly checkpoint %v", r, a)
		}
		// The agent continues from the checkpoint; its new entries are stored,
		// not dropped as duplicates.
		want := a.int("last_seq") + 20
		waitFor(t, 30*time.Second, "new entries after rollback applied", func() bool {
			// By the incarnation that got the rollback: the one before it
			// applied entries above want too (the abandoned history).
			for _, e := range s.eventsOf("applied") {
				if e.int("pid") == r.int("pid") && e.int("seq") >= want {
					return true
				}
			}
			return false
		})
		starts := s.eventsOf("start")
		_ = syscall.Kill(starts[len(starts)-1].int("pid"), syscall.SIGKILL)
		r2 := s.waitEvents("restored", 3, 30*time.Second)[2]
		all := s.allEvents()
		incs := incarnations(all)
		// Only the incarnations since the rollback: the abandoned history
		// before it applied the same sequences with other contents. (The
		// killed agent logs an entry before it applies it and reports
		// "applied": a kill in between leaves the restored last entry with
		// no "applied" event since the rollback, and the search used to
		// fall through to the abandoned history's chain at that sequence
		// — about 1 run in 30.)
		since := slices.IndexFunc(incs, func(inc []ev) bool { return inc[0].int("pid") == r.int("pid") })
		if since < 0 {
			t.Fatalf("no incarnation started with the rollback's pid %d", r.int("pid"))
		}
		if c, ok := chainAt(incs[since:], len(incs)-1-since, r2.int("last_seq")); ok && c != r2.str("chain") {
			t.Fatal("after a crash the agent was not restored onto the rolled-back history")
		} else if !ok {
			t.Logf("the rolled-back incarnation was killed between logging sequence %d and reporting it applied: no chain to compare", r2.int("last_seq"))
		}
		if r2.int("last_seq") < want {
			t.Fatalf("restore after rollback reached seq %d, want >= %d", r2.int("last_seq"), want)
		}
		code, out, _ = cli(t, "checkpoints", "list", "--data-dir", s.dataDir)
		if code != 0 || !strings.Contains(out, "abandoned") {
			t.Fatalf("newer checkpoints not marked abandoned:\n%s", out)
		}
		// Each one marked is audited as docs/operations.md says.
		waitFor(t, 30*time.Second, "a checkpoint_marked_bad audit record", func() bool {
			return auditKinds(t, s.dataDir)["checkpoint_marked_bad"] > 0
		})
	})

	t.Run("bad ids", func(t *testing.T) {
		for _, id := range []string{"../../etc/passwd", "not-a-uuid", "/abs/path", ""} {
			code, _, stderr := cli(t, "restore", "--data-dir", s.dataDir, "--checkpoint", id)
			if code != 2 {
				t.Errorf("restore --checkpoint %q: exit %d (%s), want 2", id, code, stderr)
			}
		}
		code, _, stderr := cli(t, "restore", "--data-dir", s.dataDir, "--checkpoint", "0190a7e0-0000-7000-8000-000000000000")
		if code != 1 || !strings.Contains(stderr, "not found") {
			t.Errorf("unknown id: exit %d, %s", code, stderr)
		}
		code, _, _ = cli(t, "checkpoints", "show", "../x", "--data-dir", s.dataDir)
		if code != 2 {
			t.Errorf("checkpoints show ../x: exit %d", code)
		}
	})

	t.Run("socket is owner-only", func(t *testing.T) {
		st, err := os.Stat(filepath.Join(s.dataDir, "supervisor.sock"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("socket mode %v", st.Mode().Perm())
		}
		dst, _ := os.Stat(s.dataDir)
		if dst.Mode().Perm() != 0o700 {
			t.Fatalf("data dir mode %v", dst.Mode().Perm())
		}
	})

	t.Run("status", func(t *testing.T) {
		code, out, _ := cli(t, "status", "--data-dir", s.dataDir, "--json")
		if code != 0 || !strings.Contains(out, `"running": true`) || !strings.Contains(out, `"agent_pid"`) {
			t.Fatalf("status: %d\n%s", code, out)
		}
	})
}

func TestRestorePointWhenNotRunning(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s1 := startSup(t, supOpts{dataDir: dir, flags: fastFlags,
		agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "300", "--checkpoint-every", "30"}})
	acks := s1.waitEvents("checkpoint_acked", 2, 30*time.Second)
	s1.signal(syscall.SIGTERM)
	s1.wait(30 * time.Second)
	a := acks[0]
	code, out, stderr := cli(t, "restore", "--data-dir", dir, "--checkpoint", a.str("checkpoint_id"))
	if code != 0 || !strings.Contains(out, "recorded") {
		t.Fatalf("offline restore: %d %s %s", code, out, stderr)
	}
	code, out, _ = cli(t, "status", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "not running") {
		t.Fatalf("offline status: %d %s", code, out)
	}
	s2 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
	r := s2.waitEvents("restored", 1, 30*time.Second)[0]
	if r.str("checkpoint_id") != a.str("checkpoint_id") {
		t.Fatalf("restored from %s, want the recorded restore point %s", r.str("checkpoint_id"), a.str("checkpoint_id"))
	}
}

// An operator restore asked of a running supervisor while its agent is
// down (here in a restart back-off of an hour) is answered "sent when it
// next starts". Before, the point was held only in memory: a supervisor
// killed before that start came back from the newest checkpoint, and the
// rollback the operator was promised never happened. It is now recorded
// in the data directory before the answer.
func TestRestorePointAskedWhileTheAgentIsDownSurvivesASupervisorKill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s1 := startSup(t, supOpts{dataDir: dir, flags: []string{"--backoff-initial", "1h", "--backoff-max", "1h", "--kill-timeout", "1s",
		"--checkpoint-retain", "1000"},
		agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "300", "--checkpoint-every", "30", "--crash-after", "4s"}})
	a := s1.waitEvents("checkpoint_acked", 2, 30*time.Second)[0]
	s1.waitOutput("msg=\"agent stopped\"", 30*time.Second) // the crash; the next start is an hour away
	code, out, stderr := cli(t, "restore", "--data-dir", dir, "--checkpoint", a.str("checkpoint_id"))
	if code != 0 || !strings.Contains(out, "next starts") {
		t.Fatalf("restore while the agent is down: exit %d\n%s%s", code, out, stderr)
	}
	s1.signal(syscall.SIGKILL)
	s1.wait(30 * time.Second)
	newest := lastEvent(t, s1.eventsOf("checkpoint_acked"))
	if newest.str("checkpoint_id") == a.str("checkpoint_id") {
		t.Fatal("the operator's checkpoint is the newest: the test cannot tell the two apart")
	}

	s2 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"},
		events: filepath.Join(t.TempDir(), "events2.jsonl")})
	r := s2.waitEvents("restored", 1, 30*time.Second)[0]
	if r.str("checkpoint_id") != a.str("checkpoint_id") {
		t.Fatalf("after the supervisor was killed, the agent was restored from %s, not the checkpoint the operator asked for, %s (the newest is %s)",
			r.str("checkpoint_id"), a.str("checkpoint_id"), newest.str("checkpoint_id"))
	}
	// Acted on once: cleared, so a later restart does not roll back again.
	waitFor(t, 10*time.Second, "restore-point.json cleared", func() bool {
		_, err := os.Stat(filepath.Join(dir, "checkpoints", "restore-point.json"))
		return errors.Is(err, fs.ErrNotExist)
	})
}

func lastEvent(t *testing.T, es []ev) ev {
	t.Helper()
	if len(es) == 0 {
		t.Fatal("no such event")
	}
	return es[len(es)-1]
}

// newestCheckpointFile returns the path of the newest (by id) checkpoint file.
func checkpointFiles(t *testing.T, dataDir string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dataDir, "checkpoints", "*.ckpt"))
	if len(files) == 0 {
		t.Fatal("no checkpoint files")
	}
	return files // Glob sorts; UUIDv7 names sort by creation time
}

func TestCorruptNewestCheckpointFallsBack(t *testing.T) {
	for _, damage := range []string{"bitflip", "truncate"} {
		t.Run(damage, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			s1 := startSup(t, supOpts{dataDir: dir, flags: fastFlags,
				agent: []string{"--heartbeat-interval", "50ms", "--wal-rate", "300", "--checkpoint-every", "30"}})
			s1.waitEvents("checkpoint_acked", 2, 30*time.Second)
			s1.signal(syscall.SIGTERM)
			s1.wait(30 * time.Second)
			before := s1.allEvents()
			last, _ := lastOf(before, "applied")
			files := checkpointFiles(t, dir)
			newest := files[len(files)-1]
			b, _ := os.ReadFile(newest)
			if damage == "bitflip" {
				b[len(b)-8] ^= 0xff
			} else {
				b = b[:len(b)/2]
			}
			if err := os.WriteFile(newest, b, 0o600); err != nil {
				t.Fatal(err)
			}
			id := strings.TrimSuffix(filepath.Base(newest), ".ckpt")
			code, _, stderr := cli(t, "checkpoints", "show", id, "--data-dir", dir)
			if code != 1 {
				t.Fatalf("show of a corrupt checkpoint: exit %d %s", code, stderr)
			}
			s2 := startSup(t, supOpts{dataDir: dir, flags: fastFlags, agent: []string{"--heartbeat-interval", "50ms"}})
			r := s2.waitEvents("restored", 1, 30*time.Second)[0]
			if r.str("checkpoint_id") == id {
				t.Fatal("restored from the corrupt checkpoint")
			}
			if r.int("last_seq") != last.int("seq") || r.str("chain") != last.str("chain") {
				t.Fatalf("fallback restore reached seq %d, want %d with the same chain", r.int("last_seq"), last.int("seq"))
			}
			waitFor(t, 10*time.Second, "corrupt checkpoint counted", func() bool {
				return s2.metric("supervisor_checkpoint_corrupt_total") >= 1
			})
		})
	}
}

func TestLargeRestoreCompressionByVersion(t *testing.T) {
	for _, v := range []string{"1", "2"} {
		t.Run("v"+v, func(t *testing.T) {
			s := startSup(t, supOpts{flags: append(fastFlags, "--max-restarts", "0"),
				agent: []string{"--heartbeat-interval", "50ms", "--protocol-version", v, "--wal-rate", "20000",
					"--wal-batch", "100", "--entry-size", "1024", "--wal-max", "5500", "--checkpoint-every", "5500"}})
			ack := s.waitEvents("checkpoint_acked", 1, 60*time.Second)[0]
			if ack.int("size") <= 0 {
				t.Fatalf("ack %v", ack)
			}
			pid := s.eventsOf("start")[0].int("pid")
			_ = syscall.Kill(pid, syscall.SIGKILL)
			r := s.waitEvents("restored", 1, 60*time.Second)[0]
			compressed, _ := r["compressed"].(bool)
			if want := v == "2"; compressed != want {
				t.Fatalf("v%s agent got compressed=%v restore", v, compressed)
			}
			if r.str("snapshot_digest") != ack.str("state_digest") {
				t.Fatal("large snapshot not restored exactly")
			}
		})
	}
}
