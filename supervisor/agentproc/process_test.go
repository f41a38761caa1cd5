package agentproc

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func startSleep(t testing.TB, script string) *Process {
	t.Helper()
	p, err := Shared().Start(Spec{Path: "/bin/sh", Args: []string{"-c", script}, Env: os.Environ(), Stdio: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProcessExitIsSeenWithoutReaping(t *testing.T) {
	p := startSleep(t, "exit 3")
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("exit not noticed")
	}
	// The leader is a zombie until reap: its pid cannot be reused meanwhile.
	b, err := os.ReadFile("/proc/" + itoa(p.pid) + "/stat")
	if err != nil || !strings.Contains(string(b), ") Z ") {
		t.Fatalf("leader should be an unreaped zombie: %q %v", b, err)
	}
	st := p.Reap()
	if !st.Known || st.Code != 3 {
		t.Fatalf("exit status %v", st)
	}
	if err := p.SignalGroup(syscall.SIGKILL); err != nil {
		t.Fatalf("signal after reap must be a no-op: %v", err)
	}
	if p.table.isManaged(p.pid) {
		t.Fatal("still registered as managed after reap")
	}
}

// readPids reads the lines "LABEL PID" a test agent prints on its stdout
// until it has one for every label, and returns each process with its start
// time (so that a recycled pid is never mistaken for it).
func readPids(t *testing.T, p *Process, labels ...string) map[string]target {
	t.Helper()
	// No report within 10 s: closing our end ends the read.
	deadline := time.AfterFunc(10*time.Second, func() { p.fromAgent.Close() })
	defer deadline.Stop()
	r := bufio.NewReader(p.fromAgent)
	got := map[string]target{}
	for len(got) < len(labels) {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the agent's report after %v: %v", got, err)
		}
		label, num, _ := strings.Cut(strings.TrimSpace(line), " ")
		pid, err := strconv.Atoi(num)
		if !slices.Contains(labels, label) || err != nil || pid <= 1 {
			// (pid 1 would be init: the cleanup below SIGKILLs what is reported.)
			t.Fatalf("the agent reported %q, want LABEL PID with LABEL one of %v and PID above 1", line, labels)
		}
		st, ok := procStartTime(pid)
		if !ok {
			t.Fatalf("%s (pid %d) is gone before the test began", label, pid)
		}
		got[label] = target{pid, st}
		// Whatever the test finds, nothing it started outlives it.
		t.Cleanup(func() {
			if fd, ok := signalExact(pid, st, syscall.SIGKILL); ok {
				waitGone([]int{fd}, 5*time.Second)
				syscall.Close(fd)
				Shared().reapOrphans(nil, discardLog)
			}
		})
	}
	return got
}

// procStat returns the state, process group and session of pid from
// /proc/PID/stat.
func procStat(t *testing.T, pid int) (state string, pgrp, session int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	pgrp, _ = strconv.Atoi(f[2])
	session, _ = strconv.Atoi(f[3])
	return f[0], pgrp, session
}

// assertGone fails unless the process is gone from the process table: not
// running, and not a zombie either (reaped).
func assertGone(t *testing.T, what string, tg target) {
	t.Helper()
	if st, ok := procStartTime(tg.pid); ok && st == tg.start {
		b, _ := os.ReadFile("/proc/" + itoa(tg.pid) + "/stat")
		t.Errorf("%s (pid %d) outlived the agent: %s", what, tg.pid, b)
	}
}

// escapedGrandchild is shell that starts a grandchild in a session of its
// own, as setsid() or Python's start_new_session=True do, which reports its
// pid as "session PID".
const escapedGrandchild = `setsid sh -c 'echo "session $$"; exec sleep 3600' &`

func TestStopGroupKillsDescendantsAndEscalates(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	// The shell ignores SIGTERM (its "group" line comes after the trap is
	// set) and has two children: one in its group, one that left it.
	p := startSleep(t, `trap '' TERM; sleep 3600 & echo "group $!"; `+escapedGrandchild+` wait`)
	kids := readPids(t, p, "group", "session")
	leaderStart, _ := procStartTime(p.pid)
	if _, pgrp, _ := procStat(t, kids["group"].pid); pgrp != p.pid {
		t.Fatalf("the group child is in group %d, want the agent's %d", pgrp, p.pid)
	}
	if _, pgrp, sid := procStat(t, kids["session"].pid); pgrp == p.pid || sid != kids["session"].pid {
		t.Fatalf("the setsid child is in group %d, session %d: it did not leave the agent's group", pgrp, sid)
	}

	start := time.Now()
	if killed := p.StopGroup(300 * time.Millisecond); !killed {
		t.Fatal("a leader ignoring SIGTERM must be SIGKILLed")
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("SIGKILL sent before the kill timeout")
	}
	p.Reap()
	assertGone(t, "the leader", target{p.pid, leaderStart})
	assertGone(t, "the child in the agent's group", kids["group"])
	assertGone(t, "the child that left the agent's group (setsid)", kids["session"])
}

// A descendant that left the group and was orphaned before the supervisor
// ever saw it is recognised by the environment it inherited from the agent,
// and killed with it.
func TestReapKillsAnUnseenEscapedDescendant(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	p, err := Shared().Start(Spec{Path: "/bin/sh", Args: []string{"-c", escapedGrandchild + ` read _`},
		Env: append(os.Environ(), "SUPERVISOR_ROLE=primary"), Stdio: true})
	if err != nil {
		t.Fatal(err)
	}
	kid := readPids(t, p, "session")["session"]
	if _, pgrp, _ := procStat(t, kid.pid); pgrp == p.pid {
		t.Fatalf("the setsid child is in the agent's group %d", pgrp)
	}
	// The leader exits by itself; its child is orphaned to us.
	letLeaderExit(t, p)
	if st := p.Reap(); !st.Known || st.Code != 0 || st.Signal != 0 {
		t.Fatalf("leader exit %v, want 0", st)
	}
	assertGone(t, "the orphaned child that left the agent's group (setsid)", kid)
}

// An escaped orphan caught inside execve has, for a moment, no environment
// to read. It must still be recognised as the agent's: here it re-executes
// itself without pause, so reap's look at it often lands in that moment.
func TestReapKillsAnEscapedDescendantCaughtInExec(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(t.TempDir(), "execloop")
	if err := os.WriteFile(loop, []byte("#!/bin/sh\nexec \"$0\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		p, err := Shared().Start(Spec{Path: "/bin/sh",
			Args: []string{"-c", `setsid sh -c 'echo "session $$"; exec "$0"' ` + loop + ` & read _`},
			Env:  append(os.Environ(), "SUPERVISOR_ROLE=primary"), Stdio: true})
		if err != nil {
			t.Fatal(err)
		}
		kid := readPids(t, p, "session")["session"]
		letLeaderExit(t, p)
		p.Reap()
		assertGone(t, "the orphan re-executing itself (round "+itoa(i)+")", kid)
		if t.Failed() {
			return
		}
	}
}

