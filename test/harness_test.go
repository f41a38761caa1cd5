// Package test holds end-to-end tests: they build the real supervisor binary
// and run it with the test agent (internal/testagent: this test binary,
// re-executed) over real pipes, files, sockets and an HTTP listener.
package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/internal/testagent"
)

var binPath, floodPath string

// testAgentPath is this test binary: with testagent.EnvRunAgent=1 (set for
// every process the tests start) it is the test agent instead.
var testAgentPath string

// agentCommand is the command line of the test agent with flags.
func agentCommand(flags ...string) []string {
	return append([]string{testAgentPath}, flags...)
}

func TestMain(m *testing.M) {
	if os.Getenv(envReqAgent) != "" {
		os.Exit(runReqAgent()) // the request agent (reqagent_test.go)
	}
	testagent.MainIfAgent()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "locating the test binary (it doubles as the test agent):", err)
		os.Exit(1)
	}
	testAgentPath = self
	// Inherited by every supervisor the tests start, and by its agents.
	os.Setenv(testagent.EnvRunAgent, "1")
	dir, err := os.MkdirTemp("", "supervisor-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "supervisor")
	args := []string{"build", "-o", binPath}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "../cmd/supervisor")
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the supervisor binary failed:", err)
		os.Exit(1)
	}
	floodPath = filepath.Join(dir, "floodagent")
	if out, err := exec.Command("go", "build", "-o", floodPath, "../examples/floodagent").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the flood agent failed: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer is a goroutine-safe buffer for a child's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// supOpts configures one supervisor run.
type supOpts struct {
	dataDir   string   // default: a new t.TempDir()
	flags     []string // supervisor run flags (besides --data-dir and --http-addr)
	agent     []string // test agent flags; ignored when command is set
	command   []string // a custom agent command
	env       []string // extra environment (REFAGENT_* etc.)
	noHTTP    bool
	noEvents  bool      // no --events file (benchmarks: it costs a write per entry)
	events    string    // events file; default: beside the data dir
	keepAlive bool      // do not stop it at test cleanup (the test waits for its exit)
	bin       string    // the supervisor binary; default binPath
	wrap      []string  // a command that runs the supervisor (prlimit ... --)
	stderr    io.Writer // the supervisor's stderr; default: with stdout in out
}

type sup struct {
	t        testing.TB
	cmd      *exec.Cmd
	dataDir  string
	events   string
	out      *syncBuffer
	done     chan struct{}
	code     int
	exitedAt time.Time // when its exit was seen (set before done is closed)

	addrMu sync.Mutex
	addr   string // the HTTP address the supervisor bound, once read
	noHTTP bool
}

// startSup starts `supervisor run` with the test agent. The supervisor
// picks its own HTTP port (127.0.0.1:0); [sup.httpAddr] reads it back.
func startSup(t testing.TB, o supOpts) *sup {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = filepath.Join(t.TempDir(), "data")
	}
	if o.bin == "" {
		o.bin = binPath
	}
	s := &sup{t: t, dataDir: o.dataDir, out: &syncBuffer{}, done: make(chan struct{}), noHTTP: o.noHTTP}
	s.events = filepath.Join(filepath.Dir(o.dataDir), "events.jsonl")
	if o.events != "" {
		s.events = o.events
	}
	args := []string{"run", "--data-dir", o.dataDir}
	if o.noHTTP {
		args = append(args, "--http-addr", "")
	} else {
		args = append(args, "--http-addr", "127.0.0.1:0")
	}
	args = append(args, o.flags...)
	if !strings.Contains(strings.Join(o.flags, " "), "--wal-segment-size") {
		// Segments are pre-allocated and zero-filled: keep test data dirs small.
		args = append(args, "--wal-segment-size", "4194304")
	}
	args = append(args, "--")
	if o.command != nil {
		args = append(args, o.command...)
	} else {
		args = append(args, testAgentPath)
		if !o.noEvents {
			args = append(args, "--events", s.events)
		}
		args = append(args, o.agent...)
	}
	argv := append(append(append([]string(nil), o.wrap...), o.bin), args...)
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Env = append(os.Environ(), o.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if o.stderr != nil {
		s.cmd.Stderr = o.stderr
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = s.cmd.Wait()
		s.code = s.cmd.ProcessState.ExitCode()
		s.exitedAt = time.Now()
		close(s.done)
	}()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(20 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
		if t.Failed() {
			t.Logf("supervisor output:\n%s", tail(s.out.String(), 60))
		}
	})
	return s
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// wait waits for the supervisor to exit and returns its exit code.
func (s *sup) wait(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.done:
		return s.code
	case <-time.After(timeout):
		s.t.Fatalf("supervisor did not exit within %s", timeout)
		return -1
	}
}

func (s *sup) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

// ev is one test agent event.
type ev map[string]any

func (e ev) str(k string) string { v, _ := e[k].(string); return v }

func (e ev) num(k string) float64 { v, _ := e[k].(float64); return v }

