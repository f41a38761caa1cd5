package test

// Issue 33, the edges: each case through the built binary, asserting on what
// an agent or an operator sees.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reportLines returns the lines of an agent's report file.
func reportLines(path string) []string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// An agent that sends keys and values that are not UTF-8 gets error replies
// that quote them; every frame it receives decodes with a strict decoder
// (Python's msgpack, raw=False, as the Python client reads), the bytes shown
// as \xNN escapes. Before, a reply quoting a key path carried the raw bytes
// in a str, and a strict agent crashed on it, in a loop.
func TestInvalidUTF8NeverReachesTheAgent(t *testing.T) {
	requirePythonMsgpack(t)
	report := filepath.Join(t.TempDir(), "report")
	agent, err := filepath.Abs("testdata/utf8_agent.py")
	if err != nil {
		t.Fatal(err)
	}
	// The agent never exits on shutdown: a short wait at cleanup.
	s := startSup(t, supOpts{command: []string{python, agent}, env: []string{"AGENT_REPORT=" + report}, flags: []string{"--shutdown-timeout", "1s"}})
	var sent int
	waitFor(t, 60*time.Second, "the hostile messages sent and each answered", func() bool {
		errs := 0
		for _, l := range reportLines(report) {
			if n, ok := strings.CutPrefix(l, "sent "); ok {
				sent, _ = strconv.Atoi(n)
			}
			if strings.HasPrefix(l, "frame error ") || strings.HasPrefix(l, "undecodable ") {
				errs++
			}
		}
		return sent > 0 && errs >= sent
	})
	var escaped bool
	for _, l := range reportLines(report) {
		if strings.HasPrefix(l, "undecodable ") {
			t.Errorf("a strict decoder refused a frame from the supervisor: %s", l)
		}
		if body, ok := strings.CutPrefix(l, "frame error "); ok {
			var e struct {
				Code, Message string
				Details       map[string]any
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			if e.Code != "INVALID_MESSAGE" {
				t.Errorf("reply %s, want INVALID_MESSAGE", body)
			}
			if strings.Contains(e.Message, `lat\xff\xfency`) && e.Details["field"] == `data.lat\xff\xfency` {
				escaped = true
			}
		}
	}
	if !escaped {
		t.Errorf("no reply names the field data.lat\\xff\\xfency with its bytes escaped; report:\n%s", strings.Join(reportLines(report), "\n"))
	}
	if r := s.metric("supervisor_agent_restarts_total"); r > 0 {
		t.Errorf("the agent was restarted %v times", r)
	}
}

// A frame above the largest one any message may have (a checkpoint: 100 MiB
// plus 16 KiB) but within --max-frame-size is read and thrown away in small
// pieces by its length, never held: the agent gets the same INVALID_MESSAGE
// too_large reply as before, the stream stays in step (the next checkpoint
// is acknowledged), and the supervisor's peak memory stays under 64 MiB.
// Before, each such frame was read whole first: four of 120 MiB cost the
// supervisor hundreds of MiB.
func TestOversizeFramesDiscardedUnread(t *testing.T) {
	buildBoundsTools(t)
	const size, count = 120 << 20, 4
	notes := filepath.Join(t.TempDir(), "notes")
	h := &hostileRun{notes: notes, sup: startSup(t, supOpts{bin: plainBin, command: []string{hostilePath, "oversize"}, flags: []string{"--shutdown-timeout", "1s"},
		env: []string{"HOSTILE_OUT=" + notes, "HOSTILE_SIZE=" + strconv.Itoa(size), "HOSTILE_COUNT=" + strconv.Itoa(count)}})}
	waitFor(t, 3*time.Minute, "every oversize frame answered and the small checkpoint acknowledged", func() bool {
		return len(noted(h.notes, "sent all")) == 1 && len(noted(h.notes, "error INVALID_MESSAGE")) >= count && len(noted(h.notes, "ack ")) >= 1
	})
	hwm := procStatus(h.cmd.Process.Pid, "VmHWM")
	t.Logf("supervisor VmHWM %.1f MiB after %d checkpoint frames of %d MiB", float64(hwm)/1024, count, size>>20)
	if hwm <= 0 || hwm >= 64<<10 {
		t.Errorf("VmHWM %d kB, want under 64 MiB", hwm)
	}
	if n := len(noted(h.notes, "error ")); n != count {
		t.Errorf("%d error replies, want %d (one per oversize frame)", n, count)
	}
	if r := h.metric("supervisor_agent_restarts_total"); r > 0 {
		t.Errorf("the agent was restarted %v times", r)
	}
	if !strings.Contains(h.out.String(), "too_large") {
		t.Errorf("the supervisor's log does not say the frames were too large")
	}
}

// reportEvents reads the scripted agent's report keeping integers exact
// (sequences near 2^62 do not survive a float64).
func reportEvents(t *testing.T, path string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range reportLines(path) {
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber()
		var m map[string]any
		if d.Decode(&m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Sequences run from 1 to 2^62 − 1 with any gap (SPEC §4: agents number by
// Unix nanoseconds or snowflake ids): 1, 2^40 and 2^62 − 1 are accepted and
// come back in the next restore; 2^62 is refused with SEQUENCE_CONFLICT.
// Before, a gap over 2^32 was refused.
func TestSequencesUpToTheCeiling(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	const big, top, ceiling = "1099511627776", "4611686018427387903", "4611686018427387904"
	o := scripted(t, dataDir, nil, nil,
		plan{{"entry": 1}, {"entry": uint64(1) << 40}, {"entry": uint64(1)<<62 - 1}, {"entry": uint64(1) << 62}, {"sleep": 1}, {"crash": 1}},
		plan{{"stay": true}})
	s := startSup(t, o)
	var restore map[string]any
	waitFor(t, 60*time.Second, "the agent's second start", func() bool {
		for _, e := range reportEvents(t, s.events) {
			if e["event"] == "start" && e["incarnation"] == json.Number("1") {
				restore, _ = e["restore"].(map[string]any)
				return true
			}
		}
		return false
	})
	var conflicts []string
	for _, e := range reportEvents(t, s.events) {
		if e["event"] == "error" {
			d, _ := e["details"].(map[string]any)
			if e["code"] != "SEQUENCE_CONFLICT" {
				t.Errorf("error %v %v: %v", e["code"], e["message"], d)
				continue
			}
			conflicts = append(conflicts, fmt.Sprint(d["sequence"]))
		}
	}
	if len(conflicts) != 1 || conflicts[0] != ceiling {
		t.Errorf("SEQUENCE_CONFLICT for %v, want exactly one, for %s", conflicts, ceiling)
	}
	if restore == nil {
		t.Fatal("the second start got no restore")
	}
	if got := fmt.Sprint(restore["entries"]); got != "[1 "+big+" "+top+"]" {
		t.Errorf("restored entries %s, want [1 %s %s]", got, big, top)
	}
	if got := fmt.Sprint(restore["last_sequence"]); got != top {
		t.Errorf("restore.last_sequence %s, want %s", got, top)
	}
}

// mountReadOnly mounts an empty tmpfs at a new directory, with the
// subdirectory data (mode 0700) in it, and remounts it read-only; it skips
// the test where mounting is not allowed (not root, no CAP_SYS_ADMIN).
func mountReadOnly(t *testing.T) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "mode=0700,size=1m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s): run as root", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	if err := os.Mkdir(filepath.Join(mnt, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "remount,ro", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount read-only: %v: %s", err, out)
	}
	return mnt
}

// A data directory on a read-only file system — existing, or to be created
// there — is refused at start with exit 2 and a message that says so and
// what to do. Before, an existing one was reported as a failure to open
// LOCK with "(a symlink there is refused; remove it)", exit 1.
func TestReadOnlyDataDirSaysSo(t *testing.T) {
	mnt := mountReadOnly(t)
	for _, dir := range []string{filepath.Join(mnt, "data"), filepath.Join(mnt, "new", "data")} {
		code, _, stderr := cli(t, "run", "--data-dir", dir, "--http-addr", "", "--", "true")
		if code != 2 {
			t.Errorf("%s: exit %d, want 2; stderr:\n%s", dir, code, stderr)
		}
		last := tail(strings.TrimSpace(stderr), 1)
		for _, want := range []string{"the data directory " + dir + " is on a read-only file system", "Mount it read-write", "--data-dir"} {
			if !strings.Contains(last, want) {
				t.Errorf("%s: the error does not say %q:\n%s", dir, want, last)
			}
		}
		if strings.Contains(stderr, "symlink") {
			t.Errorf("%s: the error still guesses at a symlink:\n%s", dir, stderr)
		}
	}
}

// A checkpoint file replaced by a symlink (files in the data directory are
// never followed, SPEC §9) is ignored, and the operator is told which one:
// a warning at start naming it, and one from `supervisor checkpoints list`.
// Before, it was skipped without a word.
func TestSymlinkedCheckpointIsNamed(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	o := scripted(t, dataDir, nil, []string{"AGENT_NO_FINAL_CHECKPOINT=1"},
		plan{{"log": 3}, {"checkpoint": true}, {"stay": true}})
	s := startSup(t, o)
	s.waitEvents("ack", 1, 60*time.Second)
	s.signal(syscall.SIGTERM)
	if code := s.wait(30 * time.Second); code != 0 {
		t.Fatalf("first run exited %d", code)
	}
	files, _ := filepath.Glob(filepath.Join(dataDir, "checkpoints", "*.ckpt"))
	if len(files) != 1 {
		t.Fatalf("checkpoint files %v, want one", files)
	}
	moved := filepath.Join(t.TempDir(), "moved.ckpt")
	if err := os.Rename(files[0], moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, files[0]); err != nil {
		t.Fatal(err)
	}
	o.flags = []string{"--max-restarts", "0"}
	s2 := startSup(t, o)
	s2.waitOutput("checkpoint file ignored", 60*time.Second)
	out := s2.out.String()
	if !strings.Contains(out, files[0]) || !strings.Contains(out, "symlink") {
		t.Errorf("the warning does not name %s as a symlink:\n%s", files[0], tail(out, 20))
	}
	code, stdout, stderr := cli(t, "checkpoints", "list", "--data-dir", dataDir)
	if !strings.Contains(stderr, "checkpoint file ignored") || !strings.Contains(stderr, files[0]) {
		t.Errorf("checkpoints list (exit %d) does not name the ignored file; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// An unknown flag followed by its value is named as the unknown flag (exit
// 2), not reported as an unexpected argument (its value); an agent command
// without "--" is still reported as such. Before, `--bogus 3` said
// `unexpected argument "3"`.
func TestUnknownFlagWithValueIsNamed(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus", "3", "--", "true"}, "unknown flag --bogus"},
		{[]string{"--max-restarts", "3", "--bogus", "3", "--", "true"}, "unknown flag --bogus"},
		{[]string{"--bogus=3", "./agent"}, "unknown flag --bogus"},
		{[]string{"./agent", "--bogus", "3"}, `unexpected argument "./agent": the agent command goes after --`},
	} {
		code, _, stderr := cli(t, append([]string{"run", "--data-dir", dataDir}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("run %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
		if strings.HasPrefix(tc.want, "unknown") && strings.Contains(stderr, "unexpected argument") {
			t.Errorf("run %s: %q still blames the flag's value", strings.Join(tc.args, " "), stderr)
		}
	}
	if _, err := os.Stat(dataDir); err == nil {
		t.Errorf("a refused command line created the data directory")
	}
}
