package test

// The restore invariant (SPEC §5, issue "Nothing acknowledged is lost"):
// every restore is one acknowledged checkpoint plus every WAL entry after
// it, or the agent is not started and the operator is told. Each test here
// reproduces, through the binary with a Python agent (testdata/
// scripted_agent.py, written from docs/protocol.md), a way the first build
// lost acknowledged data, and asserts on what the agent was given back.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/wal"
)

// missing skips a test whose dependency is not installed — or fails it
// when a long run was asked for (SOAK): a soak that skips would pass
// without having run.
func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("SOAK") != "" {
		t.Fatalf("SOAK=%s asked for a long run, but %s", os.Getenv("SOAK"), why)
	}
	t.Skip(why)
}

// plan is one incarnation's steps for the scripted agent.
type plan []map[string]any

// scripted returns supOpts running the scripted agent with one plan per
// incarnation (the last repeats); its report is the events file.
func scripted(t testing.TB, dataDir string, flags []string, env []string, plans ...plan) supOpts {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		missing(t, "python3 not installed")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import msgpack").Run(); err != nil {
		missing(t, "python3-msgpack not installed (apt-get install python3-msgpack)")
	}
	agentPath, err := filepath.Abs("testdata/scripted_agent.py")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(plans)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(filepath.Dir(dataDir), "report.jsonl")
	for _, e := range env {
		if r, ok := strings.CutPrefix(e, "AGENT_REPORT="); ok {
			report = r // elsewhere than beside the data dir (a disk the test freezes)
		}
	}
	return supOpts{dataDir: dataDir, flags: flags, events: report,
		command: []string{"/usr/bin/python3", agentPath},
		env:     append([]string{"AGENT_REPORT=" + report, "AGENT_PLAN=" + string(b)}, env...)}
}

// restoreOf is what one incarnation was given at its start.
type restoreOf struct {
	CheckpointID string   `json:"checkpoint_id"`
	SnapshotSeqs []uint64 `json:"snapshot_seqs"`
	Entries      []uint64 `json:"entries"`
	LastSequence uint64   `json:"last_sequence"`
	Compressed   bool     `json:"compressed"`
}

