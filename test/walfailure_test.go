package test

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/internal/crashfs"
)

// A failed fsync of a WAL segment (crashfs injects EIO with Linux
// semantics: the pages are dropped, a later fsync "succeeds") is visible to
// the operator and to the agent, and heals without losing anything
// acknowledged (issue 22, SPEC §4 "A failed fsync is never retried as if
// the data were safe"):
//   - while the WAL cannot be reopened (every WAL fsync fails), /readyz is
//     503 saying so, the log and the audit log name the failed range, and
//     supervisor_wal_fsync_failures_total counts it;
//   - the agent gets WAL_FAILED naming the sequences that are not in the log;
//   - once the disk works again the log is reopened, the agent is restarted
//     (reason wal_failed) from what the log holds, and goes on being
//     acknowledged; every entry acknowledged before is in its restore;
//   - however many retries that took, the supervisor did not give up on a
//     crash loop (--max-restarts 2).
func TestWALFsyncFailureSeenAndHealed(t *testing.T) {
	if err := crashfs.Available(); err != nil {
		t.Skipf("needs crashfs: %v", err)
	}
	agentPath := powerlossAgent(t)
	dir := t.TempDir()
	mnt, back := filepath.Join(dir, "mnt"), filepath.Join(dir, "back")
	for _, d := range []string{mnt, back} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var failing atomic.Bool
	fsys, err := crashfs.Mount(mnt, back, crashfs.Options{FailFsync: func(c crashfs.Fsync) bool {
		return failing.Load() && strings.HasPrefix(c.Path, dataRel+"/wal")
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })

	record := filepath.Join(dir, "record.jsonl") // off the failing disk
	// A low crash-loop limit: the restarts (and reopen retries) a stopped WAL
	// causes are not the agent's failures and must not add up to giving up.
	flags := append(slices.Clone(fastFlags), "--wal-sync", "batch", "--max-restarts", "2")
	s := startSup(t, supOpts{dataDir: filepath.Join(mnt, dataRel), flags: flags, command: []string{agentPath},
		events: record, env: []string{"PL_RECORD=" + record}})
	waitFor(t, time.Minute, "entries acknowledged", func() bool { return len(plRecords(t, record, "ack")) >= 200 })

	failing.Store(true)
	waitFor(t, time.Minute, "the failure counted", func() bool {
		return s.metric("supervisor_wal_fsync_failures_total") >= 1
	})
	waitFor(t, time.Minute, "/readyz failing while the WAL is stopped", func() bool {
		code, body := s.get("/readyz")
		return code == 503 && strings.Contains(body, "the WAL failed")
	})
	waitFor(t, time.Minute, "the agent told which entries are not in the log", func() bool {
		for _, e := range plRecords(t, record, "fail") {
			if strings.Contains(e.Err, "WAL_FAILED") || strings.Contains(e.Err, "not in the log") {
				return true
			}
		}
		return false
	})
	out := s.out.String()
	if !strings.Contains(out, "WAL write or fsync failed: the log stopped") || !strings.Contains(out, "first_sequence=") {
		t.Fatalf("no log line naming the failed range:\n%s", tail(out, 20))
	}
	waitFor(t, 30*time.Second, "an audit record naming the failed range", func() bool {
		for _, r := range auditRecords(t, s.dataDir) {
			f, _ := r["fields"].(map[string]any)
			if r["kind"] == "wal_error" && f["first_sequence"] != nil && f["last_sequence"] != nil && f["durable_sequence"] != nil {
				return true
			}
		}
		return false
	})
	acked := plRecords(t, record, "ack")
	// The log cannot be reopened while every WAL fsync fails: the start is
	// retried, more often than --max-restarts allows a crash loop.
	waitFor(t, time.Minute, "the start retried while the WAL cannot be reopened", func() bool {
		return s.metric("supervisor_agent_restarts_total", `reason="wal_failed"`) >= 4
	})

	// The disk works again: the log reopens and the agent is restored from it.
	failing.Store(false)
	waitFor(t, time.Minute, "/readyz ready again", func() bool {
		code, _ := s.get("/readyz")
		return code == 200
	})
	if n := s.metric("supervisor_agent_restarts_total", `reason="wal_failed"`); n < 1 {
		t.Fatalf("restarts for the stopped WAL: %v, want at least 1", n)
	}
	starts := plRecords(t, record, "start")
	last := starts[len(starts)-1]
	waitFor(t, time.Minute, "the restarted agent acknowledged again", func() bool {
		for _, e := range plRecords(t, record, "ack") {
			if e.PID == last.PID {
				return true
			}
		}
		return false
	})
	if last.Restore == nil {
		t.Fatal("the restarted agent got no restore")
	}
	held := append(slices.Clone(last.Restore.Snap), last.Restore.WAL...)
	for _, a := range acked {
		if !inRanges(held, a.S) {
			t.Fatalf("acknowledged entry %d is not in the restore after the WAL was reopened (restore %+v)", a.S, *last.Restore)
		}
	}
}

// plRecords reads the power-loss agent's record file and returns its
// events of kind e.
func plRecords(t *testing.T, path, e string) []plEvent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	defer f.Close()
	var out []plEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev plEvent
		if decodeEventLine(sc.Bytes(), &ev) && ev.E == e {
			out = append(out, ev)
		}
	}
	return out
}

func inRanges(rs [][2]uint64, s uint64) bool {
	for _, r := range rs {
		if s >= r[0] && s <= r[1] {
			return true
		}
	}
	return false
}
