package testagent

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(Config) bool
		wantErr error
	}{
		{"defaults", nil, nil, func(c Config) bool {
			return c.HeartbeatInterval == time.Second && c.CheckpointInterval == 5*time.Minute &&
				c.MetricsInterval == 10*time.Second && c.ProtocolVersion == 2 && c.CrashCode == 1 && c.WALRate == 0
		}, nil},
		{"flags", []string{"--wal-rate", "500", "--wal-batch=10", "--entry-size", "1024", "--garbage", "zero", "--ignore-sigterm"}, nil,
			func(c Config) bool {
				return c.WALRate == 500 && c.WALBatch == 10 && c.EntrySize == 1024 && c.Garbage == GarbageZero && c.IgnoreSIGTERM
			}, nil},
		{"environment stands in for missing flags", nil,
			map[string]string{"REFAGENT_WAL_RATE": "250", "REFAGENT_CRASH_AFTER": "3s", "REFAGENT_FORK_GRANDCHILD": "true", "REFAGENT_EVENTS": "/tmp/e"},
			func(c Config) bool {
				return c.WALRate == 250 && c.CrashAfter == 3*time.Second && c.ForkGrandchild && c.EventsPath == "/tmp/e"
			}, nil},
		{"a flag beats its variable", []string{"--wal-rate=7"}, map[string]string{"REFAGENT_WAL_RATE": "250"},
			func(c Config) bool { return c.WALRate == 7 }, nil},
		{"bad variable", nil, map[string]string{"REFAGENT_HEARTBEAT_INTERVAL": "soon"}, nil, ErrUsage},
		{"unknown flag", []string{"--no-such-flag"}, nil, nil, ErrUsage},
		{"stray argument", []string{"extra"}, nil, nil, ErrUsage},
		{"negative duration", []string{"--crash-after=-1s"}, nil, nil, ErrUsage},
		{"batch above the supervisor's limit", []string{"--wal-batch=101"}, nil, nil, ErrUsage},
		{"protocol version 3", []string{"--protocol-version=3"}, nil, nil, ErrUsage},
		{"unknown garbage", []string{"--garbage=confetti"}, nil, nil, ErrUsage},
		{"exit code out of range", []string{"--crash-code=300"}, nil, nil, ErrUsage},
		{"help", []string{"-h"}, nil, nil, flag.ErrHelp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			cfg, err := ParseArgs(tt.args, lookup, io.Discard)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Errorf("config = %+v", cfg)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("checkpoint-every"); got != "REFAGENT_CHECKPOINT_EVERY" {
		t.Errorf("EnvName = %s", got)
	}
}

func TestMainUsage(t *testing.T) {
	if code := Main([]string{"-h"}); code != ExitOK {
		t.Errorf("Main(-h) = %d, want 0", code)
	}
	if code := Main([]string{"--garbage=confetti"}); code != ExitUsage {
		t.Errorf("Main(bad flag) = %d, want %d", code, ExitUsage)
	}
	t.Setenv("SUPERVISOR_TRANSPORT", "carrier-pigeon")
	if code := Main(nil); code != ExitUsage {
		t.Errorf("Main with an unknown transport = %d, want %d", code, ExitUsage)
	}
}

func TestParseBehaviour(t *testing.T) {
	base := DefaultBehaviour()
	tests := []struct {
		name    string
		code    string
		want    Behaviour
		wantErr string
	}{
		{"empty keeps base", "", base, ""},
		{"all three", "latency_ms=5 error_rate=0.01 memory_mb=80", Behaviour{5, 0.01, 80, 0.2, 0}, ""},
		{"noise and answers", "jitter=0.25 differ=0.1", Behaviour{5, 0, 0, 0.25, 0.1}, ""},
		{"separators and comments", "# tuned\nlatency_ms=2;error_rate=0 , memory_mb=1 # trailing\n\n", Behaviour{2, 0, 1, 0.2, 0}, ""},
		{"partial overrides", "error_rate=1", Behaviour{base.LatencyMS, 1, 0, 0.2, 0}, ""},
		{"lisp is not config", "(def (memory-search q) ...)", base, "not key=value"},
		{"unknown key", "latency=5", base, "unknown setting"},
		{"not a number", "latency_ms=fast", base, "not a number"},
		{"NaN", "latency_ms=NaN", base, "not a number"},
		{"out of range", "error_rate=1.5", base, "out of range"},
		{"negative", "memory_mb=-1", base, "out of range"},
		{"too long", strings.Repeat("latency_ms=1 ", 400), base, "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBehaviour(tt.code, base)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrCode) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrCode mentioning %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("behaviour = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBehaviourOfModules(t *testing.T) {
	b, err := behaviourOf(DefaultBehaviour(), map[string]string{"b_tools": "latency_ms=9", "a_memory": "latency_ms=3 memory_mb=10", "c_bad": "nonsense"})
	if b != (Behaviour{LatencyMS: 9, MemoryMB: 10, Jitter: 0.2}) {
		t.Errorf("behaviour = %+v, want modules overlaid in name order", b)
	}
	if err == nil || !strings.Contains(err.Error(), "c_bad") {
		t.Errorf("err = %v, want one naming the module that does not parse", err)
	}
}