// restored returns the restore of the agent's start event e (nil: none).
func restored(t testing.TB, e ev) *restoreOf {
	t.Helper()
	if e["restore"] == nil {
		return nil
	}
	b, _ := json.Marshal(e["restore"])
	var r restoreOf
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// state is the set of sequences a restore gives back.
func (r *restoreOf) state() []uint64 {
	if r == nil {
		return nil
	}
	s := append(slices.Clone(r.SnapshotSeqs), r.Entries...)
	slices.Sort(s)
	return slices.Compact(s)
}

// accepted lists the sequences the agent sent, in events, that the
// supervisor did not refuse (an error reply naming them).
func accepted(events []ev) []uint64 {
	refused := map[uint64]bool{}
	for _, e := range events {
		if e.str("event") != "error" {
			continue
		}
		d, _ := e["details"].(map[string]any)
		first, _ := d["first_sequence"].(float64)
		last, _ := d["last_sequence"].(float64)
		if e.str("code") == "SEQUENCE_CONFLICT" {
			s, _ := d["sequence"].(float64)
			first, last = s, s
		}
		for s := uint64(first); s <= uint64(last) && s != 0; s++ {
			refused[s] = true
		}
	}
	var out []uint64
	for _, e := range events {
		if e.str("event") != "sent" || e["explicit"] == true {
			continue
		}
		for _, v := range e["seqs"].([]any) {
			if s := uint64(v.(float64)); !refused[s] {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func sameSeqs(t testing.TB, what string, got, want []uint64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %d sequences %s, want %d %s", what, len(got), summary(got), len(want), summary(want))
	}
}

func summary(s []uint64) string {
	if len(s) == 0 {
		return "[]"
	}
	var runs []string
	start := s[0]
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i] != s[i-1]+1 {
			runs = append(runs, fmt.Sprintf("%d..%d", start, s[i-1]))
			if i < len(s) {
				start = s[i]
			}
		}
	}
	if len(runs) > 8 {
		runs = append(runs[:4], append([]string{"…"}, runs[len(runs)-3:]...)...)
	}
	return "[" + strings.Join(runs, " ") + "]"
}

// checkpointsBad returns the ids `checkpoints list --json` reports bad.
func checkpointsBad(t testing.TB, dir string) []string {
	t.Helper()
	code, out, stderr := cli(t, "checkpoints", "list", "--data-dir", dir, "--json")
	if code != 0 {
		t.Fatalf("checkpoints list: exit %d %s", code, stderr)
	}
	var metas []checkpoint.Meta
	if err := json.Unmarshal([]byte(out), &metas); err != nil {
		t.Fatalf("checkpoints list --json: %v\n%s", err, out)
	}
	var bad []string
	for _, m := range metas {
		if m.Bad {
			bad = append(bad, m.ID)
		}
	}
	return bad
}

func auditKinds(t testing.TB, dir string) map[string]int {
	n := map[string]int{}
	for _, r := range auditRecords(t, dir) {
		k, _ := r["kind"].(string)
		n[k]++
	}
	return n
}

// TestCrashLoopKeepsState: an agent that crashes right after every restore,
// for a reason of its own, with few retained checkpoints and small WAL
// segments standing in for a log that rolled. The first build marked every
// checkpoint bad (two deaths each), then restored from no checkpoint plus a
// truncated WAL and let retention delete the originals. Now the supervisor
// gives up with the state intact (exit 1, nothing marked bad), and a healthy
// agent later gets every acknowledged entry back. With
// --fallback-on-crash-loop it steps back through older checkpoints, each
// with its whole WAL tail, before giving up — still marking nothing bad.
func TestCrashLoopKeepsState(t *testing.T) {
	work := plan{
		{"log": 300, "size": 400}, {"checkpoint": true},
		{"log": 300, "size": 400}, {"checkpoint": true},
		{"log": 300, "size": 400}, {"checkpoint": true},
		{"log": 137, "size": 400}, {"crash": 1},
	}
	crash := plan{{"crash": 3}}
	healthy := plan{{"stay": true}}
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprintf("fallback=%v", fallback), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			flags := append(slices.Clone(fastFlags), "--checkpoint-retain", "2", "--wal-segment-size", "65536",
				"--max-restarts", "6", "--restart-window", "60s")
			if fallback {
				flags = append(flags, "--fallback-on-crash-loop")
			}
			o := scripted(t, dir, flags, nil, work, crash)
			o.keepAlive = true
			s := startSup(t, o)
			if code := s.wait(90 * time.Second); code != 1 {
				t.Fatalf("supervisor exit code %d, want 1 (gave up on the crash loop)\n%s", code, tail(s.out.String(), 30))
			}
			events := s.allEvents()
			want := accepted(events)
			sameSeqs(t, "entries sent before the crash loop", want, seqRange(1, 1037))
			starts := s.eventsOf("start")
			if len(starts) < 7 {
				t.Fatalf("%d starts, want the first run plus --max-restarts=6 in the crash loop", len(starts))
			}
			for i, st := range starts[1:] {
				sameSeqs(t, fmt.Sprintf("restore of crash-loop start %d", i+1), restored(t, st).state(), want)
			}
			if bad := checkpointsBad(t, dir); len(bad) != 0 {
				t.Fatalf("checkpoints marked bad by a crash loop: %v", bad)
			}
			kinds := auditKinds(t, dir)
			if kinds["checkpoint_marked_bad"] != 0 || kinds["gave_up"] != 1 {
				t.Fatalf("audit kinds %v: want one gave_up and no checkpoint_marked_bad", kinds)
			}
			if !strings.Contains(s.out.String(), "state is intact") {
				t.Fatalf("the give-up message does not say the state is intact:\n%s", tail(s.out.String(), 10))
			}
			if fallback && kinds["crash_loop_fallback"] == 0 {
				t.Fatalf("audit kinds %v: --fallback-on-crash-loop fell back to no older checkpoint", kinds)
			}
			// Once the agent's own problem is fixed, everything comes back.
			s2 := startSup(t, scripted(t, dir, fastFlags, nil, healthy))
			st := s2.waitEvents("start", len(starts)+1, 30*time.Second)
			sameSeqs(t, "restore after the crash loop", restored(t, st[len(st)-1]).state(), want)
		})
	}
}

