package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/wal"
)

// RestartPolicy says when an agent that stopped is started again.
type RestartPolicy string

const (
	RestartAlways    RestartPolicy = "always"     // restart whatever the exit
	RestartOnFailure RestartPolicy = "on-failure" // restart unless it exited 0
	RestartNever     RestartPolicy = "never"      // never restart
)

// ParseRestartPolicy parses the --restart flag.
func ParseRestartPolicy(s string) (RestartPolicy, error) {
	switch p := RestartPolicy(s); p {
	case RestartAlways, RestartOnFailure, RestartNever:
		return p, nil
	}
	return "", fmt.Errorf("unknown restart policy %q: use always, on-failure or never", s)
}

// Config is everything `supervisor run` is told. Zero durations and counts are
// replaced by the defaults documented on each field (see DefaultConfig).
type Config struct {
	DataDir string
	Command []string // the agent command and its arguments
	// Stdio selects the transport: frames on the agent's stdin/stdout (true) or
	// on fd 3 (agent reads) and fd 4 (agent writes).
	Stdio    bool
	HTTPAddr string // "" disables the HTTP listener
	// HTTPTokenFile holds the bearer token that /v1/requests requires; ""
	// leaves the request API open (then HTTPAddr must be loopback unless
	// HTTPAllowRemote).
	HTTPTokenFile string
	// HTTPAllowRemote allows a non-loopback HTTPAddr without a token file.
	HTTPAllowRemote bool
	// AllowInsecureTokenFile accepts an HTTPTokenFile that other users can
	// read (api.CheckTokenFile), which is otherwise refused.
	AllowInsecureTokenFile bool
	// ProbeAddr is a second listener that serves only /healthz, /readyz and
	// /metrics, with its own small connection cap, so that probes answer
	// whatever clients do to HTTPAddr. "" (the default): none.
	ProbeAddr string
	// RequestRetention: how long a finished request (answered, failed,
	// expired, cancelled) is kept for GET /v1/requests/ID and its
	// Idempotency-Key remembered. 10m.
	RequestRetention time.Duration
	// RequestTimeout: a request not answered this long after it was
	// accepted expires (REQUEST_EXPIRED). 10m.
	RequestTimeout time.Duration
	// RequestJournalBytes bounds the request journal; when full, POST
	// answers 429. 64 MiB.
	RequestJournalBytes int64
	// RequestMaxAttempts: agent deaths with a request in flight (alone)
	// before it is set aside as poison. 3.
	RequestMaxAttempts int

	HeartbeatTimeout time.Duration // 5s
	StartTimeout     time.Duration // 30s, covers the first heartbeat
	KillTimeout      time.Duration // 5s between SIGTERM and SIGKILL
	ShutdownTimeout  time.Duration // 10s for a graceful stop

	Restart        RestartPolicy
	BackoffInitial time.Duration // 100ms
	BackoffMax     time.Duration // 30s
	MaxRestarts    int           // 5; 0 = never give up
	RestartWindow  time.Duration // 60s
	// HealthyReset: after running and heartbeating this long, the back-off
	// starts again from BackoffInitial. 10s.
	HealthyReset time.Duration
	// FallbackOnCrashLoop: when the crash-loop limit is reached, restore from
	// the next older checkpoint whose whole WAL tail is still held instead of
	// giving up (--fallback-on-crash-loop). Off by default: OTP's back-off
	// then give up, with the state intact.
	FallbackOnCrashLoop bool
	// SpawnDuringRecovery starts the first agent while the data directory
	// is recovered, told SUPERVISOR_RESTORE_PENDING from the files present
	// (early.go), instead of once its restore is built. For agents that
	// wait for their restore when it is pending. Off by default.
	SpawnDuringRecovery bool

	WALSync         string        // always | batch | none
	WALSyncInterval time.Duration // 10ms
	WALOperations   []string      // operations accepted besides the built-in three
	WALSegmentSize  int64         // 64 MiB; pre-allocated and zero-filled

	CheckpointRetain int // 5
	CheckpointLevel  int // zstd level 1..4 (klauspost's fastest..best); 0 = store default
	MaxFrameSize     int // 128 MiB

	ShadowDuration time.Duration // 30s: the minimum trial time
	// Judge is the evolution judge's configuration (SPEC §6): its tolerances
	// and confidence, whether a control shadow runs (Control), and the
	// longest trial (MaxDuration; 0: 4× ShadowDuration). MinDuration is
	// ShadowDuration, whatever it holds.
	Judge evolution.JudgeConfig
	// EvolutionMinReports is the minimum number of metrics reports from each
	// of the primary and the shadow during a trial. 1.
	EvolutionMinReports int

	// Replica is s3://BUCKET/PREFIX: the data directory is replicated there
	// continuously, and an empty one is restored from it first (SPEC §11;
	// replica.go). "" turns replication off. ReplicaEndpoint is the URL of an
	// S3-compatible server ("" = AWS S3), ReplicaSyncInterval how long a
	// durable WAL entry may wait for its upload (1s).
	Replica             string
	ReplicaEndpoint     string
	ReplicaRegion       string
	ReplicaSyncInterval time.Duration

	Logger *slog.Logger
	// LogDropped, when set, reports how many log records the logger dropped
	// (logging.Async.Dropped); exported as supervisor_log_dropped_total.
	LogDropped func() uint64
	// LoopStallTimeout: /healthz fails once the owner's event loop has not
	// made progress for this long. 0 means 60s.
	LoopStallTimeout time.Duration
}

