package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/examples/demo"
	"github.com/agent-sidecar/supervisor/internal/residency"
	"github.com/agent-sidecar/supervisor/logging"
	"github.com/agent-sidecar/supervisor/supervisor"
	"github.com/agent-sidecar/supervisor/supervisor/api"
)

const runSynopsis = "supervisor run [flags] [-- AGENT_COMMAND [ARGS...]]"

const runAbout = `Spawns the agent and supervises it until SIGTERM or SIGINT (a second signal skips
the graceful wait). Without "-- AGENT_COMMAND" it runs the built-in demo agent.
Flags and the environment: --heartbeat-timeout 2s on the command line, or
SUPERVISOR_HEARTBEAT_TIMEOUT=2s in the environment; the command line wins.`

// runCmd is `supervisor run`.
type runCmd struct{ env }

// runFlags defines run's flags on a config (defaults from
// supervisor.DefaultConfig) and returns what Config does not hold.
func runFlags(e env, cfg *supervisor.Config) (f *flagSet, restart, ops, logFormat *string) {
	f = newFlagSet(e, "run", runSynopsis, runAbout)
	f.fromEnv = func(string) bool { return true }
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the WAL, checkpoints, control socket and audit log (created mode 0700)")
	f.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP listener for /metrics, /healthz, /readyz and /v1/requests (empty disables; port 0 picks a free one)")
	f.StringVar(&cfg.HTTPTokenFile, "http-token-file", cfg.HTTPTokenFile, "file holding the bearer token that /v1/requests requires (probes and /metrics stay open)")
	f.BoolVar(&cfg.AllowInsecureTokenFile, "allow-insecure-token-file", cfg.AllowInsecureTokenFile, "accept an --http-token-file that group or others can read (refused otherwise: chmod 600 it); a warning is logged at start")
	f.StringVar(&cfg.ProbeAddr, "probe-addr", cfg.ProbeAddr, "second listener serving only /healthz, /readyz and /metrics with capacity of its own, for the kubelet and Prometheus (empty: none)")
	f.BoolVar(&cfg.HTTPAllowRemote, "http-allow-remote", cfg.HTTPAllowRemote, "allow a non-loopback --http-addr without --http-token-file (the request API is then open to the network)")
	f.duration(&cfg.RequestRetention, "request-retention", cfg.RequestRetention, "how long a finished request's result is kept for GET /v1/requests/ID (and its Idempotency-Key remembered)")
	f.duration(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "a request the agent has not answered this long after it was accepted expires (REQUEST_EXPIRED)")
	f.Int64Var(&cfg.RequestJournalBytes, "request-journal-bytes", cfg.RequestJournalBytes, "bound of the request journal (DATA_DIR/requests/journal) in bytes; when full, POST /v1/requests answers 429 (accepted requests are never dropped)")
	f.IntVar(&cfg.RequestMaxAttempts, "request-max-attempts", cfg.RequestMaxAttempts, "agent deaths with a request in flight before that request is set aside as poison (REQUEST_POISON), never delivered again")
	f.BoolVar(&cfg.Stdio, "stdio", cfg.Stdio, "frames over the agent's stdin/stdout; false: over fd 3 (agent reads) and fd 4 (agent writes)")
	f.duration(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "an agent silent this long is hung and is restarted")
	f.duration(&cfg.StartTimeout, "start-timeout", cfg.StartTimeout, "time allowed for the first heartbeat after a start")
	f.duration(&cfg.KillTimeout, "kill-timeout", cfg.KillTimeout, "time between SIGTERM and SIGKILL when stopping an agent")
	restart = f.String("restart", string(cfg.Restart), "restart policy: always, on-failure or never")
	f.duration(&cfg.BackoffInitial, "backoff-initial", cfg.BackoffInitial, "first restart delay (doubles per consecutive restart, with jitter)")
	f.duration(&cfg.BackoffMax, "backoff-max", cfg.BackoffMax, "longest restart delay")
	f.IntVar(&cfg.MaxRestarts, "max-restarts", cfg.MaxRestarts, "give up after more restarts than this within --restart-window (0: never give up)")
	f.duration(&cfg.RestartWindow, "restart-window", cfg.RestartWindow, "window for --max-restarts")
	f.BoolVar(&cfg.FallbackOnCrashLoop, "fallback-on-crash-loop", cfg.FallbackOnCrashLoop, "at the crash-loop limit, restore from the next older checkpoint whose whole WAL tail is held instead of giving up (nothing is marked bad)")
	f.BoolVar(&cfg.SpawnDuringRecovery, "spawn-during-recovery", cfg.SpawnDuringRecovery, "start the agent while the data directory is recovered, not after its restore is built (only for agents that wait for their restore when SUPERVISOR_RESTORE_PENDING=1)")
	f.duration(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "on SIGTERM/SIGINT, time the agent gets to checkpoint and exit")
	f.StringVar(&cfg.WALSync, "wal-sync", cfg.WALSync, "WAL durability: always (fsync each append), batch (group commit) or none")
	f.duration(&cfg.WALSyncInterval, "wal-sync-interval", cfg.WALSyncInterval, "longest time between WAL fsyncs under a steady flood (batch policy)")
	f.Int64Var(&cfg.WALSegmentSize, "wal-segment-size", cfg.WALSegmentSize, "WAL segment size in bytes; segments are pre-allocated and zero-filled, so the WAL uses at least two")
	ops = f.String("wal-operations", "", "comma-separated WAL operation names accepted besides memory_add, tool_register, state_update, request_step, request_done")
	f.IntVar(&cfg.CheckpointRetain, "checkpoint-retain", cfg.CheckpointRetain, "how many newest checkpoints to keep (plus pinned evolution backups)")
	f.IntVar(&cfg.CheckpointLevel, "checkpoint-level", cfg.CheckpointLevel, "zstd level for checkpoints: 1 fastest .. 4 best compression (0: store default)")
	f.IntVar(&cfg.MaxFrameSize, "max-frame-size", cfg.MaxFrameSize, "largest frame accepted from the agent, in bytes")
	f.duration(&cfg.ShadowDuration, "shadow-duration", cfg.ShadowDuration, "how long an evolution's shadow agent is compared with the primary")
	f.BoolVar(&cfg.Judge.Control, "evolution-control", cfg.Judge.Control, "run a control shadow (today's code) beside the candidate and compare with it; false: compare the candidate with the primary (cheaper, biased)")
	f.Float64Var(&cfg.Judge.Confidence, "evolution-confidence", cfg.Judge.Confidence, "the evolution judge's confidence, one error budget split across its tests, valid at every look")
	f.duration(&cfg.Judge.MaxDuration, "evolution-max-duration", cfg.Judge.MaxDuration, "longest evolution trial: latency not proven by then rejects as inconclusive (0: 4× --shadow-duration)")
	f.Float64Var(&cfg.Judge.MaxLatencyIncrease, "evolution-max-latency-increase", cfg.Judge.MaxLatencyIncrease, "latency tolerance: reject once candidate ÷ control latency is shown above 1 + this, promote once shown at or below it")
	f.Float64Var(&cfg.Judge.MaxErrorRateIncrease, "evolution-max-error-rate-increase", cfg.Judge.MaxErrorRateIncrease, "reject once the candidate's error rate is shown above the control's by more than this")
	f.Float64Var(&cfg.Judge.MaxDisagreement, "evolution-max-disagreement", cfg.Judge.MaxDisagreement, "reject once the candidate is shown to answer unlike the primary more often than the control does, by more than this")
	f.Float64Var(&cfg.Judge.MaxMemoryIncrease, "evolution-max-memory-increase", cfg.Judge.MaxMemoryIncrease, "reject when the candidate's sampled memory ÷ the control's − 1 is above this")
	f.IntVar(&cfg.EvolutionMinReports, "evolution-min-reports", cfg.EvolutionMinReports, "metrics reports needed from each of the primary and the shadow during a trial")
	f.StringVar(&cfg.Replica, "replica", cfg.Replica, "replicate the data directory to s3://BUCKET/PREFIX, and restore an empty one from it first (docs/replication.md)")
	f.StringVar(&cfg.ReplicaEndpoint, "replica-endpoint", cfg.ReplicaEndpoint, "URL of an S3-compatible server for --replica (http:// for no TLS); default AWS S3")
	f.StringVar(&cfg.ReplicaRegion, "replica-region", cfg.ReplicaRegion, "the --replica bucket's region")
	f.duration(&cfg.ReplicaSyncInterval, "replica-sync-interval", cfg.ReplicaSyncInterval, "longest time a durable WAL entry waits for its upload to the replica (one upload per interval)")
	logFormat = f.String("log-format", "text", "log format on stderr: text or json")
	for name, m := range map[string]string{"data-dir": "DIR", "http-addr": "ADDR", "probe-addr": "ADDR", "http-token-file": "FILE", "restart": "POLICY", "wal-sync": "POLICY",
		"wal-segment-size": "BYTES", "wal-operations": "LIST", "max-frame-size": "BYTES", "log-format": "FORMAT",
		"replica": "URL", "replica-endpoint": "URL", "replica-region": "REGION",
		"evolution-max-latency-increase": "X", "evolution-max-error-rate-increase": "X", "evolution-max-memory-increase": "X",
		"evolution-max-disagreement": "X", "evolution-confidence": "P", "evolution-max-duration": "D"} {
		f.meta[name] = m
	}
	return f, restart, ops, logFormat
}