// TestUnrestorableStateRefusesToStart: when the WAL no longer holds the
// entries above every checkpoint (the only checkpoint is gone and segments
// were deleted below it), no complete restore exists: the agent is not
// started, the supervisor exits 3 with a message saying what to do, and the
// refusal is audited and counted. The first build sent the partial state.
// With --spawn-during-recovery the agent is started before the restore is
// built, and is killed without having been sent a frame: it never starts
// work, and the process is gone from the process table.
func TestUnrestorableStateRefusesToStart(t *testing.T) {
	for _, early := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "spawn-during-recovery"}[early], func(t *testing.T) {
			dir, flags := unrestorableDataDir(t)
			if early {
				flags = append(flags, "--spawn-during-recovery")
			}
			o := scripted(t, dir, flags, []string{"AGENT_REPORT_LAUNCH=1"}, plan{{"stay": true}})
			o.keepAlive = true
			s2 := startSup(t, o)
			if code := s2.wait(30 * time.Second); code != 3 {
				t.Fatalf("exit %d, want 3 (state cannot be restored)\n%s", code, tail(s2.out.String(), 20))
			}
			if n := len(s2.eventsOf("start")); n != 1 {
				t.Fatalf("the agent was started %d more times without its state", n-1)
			}
			out := s2.out.String()
			for _, want := range []string{"cannot be restored completely", "no longer holds the entries", "supervisor restore --data-dir"} {
				if !strings.Contains(out, want) {
					t.Fatalf("output lacks %q:\n%s", want, tail(out, 10))
				}
			}
			if auditKinds(t, dir)["restore_refused"] != 1 {
				t.Fatalf("no restore_refused audit record: %v", auditKinds(t, dir))
			}
			launches := len(s2.eventsOf("launch"))
			if !early {
				if launches != 0 {
					t.Fatalf("%d agents launched", launches)
				}
				return
			}
			// The process may be killed before Python has even reported its launch.
			m := regexp.MustCompile(`agent process started during recovery.* pid=(\d+)`).FindStringSubmatch(out)
			if m == nil || launches > 1 {
				t.Fatalf("want one early agent (%d launched):\n%s", launches, tail(out, 20))
			}
			pid, _ := strconv.Atoi(m[1])
			if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
				t.Fatalf("the early agent (pid %d) outlived the supervisor that refused to restore it: kill 0: %v", pid, err)
			}
		})
	}
}

