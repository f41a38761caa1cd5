package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// tmpSuffix ends the name of every file that is still being written. Readers
// never look at such files; [Open] removes the ones no live writer holds.
const tmpSuffix = ".tmp"

// createTemp creates a temporary file for name in dir and holds an exclusive
// flock on it until the file is closed. The lock tells a concurrent [Open]
// (another process sweeping stale temporary files) that the file is in use.
func createTemp(dir, name string) (*os.File, error) {
	for range 3 {
		f, err := os.CreateTemp(dir, name+".*"+tmpSuffix)
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
		pi, perr := os.Stat(f.Name())
		if ferr == nil && perr == nil && os.SameFile(fi, pi) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("create temporary file for %s in %s: removed by a concurrent sweep three times", name, dir)
}

// writeAtomic makes dir/name hold exactly what write produced, or leaves the
// previous state untouched: write to a locked temporary file beside the
// target, fsync, rename over the target, close, fsync the directory. The
// temporary file stays open, and so locked, until it has its final name, so
// a concurrent sweep cannot remove it. It returns the number of bytes in the
// file. An error before the rename removes the temporary file; one after it
// (close, directory fsync) leaves the complete file in place, possibly not
// yet durable.
func writeAtomic(dir, name string, write func(f *os.File) error) (size int64, err error) {
	f, err := createTemp(dir, name)
	if err != nil {
		return 0, err
	}
	renamed := false
	defer func() {
		if err != nil && !renamed {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return 0, err
	}
	renamed = true
	if err := f.Close(); err != nil {
		return fi.Size(), fmt.Errorf("close %s: %w", name, err)
	}
	if err := syncDir(dir); err != nil {
		return fi.Size(), err
	}
	return fi.Size(), nil
}

// writeFileAtomic is writeAtomic for a small, fully built content.
func writeFileAtomic(dir, name string, data []byte) error {
	_, err := writeAtomic(dir, name, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	return err
}

// removeDurably removes dir/name and fsyncs dir. A file that is already gone
// is not an error.
func removeDurably(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory so that renames and removals in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// sweepTemp removes the temporary files in dir that no live writer holds
// (left by a crash) and returns their names. Files a writer has locked are
// left alone, so a read-only command may open the store while the
// supervisor is writing.
func sweepTemp(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), tmpSuffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.Open(path)
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
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			} else if err == nil {
				removed = append(removed, e.Name())
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

// readLimited reads the file at path, failing with an error wrapping
// ErrCorrupt if it is longer than limit. It guards reads of small marker
// files against a hostile size.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := openNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is longer than %d bytes", ErrCorrupt, path, limit)
	}
	return b, nil
}

// openNoFollow opens path for reading without following a symlink in its
// last component: a link planted in the store is refused (ELOOP), never
// read through.
func openNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
}

// checkOwner refuses a file another user owns: whoever can plant a file in
// the store must not decide the agent's state. (The supervisor also refuses
// a data directory others can write; this holds for read-only commands and
// for files planted before the directory was locked down.)
func checkOwner(fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, not by this process's uid %d; refusing to read it (remove it, or chown it if it is genuinely yours)", ErrCorrupt, fi.Name(), st.Uid, uid)
	}
	return nil
}
