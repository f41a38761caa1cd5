package wal

import (
	"os"
	"syscall"
)

// Files of the log are opened without following a symlink in the last
// component: a link planted in the WAL directory must not make the
// supervisor read, truncate or write its target (ELOOP instead).
const noFollow = syscall.O_NOFOLLOW | syscall.O_CLOEXEC

func openRead(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|noFollow, 0)
}
