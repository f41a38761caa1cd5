package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// readLimited reads a small marker file, failing with an error wrapping
// ErrCorrupt if it is longer than limit (a hostile size).
func readLimited(path string, limit int64) ([]byte, error) {
	b, err := atomicfile.ReadLimited(path, limit)
	if errors.Is(err, atomicfile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return b, err
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