func (e ev) int(k string) int { return int(e.num(k)) }

// readEvents parses the test agent's events file (a torn last line is
// ignored).
func readEvents(path string) []ev {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []ev
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e ev
		if decodeEventLine(sc.Bytes(), &e) {
			out = append(out, e)
		}
	}
	return out
}

// decodeEventLine decodes one line of an events file that agents append
// to, one write(2) per event. A SIGKILL can cut such a write short at a
// page boundary (the kernel checks for a fatal signal between the pages it
// copies), and the next agent's first event is then appended to the torn
// one: the line is recovered from the first '{' from which the rest of it
// decodes. Before, that event was lost; a test that read the newest
// agent's pid from its "start" event killed a dead one.
func decodeEventLine(line []byte, v any) bool {
	for off := 0; off < len(line); {
		if json.Unmarshal(line[off:], v) == nil {
			return true
		}
		i := bytes.IndexByte(line[off+1:], '{')
		if i < 0 {
			return false
		}
		off += 1 + i
	}
	return false
}

func (s *sup) allEvents() []ev { return readEvents(s.events) }

func (s *sup) eventsOf(kind string) []ev {
	var out []ev
	for _, e := range s.allEvents() {
		if e.str("event") == kind {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEvents waits until at least n events of kind exist and returns them.
func (s *sup) waitEvents(kind string, n int, timeout time.Duration) []ev {
	s.t.Helper()
	var got []ev
	waitFor(s.t, timeout, fmt.Sprintf("%d %q events", n, kind), func() bool {
		got = s.eventsOf(kind)
		return len(got) >= n
	})
	return got
}

// waitOutput waits until the supervisor's output contains sub.
func (s *sup) waitOutput(sub string, timeout time.Duration) {
	s.t.Helper()
	waitFor(s.t, timeout, fmt.Sprintf("output %q", sub), func() bool { return strings.Contains(s.out.String(), sub) })
}

// httpAddr returns the address the supervisor's HTTP listener bound, read
// from `supervisor status` (which names the bound port, not 0) the first
// time and kept. It fails the test if the supervisor exits first.
func (s *sup) httpAddr() string {
	s.t.Helper()
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	if s.addr != "" {
		return s.addr
	}
	if s.noHTTP {
		s.t.Fatal("httpAddr: this supervisor runs without HTTP")
	}
	deadline := time.Now().Add(60 * time.Second)
	for s.addr == "" {
		code, out, _ := cli(s.t, "status", "--data-dir", s.dataDir, "--json")
		var st struct {
			HTTPAddr string `json:"http_addr"`
		}
		if code == 0 && json.Unmarshal([]byte(out), &st) == nil && st.HTTPAddr != "" {
			s.addr = st.HTTPAddr
			break
		}
		select {
		case <-s.done:
			s.t.Fatalf("the supervisor exited (code %d) before its HTTP address could be read", s.code)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.t.Fatal("timed out reading the supervisor's HTTP address from `supervisor status`")
		}
	}
	return s.addr
}

// url is the supervisor's HTTP URL for path.
func (s *sup) url(path string) string { return "http://" + s.httpAddr() + path }

func (s *sup) get(path string) (int, string) {
	s.t.Helper()
	resp, err := http.Get(s.url(path))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *sup) post(path, body string) (int, string) {
	s.t.Helper()
	resp, err := http.Post(s.url(path), "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of the sample whose name and labels match (labels
// given as `k="v"` strings, all of which must appear), or -1 when absent.
func (s *sup) metric(name string, labels ...string) float64 {
	s.t.Helper()
	code, body := s.get("/metrics")
	if code != 200 {
		return -1
	}
	return metricValue(body, name, labels...)
}

func metricValue(body, name string, labels ...string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

// cli runs a supervisor subcommand and returns its exit code and output.
func cli(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// auditKinds returns the kinds of the audit records in a data dir.
func auditRecords(t testing.TB, dataDir string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "audit.jsonl"))
	if err != nil {
		return nil
	}
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestReadEventsAfterATornWrite: an agent killed while it appended an
// event leaves the line cut short (seen here: 2 of 60 kill -9s of a writer
// appending 330-byte lines cut one at a page boundary); the next agent's
// "start" follows it on the same line and must still be read.
func TestReadEventsAfterATornWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events")
	whole := `{"event":"applied","pid":7,"seq":41,"params":{"a":1}}` + "\n"
	torn := `{"event":"applied","pid":7,"seq":42,"par`
	next := `{"chain":"c","event":"start","pid":8,"params":{"b":{"c":2}}}` + "\n"
	if err := os.WriteFile(path, []byte(whole+torn+next), 0o600); err != nil {
		t.Fatal(err)
	}
	evs := readEvents(path)
	if len(evs) != 2 || evs[1].str("event") != "start" || evs[1].int("pid") != 8 {
		t.Fatalf("events %v; want the applied of pid 7 and the start of pid 8", evs)
	}
}