// parseRun turns run's arguments (and environment) into a configuration.
// Without "--" the agent is the built-in demo agent; "--" with nothing
// after it is a usage error.
func parseRun(e env, args []string) (supervisor.Config, string, error) {
	cfg := supervisor.DefaultConfig()
	f, restart, ops, logFormat := runFlags(e, &cfg)
	// An agent command without "--" is the likelier mistake than whatever
	// flag of the agent's follows it: say so first — unless an unknown flag
	// came before it, whose value it probably is (--bogus 3): name the flag.
	if _, pos, _, _ := f.splitAt(args); len(pos) > 0 {
		if stray, unknown := f.firstStray(args); unknown {
			return cfg, "", usageErr("run", "unknown flag %s", truncate(stray, 64))
		}
		i := pos[0]
		return cfg, "", usageErr("run", "unexpected argument %q: the agent command goes after --, as in: supervisor run [flags] -- %s",
			truncate(args[i], 64), truncate(strings.Join(args[i:], " "), 80))
	}
	_, command, dashdash, err := f.parse(args)
	if err != nil {
		return cfg, "", err
	}
	switch {
	case dashdash && len(command) == 0:
		return cfg, "", usageErr("run", "nothing after --: give the agent command (supervisor run [flags] -- AGENT_COMMAND [ARGS...]), or leave out -- to run the built-in demo agent")
	}
	// Config's zero means "the default" for library callers; on the
	// command line (or in the environment) a 0 is a mistake, refused
	// rather than silently replaced.
	var zero error
	f.Visit(func(fl *flag.Flag) {
		if zero != nil {
			return
		}
		switch v := fl.Value.String(); {
		case v != "0" && v != "0s":
		case fl.Name == "request-retention" || fl.Name == "request-timeout":
			zero = usageErr("run", "--%s must be a positive duration, got %s", fl.Name, v)
		case fl.Name == "request-max-attempts":
			zero = usageErr("run", "--request-max-attempts must be at least 1, got 0")
		case fl.Name == "request-journal-bytes":
			zero = usageErr("run", "--request-journal-bytes must be at least 4096, got 0")
		}
	})
	if zero != nil {
		return cfg, "", zero
	}
	p, err := supervisor.ParseRestartPolicy(*restart)
	if err != nil {
		return cfg, "", usageErr("run", "--restart: %v", err)
	}
	cfg.Restart = p
	for _, op := range strings.Split(*ops, ",") {
		if op = strings.TrimSpace(op); op != "" {
			cfg.WALOperations = append(cfg.WALOperations, op)
		}
	}
	if *logFormat != "text" && *logFormat != "json" {
		return cfg, "", usageErr("run", "--log-format must be text or json, got %q", truncate(*logFormat, 32))
	}
	cfg.Command = command
	return cfg, *logFormat, nil
}

