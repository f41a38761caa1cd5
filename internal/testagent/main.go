package testagent

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

// EnvRunAgent is the environment variable that makes a test binary the
// agent: with EnvRunAgent=1, [MainIfAgent] runs [Main] instead of the tests.
// The supervisor passes its environment on to the agents it starts, so a
// test sets it on the supervisor and names the test binary as the agent.
const EnvRunAgent = "SUPERVISOR_TEST_AGENT"

// MainIfAgent is called first thing in a TestMain. When EnvRunAgent=1 the
// process is the agent: it runs [Main] with the arguments and exits.
// Otherwise it returns and the tests run.
func MainIfAgent() {
	if os.Getenv(EnvRunAgent) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
}

// Main runs the agent as a program: flags (and REFAGENT_* variables),
// connection from the SUPERVISOR_* environment, then [Run]. It returns the
// exit code.
func Main(args []string) int {
	cfg, err := ParseArgs(args, os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testagent: %v\n", err)
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
		fmt.Fprintf(os.Stderr, "testagent: %v\n", err)
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
