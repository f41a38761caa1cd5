package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-sidecar/supervisor/supervisor"
)

// Exit codes (SPEC §10). A process manager should not retry exitUsage: the
// command line or the configuration must change first.
const (
	exitOK      = 0
	exitFailure = 1 // the agent crash-looped (or failed with --restart never), or a command failed
	exitUsage   = 2 // usage or configuration error
	// exitUnrestorable: the agent's state cannot be restored completely (the
	// WAL lost entries a restore needs); the agent was not started. Not to
	// be retried: an operator must act (docs/operations.md).
	exitUnrestorable = 3
	// exitBusy (EX_TEMPFAIL): `supervisor restore` while another restore is
	// being delivered; retry in a moment.
	exitBusy = 75
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
  supervisor requests list|show ID [--data-dir DIR] [--json]
  supervisor requests cancel ID [--data-dir DIR]
  supervisor evolutions list [--data-dir DIR] [--json]
  supervisor evolutions show ID [--data-dir DIR] [--json]
  supervisor replica restore --replica URL --data-dir DIR [--to-sequence N | --to-time T]
  supervisor replica list --replica URL [--json]
  supervisor version [--json]

Without an agent command, "run" supervises the built-in demo agent
(supervisor demo-agent).
Flags and arguments may come in any order. Every flag of "run" can also be
set in the environment (--heartbeat-timeout: SUPERVISOR_HEARTBEAT_TIMEOUT),
and --data-dir by SUPERVISOR_DATA_DIR for every command; a flag wins.
Every command has --help. Exit codes: 0 clean stop, 1 the agent failed (or a
command failed), 2 usage or configuration error, 3 the agent's state cannot be
restored completely (the agent was not started), 75 (restore) busy: another
restore is being delivered, retry.
`

// env is what a command sees of the world: tests give it buffers and a map.
type env struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// force delivers the stop signals after the first (run: skip the
	// graceful wait). Nil outside main.
	force <-chan os.Signal
}

// command is one subcommand. Run returns nil, errHelp (help was printed), or
// an error for exitCode and report.
type command interface {
	Run(ctx context.Context, args []string) error
}

func main() {
	e := env{stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}
	ctx := context.Background()
	if len(os.Args) > 1 && os.Args[1] == "run" {
		// The first SIGTERM/SIGINT cancels ctx: a graceful stop. Later ones
		// arrive on force and skip the graceful wait. Only run traps them:
		// the embedded agents and the short commands keep the defaults.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		// SIGHUP never stops the supervisor (run.go reopens the audit log
		// on it once the supervisor exists).
		signal.Ignore(syscall.SIGHUP)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		force := make(chan os.Signal, 4)
		go func() {
			<-sigs
			cancel()
			for s := range sigs {
				force <- s
			}
		}()
		e.force = force
	}
	err := dispatch(ctx, os.Args[1:], e)
	report(e.stderr, err)
	os.Exit(exitCode(err))
}

// commands maps each verb to its command.
func commands(e env) map[string]command {
	return map[string]command{
		"run":         &runCmd{env: e},
		"checkpoints": &checkpointsCmd{env: e},
		"restore":     &restoreCmd{env: e},
		"status":      &statusCmd{env: e},
		"wal":         &walCmd{env: e},
		"audit":       &auditCmd{env: e},
		"requests":    &requestsCmd{env: e},
		"evolutions":  &evolutionsCmd{env: e},
		"replica":     &replicaCmd{env: e},
		"version":     &versionCmd{env: e},
		"demo-agent":  demoAgent{},
	}
}

// dispatch runs the command args[0] names.
func dispatch(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return &cliError{err: errors.New("no command given"), code: exitUsage, quiet: true}
	}
	verb, rest := args[0], args[1:]
	if isHelpArg(verb) {
		fmt.Fprint(e.stdout, usage)
		return nil
	}
	if verb == "--version" {
		verb = "version"
	}
	if verb != "run" && verb != "demo-agent" {
		// The read-only commands print what agents and clients wrote:
		// escaped so it cannot drive the terminal (termSafe). run's
		// output is its log, whose handler quotes such text, and the demo
		// agent's stdout is its frame pipe.
		out, errOut := newTermSafe(e.stdout), newTermSafe(e.stderr)
		defer out.Flush()
		defer errOut.Flush()
		e.stdout, e.stderr = out, errOut
	}
	cmd, ok := commands(e)[verb]
	if !ok {
		return &cliError{err: fmt.Errorf("unknown command %q", verb), usage: true}
	}
	return cmd.Run(ctx, rest)
}

// isHelpArg: the words that ask for help where a (sub)command is expected.
// Flag sets recognise -h, -help and --help themselves.
func isHelpArg(a string) bool {
	return a == "help" || a == "-h" || a == "-help" || a == "--help"
}

// cliError is a failed command, with what the user needs to see.
type cliError struct {
	cmd   string // "checkpoints show"; "" for the top level
	err   error
	usage bool // a usage error: exit 2 and a hint to --help
	code  int  // a specific exit code (0: from err)
	quiet bool // already told: print nothing more
}

func (e *cliError) Error() string {
	if e.cmd == "" {
		return e.err.Error()
	}
	return e.cmd + ": " + e.err.Error()
}

func (e *cliError) Unwrap() error { return e.err }

func usageErr(cmd string, format string, args ...any) error {
	return &cliError{cmd: cmd, err: fmt.Errorf(format, args...), usage: true}
}

func failed(cmd string, err error) error {
	if err == nil {
		return nil
	}
	return &cliError{cmd: cmd, err: err}
}

// errHelp: help was asked for and printed.
var errHelp = errors.New("help requested")

// exitCode maps a command's error to the process exit code.
func exitCode(err error) int {
	var ce *cliError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ce) && ce.code != 0:
		return ce.code
	case errors.As(err, &ce) && ce.usage,
		errors.Is(err, supervisor.ErrConfig), errors.Is(err, supervisor.ErrDataDirLocked):
		return exitUsage
	case errors.Is(err, supervisor.ErrUnrestorable):
		return exitUnrestorable
	case errors.Is(err, supervisor.ErrBusy):
		return exitBusy
	default:
		return exitFailure
	}
}

// report prints err once, as "supervisor CMD: what went wrong", with a hint
// to --help after a usage error.
func report(w io.Writer, err error) {
	// An error may quote what an agent or a client wrote (clipped).
	t := newTermSafe(w)
	defer t.Flush()
	w = t
	var ce *cliError
	if err == nil || errors.Is(err, errHelp) || (errors.As(err, &ce) && ce.quiet) {
		return
	}
	if ce == nil || ce.cmd == "" {
		fmt.Fprintf(w, "supervisor: %v\n", err)
	} else {
		fmt.Fprintf(w, "supervisor %v\n", err)
	}
	if ce != nil && ce.usage {
		help := "supervisor --help"
		if ce.cmd != "" {
			help = "supervisor " + ce.cmd + " --help"
		}
		fmt.Fprintf(w, "Run '%s' for usage.\n", help)
	}
}
