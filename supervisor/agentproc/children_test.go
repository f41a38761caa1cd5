package agentproc

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// parentsFromProc maps every process in /proc to its parent (field 4 of
// /proc/PID/stat): the process tree the lister reads through the
// children files, read the other way, to check it against.
func parentsFromProc(t *testing.T) map[int]int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		ppid, _ := strconv.Atoi(f[1])
		out[pid] = ppid
	}
	return out
}

func TestChildListerReadsTheProcessTree(t *testing.T) {
	// A tree three deep below the agent: two children, one with a child of
	// its own (each waits for its children, so none is re-parented).
	p := startSleep(t, `sh -c 'sleep 3600 & echo "grand $!"; wait' & sleep 3600 & echo "child $!"; wait`)
	t.Cleanup(func() { p.StopGroup(0); p.Reap() })
	kids := readPids(t, p, "grand", "child")
	parents := parentsFromProc(t)
	var want []int
	for pid := range parents {
		for a := parents[pid]; a > 1; a = parents[a] {
			if a == p.pid {
				want = append(want, pid)
				break
			}
		}
	}
	var l childLister
	got := l.descendants(nil, p.pid)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(got) != 3 {
		t.Fatalf("descendants of the agent %d: %v, /proc's parents say %v (3 of them)", p.pid, got, want)
	}
	for _, k := range kids {
		if !slices.Contains(got, k.pid) {
			t.Errorf("the agent reported %d, not among its descendants %v", k.pid, got)
		}
	}
	// Used again, the lister gives the same (its buffers are reused).
	if again := l.descendants(nil, p.pid); len(again) != 3 {
		t.Fatalf("the second listing: %v", again)
	}
	// This process's children include the agent.
	if own := l.children(nil, 0); !slices.Contains(own, p.pid) {
		t.Fatalf("this process's children %v lack the agent %d", own, p.pid)
	}
	if st, ok := l.startTime(p.pid); !ok || st != procStartTimeSlow(t, p.pid) {
		t.Fatalf("start time %d %v, want %d", st, ok, procStartTimeSlow(t, p.pid))
	}
	if none := l.children(nil, 1<<30); len(none) != 0 {
		t.Fatalf("a process that does not exist has children %v", none)
	}
}

// A children file longer than the lister's first buffer (512 bytes: 70 to
// 100 pids, as long as they are) is read whole. 200 children make one over
// it whatever the pids' length (three digits each at least, and a space).
func TestChildListerReadsTwoHundredChildren(t *testing.T) {
	p := startSleep(t, `i=0; while [ $i -lt 200 ]; do sleep 3600 & i=$((i+1)); done; echo "up $$"; wait`)
	t.Cleanup(func() { p.StopGroup(0); p.Reap() })
	readPids(t, p, "up")
	var l childLister
	if got := l.children(nil, p.pid); len(got) != 200 {
		t.Fatalf("%d children, want 200: %v", len(got), got)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/task/" + strconv.Itoa(p.pid) + "/children")
	if err != nil || len(b) <= 512 {
		t.Fatalf("the children file holds %d bytes (%v): this test needs one over 512", len(b), err)
	}
}

// procStartTimeSlow reads field 22 of /proc/PID/stat with strings.Fields.
func procStartTimeSlow(t *testing.T, pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestParseStartTimeAndPids(t *testing.T) {
	// The command may hold spaces and parentheses.
	if v, ok := parseStartTime([]byte("12 (a) b) (c) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 98765 200 33 x\n")); !ok || v != 98765 {
		t.Fatalf("start time %d %v", v, ok)
	}
	for _, bad := range []string{"12 (a) S 1 7", "no parenthesis", "12 (a) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 x9 1"} {
		if v, ok := parseStartTime([]byte(bad)); ok {
			t.Errorf("%q parsed as %d", bad, v)
		}
	}
	got := parsePids(nil, []byte("12 345 6789 \n"))
	if !slices.Equal(got, []int{12, 345, 6789}) {
		t.Fatalf("pids %v", got)
	}
	if got := parsePids(nil, []byte("")); len(got) != 0 {
		t.Fatalf("pids of nothing: %v", got)
	}
}

// The reaper's sweep runs for the supervisor's whole life: it must not
// refill the idle heap every time (issue 31: idle under 15 MiB). With
// filepath.Glob and os.ReadFile a sweep allocated tens of KiB; with the
// lister's buffers what is left is a path string per file opened.
func TestReaperSweepAllocatesLittle(t *testing.T) {
	p := startSleep(t, `sleep 3600 & sleep 3600 & echo "up $$"; wait`)
	t.Cleanup(func() { p.StopGroup(0); p.Reap() })
	readPids(t, p, "up")
	var (
		l     childLister
		procs []*Process
	)
	sweep := func() {
		p.table.reapOrphans(&l, discardLog)
		procs = p.table.appendRunning(procs[:0])
		for _, q := range procs {
			q.trackDescendants(&l)
		}
	}
	sweep() // the buffers
	const sweeps = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < sweeps; i++ {
		sweep()
	}
	runtime.ReadMemStats(&after)
	perSweep := (after.TotalAlloc - before.TotalAlloc) / sweeps
	// This test process has a dozen threads; each children file opened
	// costs a path of some 20 bytes.
	if perSweep > 2048 {
		t.Fatalf("a sweep allocated %d bytes, want at most 2 KiB", perSweep)
	}
	t.Logf("a sweep allocated %d bytes (%d threads here)", perSweep, threads(t))
}

func threads(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func BenchmarkReaperSweep(b *testing.B) {
	var (
		l     childLister
		procs []*Process
	)
	tab := Shared()
	b.ReportAllocs()
	for b.Loop() {
		tab.reapOrphans(&l, discardLog)
		procs = tab.appendRunning(procs[:0])
		for _, q := range procs {
			q.trackDescendants(&l)
		}
	}
}
