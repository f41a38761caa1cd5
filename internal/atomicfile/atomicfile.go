// Package atomicfile replaces files so that a crash at any moment leaves a
// file holding either its old content or its new content, never a mix, and
// makes directory changes durable.
//
// A replacement is written to a temporary file beside the target, fsynced,
// renamed over the target, and the directory fsynced. The temporary file is
// named <name>.<random>.tmp, created with O_CREAT|O_EXCL (a file or symlink
// planted under that name is never written through) and mode 0600, and held
// under an exclusive flock until it has its final name, so that [Sweep] in
// another process — a read-only command opening the same store — never
// removes a file that is still being written.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// TempSuffix ends the name of every temporary file: one being written, or
// one a crash left behind. Readers never look at such files.
const TempSuffix = ".tmp"

// ErrNotDurable marks an error that came after the rename: the target already
// holds the new content, but it is not known to survive a crash (the
// directory fsync failed). A caller that must keep disk and memory in step
// puts the old content back; errors.Is finds it, the message is the cause's.
var ErrNotDurable = errors.New("atomicfile: replaced, but the rename is not known to be durable")

// notDurable is an error after the rename: it reads as its cause and matches
// both the cause and ErrNotDurable.
type notDurable struct{ err error }

func (e notDurable) Error() string   { return e.err.Error() }
func (e notDurable) Unwrap() []error { return []error{e.err, ErrNotDurable} }

// Write makes dir/name hold exactly what write puts in the temporary file
// it is given, or leaves dir/name as it was. write may seek and write at
// offsets; its error is returned as it is. Write returns the size of the new
// file. An error before the rename removes the temporary file; one after it
// wraps [ErrNotDurable].
func Write(dir, name string, write func(f *os.File) error) (size int64, err error) {
	t, err := CreateTemp(dir, name)
	if err != nil {
		return 0, err
	}
	if err := write(t.F); err != nil {
		t.Abort()
		return 0, err
	}
	return t.Commit(name)
}

// Temp is a temporary file in dir that becomes a file of the directory
// only by Commit: [Write] split in two for a writer that learns the name
// (or whether to keep the file at all) after the bytes.
type Temp struct {
	F   *os.File // the temporary file, locked against sweeps until closed
	dir string
}

// CreateTemp creates a temporary file in dir for a file to be called
// prefix-something (or another name given to Commit).
func CreateTemp(dir, prefix string) (*Temp, error) {
	f, err := createTemp(dir, prefix)
	if err != nil {
		return nil, err
	}
	return &Temp{F: f, dir: dir}, nil
}

// Abort closes and removes the temporary file.
func (t *Temp) Abort() {
	t.F.Close()
	os.Remove(t.F.Name())
}

// Commit fsyncs the temporary file, renames it to dir/name and fsyncs dir,
// as [Write] does. An error before the rename removes the temporary file;
// one after it wraps [ErrNotDurable].
func (t *Temp) Commit(name string) (size int64, err error) {
	f, dir := t.F, t.dir
	renamed := false
	defer func() {
		if err != nil && !renamed {
			t.Abort()
		}
	}()
	err = hooked(filepath.Join(dir, name))
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return 0, fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	// Renamed while still open, so still locked: a concurrent sweep cannot
	// take it between the fsync and the rename.
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return 0, err
	}
	renamed = true
	if err := f.Close(); err != nil {
		return fi.Size(), notDurable{fmt.Errorf("close %s: %w", name, err)}
	}
	if err := SyncDir(dir); err != nil {
		return fi.Size(), notDurable{err}
	}
	return fi.Size(), nil
}

