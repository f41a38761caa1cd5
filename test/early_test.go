package test

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/wal"
)

// --spawn-during-recovery through the binary (issue 31, item 3): a
// supervisor SIGKILLed and started again with the flag starts the agent
// before the WAL is recovered, and the agent — the same process — gets the
// complete restore as its first frame. The Python agent reports its launch
// before it reads anything.
func TestSpawnDuringRecoveryRestoresThroughTheBinary(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, fastFlags, nil,
		plan{{"log": 50}, {"checkpoint": true}, {"log": 20}, {"stay": true}}))
	s.waitEvents("staying", 1, 60*time.Second)
	// The agent sends its last 20 entries without waiting for acks: they
	// may still be in the pipe when it reports. Kill only once they are
	// written to the WAL's files (a process kill keeps what was written).
	waitFor(t, 30*time.Second, "entries up to 70 written to the WAL", func() bool {
		var last uint64
		_ = wal.ReadDir(filepath.Join(dir, "wal"), 0, func(e wal.Entry) error { last = e.Sequence; return nil })
		return last >= 70
	})
	s.signal(syscall.SIGKILL)
	s.wait(30 * time.Second)

	o := scripted(t, dir, append(slices.Clone(fastFlags), "--spawn-during-recovery"), []string{"AGENT_REPORT_LAUNCH=1"}, plan{{"stay": true}})
	s2 := startSup(t, o)
	starts := s2.waitEvents("start", 2, 60*time.Second)
	s2.waitEvents("staying", 2, 30*time.Second)
	launches := s2.eventsOf("launch")
	if len(launches) != 1 {
		t.Fatalf("%d agent launches after the restart, want 1 (the early one, used)", len(launches))
	}
	if l := launches[0]; l.str("restore_pending") != "1" || l.int("pid") != starts[1].int("pid") {
		t.Fatalf("launch %v, start %v: want the same process, told a restore is coming", l, starts[1])
	}
	sameSeqs(t, "restore of the early agent", restored(t, starts[1]).state(), seqRange(1, 70))
	out := s2.out.String()
	spawned, opened := strings.Index(out, "starting the agent while the data directory is recovered"), strings.Index(out, "WAL opened")
	if spawned < 0 || opened < 0 || spawned > opened {
		t.Fatalf("want the agent started before the WAL was opened:\n%s", tail(out, 20))
	}
	s2.signal(syscall.SIGTERM)
	if code := s2.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
