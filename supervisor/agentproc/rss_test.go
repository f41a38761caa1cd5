package agentproc

import (
	"os"
	"syscall"
	"testing"
)

func TestGroupRSSOfOwnGroup(t *testing.T) {
	pg, err := syscall.Getpgid(os.Getpid())
	if err != nil {
		t.Skip(err)
	}
	rss, ok := GroupRSS(pg)
	if !ok || rss < 1<<20 {
		t.Fatalf("own group RSS %d %v", rss, ok)
	}
	if _, ok := GroupRSS(1 << 30); ok {
		t.Fatal("found a group that does not exist")
	}
	if g, r, ok := parseStat([]byte("12 (a) b) c) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 200 33 x")); !ok || g != 7 || r != 33 {
		t.Fatalf("parse %d %d %v", g, r, ok)
	}
}
