package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"
)

func TestExplainDataDir(t *testing.T) {
	wrap := func(op, path string, errno syscall.Errno) error {
		return fmt.Errorf("open lock file: %w (hint)", &fs.PathError{Op: op, Path: path, Err: errno})
	}
	for _, tc := range []struct {
		name string
		err  error
		want string // "" for err unchanged
	}{
		{"read-only, in the directory", wrap("open", "/data/LOCK", syscall.EROFS), "is on a read-only file system (open /data/LOCK"},
		{"read-only, above it", wrap("mkdir", "/", syscall.EROFS), "is on a read-only file system (mkdir /"},
		{"permissions", wrap("open", "/data/wal", syscall.EACCES), "is not writable by this user"},
		{"elsewhere: the agent's binary", wrap("fork/exec", "/opt/agent", syscall.EACCES), ""},
		{"a neighbour with a common prefix", wrap("open", "/data2/x", syscall.EROFS), ""},
		{"another errno", wrap("open", "/data/LOCK", syscall.ELOOP), ""},
		{"no path", syscall.EROFS, ""},
	} {
		got := explainDataDir("/data", tc.err)
		if tc.want == "" {
			if got != tc.err {
				t.Errorf("%s: %v, want it unchanged", tc.name, got)
			}
			continue
		}
		if !strings.Contains(got.Error(), tc.want) || exitCode(got) != exitUsage || !errors.Is(got, tc.err.(interface{ Unwrap() error }).Unwrap()) {
			t.Errorf("%s: %v (exit %d), want %q, exit 2, the cause kept", tc.name, got, exitCode(got), tc.want)
		}
	}
}
