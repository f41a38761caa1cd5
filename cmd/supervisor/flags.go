package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/agent-sidecar/supervisor/supervisor"
)

var errHelp = errors.New("help requested")

// newFlagSet returns a flag set that prints its usage to stderr and reports
// -h/--help as errHelp.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return err
	}
	return nil
}

func parseRunFlags(args []string, stderr io.Writer) (supervisor.Config, string, error) {
	cfg := supervisor.DefaultConfig()
	fs := newFlagSet("supervisor run", "supervisor run [flags] [-- AGENT_COMMAND [ARGS...]]", stderr)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the WAL, checkpoints, control socket and audit log")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP listener for /metrics, /healthz, /readyz and /v1/requests (empty disables)")
	fs.StringVar(&cfg.HTTPTokenFile, "http-token-file", cfg.HTTPTokenFile, "file holding the bearer token that /v1/requests requires (probes and /metrics stay open)")
	fs.BoolVar(&cfg.HTTPAllowRemote, "http-allow-remote", cfg.HTTPAllowRemote, "allow a non-loopback --http-addr without --http-token-file (the request API is then open to the network)")
	fs.DurationVar(&cfg.RequestRetention, "request-retention", cfg.RequestRetention, "how long a request waits for the agent's result, and a result is kept for GET /v1/requests/ID")
	fs.BoolVar(&cfg.Stdio, "stdio", cfg.Stdio, "frames over the agent's stdin/stdout; false: over fd 3 (agent reads) and fd 4 (agent writes)")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "an agent silent this long is hung and is restarted")
	fs.DurationVar(&cfg.StartTimeout, "start-timeout", cfg.StartTimeout, "time allowed for the first heartbeat after a start")
	fs.DurationVar(&cfg.KillTimeout, "kill-timeout", cfg.KillTimeout, "time between SIGTERM and SIGKILL when stopping an agent")
	restart := fs.String("restart", string(cfg.Restart), "restart policy: always, on-failure or never")
	fs.DurationVar(&cfg.BackoffInitial, "backoff-initial", cfg.BackoffInitial, "first restart delay (doubles per consecutive restart, with jitter)")
	fs.DurationVar(&cfg.BackoffMax, "backoff-max", cfg.BackoffMax, "longest restart delay")
	fs.IntVar(&cfg.MaxRestarts, "max-restarts", cfg.MaxRestarts, "give up after more restarts than this within --restart-window (0: never give up)")
	fs.DurationVar(&cfg.RestartWindow, "restart-window", cfg.RestartWindow, "window for --max-restarts")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "on SIGTERM/SIGINT, time the agent gets to checkpoint and exit")
	fs.StringVar(&cfg.WALSync, "wal-sync", cfg.WALSync, "WAL durability: always (fsync each append), batch (group commit) or none")
	fs.DurationVar(&cfg.WALSyncInterval, "wal-sync-interval", cfg.WALSyncInterval, "longest time between WAL fsyncs under a steady flood (batch policy)")
	fs.Int64Var(&cfg.WALSegmentSize, "wal-segment-size", cfg.WALSegmentSize, "WAL segment size in bytes; segments are pre-allocated and zero-filled, so the WAL uses at least two")
	ops := fs.String("wal-operations", "", "comma-separated WAL operation names accepted besides memory_add, tool_register, state_update")
	fs.IntVar(&cfg.CheckpointRetain, "checkpoint-retain", cfg.CheckpointRetain, "how many newest checkpoints to keep (plus pinned evolution backups)")
	fs.IntVar(&cfg.CheckpointLevel, "checkpoint-level", cfg.CheckpointLevel, "zstd level for checkpoints: 1 fastest .. 4 best compression (0: store default)")
	fs.IntVar(&cfg.MaxFrameSize, "max-frame-size", cfg.MaxFrameSize, "largest frame accepted from the agent, in bytes")
	fs.DurationVar(&cfg.ShadowDuration, "shadow-duration", cfg.ShadowDuration, "how long an evolution's shadow agent is compared with the primary")
	fs.Float64Var(&cfg.EvolutionThresholds.MaxLatencyIncrease, "evolution-max-latency-increase", cfg.EvolutionThresholds.MaxLatencyIncrease, "promote only if shadow avg latency ÷ primary − 1 is at most this")
	fs.Float64Var(&cfg.EvolutionThresholds.MaxErrorRateIncrease, "evolution-max-error-rate-increase", cfg.EvolutionThresholds.MaxErrorRateIncrease, "promote only if shadow error rate − primary error rate is at most this")
	fs.Float64Var(&cfg.EvolutionThresholds.MaxMemoryIncrease, "evolution-max-memory-increase", cfg.EvolutionThresholds.MaxMemoryIncrease, "promote only if shadow memory ÷ primary − 1 is at most this")
	fs.IntVar(&cfg.EvolutionMinReports, "evolution-min-reports", cfg.EvolutionMinReports, "metrics reports needed from each of the primary and the shadow during a trial")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	if err := parseFlags(fs, args); err != nil {
		return cfg, "", err
	}
	p, err := supervisor.ParseRestartPolicy(*restart)
	if err != nil {
		return cfg, "", err
	}
	cfg.Restart = p
	if *ops != "" {
		for _, op := range strings.Split(*ops, ",") {
			if op = strings.TrimSpace(op); op != "" {
				cfg.WALOperations = append(cfg.WALOperations, op)
			}
		}
	}
	if *logFormat != "text" && *logFormat != "json" {
		return cfg, "", fmt.Errorf("--log-format must be text or json, got %q", *logFormat)
	}
	cfg.Command = fs.Args()
	return cfg, *logFormat, nil
}

func newLogger(w io.Writer, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
