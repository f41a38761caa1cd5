// Command supervisor runs an AI agent as a child process and keeps it alive
// and its state safe. See `supervisor --help` and docs/cli.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/examples/refagent"
	"github.com/agent-sidecar/supervisor/logging"
	"github.com/agent-sidecar/supervisor/supervisor"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes (SPEC §10).
const (
	exitOK       = 0
	exitFailure  = 1 // the agent crash-looped, or a command failed
	exitUsage    = 2 // usage or configuration error
	exitBusy     = 3 // `supervisor restore`: another restore is being delivered; retry (issue 12)
	refAgentVerb = "reference-agent"
)

const usage = `supervisor — a sidecar that keeps an AI agent alive and its state safe.

Usage:
  supervisor run [flags] [-- AGENT_COMMAND [ARGS...]]
  supervisor checkpoints list [--data-dir DIR] [--json]
  supervisor checkpoints show ID [--data-dir DIR] [--json]
  supervisor restore --checkpoint ID [--data-dir DIR] [--no-wal]
  supervisor status [--data-dir DIR] [--json]
  supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]
  supervisor audit [--data-dir DIR] [--since D] [--json]
  supervisor version

Without an agent command, "run" supervises the built-in reference agent.
Every command has --help. Exit codes: 0 clean stop, 1 the agent crash-looped
(or a command failed), 2 usage or configuration error, 3 (restore) busy:
another restore is being delivered, retry.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "checkpoints":
		return cmdCheckpoints(rest, stdout, stderr)
	case "restore":
		return cmdRestore(rest, stdout, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "wal":
		return cmdWAL(rest, stdout, stderr)
	case "audit":
		return cmdAudit(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "supervisor %s\n", version)
		return exitOK
	case refAgentVerb:
		// The embedded reference agent: `supervisor run` with no agent command
		// re-executes this binary with this verb.
		return refagent.Main(rest)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "supervisor: unknown command %q\n\n%s", verb, usage)
		return exitUsage
	}
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	cfg, logFormat, err := parseRunFlags(args, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "supervisor run: %v\n", err)
		return exitUsage
	}
	if len(cfg.Command) == 0 {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "supervisor run: no agent command given and cannot locate this binary for the reference agent: %v\n", err)
			return exitUsage
		}
		cfg.Command = []string{self, refAgentVerb}
	}
	// issue 12: logging never blocks the supervisor (bounded, drops and counts).
	logger, logBuf := logging.New(stderr, logging.Options{Format: logFormat, Level: slog.LevelInfo})
	defer logBuf.Close(2 * time.Second)
	cfg.Logger, cfg.LogDropped = logger, logBuf.Dropped
	// end issue 12
	sup, err := supervisor.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor run: %v\n", err)
		return exitUsage
	}
	// First SIGTERM/SIGINT: graceful stop. Second: skip the graceful wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	runDone := make(chan struct{})
	defer close(runDone)
	// issue 12: SIGHUP reopens the audit log (logrotate) and never stops us.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	go func() {
		for {
			select {
			case <-hups:
				_ = sup.ReopenAudit() // logged by the supervisor
			case <-runDone:
				return
			}
		}
	}()
	// end issue 12
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-runDone:
			return
		}
		for {
			select {
			case <-sigs:
				sup.ForceStop()
			case <-runDone:
				return
			}
		}
	}()
	err = sup.Run(ctx)
	logBuf.Close(2 * time.Second) // issue 12: flush the log before the last line below
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, supervisor.ErrConfig), errors.Is(err, supervisor.ErrDataDirLocked):
		fmt.Fprintf(stderr, "supervisor run: %v\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "supervisor run: %v\n", err)
		return exitFailure
	}
}