// WriteFile is [Write] for content that is already in memory.
func WriteFile(dir, name string, data []byte) error {
	_, err := Write(dir, name, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	return err
}

// createTemp creates the temporary file for name in dir and holds an
// exclusive flock on it until it is closed. Between its creation and the
// lock a sweeper may take it; each try loses only if a sweep lands in that
// window of a few microseconds, so many tries make losing them all
// impossible in practice (three were lost under a tight Open loop on a
// loaded machine).
func createTemp(dir, name string) (*os.File, error) {
	const tries = 100
	for range tries {
		// os.CreateTemp opens with O_CREAT|O_EXCL, mode 0600, O_CLOEXEC.
		f, err := os.CreateTemp(dir, name+".*"+TempSuffix)
		if err != nil {
			return nil, err
		}
		if err := flock(f, syscall.LOCK_EX); err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		// A sweeper may have locked and removed the file between its creation
		// and our lock. Only a file still reachable under its name is ours.
		fi, ferr := f.Stat()
		pi, perr := os.Lstat(f.Name())
		if ferr == nil && perr == nil && os.SameFile(fi, pi) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("create temporary file for %s in %s: removed by a concurrent sweep %d times (is another process sweeping this directory in a loop?)", name, dir, tries)
}

// SyncDir fsyncs dir so that creations, renames and removals in it are
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err = hooked(dir); err == nil {
		err = fsyncDir(d)
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// fsyncDir is (*os.File).Sync; the tests replace it to see a directory fsync
// fail.
var fsyncDir = (*os.File).Sync

// Remove removes dir/name and fsyncs dir. A file that is already gone is not
// an error, but dir is fsynced all the same: an earlier Remove may have
// unlinked it and then failed its fsync, and the removal is durable only
// once one succeeds.
func Remove(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return SyncDir(dir)
}

// MkdirAll creates dir and every missing parent with mode perm, as
// os.MkdirAll does, and makes the creations durable: each directory it
// creates is followed by an fsync of its parent, and dir's parent is fsynced
// even when dir already existed (an earlier MkdirAll may have created it and
// failed before its fsync; until one succeeds, a power cut can take dir and
// everything in it). Without it a new directory is durable only by accident
// of the filesystem's journal (SPEC §4, "Durable means durable across a
// machine crash").
func MkdirAll(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	if _, err := mkdirAll(dir, perm); err != nil {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		return SyncDir(parent)
	}
	return nil
}

// mkdirAll creates dir and its missing parents, fsyncing the parent of each
// directory it creates except dir's own (MkdirAll does that one), and says
// whether it created dir.
func mkdirAll(dir string, perm os.FileMode) (created bool, err error) {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return false, &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		made, err := mkdirAll(parent, perm)
		if err != nil {
			return false, err
		}
		if made {
			if gp := filepath.Dir(parent); gp != parent {
				if err := SyncDir(gp); err != nil {
					return false, err
				}
			}
		}
	}
	if err := os.Mkdir(dir, perm); err != nil {
		if errors.Is(err, os.ErrExist) {
			if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
				return false, nil // created meanwhile by someone else
			}
		}
		return false, err
	}
	return true, nil
}

// Sweep removes the temporary files in dir that no live writer holds (left
// by a crash) and returns their names: those of target name, or of every
// target when name is "". A file a writer has locked is left alone.
func Sweep(dir, name string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(n, TempSuffix) || (name != "" && !strings.HasPrefix(n, name+".")) {
			continue
		}
		path := filepath.Join(dir, n)
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		switch err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); {
		case errors.Is(err, syscall.EWOULDBLOCK):
			// A live writer holds it.
		case err != nil:
			errs = append(errs, fmt.Errorf("lock %s: %w", path, err))
		default:
			if err := os.Remove(path); err == nil {
				removed = append(removed, n)
			} else if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		f.Close()
	}
	return removed, errors.Join(errs...)
}

// flock applies an advisory lock to f, retrying on EINTR.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// ErrTooLarge: ReadLimited found a file longer than its limit.
var ErrTooLarge = errors.New("atomicfile: file larger than its limit")

// ReadLimited reads the small file at path without following a symlink in
// its last component (a planted link is refused, never read through), and
// fails with an error wrapping ErrTooLarge when it holds more than limit
// bytes: a hostile size never makes the caller allocate more.
func ReadLimited(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is longer than %d bytes", ErrTooLarge, path, limit)
	}
	return b, nil
}
