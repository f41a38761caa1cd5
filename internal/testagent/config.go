package testagent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
)

// Garbage kinds for --garbage.
const (
	GarbageBytes    = "bytes"    // random bytes that are not a frame
	GarbageOversize = "oversize" // a 0xFFFFFFFF length prefix and a few bytes
	GarbageZero     = "zero"     // a zero length prefix
	GarbageInvalid  = "invalid"  // a well-framed map with an unknown type
	GarbageNotMap   = "notmap"   // a well-framed MessagePack array
)

// EnvPrefix prefixes the environment variable that stands in for each flag
// not given on the command line: --wal-rate is REFAGENT_WAL_RATE.
const EnvPrefix = "REFAGENT_"

// Config is the reference agent's behaviour. Flags fill it (see
// [ParseArgs]); tests may build it directly from [DefaultConfig].
type Config struct {
	HeartbeatInterval  time.Duration // --heartbeat-interval
	WALRate            float64       // --wal-rate: self-driven memory_add entries per second; 0 = off
	WALBatch           int           // --wal-batch: entries per wal_batch; 0 or 1 = single wal_entry frames
	WALMax             int           // --wal-max: stop after this many self-driven entries; 0 = unlimited
	EntrySize          int           // --entry-size: pad self-driven entries to about this many bytes
	CheckpointInterval time.Duration // --checkpoint-interval; 0 = off
	CheckpointEvery    int           // --checkpoint-every: after every N applied entries; 0 = off
	MetricsInterval    time.Duration // --metrics-interval; 0 = off
	MemoryLimit        int           // --memory-limit: memory blocks (and turns) kept; 0 = unlimited
	EventsPath         string        // --events: JSON-lines event file; "" = none

	CrashAfter     time.Duration // --crash-after: exit with CrashCode after this long
	CrashCode      int           // --crash-code
	CrashOnRestore string        // --crash-on-restore: exit 3 on a restore from this checkpoint id
	HangAfter      time.Duration // --hang-after: stop heartbeats and reading, stay alive
	IgnoreSIGTERM  bool          // --ignore-sigterm
	Garbage        string        // --garbage: one of the Garbage* kinds, after the first heartbeat
	ForkGrandchild bool          // --fork-grandchild: start `sleep 3600` in our process group
	StderrFlood    bool          // --stderr-flood: write lines to stderr without pause
	StartDelay     time.Duration // --start-delay: sleep before connecting

	ProtocolVersion  int           // --protocol-version: 1 or 2
	EvolveAfter      time.Duration // --evolve-after: send one evolution_intent (primary only); 0 = never
	EvolveRepeat     time.Duration // --evolve-repeat: after the first intent, send another every D; 0 = only one
	ShadowCrash      time.Duration // --shadow-crash-after: as a shadow only, exit 1 after this long; 0 = never
	EvolveCode       string        // --evolve-code: the intent's new_code
	StopReadingAfter time.Duration // --stop-reading-after: fault: stop reading (heartbeats go on)
	Answer           bool          // --answer: send a request_result for every process_request
	AnswerSize       int           // --answer-size: pad each answer's data to about this many bytes
	AnswerEcho       bool          // --answer-echo: answer data is {echo: message}, the same from every agent
	AnswerTwice      bool          // --answer-twice: fault: send every request_result twice
	AnswerUnknown    int           // --answer-unknown: fault: with every answer, this many results for ids never sent
	ShadowSilent     bool          // --shadow-silent: fault: as a shadow, answer no request
	ControlCrash     time.Duration // --control-crash-after: as a shadow never hot-reloaded (a control), exit 1 after this long
	Behaviour        string        // --behaviour: module code the agent starts with, under any restored module's
	EvolveTarget     string        // --evolve-target: the intent's target (module)

	// Not flags.
	Logger        *slog.Logger // default: text on Stderr
	Stderr        io.Writer    // for --stderr-flood and the default logger; default os.Stderr
	GrandchildPID int          // set by Main for --fork-grandchild; reported in the start event
}

// DefaultConfig is the configuration with no flags given.
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval:  time.Second,
		CheckpointInterval: 5 * time.Minute,
		MetricsInterval:    10 * time.Second,
		MemoryLimit:        10000,
		CrashCode:          1,
		ProtocolVersion:    2,
		EvolveCode:         "latency_ms=2",
		EvolveTarget:       "memory_system",
	}
}

