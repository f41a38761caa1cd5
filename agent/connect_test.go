package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// helperEnv makes the test binary act as an agent process (see TestMain).
const helperEnv = "AGENT_TEST_HELPER"

// Exit codes of the helper agent.
const (
	helperNotSupervised = 3
	helperBadTransport  = 4
	helperOther         = 5
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "echo" {
		os.Exit(echoAgent())
	}
	os.Exit(m.Run())
}

// echoAgent connects from the environment, heartbeats once, answers each
// process_request with an error whose message is the request's message,
// and exits 0 on shutdown or when the supervisor goes away.
func echoAgent() int {
	conn, err := agent.Connect(agent.Options{})
	switch {
	case errors.Is(err, agent.ErrNotSupervised):
		fmt.Fprintln(os.Stderr, err)
		return helperNotSupervised
	case errors.Is(err, agent.ErrTransport):
		fmt.Fprintln(os.Stderr, err)
		return helperBadTransport
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return helperOther
	}
	defer conn.Close()
	if err := conn.SendHeartbeat(); err != nil {
		return helperOther
	}
	err = conn.Run(context.Background(), agent.Handlers{
		ProcessRequest: func(m *schema.ProcessRequest) {
			conn.SendError("ECHO", conn.Config().Role+":"+m.Data.Message)
		},
	})
	if errors.Is(err, agent.ErrShutdown) || errors.Is(err, agent.ErrSupervisorGone) {
		return 0
	}
	fmt.Fprintln(os.Stderr, err)
	return helperOther
}

// unsetAll removes the SUPERVISOR_* variables for the test's duration.
func unsetAll(t *testing.T) {
	for _, k := range []string{agent.EnvRole, agent.EnvProtocolVersion, agent.EnvTransport, agent.EnvRestorePending} {
		t.Setenv(k, "") // registers the restore
		os.Unsetenv(k)
	}
}

func helperCmd(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=echo")
	// The race detector sleeps a second at exit unless told otherwise.
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func TestConnectTransports(t *testing.T) {
	for _, transport := range []string{agent.TransportStdio, agent.TransportFD} {
		t.Run(transport, func(t *testing.T) {
			unsetAll(t)
			agentIn, supOut, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			supIn, agentOut, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer supIn.Close()
			defer supOut.Close()
			cmd := helperCmd(t, agent.EnvRole+"=shadow", agent.EnvTransport+"="+transport)
			var stdout, stderr bytes.Buffer
			cmd.Stderr = &stderr
			if transport == agent.TransportStdio {
				cmd.Stdin, cmd.Stdout = agentIn, agentOut
			} else {
				cmd.Stdout = &stdout
				cmd.ExtraFiles = []*os.File{agentIn, agentOut} // fds 3 and 4
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			agentIn.Close()
			agentOut.Close()

			r := wire.NewReader(supIn, 0)
			w := wire.NewWriter(supOut, 0)
			read := func() schema.Message {
				t.Helper()
				supIn.SetReadDeadline(time.Now().Add(testTimeout))
				b, err := r.ReadFrame()
				if err != nil {
					t.Fatalf("read from the agent: %v (stderr: %s)", err, stderr.String())
				}
				m, err := schema.Decode(schema.FromAgent, b)
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				return m
			}
			if _, ok := read().(*schema.Heartbeat); !ok {
				t.Fatal("first frame is not a heartbeat")
			}
			b, err := schema.Encode(&schema.ProcessRequest{RequestID: "r1", Data: schema.RequestData{Message: "ping"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteFrame(b); err != nil {
				t.Fatal(err)
			}
			e, ok := read().(*schema.Error)
			if !ok || e.Error.Code != "ECHO" || e.Error.Message != "shadow:ping" {
				t.Fatalf("echo reply = %+v", e)
			}
			supOut.Close() // EOF: the agent exits 0
			if err := cmd.Wait(); err != nil {
				t.Fatalf("agent exit: %v (stderr: %s)", err, stderr.String())
			}
		})
	}
}

func TestConnectRefuses(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		wantCode int
		wantMsg  string
	}{
		{"run by hand from a terminal-like stdin", nil, helperNotSupervised, "supervisor run"},
		{"unknown transport", []string{agent.EnvRole + "=primary", agent.EnvTransport + "=tcp"}, helperBadTransport, `"tcp"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			unsetAll(t)
			cmd := helperCmd(t, tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr // stdin is /dev/null, a character device
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.wantCode {
				t.Fatalf("exit = %v, want code %d (stderr: %s)", err, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantMsg) {
				t.Errorf("stderr %q does not mention %q", stderr.String(), tt.wantMsg)
			}
		})
	}
}
