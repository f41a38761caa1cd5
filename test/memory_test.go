package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// An agent answering many requests with 1 MiB results costs the supervisor
// under 64 MiB at its peak, and the newest results can still be fetched.
// (It peaked at 173–209 MiB: up to 64 MiB of results held, as JSON, and the
// garbage of converting them.)
func TestLargeResultsMemoryBounded(t *testing.T) {
	buildBoundsTools(t)
	s := startSup(t, supOpts{bin: plainBin, noEvents: true,
		agent: []string{"--heartbeat-interval", "100ms", "--answer", "--answer-size", "1000000", "--behaviour", "latency_ms=1"}})
	waitFor(t, 30*time.Second, "the agent to be up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	const n = 200
	ids := make([]string, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last string
	codes := map[int]int{}
	for c := 0; c < 8; c++ {
		wg.Go(func() {
			for i := c; i < n; i += 8 {
				code, body := s.post("/v1/requests?wait=30s", fmt.Sprintf(`{"message":"big answer %d"}`, i))
				mu.Lock()
				codes[code]++
				if code == http.StatusOK {
					ids[i] = jsonField(t, body, "request_id")
					last = ids[i] // the newest answer: the last POST to come back
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	hwm := procStatus(s.cmd.Process.Pid, "VmHWM")
	t.Logf("%d requests answered with 1 MB each: HTTP codes %v; supervisor VmHWM %.1f MiB", n, codes, float64(hwm)/1024)
	if codes[http.StatusOK] != n {
		t.Errorf("HTTP codes %v, want %d × 200", codes, n)
	}
	if hwm >= 64<<10 {
		t.Errorf("VmHWM %d kB, want under 64 MiB", hwm)
	}
	if code, body := s.get("/v1/requests/" + last); code != http.StatusOK || !strings.Contains(body, `"status":"answered"`) || len(body) < 1000000 {
		t.Errorf("the newest result: HTTP %d, %d bytes: %.200s", code, len(body), body)
	}
}

// Eight uncompressed checkpoints of 30 MiB, sent back to back, are all
// stored and acknowledged, and cost the supervisor under 64 MiB at its peak
// (it peaked at 303 MiB).
func TestPlainCheckpointsMemoryBounded(t *testing.T) {
	buildBoundsTools(t)
	h := startHostile(t, plainBin, "plaincheckpoints", nil, nil)
	waitFor(t, 3*time.Minute, "8 checkpoints acknowledged", func() bool { return len(noted(h.notes, "ack ")) >= 8 })
	hwm := procStatus(h.cmd.Process.Pid, "VmHWM")
	t.Logf("8 uncompressed checkpoints of 30 MiB: supervisor VmHWM %.1f MiB", float64(hwm)/1024)
	if hwm >= 64<<10 {
		t.Errorf("VmHWM %d kB, want under 64 MiB", hwm)
	}
}

// jsonField returns a top-level string field of a JSON object.
func jsonField(t *testing.T, body, key string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("not JSON: %.200s", body)
	}
	v, _ := m[key].(string)
	return v
}

// A restore of a long WAL tail — 100,000 entries of 1 KB above no
// checkpoint, about 105 MB, near the most one restore may carry — is
// streamed from the log to the agent: restoring it costs the supervisor
// under 64 MiB at its peak (it peaked at 274 MiB building it whole), and the
// agent gets every entry.
func TestLongWALTailRestoreMemoryBounded(t *testing.T) {
	buildBoundsTools(t)
	const entries = 100000
	s := startSup(t, supOpts{bin: plainBin, flags: []string{"--backoff-initial", "10ms"},
		agent: []string{"--heartbeat-interval", "200ms", "--wal-rate", "50000", "--wal-batch", "100", "--entry-size", "1000",
			"--wal-max", strconv.Itoa(entries), "--checkpoint-interval", "0", "--memory-limit", "100"}})
	waitFor(t, 3*time.Minute, "the agent's entries in the WAL", func() bool { return s.metric("supervisor_wal_last_sequence") >= entries })
	_, ready := s.get("/readyz")
	pid := readyPID(t, ready)
	// Only the restore's peak counts: the peak so far is reset.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.cmd.Process.Pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset VmHWM: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	restored := s.waitEvents("restored", 1, 3*time.Minute)[0]
	hwm := procStatus(s.cmd.Process.Pid, "VmHWM")
	t.Logf("restore of %v WAL entries (last_seq %v): supervisor VmHWM %.1f MiB", restored["wal_entries"], restored["last_seq"], float64(hwm)/1024)
	if restored.int("wal_entries") != entries || restored.int("last_seq") != entries {
		t.Errorf("restored %v", restored)
	}
	if hwm >= 64<<10 {
		t.Errorf("VmHWM %d kB, want under 64 MiB", hwm)
	}
}

// A frame header that declares 90 MiB, followed by 2 MiB and then nothing,
// costs the supervisor what was sent, not what was declared: the payload
// buffer is allocated whole once 1 MiB has come (wire.trustGrowth), but its
// pages are backed only as bytes arrive.
func TestLyingFrameHeaderCostsWhatWasSent(t *testing.T) {
	buildBoundsTools(t)
	h := startHostile(t, plainBin, "lyingheader", []string{"--heartbeat-timeout", "60s"}, nil)
	waitFor(t, time.Minute, "the lying frame sent", func() bool { return len(noted(h.notes, "sent all")) == 1 })
	time.Sleep(time.Second) // the supervisor reads what came; nothing signals it
	hwm := procStatus(h.cmd.Process.Pid, "VmHWM")
	t.Logf("a 90 MiB frame header with 2 MiB sent: supervisor VmHWM %.1f MiB", float64(hwm)/1024)
	if hwm >= 32<<10 {
		t.Errorf("VmHWM %d kB, want well under the 90 MiB declared", hwm)
	}
}

// An idle supervisor beside a 1 Hz agent stays under 16 MiB resident in its
// steady state, and its heap under 3 MiB. Issue 31's target is 15 MiB: the
// shipped binary idled at 13.7-15.2 MiB in this test's runs on 2026-11-29
// (15.7 once beside four busy loops and two more of it), 13.7-13.9 MiB
// since run collects at the trim and the reaper and the status sampler stop
// allocating (docs/benchmarks.md). It was 18.8 MiB before run gave back the
// executable's pages that start-up had touched (internal/residency).
//
// The steady state is measured after a garbage collection that followed the
// trim. A collection scans every goroutine's stack and so reads the function
// tables (pclntab) of every frame: 1.5-2 MiB of the executable. This test
// used to measure 5 s after the trim, before the runtime's first collection
// after it (forced within two minutes) unless the heap's growth brought one
// sooner: 13 MiB most times, 15.2-16.2 MiB when a collection fell in the
// window (a CI run failed on it). The binary is built as the Dockerfile
// builds it (statically: the one operators run).
//
// The heap at that collection is what the supervisor keeps (about 1 MiB)
// plus what it allocated since the collection at the trim, two minutes
// before: 1-2 MiB in all (gctrace rounds down). Its pages stay resident
// below the heap's 4 MiB goal, so what an idle supervisor allocates is what
// it weighs. Before, the heap was 3 MiB there: no collection at the trim
// (the runtime forces one every two minutes only after a first, so the
// heap grew from the start), the reaper's sweep allocated 45 KiB every 10 s
// and the status sampler copied its arrays every 5 s (agentproc's and
// api's tests pin those two).
func TestIdleResidentMemory(t *testing.T) {
	buildBoundsTools(t)
	bin := shippedBinary(t)
	s := startSup(t, supOpts{bin: bin, noEvents: true, env: []string{"GODEBUG=gctrace=1"},
		agent: []string{"--heartbeat-interval", "1s", "--metrics-interval", "10s"}})
	waitFor(t, 30*time.Second, "the agent to be up", func() bool { return s.metric("supervisor_agent_up", `role="primary"`) == 1 })
	const trimmed = "gave back the executable's start-up pages"
	s.waitOutput(trimmed, time.Minute)
	// Idle: the agent's heartbeats and a liveness probe every few seconds,
	// until the runtime has collected after the trim (gctrace prints a line
	// per collection). A /metrics scrape or a status page brings back more
	// of the executable: docs/benchmarks.md has that figure too.
	var gc, heapMiB string
	probed := time.Now()
	waitFor(t, 4*time.Minute, "a garbage collection after the trim", func() bool {
		if time.Since(probed) >= 2*time.Second {
			s.get("/healthz")
			probed = time.Now()
		}
		out := s.out.String()
		if m := gcTraceLine.FindStringSubmatch(out[strings.Index(out, trimmed):]); m != nil {
			gc, heapMiB = m[0], m[1]
		}
		return gc != ""
	})
	for i := 0; i < 5; i++ {
		s.get("/healthz")
		time.Sleep(time.Second) // let heartbeats arrive; the figure is memory, not time
	}
	pid := s.cmd.Process.Pid
	rss := procStatus(pid, "VmRSS")
	t.Logf("idle supervisor after %q: VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f)", gc, float64(rss)/1024,
		float64(procStatus(pid, "RssAnon"))/1024, float64(procStatus(pid, "RssFile"))/1024)
	if rss >= 16<<10 {
		t.Errorf("idle VmRSS %d kB, want under 16 MiB", rss)
	}
	if heap, _ := strconv.Atoi(heapMiB); heap >= 3 {
		t.Errorf("the idle heap was %s MiB when the runtime collected two minutes after the trim, want under 3 MiB (%q)", heapMiB, gc)
	}
	// The collection at the trim: forced (runtime.GC, debug.FreeOSMemory),
	// after the agent started and before the trim's line.
	out := s.out.String()
	before := out[strings.Index(out, "agent started"):strings.Index(out, trimmed)]
	if !regexp.MustCompile(`(?m)^gc \d+ @[^\n]*\(forced\)$`).MatchString(before) {
		t.Errorf("no forced collection between the agent's start and the trim; the collections there: %q",
			regexp.MustCompile(`(?m)^gc \d+ @.*$`).FindAllString(before, -1))
	}
}

// gcTraceLine is the Go runtime's line for a collection (GODEBUG=gctrace=1),
// as the supervisor writes it to its stderr (at the start of a line; the
// agent's stderr reaches the output inside the supervisor's log lines).
// Its heap sizes ("A->B->C MB": the heap when the collection began, when it
// ended, and what it kept, in whole MiB rounded down) come in the same line;
// the runtime writes a line in pieces, so a line is taken once they are in.
var gcTraceLine = regexp.MustCompile(`(?m)^gc \d+ @[0-9.]+s[^\n]*? (\d+)->(\d+)->(\d+) MB`)

// shippedBinary builds the supervisor as the Dockerfile does: without cgo
// (a static binary, no libc mapped: about 1.2 MiB less resident than a
// default build on a machine with a C compiler), -trimpath, no symbols.
func shippedBinary(t testing.TB) string {
	t.Helper()
	return goBuild(t, "supervisor-static", "../cmd/supervisor", []string{"CGO_ENABLED=0"}, "-trimpath", "-ldflags", "-s -w")
}

// startBigState runs the hostile agent's bigstate mode (a protocol v1
// agent that checkpoints size bytes of text and float32 embeddings once,
// then logs entries WAL entries) under the binary bin.
func startBigState(t testing.TB, bin string, size, entries int) *hostileRun {
	t.Helper()
	dir := t.TempDir()
	notes := filepath.Join(dir, "notes")
	o := supOpts{bin: bin, flags: []string{"--backoff-initial", "10ms"}, command: []string{hostilePath, "bigstate"},
		env: []string{"HOSTILE_OUT=" + notes, "HOSTILE_MARK=" + filepath.Join(dir, "mark"),
			"HOSTILE_SIZE=" + strconv.Itoa(size), "HOSTILE_ENTRIES=" + strconv.Itoa(entries)}}
	return &hostileRun{sup: startSup(t, o), notes: notes}
}

// resetHWM resets the supervisor's peak RSS (VmHWM) to its RSS now.
func resetHWM(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset VmHWM: %v", err)
	}
}

// notedPID is the pid the agent noted first ("pid N"): its first
// incarnation's.
func notedPID(t testing.TB, notes string) int {
	t.Helper()
	p := noted(notes, "pid ")
	if len(p) == 0 {
		t.Fatal("the agent noted no pid")
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(p[len(p)-1], "pid "))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// A 100 MB uncompressed (protocol v1) checkpoint is streamed from the pipe
// into the compressor and its file, and back from the decompressor into the
// pipe when the agent is killed: taking it and restoring it each cost the
// supervisor under 64 MiB at its peak (they peaked at 238–310 MiB and
// 309–373 MiB holding it whole), and the restore is the checkpoint byte for
// byte.
func TestBigCheckpointMemoryBounded(t *testing.T) {
	buildBoundsTools(t)
	h := startBigState(t, plainBin, 100_000_000, 0)
	waitFor(t, 3*time.Minute, "the checkpoint acknowledged", func() bool { return len(noted(h.notes, "ack ")) == 1 })
	pid := h.cmd.Process.Pid
	in := procStatus(pid, "VmHWM")
	resetHWM(t, pid)
	digest := strings.Fields(noted(h.notes, "digest ")[0])[1]
	if err := syscall.Kill(notedPID(t, h.notes), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the restore read", func() bool { return len(noted(h.notes, "restored ")) == 1 })
	out := procStatus(pid, "VmHWM")
	restored := strings.Fields(noted(h.notes, "restored ")[0])
	t.Logf("100 MB v1 checkpoint: supervisor VmHWM %.1f MiB taking it, %.1f MiB restoring it", float64(in)/1024, float64(out)/1024)
	if restored[3] != digest {
		t.Errorf("restored snapshot digest %s, the checkpoint sent was %s", restored[3], digest)
	}
	if in >= 64<<10 || out >= 64<<10 {
		t.Errorf("VmHWM %d kB taking the checkpoint, %d kB restoring it: want each under 64 MiB", in, out)
	}
}

// A large checkpoint damaged in the middle of its file after it was stored
// is found out while its restore is streamed: the agent never reads a
// restore that looks whole with wrong content — its frame is cut short and
// its input closed — and the restore after that passes over the damaged
// checkpoint (here to none: the WAL from sequence 1), logged and counted.
func TestDamagedCheckpointNeverRestoredWhole(t *testing.T) {
	buildBoundsTools(t)
	h := startBigState(t, plainBin, 20_000_000, 10)
	waitFor(t, 3*time.Minute, "the checkpoint and the entries acknowledged", func() bool {
		return len(noted(h.notes, "ack ")) == 1 && len(noted(h.notes, "walack 10")) == 1
	})
	id := strings.Fields(noted(h.notes, "ack ")[0])[1]
	path := filepath.Join(h.dataDir, "checkpoints", id+".ckpt")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := syscall.Kill(notedPID(t, h.notes), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "a restore from the WAL alone", func() bool {
		return len(noted(h.notes, `restored "" `)) == 1
	})
	for _, r := range noted(h.notes, "restored ") {
		if !strings.HasPrefix(r, `restored "" `) || strings.Fields(r)[5] != "10" {
			t.Errorf("the agent read a whole restore: %s", r)
		}
	}
	if cut := noted(h.notes, "cut "); len(cut) != 1 {
		t.Errorf("the agent saw %d restores cut short (%v): want the damaged one", len(cut), cut)
	}
	if n := h.metric("supervisor_checkpoint_corrupt_total"); n < 1 {
		t.Errorf("supervisor_checkpoint_corrupt_total %v: the damaged checkpoint's skip is not counted", n)
	}
}