// TestWALDamagedAfterRecoveryRefusesRestore: a record recovery verified
// is changed on disk while the supervisor runs (its pages are read back
// from a disk that no longer holds what it confirmed). The agent's next
// restore streams the tail and finds the damage as it sends it: that
// restore is cut short (the agent never reads it whole), and the start
// after it reads the whole tail first and is refused with the damage named
// (exit 3, restore_refused), instead of the agent being restarted into the
// same cut restore until it counts as a crash loop. Started again, the
// supervisor recovers as from any damage to durable data.
func TestWALDamagedAfterRecoveryRefusesRestore(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	gate := filepath.Join(root, "damaged")
	o := scripted(t, dir, fastFlags, []string{"AGENT_NO_FINAL_CHECKPOINT=1"},
		plan{{"log": 3000, "size": 1000}, {"stay": true}}, // about 3 MB: a restore streams all but its first 1 MiB
		plan{{"wait_file": gate}, {"crash": 1}},
		plan{{"stay": true}})
	s := startSup(t, o)
	s.waitEvents("staying", 1, 60*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	o.keepAlive = true
	s2 := startSup(t, o)
	s2.waitEvents("start", 2, 60*time.Second) // restored whole from what recovery verified
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(b, 'x') // the file is preallocated: zeros follow the records
	at := bytes.IndexByte(b[end*2/3:], 'x') + end*2/3
	f, err := os.OpenFile(segs[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'y'}, int64(at)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(gate, nil, 0o600); err != nil { // the agent crashes now
		t.Fatal(err)
	}

	if code := s2.wait(60 * time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (state cannot be restored)\n%s", code, tail(s2.out.String(), 30))
	}
	if n := len(s2.eventsOf("start")); n != 2 {
		t.Fatalf("%d starts, want 2: an agent started from a restore with the damaged record in it", n)
	}
	out := s2.out.String()
	for _, want := range []string{"checksum mismatch", "cannot be restored completely", "supervisor wal dump --data-dir"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, tail(out, 20))
		}
	}
	if auditKinds(t, dir)["restore_refused"] != 1 {
		t.Fatalf("no restore_refused audit record: %v", auditKinds(t, dir))
	}

	// Started again, the supervisor's recovery meets the damage itself and
	// does what it does with damage to durable data (SPEC §4): the log is
	// cut there, loudly, the damaged file kept, and the agent restored from
	// the good prefix — never with the damaged entry.
	s3 := startSup(t, o)
	r := restored(t, s3.waitEvents("start", 3, 60*time.Second)[2])
	got := r.state()
	if len(got) == 0 || len(got) >= 3000 {
		t.Fatalf("restore after the restart: %d entries, want the good prefix of the 3000", len(got))
	}
	sameSeqs(t, "restore after the restart", got, seqRange(1, uint64(len(got))))
	if out := s3.out.String(); !strings.Contains(out, "WAL CORRUPTION") || !strings.Contains(out, "checksum mismatch") {
		t.Fatalf("the restart did not report the damage:\n%s", tail(out, 20))
	}
	if kept, _ := filepath.Glob(filepath.Join(dir, "wal", "*.corrupt-*")); len(kept) == 0 {
		t.Fatal("the damaged segment was not kept for inspection")
	}
	s3.signal(syscall.SIGTERM)
	if code := s3.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after the restart", code)
	}
}

// unrestorableDataDir makes a data directory whose only checkpoint is gone
// and whose WAL was truncated below it: no complete restore exists. flags
// are the ones it was made with.
func unrestorableDataDir(t *testing.T) (dir string, flags []string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "data")
	flags = append(slices.Clone(fastFlags), "--checkpoint-retain", "1", "--wal-segment-size", "65536")
	s := startSup(t, scripted(t, dir, flags, []string{"AGENT_NO_FINAL_CHECKPOINT=1"},
		plan{{"log": 400, "size": 400}, {"checkpoint": true}, {"log": 20, "size": 400}, {"stay": true}}))
	s.waitEvents("staying", 1, 60*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*.ckpt"))
	if len(files) != 1 {
		t.Fatalf("%d checkpoints, want 1", len(files))
	}
	os.Remove(files[0]) // the checkpoint the truncated WAL depends on
	return dir, flags
}

// TestSequenceConflictsAreNeverSilent: an agent that does not keep its last
// sequence numbers from 1 again after a restore; the first build dropped
// those entries as duplicates without a word. Now each is answered
// SEQUENCE_CONFLICT (with sequence and last_sequence), audited and counted;
// a byte-identical replay is still skipped silently; a sequence near 2^63
// is refused and does not wedge the log; restore.last_sequence tells the
// agent where to continue, and the restore holds exactly what was accepted.
func TestSequenceConflictsAreNeverSilent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, fastFlags, nil,
		plan{{"log": 50}, {"checkpoint": true}, {"log": 20}, {"crash": 1}},
		plan{
			{"log": 5, "from": 1, "tag": "new"}, // renumbered from 1: conflicts
			{"log": 3, "from": 61},              // identical replays: skipped silently
			{"entry": uint64(1) << 62},          // an absurd jump: refused
			{"log": 10, "from": 71},             // continuing above last_sequence
			{"sleep": 0.5}, {"crash": 1}},
		plan{{"stay": true}}))
	starts := s.waitEvents("start", 3, 60*time.Second)
	r1 := restored(t, starts[1])
	if r1.LastSequence != 70 {
		t.Fatalf("restore.last_sequence = %d, want 70", r1.LastSequence)
	}
	errs := s.eventsOf("error")
	var conflicts []uint64
	for _, e := range errs {
		if e.str("code") != "SEQUENCE_CONFLICT" {
			t.Fatalf("unexpected error reply %v", e)
		}
		d := e["details"].(map[string]any)
		if d["last_sequence"].(float64) != 70 {
			t.Fatalf("conflict details %v: last_sequence want 70", d)
		}
		conflicts = append(conflicts, uint64(d["sequence"].(float64)))
	}
	sameSeqs(t, "conflicting sequences", conflicts, append(seqRange(1, 5), 1<<62))
	sameSeqs(t, "restore after the conflicts", restored(t, starts[2]).state(), seqRange(1, 80))
	if got := auditKinds(t, dir)["sequence_conflict"]; got != 6 {
		t.Fatalf("%d sequence_conflict audit records, want 6", got)
	}
	if v := s.metric("supervisor_wal_errors_total", `code="SEQUENCE_CONFLICT"`); v != 6 {
		t.Fatalf("supervisor_wal_errors_total{code=SEQUENCE_CONFLICT} = %v, want 6", v)
	}
}