// DefaultConfig returns the defaults of SPEC §3–§5 and §10.
func DefaultConfig() Config {
	return Config{
		DataDir:             "./supervisor-data",
		Stdio:               true,
		HTTPAddr:            "127.0.0.1:9464",
		HeartbeatTimeout:    5 * time.Second,
		StartTimeout:        30 * time.Second,
		KillTimeout:         5 * time.Second,
		ShutdownTimeout:     10 * time.Second,
		Restart:             RestartAlways,
		BackoffInitial:      100 * time.Millisecond,
		BackoffMax:          30 * time.Second,
		MaxRestarts:         5,
		RestartWindow:       60 * time.Second,
		HealthyReset:        10 * time.Second,
		WALSync:             "batch",
		WALSyncInterval:     10 * time.Millisecond,
		WALSegmentSize:      64 << 20,
		CheckpointRetain:    5,
		MaxFrameSize:        128 << 20,
		ShadowDuration:      30 * time.Second,
		RequestRetention:    10 * time.Minute,
		RequestTimeout:      10 * time.Minute,
		RequestJournalBytes: 64 << 20,
		RequestMaxAttempts:  3,

		ReplicaSyncInterval: time.Second,

		Judge:               defaultJudge(),
		EvolutionMinReports: 1,
	}
}

// walSyncPolicy parses --wal-sync, for Validate and for opening the WAL
// alike, so both say the same thing of a bad value.
func (c *Config) walSyncPolicy() (wal.SyncPolicy, error) {
	p, err := wal.ParseSyncPolicy(c.WALSync)
	if err != nil {
		return 0, fmt.Errorf("%w: --wal-sync %w", ErrConfig, err)
	}
	return p, nil
}

// ErrConfig marks configuration errors (exit code 2).
var ErrConfig = errors.New("configuration error")