// letLeaderExit ends the leader's `read _` and waits until it has exited
// (not yet reaped).
func letLeaderExit(t *testing.T, p *Process) {
	t.Helper()
	if _, err := p.toAgent.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not exit")
	}
}

func TestSpawnFailureIsReported(t *testing.T) {
	_, err := Shared().Start(Spec{Path: "/nonexistent/agent", Env: os.Environ(), Stdio: true})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/agent") {
		t.Fatalf("err = %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// BenchmarkDeathDetection measures the time from a SIGKILL of a running agent
// process to the supervisor noticing its exit (SPEC §8: under 10 ms).
func BenchmarkDeathDetection(b *testing.B) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		p := startSleep(b, "exec sleep 3600")
		b.StartTimer()
		start := time.Now()
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.exited
		total += time.Since(start)
		b.StopTimer()
		p.Reap()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-to-detect")
}

// The supervisor → agent pipe holds 1 MiB (issue 31): a big restore moves
// in 1 MiB writes and reads, not 64 KiB ones, which cost a restart on a
// 110 MB WAL tail about a fifth of its time in wake-ups.
func TestAgentInputPipeHoldsOneMebibyte(t *testing.T) {
	max, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		t.Skipf("no pipe-max-size to compare with: %v", err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(max))); n < inputPipeSize {
		t.Skipf("this kernel's pipe-max-size is %d bytes, below %d", n, inputPipeSize)
	}
	p := startSleep(t, "sleep 30")
	defer func() {
		p.SignalGroup(syscall.SIGKILL)
		<-p.exited
		p.Reap()
	}()
	rc, err := p.toAgent.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	var ferr error
	if err := rc.Control(func(fd uintptr) { size, ferr = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }); err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	if size != inputPipeSize {
		t.Fatalf("the agent's input pipe holds %d bytes, want %d", size, inputPipeSize)
	}
}