// TestLongWALTailStaysRestorable: an agent that logs large entries and
// never checkpoints. The first build accepted a tail larger than a restore
// may be and then could never start the agent again. Now entries that would
// outgrow the restore are refused with WAL_FULL telling the agent to
// checkpoint; every accepted entry is restored; after a checkpoint, appends
// resume. (--max-frame-size scales the 128 MiB default down to 2 MiB.)
func TestLongWALTailStaysRestorable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, append(slices.Clone(fastFlags), "--max-frame-size", "2097152"), nil,
		plan{{"log": 400, "size": 9000}, {"sleep": 0.5}, {"crash": 1}},
		plan{{"checkpoint": true}, {"log": 50, "size": 9000}, {"sleep": 0.5}, {"crash": 1}},
		plan{{"stay": true}}))
	starts := s.waitEvents("start", 3, 60*time.Second)
	first := s.allEvents()
	var full int
	for _, e := range first {
		if e.str("event") == "error" {
			if e.str("code") != "WAL_FULL" || !strings.Contains(e.str("message"), "checkpoint") {
				t.Fatalf("refusal %v: want WAL_FULL telling the agent to checkpoint", e)
			}
			full++
		}
	}
	if full == 0 {
		t.Fatal("400 entries of 9 KB under a 2 MiB restore limit were all accepted")
	}
	acc := accepted(first)
	if len(acc) < 150 || len(acc) >= 400 {
		t.Fatalf("%d entries accepted, want a prefix of most of the 2 MiB", len(acc))
	}
	r1 := restored(t, starts[1])
	sameSeqs(t, "restore of the long tail", r1.state(), seqRange(1, uint64(len(acc))))
	r2 := restored(t, starts[2])
	if r2.CheckpointID == "" {
		t.Fatal("the second incarnation's checkpoint was not restored")
	}
	sameSeqs(t, "restore after checkpoint and 50 more", r2.state(), seqRange(1, uint64(len(acc))+50))
}

// TestV2AgentGetsCompressedRestoreAfterSupervisorRestart: an agent that
// speaks protocol v2 gets a compressed restore of a large snapshot also on
// the first start after a supervisor restart (the first build forgot the
// agent's version with the process).
func TestV2AgentGetsCompressedRestoreAfterSupervisorRestart(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import zstandard").Run(); err != nil {
		t.Skip("python3-zstandard not installed")
	}
	dir := filepath.Join(t.TempDir(), "data")
	env := []string{"AGENT_VERSION=2", "AGENT_NO_FINAL_CHECKPOINT=1"}
	s := startSup(t, scripted(t, dir, fastFlags, env, plan{{"log": 10}, {"checkpoint": true, "pad": 3 << 20}, {"stay": true}}))
	s.waitEvents("ack", 1, 60*time.Second)
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	s2 := startSup(t, scripted(t, dir, fastFlags, env, plan{{"stay": true}}))
	st := s2.waitEvents("start", 2, 60*time.Second)
	r := restored(t, st[1])
	if !r.Compressed {
		t.Fatal("the first restore after a supervisor restart was not compressed for a v2 agent")
	}
	sameSeqs(t, "compressed restore", r.state(), seqRange(1, 10))
}

