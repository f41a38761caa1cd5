package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
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
