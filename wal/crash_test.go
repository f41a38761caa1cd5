package wal

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Environment of the crash child (TestCrashChild).
const (
	crashDirEnv      = "WAL_CRASH_CHILD_DIR"
	crashPolicyEnv   = "WAL_CRASH_CHILD_POLICY"
	crashPreallocEnv = "WAL_CRASH_CHILD_PREALLOC"
	crashSeedEnv     = "WAL_CRASH_CHILD_SEED"
)

// TestCrashKill9 runs a child process that appends in a loop and reports
// each durable sequence on stdout, kills it with SIGKILL at a random moment,
// and checks that the log opens cleanly, holds every entry the child
// reported durable (intact, with no holes), and appends again. 50 rounds by
// default; WAL_CRASH_ITERATIONS=N for more.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	iterations := 50
	if s := os.Getenv("WAL_CRASH_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("WAL_CRASH_ITERATIONS=%q: want a positive number", s)
		}
		iterations = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("WAL_CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with WAL_CRASH_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	policies := []SyncPolicy{SyncBatch, SyncAlways, SyncNone}
	var maxSeen uint64
	torn := 0
	for i := range iterations {
		policy := policies[i%len(policies)]
		prealloc := i%2 == 0
		durable, err := runCrashChild(t, dir, policy, prealloc, rng.Uint64(), time.Duration(rng.IntN(60))*time.Millisecond)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		o := testOptions(t, dir)
		o.SegmentSize = 32 << 10
		l, err := Open(o)
		if err != nil {
			t.Fatalf("round %d (%v, prealloc %v): Open after kill -9: %v", i, policy, prealloc, err)
		}
		rec := l.Recovery()
		if rec.TruncatedBytes > 0 {
			torn++
		}
		if rec.Corruption != nil {
			l.Close()
			t.Fatalf("round %d (%v, prealloc %v): corruption after kill -9: %v", i, policy, prealloc, rec.Corruption)
		}
		last := l.LastSequence()
		if last < durable {
			l.Close()
			t.Fatalf("round %d (%v, prealloc %v): log ends at %d, but the child reported %d durable", i, policy, prealloc, last, durable)
		}
		first := l.FirstSequence()
		next := first
		if first == 0 {
			next = last + 1 // no entry yet: the child was killed before its first append
		}
		err = l.ReadAfter(0, func(e Entry) error {
			if e.Sequence != next {
				return fmt.Errorf("entry %d where %d was expected (a hole)", e.Sequence, next)
			}
			if !bytes.Equal(e.Data, payload(e.Sequence)) {
				return fmt.Errorf("entry %d has the wrong data", e.Sequence)
			}
			next++
			return nil
		})
		if err == nil && next != last+1 {
			err = fmt.Errorf("read up to %d, log ends at %d", next-1, last)
		}
		if err == nil {
			_, err = l.Append(Entry{Sequence: last + 1, Data: payload(last + 1)})
		}
		if cerr := l.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("round %d (%v, prealloc %v): %v", i, policy, prealloc, err)
		}
		maxSeen = max(maxSeen, last)
	}
	segs, _ := listSegments(dir)
	t.Logf("%d rounds, %d entries appended, %d torn tails repaired, %d segments left", iterations, maxSeen, torn, len(segs))
	if maxSeen < uint64(iterations) {
		t.Fatalf("the children appended only %d entries in %d rounds", maxSeen, iterations)
	}
}

// runCrashChild starts the child, lets it run for delay after it is ready,
// kills it with SIGKILL and returns the highest sequence it reported durable.
func runCrashChild(t *testing.T, dir string, policy SyncPolicy, prealloc bool, seed uint64, delay time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		crashDirEnv+"="+dir,
		crashPolicyEnv+"="+policy.String(),
		crashPreallocEnv+"="+strconv.FormatBool(prealloc),
		crashSeedEnv+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	ready := make(chan struct{})
	reported := make(chan uint64, 1)
	go func() {
		var maxDurable uint64
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "durable "):
				n, err := strconv.ParseUint(strings.TrimPrefix(line, "durable "), 10, 64)
				if err == nil {
					maxDurable = max(maxDurable, n)
				}
			}
		}
		reported <- maxDurable
	}()
	select {
	case <-ready:
		time.Sleep(delay)
	case <-ctx.Done():
	case <-time.After(time.Minute):
	}
	_ = cmd.Process.Kill()
	durable := <-reported
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
		return 0, fmt.Errorf("child did not die by the signal (%v); its stderr:\n%s", err, stderr.String())
	}
	return durable, nil
}

// TestCrashChild is the child of TestCrashKill9; it does nothing otherwise.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("only runs as the child of TestCrashKill9")
	}
	policy, err := ParseSyncPolicy(os.Getenv(crashPolicyEnv))
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	l, err := Open(Options{Dir: dir, SegmentSize: 32 << 10, Sync: policy, SyncInterval: time.Millisecond,
		NoPreallocate: os.Getenv(crashPreallocEnv) != "true"})
	if err != nil {
		t.Fatal(err)
	}
	if rec := l.Recovery(); rec.Corruption != nil {
		t.Fatal(rec.Corruption)
	}
	fmt.Fprintln(os.Stdout, "ready")
	for {
		s := l.LastSequence() + 1
		n := uint64(1 + rng.IntN(20))
		if _, err := l.Append(seqEntries(s, s+n-1)...); err != nil {
			t.Fatal(err)
		}
		switch {
		case policy == SyncAlways:
			fmt.Fprintf(os.Stdout, "durable %d\n", s+n-1)
		case rng.IntN(4) == 0:
			if err := l.WaitDurable(context.Background(), s+n-1); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(os.Stdout, "durable %d\n", s+n-1)
		}
		if rng.IntN(200) == 0 && s > 500 {
			if _, err := l.TruncateBefore(s - 500); err != nil {
				t.Fatal(err)
			}
		}
	}
}