// ErrUsage: the command line (or a REFAGENT_* variable) is invalid.
var ErrUsage = errors.New("testagent: usage")

// ParseArgs parses the reference agent's flags. A flag not on the command
// line is taken from its REFAGENT_* environment variable through lookup
// when that is set. It returns flag.ErrHelp for -h, and errors wrapping
// [ErrUsage] otherwise; usage text goes to output.
func ParseArgs(args []string, lookup func(string) (string, bool), output io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("testagent", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: testagent [flags]\n\n"+
			"The agent the supervisor's tests run. Run it under the supervisor; every flag\n"+
			"may also be set by an environment variable %sNAME (--wal-rate: %sWAL_RATE).\n\nFlags:\n", EnvPrefix, EnvPrefix)
		fs.PrintDefaults()
	}
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "interval between heartbeats")
	fs.Float64Var(&cfg.WALRate, "wal-rate", cfg.WALRate, "`RATE` self-driven memory_add entries per second (0 = off)")
	fs.IntVar(&cfg.WALBatch, "wal-batch", cfg.WALBatch, "send self-driven entries as wal_batch frames of `N` entries (0 or 1 = one wal_entry each)")
	fs.IntVar(&cfg.WALMax, "wal-max", cfg.WALMax, "stop self-driven work after `N` entries (0 = unlimited)")
	fs.IntVar(&cfg.EntrySize, "entry-size", cfg.EntrySize, "pad self-driven entries to about this many `bytes` (0 = no padding)")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", cfg.CheckpointInterval, "send a checkpoint this often (0 = off)")
	fs.IntVar(&cfg.CheckpointEvery, "checkpoint-every", cfg.CheckpointEvery, "send a checkpoint after every `N` applied entries (0 = off)")
	fs.DurationVar(&cfg.MetricsInterval, "metrics-interval", cfg.MetricsInterval, "send metrics this often (0 = off)")
	fs.IntVar(&cfg.MemoryLimit, "memory-limit", cfg.MemoryLimit, "`N` memory blocks and conversation turns kept, oldest evicted first (0 = unlimited)")
	fs.StringVar(&cfg.EventsPath, "events", cfg.EventsPath, "append JSON lines describing what happened to this `file`")
	fs.DurationVar(&cfg.CrashAfter, "crash-after", cfg.CrashAfter, "fault: exit with --crash-code after this long (0 = never)")
	fs.IntVar(&cfg.CrashCode, "crash-code", cfg.CrashCode, "exit `code` for --crash-after")
	fs.StringVar(&cfg.CrashOnRestore, "crash-on-restore", cfg.CrashOnRestore, "fault: exit 3 on receiving a restore from this checkpoint `id`")
	fs.DurationVar(&cfg.HangAfter, "hang-after", cfg.HangAfter, "fault: stop heartbeats and stop reading after this long, stay alive (0 = never)")
	fs.DurationVar(&cfg.StopReadingAfter, "stop-reading-after", cfg.StopReadingAfter, "fault: stop reading input after this long, heartbeats going on (0 = never)")
	fs.BoolVar(&cfg.IgnoreSIGTERM, "ignore-sigterm", cfg.IgnoreSIGTERM, "fault: ignore SIGTERM")
	fs.StringVar(&cfg.Garbage, "garbage", cfg.Garbage, "fault: after the first heartbeat send `kind`: bytes, oversize, zero, invalid or notmap")
	fs.BoolVar(&cfg.ForkGrandchild, "fork-grandchild", cfg.ForkGrandchild, "fault: start \"sleep 3600\" in the agent's process group")
	fs.BoolVar(&cfg.StderrFlood, "stderr-flood", cfg.StderrFlood, "fault: write lines to stderr continuously")
	fs.DurationVar(&cfg.StartDelay, "start-delay", cfg.StartDelay, "sleep this long before connecting")
	fs.IntVar(&cfg.ProtocolVersion, "protocol-version", cfg.ProtocolVersion, "protocol `version` to speak: 1 or 2 (1 never compresses)")
	fs.DurationVar(&cfg.EvolveAfter, "evolve-after", cfg.EvolveAfter, "send one evolution_intent after this long, as primary only (0 = never)")
	fs.DurationVar(&cfg.EvolveRepeat, "evolve-repeat", cfg.EvolveRepeat, "after the first evolution_intent, send another this often (0 = only one)")
	fs.DurationVar(&cfg.ShadowCrash, "shadow-crash-after", cfg.ShadowCrash, "fault: when running as a shadow, exit 1 after this long (0 = never)")
	fs.StringVar(&cfg.EvolveCode, "evolve-code", cfg.EvolveCode, "the evolution's new_code, module `CODE` such as \"latency_ms=2\"")
	fs.BoolVar(&cfg.Answer, "answer", cfg.Answer, "answer every process_request with a request_result {seq} (or an error result when the behaviour's error_rate fails it)")
	fs.BoolVar(&cfg.AnswerEcho, "answer-echo", cfg.AnswerEcho, "with --answer, answer {echo: message}, the same from every agent (the behaviour's differ adds a random variant to that fraction)")
	fs.BoolVar(&cfg.AnswerTwice, "answer-twice", cfg.AnswerTwice, "fault: with --answer, send every request_result twice")
	fs.IntVar(&cfg.AnswerUnknown, "answer-unknown", cfg.AnswerUnknown, "fault: with --answer, send `N` request_results for ids never sent with every answer")
	fs.BoolVar(&cfg.ShadowSilent, "shadow-silent", cfg.ShadowSilent, "fault: when running as a shadow, answer no request (only the primary answers)")
	fs.DurationVar(&cfg.ControlCrash, "control-crash-after", cfg.ControlCrash, "fault: when running as a shadow that got no hot_reload (an evolution's control), exit 1 after this long (0 = never)")
	fs.IntVar(&cfg.AnswerSize, "answer-size", cfg.AnswerSize, "with --answer, pad each answer's data with a `bytes`-long string (0 = none)")
	fs.StringVar(&cfg.Behaviour, "behaviour", cfg.Behaviour, "module `CODE` the agent starts with, such as \"latency_ms=50\" (restored modules' code overrides it)")
	fs.StringVar(&cfg.EvolveTarget, "evolve-target", cfg.EvolveTarget, "the evolution's target `MODULE`")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || lookup == nil {
			return
		}
		env := EnvName(f.Name)
		if v, ok := lookup(env); ok && v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", env, v, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return cfg, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if err := cfg.validate(); err != nil {
		return cfg, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return cfg, nil
}