// TestFlippedByteBelowCheckpointCostsNothing: a corrupt record in a WAL
// segment wholly below the newest checkpoint's watermark. The first build
// cut the log there and set aside the intact newer segments too, losing the
// durable entries after the checkpoint. Now the damaged segment is set aside
// and reported, and the restore is the checkpoint plus every entry after it.
func TestFlippedByteBelowCheckpointCostsNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	flags := append(slices.Clone(fastFlags), "--wal-segment-size", "65536", "--checkpoint-retain", "5")
	s := startSup(t, scripted(t, dir, flags, []string{"AGENT_NO_FINAL_CHECKPOINT=1"},
		plan{{"log": 200, "size": 400}, {"checkpoint": true}, {"log": 200, "size": 400}, {"checkpoint": true},
			{"log": 279, "size": 400}, {"stay": true}}))
	s.waitEvents("staying", 1, 60*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Damage a segment wholly below the newest checkpoint's watermark (400)
	// that the older checkpoint (200) still keeps.
	info, err := wal.Inspect(filepath.Join(dir, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	var victim string
	for _, sg := range info.Segments {
		if sg.Last != 0 && sg.Last <= 400 && sg.First > 200 {
			victim = filepath.Join(dir, "wal", sg.Name)
		}
	}
	if victim == "" {
		t.Fatalf("no segment wholly within (200, 400]: %+v", info.Segments)
	}
	f, err := os.OpenFile(victim, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	f.ReadAt(b, 30000)
	b[0] ^= 0x5a
	f.WriteAt(b, 30000)
	f.Close()

	s2 := startSup(t, scripted(t, dir, flags, nil, plan{{"stay": true}}))
	st := s2.waitEvents("start", 2, 30*time.Second)
	sameSeqs(t, "restore after a flipped byte below the checkpoint", restored(t, st[1]).state(), seqRange(1, 679))
	moved, _ := filepath.Glob(filepath.Join(dir, "wal", "*.corrupt-*"))
	if len(moved) == 0 {
		t.Fatal("the damaged segment was not set aside for inspection")
	}
	found := false
	for _, r := range auditRecords(t, dir) {
		f, _ := r["fields"].(map[string]any)
		found = found || (r["kind"] == "wal_error" && f["covered_by_checkpoint"] == true)
	}
	if !found {
		t.Fatal("the damage was not reported in the audit log")
	}
}

// TestClockStepBackDoesNotPruneNewCheckpoints: checkpoints dated a year in
// the future (a wall clock that has since stepped back). The first build
// ordered checkpoints by creation time, so each new checkpoint was pruned
// as "oldest" right after its ack. Now the store's order is the order of
// saves: the new checkpoint is kept and restored from.
func TestClockStepBackDoesNotPruneNewCheckpoints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	future := time.Now().Add(365 * 24 * time.Hour)
	st, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{Now: func() time.Time { return future }})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := st.Save([]byte{0x81, 0xa4, 's', 'e', 'q', 's', 0x90}, 0); err != nil { // {"seqs": []}
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o700)
	s := startSup(t, scripted(t, dir, append(slices.Clone(fastFlags), "--checkpoint-retain", "2"), nil,
		plan{{"log": 10}, {"checkpoint": true}, {"log": 5}, {"sleep": 0.3}, {"crash": 1}},
		plan{{"stay": true}}))
	starts := s.waitEvents("start", 2, 60*time.Second)
	acks := s.eventsOf("ack")
	if len(acks) != 1 {
		t.Fatalf("%d acks, want 1", len(acks))
	}
	id := acks[0].str("checkpoint_id")
	r := restored(t, starts[1])
	if r.CheckpointID != id {
		t.Fatalf("restored from %q, want the new checkpoint %s (pruned as old?)", r.CheckpointID, id)
	}
	sameSeqs(t, "restore", r.state(), seqRange(1, 15))
	if _, err := os.Stat(filepath.Join(dir, "checkpoints", id+".ckpt")); err != nil {
		t.Fatalf("the new checkpoint is gone: %v", err)
	}
}
