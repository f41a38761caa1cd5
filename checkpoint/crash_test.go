package checkpoint

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

const crashEnv = "CHECKPOINT_TEST_CRASH_DIR"

// TestKilledWhileSaving kills a process (this test binary re-executed) with
// SIGKILL at random moments while it saves checkpoints in a loop, then
// checks the store: every checkpoint listed loads, and Open clears what the
// interrupted write left behind.
func TestKilledWhileSaving(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		s, err := Open(dir, Options{Retain: 3})
		if err != nil {
			t.Fatal(err)
		}
		data := cheapData(5 << 20)
		for i := uint64(0); ; i++ {
			if _, err := s.Save(data, i); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Prune(); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := openStore(t, Options{})
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for round := range 4 {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestKilledWhileSaving$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+s.dir)
		cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let it store at least one checkpoint, then kill it at a random
		// point of a later save.
		deadline := time.Now().Add(time.Minute)
		for n := 0; n < round+1; {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("child stored no checkpoint within a minute")
			}
			time.Sleep(10 * time.Millisecond)
			ms, err := s.List()
			if err != nil {
				t.Fatal(err)
			}
			n = len(ms)
		}
		time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
		cmd.Process.Kill()
		if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("child exited with %v, want killed", err)
		}

		s2, err := Open(s.dir, Options{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		des, err := os.ReadDir(s.dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range des {
			if strings.HasSuffix(de.Name(), atomicfile.TempSuffix) {
				t.Errorf("round %d: %s survived Open", round, de.Name())
			}
		}
		ms, err := s2.List()
		if err != nil || len(ms) == 0 {
			t.Fatalf("round %d: List = %v, %v", round, ms, err)
		}
		for _, m := range ms {
			if _, _, err := s2.Load(m.ID); err != nil || m.Bad {
				t.Errorf("round %d: checkpoint %s after the kill: bad %v (%s), Load: %v", round, m.ID, m.Bad, m.BadReason, err)
			}
		}
	}
}
