package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// builds holds the binaries goBuild made, by name: each is built once per
// test binary, on first use, beside the supervisor TestMain built.
var builds struct {
	mu sync.Mutex
	m  map[string]*built
}

type built struct {
	once sync.Once
	path string
	err  error
}

// goBuild builds the Go package pkg (a path relative to test/) into a binary
// called name, with flags added to go build's and env to its environment,
// once per test binary, and returns its path. A failed build fails every
// caller, with go build's output.
func goBuild(t testing.TB, name, pkg string, env []string, flags ...string) string {
	t.Helper()
	builds.mu.Lock()
	if builds.m == nil {
		builds.m = map[string]*built{}
	}
	b := builds.m[name]
	if b == nil {
		b = &built{}
		builds.m[name] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() {
		b.path = filepath.Join(filepath.Dir(binPath), name)
		args := append(append([]string{"build"}, flags...), "-o", b.path, pkg)
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}
