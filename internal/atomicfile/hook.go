package atomicfile

import "sync/atomic"

// dirSyncHook, when set, is consulted by every directory fsync (SyncDir and
// everything built on it) before the real one; see SetDirSyncHook.
var dirSyncHook atomic.Pointer[func(dir string) error]

// SetDirSyncHook makes every directory fsync of this package — SyncDir, and
// Write, WriteFile, Remove and MkdirAll through it — first call hook with
// the directory's path: a non-nil error is returned as the fsync's error
// (the real fsync is skipped), nil goes on with the real fsync. It is for
// the tests of packages that must handle a failed directory fsync (wal,
// checkpoint); it returns the function that removes the hook. Tests using
// it must not run in parallel with others that fsync directories.
func SetDirSyncHook(hook func(dir string) error) (remove func()) {
	dirSyncHook.Store(&hook)
	return func() { dirSyncHook.Store(nil) }
}
