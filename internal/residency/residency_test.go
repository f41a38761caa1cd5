//go:build linux

package residency

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func rssFileKB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "RssFile:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestTrim gives back the test binary's own start-up pages: its file-backed
// resident memory falls, and the program runs on (its code and read-only
// data come back as they are used).
func TestTrim(t *testing.T) {
	before := rssFileKB(t)
	n, err := Trim()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no mapping of the executable was advised")
	}
	after := rssFileKB(t)
	t.Logf("RssFile %d kB → %d kB (%d bytes of mappings advised)", before, after, n)
	if after >= before {
		t.Errorf("RssFile did not fall: %d kB → %d kB", before, after)
	}
	// Code and data are still there: format, parse, allocate.
	if got := strconv.Itoa(12345) + strings.Repeat("x", 3); got != "12345xxx" {
		t.Fatalf("after Trim: %q", got)
	}
	maps, err := readMaps(mustExe(t))
	if err != nil || len(maps) == 0 {
		t.Fatalf("readMaps after Trim: %v, %d mappings", err, len(maps))
	}
}

func mustExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}
