package wal

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// datasync flushes f's data (and the metadata needed to read it back) to the disk.
func datasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// fallocate reserves size bytes for f. Filesystems that cannot (tmpfs on old
// kernels, some network filesystems) are not an error: the caller writes the
// zeros anyway.
func fallocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINTR) {
		return nil
	}
	return err
}

// lockFile takes an exclusive, non-blocking flock on f.
func lockFile(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}
