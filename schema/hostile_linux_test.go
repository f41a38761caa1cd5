//go:build linux

package schema_test

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
)

// The hazards these tests guard against end the process instead of failing
// a test: msgpack/v5 allocating from a hostile declared length is a fatal
// out-of-memory that recover cannot catch, deep nesting a stack overflow, a
// zstd bomb an OOM kill. So each case runs in a child process (this test
// binary re-executed) with its memory capped; a regression fails the child,
// and the parent reports it instead of the whole suite dying.

const hostileEnv = "SCHEMA_HOSTILE_CHILD"

// childHeadroom is the address space the child may add to what it has when
// it starts (RLIMIT_AS): a 100 MiB checkpoint body and the zstd window fit,
// a 4 GiB allocation does not.
const childHeadroom = 1 << 30

var hostileCases = map[string]func(t *testing.T){
	"declared-lengths": func(t *testing.T) {
		for _, code := range []byte{0xdd, 0xdf, 0xc6, 0xdb, 0xc9} { // array32, map32, bin32, str32, ext32
			p := []byte{code, 0xff, 0xff, 0xff, 0xff}
			// The same header as a checkpoint's data: {type, timestamp, data: <p>}.
			nested := append([]byte{0x83}, enc("type")...)
			nested = append(nested, enc("checkpoint")...)
			nested = append(nested, enc("timestamp")...)
			nested = append(nested, 1)
			nested = append(nested, enc("data")...)
			nested = append(nested, p...)
			for _, payload := range [][]byte{p, nested, append(p, make([]byte, 64)...)} {
				for _, dir := range []schema.Direction{schema.FromAgent, schema.ToAgent} {
					if _, err := schema.Decode(dir, payload); schema.RuleOf(err) != schema.RuleMalformed {
						t.Errorf("code 0x%02x: got %v, want a malformed error", code, err)
					}
				}
			}
		}
	},
	"deep-nesting": func(t *testing.T) {
		deep := append(bytes.Repeat([]byte{0x91}, 4<<20), 0xc0)
		deepMaps := append(bytes.Repeat([]byte{0x81, 0xa0}, 2<<20), 0xc0)
		for _, payload := range [][]byte{
			deep,
			deepMaps,
			msg("checkpoint", kv{"data", obj(kv{"x", raw(deep)})}),
		} {
			if _, err := schema.Decode(schema.FromAgent, payload); schema.RuleOf(err) != schema.RuleMalformed {
				t.Errorf("got %v, want a malformed error", err)
			}
		}
	},
	"zstd-bomb": func(t *testing.T) {
		// 1 MiB of zeros compresses to a few hundred bytes; 1,000 copies
		// of the frame claim 1,000 MiB against the 100 MiB checkpoint limit.
		frame := zstdBytes(t, obj(kv{"z", make([]byte, 1<<20)}))
		bomb := bytes.Repeat(frame, 1000)
		p := msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(bomb)})
		if _, err := schema.Decode(schema.FromAgent, p); schema.RuleOf(err) != schema.RuleCompression {
			t.Errorf("bomb: got %v, want a compression error", err)
		}
		// A frame header asking for a 2 GiB window, then one RLE block.
		hugeWindow := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 21 << 3, 0x03, 0x00, 0x02, 0x00}
		p = msg("checkpoint", kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", bin(hugeWindow)})
		if _, err := schema.Decode(schema.FromAgent, p); schema.RuleOf(err) != schema.RuleCompression {
			t.Errorf("huge window: got %v, want a compression error", err)
		}
	},
}

func TestHostileInputsInChild(t *testing.T) {
	if name := os.Getenv(hostileEnv); name != "" {
		runHostileChild(t, name)
		return
	}
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	for name := range hostileCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHostileInputsInChild$", "-test.count=1", "-test.v", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), hostileEnv+"="+name)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child process for %q failed after %v (%v): a hostile input crashed or overran the memory cap:\n%s",
					name, time.Since(start).Round(time.Millisecond), err, head(out, 4000))
			}
			if !bytes.Contains(out, []byte("hostile case "+name+" ok")) {
				t.Fatalf("child for %q did not run the case:\n%s", name, tail(out, 4000))
			}
		})
	}
}

func runHostileChild(t *testing.T, name string) {
	run, ok := hostileCases[name]
	if !ok {
		t.Fatalf("unknown hostile case %q", name)
	}
	debug.SetMemoryLimit(512 << 20)
	if !raceEnabled { // the race runtime reserves terabytes of address space
		vm := vmSize(t)
		lim := vm + childHeadroom
		if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
			t.Fatalf("capping the address space: %v", err)
		}
		t.Logf("address space capped at %d MiB (%d MiB in use)", lim>>20, vm>>20)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run(t)
	runtime.ReadMemStats(&after)
	t.Logf("case %s allocated %d MiB in total", name, (after.TotalAlloc-before.TotalAlloc)>>20)
	if !t.Failed() {
		t.Logf("hostile case %s ok", name)
	}
}

// vmSize returns the process's current virtual memory size in bytes.
func vmSize(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmSize:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmSize in /proc/self/status")
	return 0
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// head keeps the start of a crashed child's output: the fatal error and the
// goroutine that hit it.
func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
