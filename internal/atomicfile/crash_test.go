package atomicfile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crashDirEnv makes the test binary the writer that TestCrashNeverTearsTarget
// kills: it rewrites target in that directory, generation after generation,
// until it is killed.
const crashDirEnv = "ATOMICFILE_TEST_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		os.Exit(crashWriter(dir))
	}
	os.Exit(m.Run())
}

const (
	crashTarget  = "target"
	crashPayload = 256 << 10
)

// generation returns the content of generation g: the generation, a
// payload of the byte g repeated, and a CRC-32 of both.
func generation(g uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, g)
	b = append(b, strings.Repeat(string(rune(g%128)), crashPayload)...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// parseGeneration says which generation b is, or why it is none (torn).
func parseGeneration(b []byte) (uint64, error) {
	if len(b) != 8+crashPayload+4 {
		return 0, fmt.Errorf("%d bytes, a generation has %d", len(b), 8+crashPayload+4)
	}
	body := b[:len(b)-4]
	if crc32.ChecksumIEEE(body) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return 0, fmt.Errorf("checksum mismatch")
	}
	return binary.BigEndian.Uint64(b), nil
}

// crashWriter rewrites the target with the next generations, in chunks so
// that a kill can land in the middle of a write, and says "writing" once the
// first write has begun.
func crashWriter(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, crashTarget))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, err := parseGeneration(b)
	if err != nil {
		fmt.Fprintln(os.Stderr, "the writer found a torn target:", err)
		return 1
	}
	for said := false; ; {
		g++
		data := generation(g)
		_, err := Write(dir, crashTarget, func(f *os.File) error {
			if !said {
				said = true
				fmt.Println("writing")
			}
			for off := 0; off < len(data); off += 4096 {
				if _, err := f.Write(data[off:min(off+4096, len(data))]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
}

// TestCrashNeverTearsTarget kills a writer at random moments: afterwards the
// target is always one whole generation, never older than before, and Sweep
// leaves no temporary file behind. It goes on until kills have interrupted
// a write in progress several times (a temporary file was left), so that it
// cannot pass without testing what it claims.
func TestCrashNeverTearsTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("kills writers for a while")
	}
	dir := t.TempDir()
	if err := WriteFile(dir, crashTarget, generation(0)); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const wantInterrupted, maxRounds = 10, 400
	var last uint64
	interrupted, rounds := 0, 0
	for ; interrupted < wantInterrupted && rounds < maxRounds; rounds++ {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "writing\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: the writer said %q, %v; want writing", rounds, line, err)
		}
		// A random kill point, from inside the first write to a few
		// generations later.
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: the writer ended by itself (%v) instead of being killed", rounds, cmd.ProcessState)
		}

		b, err := os.ReadFile(filepath.Join(dir, crashTarget))
		if err != nil {
			t.Fatalf("round %d: target after a kill: %v", rounds, err)
		}
		g, err := parseGeneration(b)
		if err != nil {
			t.Fatalf("round %d: target torn by a kill: %v", rounds, err)
		}
		if g < last {
			t.Fatalf("round %d: target went back from generation %d to %d", rounds, last, g)
		}
		last = g

		removed, err := Sweep(dir, crashTarget)
		if err != nil {
			t.Fatalf("round %d: Sweep: %v", rounds, err)
		}
		if len(removed) > 0 {
			interrupted++
		}
		if names := readDirNames(t, dir); len(names) != 1 || names[0] != crashTarget {
			t.Fatalf("round %d: after Sweep the directory holds %v, want only %s", rounds, names, crashTarget)
		}
	}
	t.Logf("%d rounds, %d kills in the middle of a write, generation %d reached", rounds, interrupted, last)
	if interrupted < wantInterrupted {
		t.Fatalf("only %d of %d kills landed in the middle of a write; the test did not test torn writes", interrupted, rounds)
	}
}