// EnvName is the environment variable standing in for a flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (c Config) validate() error {
	var errs []error
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"heartbeat-interval", c.HeartbeatInterval}, {"checkpoint-interval", c.CheckpointInterval},
		{"metrics-interval", c.MetricsInterval}, {"crash-after", c.CrashAfter}, {"hang-after", c.HangAfter},
		{"start-delay", c.StartDelay}, {"evolve-after", c.EvolveAfter}, {"evolve-repeat", c.EvolveRepeat},
		{"shadow-crash-after", c.ShadowCrash}, {"control-crash-after", c.ControlCrash},
	}
	for _, f := range durations {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative", f.name))
		}
	}
	counts := []struct {
		name string
		n    int
	}{
		{"wal-batch", c.WALBatch}, {"wal-max", c.WALMax}, {"entry-size", c.EntrySize},
		{"checkpoint-every", c.CheckpointEvery}, {"memory-limit", c.MemoryLimit}, {"answer-unknown", c.AnswerUnknown},
	}
	for _, f := range counts {
		if f.n < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative", f.name))
		}
	}
	if c.WALRate < 0 {
		errs = append(errs, errors.New("--wal-rate must not be negative"))
	}
	if max := schema.DefaultLimits().BatchEntries; c.WALBatch > max {
		errs = append(errs, fmt.Errorf("--wal-batch %d is above the supervisor's batch limit of %d", c.WALBatch, max))
	}
	if c.CrashCode < 0 || c.CrashCode > 255 {
		errs = append(errs, fmt.Errorf("--crash-code %d is not an exit code (0..255)", c.CrashCode))
	}
	if c.ProtocolVersion != 1 && c.ProtocolVersion != 2 {
		errs = append(errs, fmt.Errorf("--protocol-version %d: want 1 or 2", c.ProtocolVersion))
	}
	switch c.Garbage {
	case "", GarbageBytes, GarbageOversize, GarbageZero, GarbageInvalid, GarbageNotMap:
	default:
		errs = append(errs, fmt.Errorf("--garbage %q: want bytes, oversize, zero, invalid or notmap", c.Garbage))
	}
	return errors.Join(errs...)
}
