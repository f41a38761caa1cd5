package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// checkDataDir refuses a data directory (and its wal/, checkpoints/ and
// shadow/ subdirectories, when present) that is not owned by the user we run
// as, or that group or others may write — as ssh refuses a loose ~/.ssh.
// Whoever can write there can plant a checkpoint the agent would be restored
// from, or a symlink that makes us write where they choose.
func checkDataDir(dir string) error {
	if err := checkOwnedDir(dir, true); err != nil {
		return err
	}
	for _, sub := range []string{"wal", "checkpoints", "shadow"} {
		if err := checkOwnedDir(filepath.Join(dir, sub), false); err != nil {
			return err
		}
	}
	return nil
}

func checkOwnedDir(path string, follow bool) error {
	stat := os.Lstat
	if follow { // the data directory itself may be reached through a symlink
		stat = os.Stat
	}
	fi, err := stat(path)
	if errors.Is(err, fs.ErrNotExist) && !follow {
		return nil // created by us, 0700, when needed
	}
	if err != nil {
		return fmt.Errorf("%w: data directory: %w", ErrConfig, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory (a symlink or file planted in the data directory?); remove it", ErrConfig, path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, but the supervisor runs as uid %d; refusing to trust it "+
			"(another user could plant state the agent would be restored from). Use a directory of your own, or `chown -R %d %s`",
			ErrConfig, path, st.Uid, uid, uid, path)
	}
	if mode := fi.Mode().Perm(); mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %04o); refusing to trust it "+
			"(another user could plant state the agent would be restored from). Fix it with `chmod go-w %s` (0700 is best)",
			ErrConfig, path, mode, path)
	}
	return nil
}

// openNoFollow opens a file in the data directory for writing (creating it
// with mode 0600) without following a symlink in its last component.
func openNoFollow(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
}

// plantedLink makes a refused symlink (ELOOP from O_NOFOLLOW) a configuration
// error: the data directory needs an operator's attention, exit code 2.
func plantedLink(err error) error {
	if errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return err
}
