package refagent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/agent"
)

// Main runs the reference agent as a program: flags (and REFAGENT_*
// variables), connection from the SUPERVISOR_* environment, then [Run]. It
// returns the exit code and never calls os.Exit, so the supervisor binary
// can embed it as a subcommand.
func Main(args []string) int {
	cfg, err := ParseArgs(args, os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "reference-agent: %v\n", err)
		return ExitUsage
	}
	cfg.Stderr = os.Stderr
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "refagent")
	cfg.Logger = log
	if cfg.IgnoreSIGTERM {
		signal.Ignore(syscall.SIGTERM)
	}
	if cfg.StartDelay > 0 {
		time.Sleep(cfg.StartDelay)
	}
	if cfg.ForkGrandchild {
		pid, err := forkGrandchild()
		if err != nil {
			log.Error("could not start the grandchild", "err", err)
			return ExitFailure
		}
		cfg.GrandchildPID = pid
	}
	conn, err := agent.Connect(agent.Options{Version: cfg.ProtocolVersion, Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "reference-agent: %v\n", err)
		return ExitCode(err)
	}
	defer conn.Close()
	err = Run(context.Background(), conn, cfg)
	code := ExitCode(err)
	switch {
	case code == ExitOK && err != nil:
		log.Info("exiting", "why", err)
	case code != ExitOK:
		log.Error("exiting", "code", code, "err", err)
	}
	return code
}