// Run supervises until ctx ends (nil: a clean stop) or the agent fails.
func (c *runCmd) Run(ctx context.Context, args []string) error {
	cfg, logFormat, err := parseRun(c.env, args)
	if err != nil {
		return err
	}
	if len(cfg.Command) == 0 {
		self, err := os.Executable()
		if err != nil {
			return failed("run", fmt.Errorf("no agent command given, and this binary cannot be located to run the demo agent: %v", err))
		}
		cfg.Command = []string{self, "demo-agent"}
	}
	// Logging never blocks the supervisor: a bounded buffer in front of
	// stderr drops (and counts) what a stalled reader cannot take.
	log, logBuf := logging.New(c.stderr, logging.Options{Format: logFormat, Level: slog.LevelInfo})
	defer logBuf.Close(2 * time.Second)
	cfg.Logger, cfg.LogDropped = log, logBuf.Dropped
	if limit, set := softMemoryLimit(c.lookupEnv); set {
		log.Debug("Go soft memory limit", "bytes", limit)
	}
	sup, err := supervisor.New(cfg)
	if err != nil {
		return failed("run", err)
	}
	if err := checkDataDirWritable(cfg.DataDir); err != nil {
		log.Error("supervisor stopped", "exit_code", exitCode(err), "err", errors.Unwrap(err))
		logBuf.Close(2 * time.Second)
		return err
	}
	if cfg.AllowInsecureTokenFile && cfg.HTTPTokenFile != "" {
		if err := api.CheckTokenFile(cfg.HTTPTokenFile); errors.Is(err, api.ErrInsecureTokenFile) {
			log.Warn("INSECURE TOKEN FILE: users other than the supervisor's can read the bearer token that protects /v1/requests; "+
				"used anyway because of --allow-insecure-token-file. Run `chmod 600 "+cfg.HTTPTokenFile+"` and drop that flag", "err", err)
		}
	}
	done := make(chan struct{})
	defer close(done)
	// A log reader that went away (a log shipper restarted, `| head`) must
	// not kill the supervisor and orphan its agent: by default Go exits on
	// SIGPIPE from a write to stderr. Notified, the write fails with EPIPE
	// and the log drops the line. (A handler, not SIG_IGN: an ignored
	// SIGPIPE would be inherited by the agent.)
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)
	// SIGHUP reopens the audit log (logrotate) and never stops us.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	// Once started, give back what only start-up used: its garbage, and the
	// executable's pages (internal/residency), most of an idle supervisor's
	// RSS. The collection matters as much: the runtime forces one every two
	// minutes only after a first, and the heap keeps the pages it has
	// touched below its goal (4 MiB). Without it the heap grew to that goal
	// before its first collection and kept it; after it, an idle
	// supervisor's heap is what it keeps plus what it allocates in two
	// minutes (docs/benchmarks.md, "idle").
	var trim <-chan time.Time
	if c.lookupEnv != nil { // a process of its own, not a test calling run
		t := time.NewTimer(trimAfter)
		defer t.Stop()
		trim = t.C
	}
	go func() {
		for {
			select {
			case <-trim:
				trim = nil
				n, err := residency.Trim()
				debug.FreeOSMemory() // after: Trim's own garbage too
				if err != nil {
					log.Debug("could not give back the executable's start-up pages", "err", err)
				} else {
					log.Info("gave back the executable's start-up pages", "mapped_bytes", n)
				}
			case <-c.force:
				sup.ForceStop()
			case <-hups:
				_ = sup.ReopenAudit() // logged by the supervisor
			case <-done:
				return
			}
		}
	}()
	runErr := sup.Run(ctx)
	err = failed("run", runErr)
	if de := explainDataDir(cfg.DataDir, runErr); de != runErr {
		err, runErr = de, errors.Unwrap(de)
	}
	code := exitCode(err)
	if code == exitOK {
		log.Info("supervisor stopped", "exit_code", code)
	} else {
		log.Error("supervisor stopped", "exit_code", code, "err", runErr)
	}
	logBuf.Close(2 * time.Second) // the last line is written before we exit
	return err
}

