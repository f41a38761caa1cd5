package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// dataDirError is a start that failed because the data directory cannot be
// written: a read-only file system (EROFS) or permissions (EACCES, EPERM).
// It says that, and what to do, in place of the low-level error (which
// guessed at a planted symlink); the low-level error stays in its chain.
type dataDirError struct {
	dir   string
	what  string // what failed: "open /data/LOCK", "access /data"
	errno syscall.Errno
	err   error
}

func (e *dataDirError) Error() string {
	if e.errno == syscall.EROFS {
		return fmt.Sprintf("the data directory %s is on a read-only file system (%s: %v): "+
			"the supervisor writes its lock, WAL, checkpoints and audit log there. Mount it read-write, "+
			"or point --data-dir at a writable directory (in Kubernetes: a volume not mounted readOnly)",
			e.dir, e.what, e.errno)
	}
	return fmt.Sprintf("the data directory %s is not writable by this user (uid %d; %s: %v): "+
		"chown it to uid %d and chmod 700, or run the supervisor as the directory's owner",
		e.dir, os.Getuid(), e.what, e.errno, os.Getuid())
}

func (e *dataDirError) Unwrap() error { return e.err }

// explainDataDir returns err as a *dataDirError (exit code 2: retrying will
// not help) when it is an operation on dir, or on a path in or above it,
// refused by a read-only file system or by permissions, and err itself
// otherwise (an agent command that is not executable is not about dir).
func explainDataDir(dir string, err error) error {
	var errno syscall.Errno
	var pe *fs.PathError
	if err == nil || !errors.As(err, &pe) || !errors.As(pe.Err, &errno) ||
		(errno != syscall.EROFS && errno != syscall.EACCES && errno != syscall.EPERM) || !related(dir, pe.Path) {
		return err
	}
	return &cliError{cmd: "run", err: &dataDirError{dir: dir, what: pe.Op + " " + pe.Path, errno: errno, err: err}, code: exitUsage}
}

// related reports whether path is dir, inside it, or a directory above it
// (where dir would be created).
func related(dir, path string) bool {
	dir, path = filepath.Clean(dir), filepath.Clean(path)
	within := func(a, b string) bool { // a is b or below it
		r, err := filepath.Rel(b, a)
		return err == nil && r != ".." && !strings.HasPrefix(r, "../")
	}
	return within(path, dir) || within(dir, path)
}

// checkDataDirWritable refuses, before anything starts, a data directory
// (or, when it does not exist yet, the nearest directory above it, where it
// would be created) that this process may not write: access(2) says EROFS
// for a read-only file system, EACCES for permissions.
func checkDataDirWritable(dir string) error {
	if dir == "" {
		return nil
	}
	p := dir
	for {
		if _, err := os.Stat(p); err == nil {
			break
		}
		up := filepath.Dir(p)
		if up == p {
			return nil
		}
		p = up
	}
	if err := syscall.Access(p, 2 /* W_OK */); err != nil {
		return explainDataDir(dir, &fs.PathError{Op: "access", Path: p, Err: err})
	}
	return nil
}
