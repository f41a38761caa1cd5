package atomicfile

import "sync/atomic"

// syncHook, when set, is consulted by every fsync of this package before
// the real one; see SetSyncHook.
var syncHook atomic.Pointer[func(path string) error]

// SetSyncHook makes every fsync of this package first call hook with the
// path being made durable: the directory for a directory fsync (SyncDir,
// and Write, WriteFile, Remove and MkdirAll through it), the target
// dir/name for the fsync of a new file's content in Write. A non-nil error
// is returned as the fsync's error (the real fsync is skipped); nil goes on
// with the real fsync. It is for the tests of packages that must handle a
// failed fsync (wal, checkpoint) and returns the function that removes the
// hook. Tests using it must not run in parallel with others that use this
// package.
func SetSyncHook(hook func(path string) error) (remove func()) {
	syncHook.Store(&hook)
	return func() { syncHook.Store(nil) }
}

// hooked returns the hook's verdict for path (nil when no hook is set).
func hooked(path string) error {
	if h := syncHook.Load(); h != nil {
		return (*h)(path)
	}
	return nil
}
