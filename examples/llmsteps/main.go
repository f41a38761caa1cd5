// Command llmsteps is an example agent that answers requests by calling an
// LLM through durable steps (package agent, Request.Step): each call's
// answer is logged in the supervisor's WAL before the agent goes on, so a
// request redelivered after the agent was killed does not call the LLM again
// for the steps it had completed, and a request cancelled with
// DELETE /v1/requests/ID stops before its next step.
//
// The LLM is a fake that works offline: it sleeps (-delay) and appends one
// line per call to a file outside the data directory (-calls, or
// LLMSTEPS_CALLS), "call PID REQUEST_ID STEP ATTEMPT", the bill to check.
//
//	supervisor run --data-dir /tmp/data -- llmsteps -calls /tmp/llm-calls.txt
//	curl -s -XPOST localhost:9464/v1/requests -d '{"message":"plan a trip"}'
//
// See docs/agent.md ("Durable requests and steps") for the walkthrough: kill
// -9 the agent mid-request and count the calls.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

func main() {
	calls := flag.String("calls", os.Getenv("LLMSTEPS_CALLS"), "file to which every LLM call appends a line (keep it outside the data directory); empty: none")
	delay := flag.Duration("delay", envDuration("LLMSTEPS_DELAY", 500*time.Millisecond), "how long one fake LLM call takes")
	steps := flag.Int("steps", envInt("LLMSTEPS_STEPS", 3), "LLM calls (steps) per request")
	every := flag.Duration("checkpoint-every", 2*time.Second, "send a checkpoint this often (it carries the steps of unanswered requests)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	a := &llmAgent{log: log, llm: &fakeLLM{path: *calls, delay: *delay}, steps: *steps}
	if err := a.run(*every); err != nil && !errors.Is(err, agent.ErrShutdown) && !errors.Is(err, agent.ErrSupervisorGone) {
		log.Error("llmsteps stopped", "err", err)
		os.Exit(1)
	}
}

type llmAgent struct {
	log   *slog.Logger
	llm   *fakeLLM
	steps int

	restored chan struct{} // closed once the state is restored
	once     sync.Once

	mu    sync.Mutex
	state struct {
		Answered int `msgpack:"answered"`
	}
}

func (a *llmAgent) run(every time.Duration) error {
	conn, err := agent.Connect(agent.Options{Logger: a.log})
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go conn.Heartbeats(ctx, time.Second)
	// Checkpoints start once the state is restored (or known fresh).
	a.restored = make(chan struct{})
	if !conn.Config().RestorePending {
		close(a.restored)
	}
	go func() {
		select {
		case <-a.restored:
		case <-ctx.Done():
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := conn.SendCheckpoint(a.snapshot()); err != nil {
					a.log.Warn("checkpoint not sent", "err", err)
				}
			}
		}
	}()
	return conn.Run(ctx, agent.Handlers{
		Restore: a.restore,
		Handle:  a.handle,
		Shutdown: func(m *schema.Shutdown) {
			if m.CreateCheckpoint && conn.SendCheckpoint(a.snapshot()) == nil {
				ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, _ = conn.AwaitCheckpointAck(ctx)
			}
		},
	})
}

func (a *llmAgent) snapshot() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return map[string]any{"answered": a.state.Answered}
}

// restore takes the agent's own state back. The client has already taken
// its step table out of the snapshot (and its request_step entries out of
// the WAL tail): what is left is the agent's.
func (a *llmAgent) restore(m *schema.Restore) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.once.Do(func() {
		select {
		case <-a.restored:
		default:
			close(a.restored)
		}
	})
	if m.CheckpointID != "" {
		if err := msgpack.Unmarshal(m.Snapshot, &a.state); err != nil {
			return err
		}
	}
	return nil
}

// handle answers one request with a chain of LLM calls, each a step: the
// first one's answer feeds the second, and so on. On a redelivery
// (req.Attempt > 1) the steps completed before the crash return their
// logged answers at once.
func (a *llmAgent) handle(ctx context.Context, req *agent.Request) (any, error) {
	a.log.Info("request", "request_id", req.ID, "attempt", req.Attempt)
	prompt := req.Data.Message
	for i := range a.steps {
		name := "llm-" + strconv.Itoa(i)
		out, err := agent.Step(ctx, req, name, func(ctx context.Context) (string, error) {
			return a.llm.complete(ctx, req, name, prompt)
		})
		if err != nil {
			if req.Cancelled() {
				a.log.Info("request cancelled; remaining steps skipped", "request_id", req.ID, "step", name)
			}
			return nil, err
		}
		prompt = out
	}
	a.mu.Lock()
	a.state.Answered++
	a.mu.Unlock()
	a.log.Info("request answered", "request_id", req.ID, "attempt", req.Attempt)
	return map[string]any{"answer": prompt, "attempt": req.Attempt}, nil
}

// fakeLLM stands in for a model API. A real one would be, with the OpenAI Go
// SDK (github.com/openai/openai-go), passing ctx so a cancelled request
// stops the call, and the step's identity as an idempotency key so a call in
// flight at a crash is not billed twice:
//
//	resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
//		Model:    openai.ChatModelGPT4o,
//		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
//	}, option.WithHeader("Idempotency-Key", req.ID+"/"+name))
//	if err != nil {
//		return "", err
//	}
//	return resp.Choices[0].Message.Content, nil
type fakeLLM struct {
	path  string
	delay time.Duration
	mu    sync.Mutex
}

func (l *fakeLLM) complete(ctx context.Context, req *agent.Request, name, prompt string) (string, error) {
	if err := l.bill(req, name); err != nil {
		return "", err
	}
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
	return fmt.Sprintf("%s(%.40s)", name, prompt), nil
}

// bill appends "call PID REQUEST_ID STEP ATTEMPT" to the calls file, synced:
// a call counts once it has started.
func (l *fakeLLM) bill(req *agent.Request, name string) error {
	if l.path == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("fake LLM: open the calls file: %w", err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "call %d %s %s %d\n", os.Getpid(), req.ID, name, req.Attempt); err != nil {
		return err
	}
	return f.Sync()
}

func envDuration(k string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return d
	}
	return def
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}
