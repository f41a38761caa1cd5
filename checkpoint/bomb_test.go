package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/uuid"
)

const bombEnv = "CHECKPOINT_TEST_BOMB_DIR"

// TestZstdBomb loads checkpoints whose small bodies decompress to many GiB.
// The loads run in a child process (this test binary re-executed) whose
// address space is capped, so a regression that decompresses without bound
// fails this test instead of taking the machine or the suite down.
func TestZstdBomb(t *testing.T) {
	if dir := os.Getenv(bombEnv); dir != "" {
		bombChild(t, dir)
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc/self/status and RLIMIT_AS")
	}
	s := openStore(t, Options{})
	bombs := []struct {
		claim uint64 // uncompressed size in the header
		total uint64 // what the body decodes to
		fcs   bool
	}{
		{1 << 20, 4 << 30, false},
		{DefaultMaxSize, 16 << 30, true},
		{16 << 20, 16 << 30, false},
	}
	for _, b := range bombs {
		id := uuid.Must(uuid.NewV7())
		body := zstdRLEBomb(b.total, b.fcs)
		file := forge(id, b.claim, uint64(len(body)), 0, body)
		if err := os.WriteFile(ckptPath(s, id.String()), file, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Logf("bomb %s: %d bytes on disk decode to %d GiB; header claims %d bytes", id, len(file), b.total>>30, b.claim)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestZstdBomb$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), bombEnv+"="+s.dir)
	out, err := cmd.CombinedOutput()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child process: %v", err)
	}
	if !strings.Contains(string(out), "bombs defused") {
		t.Fatal("child process did not run the bomb loads")
	}
}

// bombChild caps its own address space at 1 GiB over what it maps now, then
// loads every checkpoint in dir, each of which must fail as corrupt having
// allocated little more than its header's claim.
func bombChild(t *testing.T, dir string) {
	vm, err := vmSize()
	if err != nil {
		t.Fatal(err)
	}
	limit := vm + 1<<30
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	s, err := Open(dir, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := s.List()
	if err != nil || len(ms) == 0 {
		t.Fatalf("List = %v, %v", ms, err)
	}
	for _, m := range ms {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, data, err := s.Load(m.ID)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorrupt) || data != nil {
			t.Errorf("Load(bomb %s) = %d bytes, %v; want ErrCorrupt", m.ID, len(data), err)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		if limit := uint64(m.Size) + 32<<20; alloc > limit {
			t.Errorf("Load(bomb %s) allocated %d bytes, want at most the claim %d + 32 MiB", m.ID, alloc, m.Size)
		}
		t.Logf("Load(bomb %s): %v; allocated %d MiB", m.ID, err, alloc>>20)
	}
	fmt.Println("bombs defused")
}

// vmSize is the process's mapped address space, from /proc/self/status.
func vmSize() (uint64, error) {
	f, err := os.Open(filepath.Join("/proc", "self", "status"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmSize in /proc/self/status")
}
