// Package test holds end-to-end tests: they build the real supervisor binary
// and run it with the reference agent (embedded in the same binary) over real
// pipes, files, sockets and an HTTP listener.
package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
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
)

var binPath, floodPath string

func TestMain(m *testing.M) {
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
	agent     []string // reference-agent flags; ignored when command is set
	command   []string // a custom agent command
	env       []string // extra environment (REFAGENT_* etc.)
	noHTTP    bool
	noEvents  bool   // no --events file (benchmarks: it costs a write per entry)
	events    string // events file; default: beside the data dir
	keepAlive bool   // do not stop it at test cleanup (the test waits for its exit)
}

type sup struct {
	t       testing.TB
	cmd     *exec.Cmd
	dataDir string
	addr    string
	events  string
	out     *syncBuffer
	done    chan struct{}
	code    int
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startSup starts `supervisor run` with the reference agent.
func startSup(t testing.TB, o supOpts) *sup {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = filepath.Join(t.TempDir(), "data")
	}
	s := &sup{t: t, dataDir: o.dataDir, out: &syncBuffer{}, done: make(chan struct{})}
	s.events = filepath.Join(filepath.Dir(o.dataDir), "events.jsonl")
	if o.events != "" {
		s.events = o.events
	}
	args := []string{"run", "--data-dir", o.dataDir}
	if o.noHTTP {
		args = append(args, "--http-addr", "")
	} else {
		s.addr = freeAddr(t)
		args = append(args, "--http-addr", s.addr)
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
		args = append(args, binPath, "reference-agent")
		if !o.noEvents {
			args = append(args, "--events", s.events)
		}
		args = append(args, o.agent...)
	}
	s.cmd = exec.Command(binPath, args...)
	s.cmd.Env = append(os.Environ(), o.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = s.cmd.Wait()
		s.code = s.cmd.ProcessState.ExitCode()
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

// ev is one reference-agent event.
type ev map[string]any

func (e ev) str(k string) string { v, _ := e[k].(string); return v }

func (e ev) num(k string) float64 { v, _ := e[k].(float64); return v }

func (e ev) int(k string) int { return int(e.num(k)) }

// readEvents parses the reference agent's events file (a torn last line is
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
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
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

func (s *sup) get(path string) (int, string) {
	s.t.Helper()
	resp, err := http.Get("http://" + s.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *sup) post(path, body string) (int, string) {
	s.t.Helper()
	resp, err := http.Post("http://"+s.addr+path, "application/json", strings.NewReader(body))
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