// demoAgent is the demo agent built into this binary: `run` without an agent
// command re-executes the binary as demo-agent. It prints its own errors.
type demoAgent struct{}

func (demoAgent) Run(_ context.Context, args []string) error {
	if code := demo.Main(args); code != 0 {
		return &cliError{cmd: "demo-agent", err: errors.New("agent exited"), code: code, quiet: true}
	}
	return nil
}

// defaultSoftMemoryLimit is the Go runtime's soft memory limit for `run`
// unless GOMEMLIMIT is set: the supervisor promises to stay under 64 MiB of
// RSS (docs/operations.md, bounds), and without a limit the garbage
// collector lets the heap grow to twice what is live — a few large frames
// (1 MiB results, a 30 MiB checkpoint) would then cost two or three times
// their size. It is soft: a supervisor that really needs more (a restore of
// a 100 MiB checkpoint) gets it, and collects more often meanwhile.
const defaultSoftMemoryLimit = 40 << 20

// trimAfter is when run gives back the executable's start-up pages: after
// the first agent start, whose code the supervisor runs once.
const trimAfter = 10 * time.Second

// softMemoryLimit sets defaultSoftMemoryLimit unless GOMEMLIMIT is set (the
// runtime has read it already). It returns the limit and whether it set it.
// Without an environment (a test running the command in its own process) it
// sets nothing.
func softMemoryLimit(lookupEnv func(string) (string, bool)) (int64, bool) {
	if lookupEnv == nil {
		return 0, false
	}
	if v, ok := lookupEnv("GOMEMLIMIT"); ok && v != "" {
		return 0, false
	}
	debug.SetMemoryLimit(defaultSoftMemoryLimit)
	return defaultSoftMemoryLimit, true
}
