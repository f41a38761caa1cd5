package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loopMount mounts a fresh ext4 filesystem of sizeMiB on a loop device and
// returns its mount point, with a freeze function (fsfreeze: every write to
// it blocks until thawed). It skips the test where that cannot be done (not
// root, no loop devices); CI runs as root.
func loopMount(t *testing.T, sizeMiB int) (dir string, freeze func(on bool)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a loop device and freeze it")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	base := t.TempDir()
	img, mnt := filepath.Join(base, "disk.img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount (no loop devices in this sandbox?): %v %s", err, out)
	}
	frozen := false
	freeze = func(on bool) {
		t.Helper()
		if on == frozen {
			return
		}
		flag := "-u"
		if on {
			flag = "-f"
		}
		if out, err := exec.Command("fsfreeze", flag, mnt).CombinedOutput(); err != nil {
			t.Fatalf("fsfreeze %s: %v %s", flag, err, out)
		}
		frozen = on
	}
	t.Cleanup(func() {
		if frozen {
			_ = exec.Command("fsfreeze", "-u", mnt).Run()
		}
		for i := 0; i < 50; i++ { // the supervisor may still be closing files
			if exec.Command("umount", mnt).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("could not unmount %s", mnt)
	})
	return mnt, freeze
}

// TestSlowDiskDoesNotKillHealthyAgent: the WAL's disk stalls (an ext4
// frozen with fsfreeze) for longer than --heartbeat-timeout while the agent
// logs with --wal-sync always. The first build read heartbeats on the
// goroutine blocked on our fsync, so the healthy agent was killed as hung.
// Now time blocked on our own storage does not count against the agent: it
// is never restarted, and every entry it wrote is restored later.
func TestSlowDiskDoesNotKillHealthyAgent(t *testing.T) {
	mnt, freeze := loopMount(t, 128)
	dir := filepath.Join(mnt, "data")
	flags := append(slices.Clone(fastFlags), "--wal-sync", "always", "--heartbeat-timeout", "2s", "--wal-segment-size", "1048576")
	report := "AGENT_REPORT=" + filepath.Join(t.TempDir(), "report.jsonl") // off the frozen disk
	s := startSup(t, scripted(t, dir, flags, []string{"AGENT_NO_FINAL_CHECKPOINT=1", "AGENT_HB=0.1", report},
		plan{{"log": 600, "rate": 100}, {"stay": true}}, plan{{"stay": true}}))
	t.Cleanup(func() { freeze(false) }) // before the supervisor's cleanup: nothing blocked on a frozen disk can be killed
	first := s.waitEvents("start", 1, 30*time.Second)[0]
	waitFor(t, 10*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	time.Sleep(time.Second) // let it log for a while: the freeze must land mid-stream
	freeze(true)
	time.Sleep(5 * time.Second) // 2.5× --heartbeat-timeout with the WAL blocked
	freeze(false)
	s.waitEvents("staying", 1, 60*time.Second)
	if starts := s.eventsOf("start"); len(starts) != 1 {
		t.Fatalf("the agent was restarted during the stall: %d starts", len(starts))
	}
	if !alive(first.int("pid")) {
		t.Fatal("the agent process is gone")
	}
	if n := s.metric("supervisor_agent_restarts_total", `reason="hung"`); n > 0 {
		t.Fatalf("restarts{reason=hung} = %v", n)
	}
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s2 := startSup(t, scripted(t, dir, flags, []string{report}, plan{{"stay": true}}))
	st := s2.waitEvents("start", 2, 30*time.Second)
	sameSeqs(t, "restore after the stall", restored(t, st[1]).state(), seqRange(1, 600))
}

// TestExitDuringStallKeepsWrittenEntries: the agent writes 80 entries and
// exits while our disk is frozen. The first build gave the frame reader 2 s
// after the exit, then closed the pipe although the reader was busy (blocked
// on our fsync), not idle: entries the agent wrote were thrown away. Now
// they are read to the end and stored however long the disk takes, and the
// restore after the thaw holds every one.
func TestExitDuringStallKeepsWrittenEntries(t *testing.T) {
	trigger := filepath.Join(t.TempDir(), "go")
	s, _, freeze, first := startOnFreezableDisk(t, plan{{"wait_file": trigger}, {"log": 80, "size": 200}, {"crash": 1}})
	freeze(true)
	if err := os.WriteFile(trigger, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the agent to exit", func() bool { return !alive(first.int("pid")) })
	time.Sleep(4 * time.Second) // twice the old 2 s drain limit, the disk still frozen
	freeze(false)
	st := s.waitEvents("start", 2, 60*time.Second)
	sameSeqs(t, "restore after exiting during the stall", restored(t, st[1]).state(), seqRange(1, 80))
	if strings.Contains(s.out.String(), "closing it") {
		t.Fatalf("the supervisor cut the agent's output while storing it:\n%s", tail(s.out.String(), 20))
	}
}

// TestFrozenDiskOwnerStaysResponsive: the agent crashes while our disk is
// frozen. The owner loop used to write (and fsync) the audit record of the
// restart itself and assemble the next restore on its own goroutine, so it
// stopped with the disk: `supervisor status` hung, and so would a stop. Now
// storage work runs on the store worker and the audit log queues: the owner
// answers while the disk is frozen, and after the thaw the agent is restored
// with every entry.
func TestFrozenDiskOwnerStaysResponsive(t *testing.T) {
	trigger := filepath.Join(t.TempDir(), "go")
	s, dir, freeze, first := startOnFreezableDisk(t, plan{{"log": 50}, {"wait_file": trigger}, {"crash": 1}})
	waitFor(t, 10*time.Second, "50 entries durable", func() bool { return s.metric("supervisor_wal_last_sequence") >= 50 })
	freeze(true)
	if err := os.WriteFile(trigger, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the agent to exit", func() bool { return !alive(first.int("pid")) })
	// The restart is decided with the disk still frozen; the control socket
	// is answered by the owner loop.
	var st struct {
		State    string `json:"state"`
		Restarts int    `json:"restarts"`
	}
	waitFor(t, 30*time.Second, "supervisor status to report the restart while the disk is frozen", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, binPath, "status", "--data-dir", dir, "--json").Output()
		if ctx.Err() != nil {
			t.Fatalf("supervisor status hung for 10 s while the disk was frozen (the owner loop is blocked on storage)")
		}
		return err == nil && json.Unmarshal(out, &st) == nil && st.Restarts == 1
	})
	freeze(false)
	starts := s.waitEvents("start", 2, 60*time.Second)
	sameSeqs(t, "restore after the crash during the freeze", restored(t, starts[1]).state(), seqRange(1, 50))
}

// startOnFreezableDisk starts a supervisor whose data directory is on a
// loop-mounted ext4 that freeze(true) freezes (thawed at cleanup), with
// --wal-sync always, a scripted agent that runs first and then stays, and
// its report off the frozen disk. It returns once the first agent is up,
// with its start event.
func startOnFreezableDisk(t *testing.T, first plan) (s *sup, dir string, freeze func(on bool), start ev) {
	t.Helper()
	mnt, freeze := loopMount(t, 128)
	dir = filepath.Join(mnt, "data")
	flags := append(slices.Clone(fastFlags), "--wal-sync", "always", "--wal-segment-size", "1048576")
	report := "AGENT_REPORT=" + filepath.Join(t.TempDir(), "report.jsonl")
	s = startSup(t, scripted(t, dir, flags, []string{report}, first, plan{{"stay": true}}))
	t.Cleanup(func() { freeze(false) })
	start = s.waitEvents("start", 1, 30*time.Second)[0]
	waitFor(t, 10*time.Second, "the agent up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	return s, dir, freeze, start
}

// TestFrozenDiskWhileAgentWaitsForAck: under --wal-sync batch an agent that
// logs one entry at a time and waits for each wal_ack (the durable Python
// agent of protocol.md, fed requests) has its entries written and fsynced
// by the frame reader itself when the WAL's syncer is idle (issue 31). The
// disk freezes for 2.5× --heartbeat-timeout while it works: the reader may
// be blocked in that fsync, but that is our storage's time — the agent is
// never restarted as hung, it goes on acting after the thaw, and everything
// it acted on is in the WAL.
func TestFrozenDiskWhileAgentWaitsForAck(t *testing.T) {
	requirePythonMsgpack(t)
	mnt, freeze := loopMount(t, 128)
	dir := t.TempDir()
	agentPy := docBlock(t, "example-durable-agent", dir)
	effects := filepath.Join(dir, "effects.log") // off the frozen disk
	dataDir := filepath.Join(mnt, "data")
	flags := append(slices.Clone(fastFlags), "--wal-sync", "batch", "--heartbeat-timeout", "2s")
	s := startSup(t, supOpts{dataDir: dataDir, flags: flags, command: []string{python, agentPy}, env: []string{"SIDE_EFFECT_LOG=" + effects}})
	t.Cleanup(func() { freeze(false) }) // before the supervisor's cleanup
	s.waitReady()
	_, ready := s.get("/readyz")
	first := readyPID(t, ready)
	stop := floodRequests(s, 2, "f")
	defer stop()
	waitFor(t, 60*time.Second, "the agent acting", func() bool { return len(sideEffects(t, effects)) >= 20 })
	freeze(true)
	time.Sleep(5 * time.Second) // the fault's length: 2.5× --heartbeat-timeout with the disk frozen
	frozenAt := len(sideEffects(t, effects))
	freeze(false)
	waitFor(t, 60*time.Second, "the agent acting again after the thaw", func() bool { return len(sideEffects(t, effects)) >= frozenAt+20 })
	if n := s.metric("supervisor_agent_restarts_total", `reason="hung"`); n > 0 {
		t.Fatalf("the agent was restarted as hung while our disk was frozen: restarts{reason=hung} = %v", n)
	}
	if _, ready := s.get("/readyz"); readyPID(t, ready) != first {
		t.Fatalf("the agent was replaced during the freeze (pid %d before): %s", first, ready)
	}
	s.signal(syscall.SIGKILL)
	s.wait(30 * time.Second)
	wal := walSequences(t, dataDir)
	for seq, text := range sideEffects(t, effects) {
		if got, ok := wal[seq]; !ok || got != text {
			t.Fatalf("the agent acted on entry %d (%q) after its wal_ack, but the WAL has %q (present %v)", seq, text, got, ok)
		}
	}
}