// Validate checks the configuration and says what to fix.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.DataDir == "" {
		return bad("--data-dir must not be empty")
	}
	if len(c.Command) == 0 || c.Command[0] == "" {
		return bad("no agent command: put it after --, e.g. supervisor run -- ./my-agent --flag")
	}
	positive := []struct {
		name string
		d    time.Duration
	}{
		{"--heartbeat-timeout", c.HeartbeatTimeout}, {"--start-timeout", c.StartTimeout},
		{"--kill-timeout", c.KillTimeout}, {"--shutdown-timeout", c.ShutdownTimeout},
		{"--backoff-initial", c.BackoffInitial}, {"--backoff-max", c.BackoffMax},
		{"--restart-window", c.RestartWindow}, {"--wal-sync-interval", c.WALSyncInterval},
		{"--shadow-duration", c.ShadowDuration},
	}
	for _, p := range positive {
		if p.d <= 0 {
			return bad("%s must be a positive duration, got %s", p.name, p.d)
		}
	}
	if c.BackoffMax < c.BackoffInitial {
		return bad("--backoff-max (%s) must not be below --backoff-initial (%s)", c.BackoffMax, c.BackoffInitial)
	}
	if _, err := ParseRestartPolicy(string(c.Restart)); err != nil {
		return bad("%v", err)
	}
	if c.MaxRestarts < 0 {
		return bad("--max-restarts must be 0 (never give up) or more, got %d", c.MaxRestarts)
	}
	if c.CheckpointRetain < 1 {
		return bad("--checkpoint-retain must be at least 1, got %d", c.CheckpointRetain)
	}
	if c.CheckpointLevel < 0 || c.CheckpointLevel > 4 {
		return bad("--checkpoint-level must be 1 (fastest) to 4 (best compression), or 0 for the default, got %d", c.CheckpointLevel)
	}
	if c.MaxFrameSize < 1024 {
		return bad("--max-frame-size must be at least 1024 bytes, got %d", c.MaxFrameSize)
	}
	if _, err := c.walSyncPolicy(); err != nil {
		return err
	}
	if c.Judge.MaxDuration == 0 {
		c.Judge.MaxDuration = 4 * c.ShadowDuration
	}
	if c.Judge.MaxDuration < c.ShadowDuration {
		return bad("--evolution-max-duration (%s) must not be below --shadow-duration (%s), the minimum trial time", c.Judge.MaxDuration, c.ShadowDuration)
	}
	if err := c.judgeConfig().Validate(); err != nil {
		return bad("evolution judge: %v", err)
	}
	if err := c.fallbackThresholds().Validate(); err != nil {
		return bad("evolution thresholds: %v", err)
	}
	if c.EvolutionMinReports < 1 {
		return bad("--evolution-min-reports must be at least 1, got %d", c.EvolutionMinReports)
	}
	if c.HealthyReset <= 0 {
		c.HealthyReset = 10 * time.Second
	}
	if c.RequestRetention < 0 {
		return bad("--request-retention must be a positive duration, got %s", c.RequestRetention)
	}
	if c.RequestRetention == 0 {
		c.RequestRetention = 10 * time.Minute
	}
	if c.RequestTimeout < 0 {
		return bad("--request-timeout must be a positive duration, got %s", c.RequestTimeout)
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 10 * time.Minute
	}
	if c.RequestJournalBytes < 0 || c.RequestJournalBytes > 0 && c.RequestJournalBytes < 4096 {
		return bad("--request-journal-bytes must be at least 4096, got %d", c.RequestJournalBytes)
	}
	if c.RequestJournalBytes == 0 {
		c.RequestJournalBytes = 64 << 20
	}
	if c.RequestMaxAttempts < 0 {
		return bad("--request-max-attempts must be at least 1, got %d", c.RequestMaxAttempts)
	}
	if c.RequestMaxAttempts == 0 {
		c.RequestMaxAttempts = 3
	}
	if c.HTTPAddr != "" && c.HTTPTokenFile == "" && !c.HTTPAllowRemote && !api.IsLoopbackAddr(c.HTTPAddr) {
		return bad("--http-addr %s is not a loopback address and no --http-token-file protects /v1/requests: "+
			"anyone who can reach it could send work to the agent. Give --http-token-file FILE (a bearer token), "+
			"or --http-allow-remote to expose it without one (e.g. behind an authenticating proxy or a network policy)", c.HTTPAddr)
	}
	if c.HTTPTokenFile != "" && !c.AllowInsecureTokenFile {
		if err := api.CheckTokenFile(c.HTTPTokenFile); errors.Is(err, api.ErrInsecureTokenFile) {
			return bad("%v", err)
		} // any other error (a missing file) is reported when the token is read
	}
	if c.ProbeAddr != "" && c.ProbeAddr == c.HTTPAddr && !strings.HasSuffix(c.ProbeAddr, ":0") {
		return bad("--probe-addr %s is also --http-addr: give the probes a port of their own", c.ProbeAddr)
	}
	if err := c.validateReplica(); err != nil {
		return bad("%v", err)
	}
	if c.WALSegmentSize < 4096 {
		return bad("--wal-segment-size must be at least 4096 bytes, got %d", c.WALSegmentSize)
	}
	return nil
}

// defaultJudge is the judge's configuration by default: the judge's own
// defaults, durations from --shadow-duration.
func defaultJudge() evolution.JudgeConfig {
	j := evolution.DefaultJudgeConfig()
	j.MinDuration, j.MaxDuration, j.Control = 0, 0, true
	return j
}

// judgeConfig is the judge's configuration for a trial: the minimum trial
// time is --shadow-duration.
func (c *Config) judgeConfig() evolution.JudgeConfig {
	j := c.Judge
	j.MinDuration = c.ShadowDuration
	if j.MaxDuration == 0 {
		j.MaxDuration = 4 * c.ShadowDuration
	}
	return j
}

// fallbackThresholds are the limits on the agents' own reported figures,
// used when a trial saw no mirrored request (evolution.Decide).
func (c *Config) fallbackThresholds() evolution.Thresholds {
	return evolution.Thresholds{MaxLatencyIncrease: c.Judge.MaxLatencyIncrease,
		MaxErrorRateIncrease: c.Judge.MaxErrorRateIncrease, MaxMemoryIncrease: c.Judge.MaxMemoryIncrease}
}
