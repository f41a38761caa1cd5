//go:build unix && !linux

package wal

import (
	"errors"
	"os"
	"syscall"
)

func datasync(f *os.File) error { return f.Sync() }

func fallocate(*os.File, int64) error { return nil }

func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}
