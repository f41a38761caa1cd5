// Package crashfs is a test-only FUSE filesystem that simulates a machine
// losing power. It is a loopback onto a backing directory whose live view
// behaves like any local filesystem, while it keeps, beside it, the image a
// disk would hold after a power cut under the strictest reading of POSIX:
//
//   - a file's data (and size) reaches the image only when the file is
//     fsynced or fdatasynced;
//   - a directory entry — created by create, mkdir, mknod, symlink or link,
//     changed by rename, removed by unlink or rmdir — reaches the image only
//     when its directory is fsynced. A new file whose directory was never
//     fsynced is lost however often the file itself was; a rename without a
//     fsync of the directory is undone; a directory made with mkdir is lost
//     with everything below it until its parent is fsynced.
//
// [FS.PowerOff] cuts the power (nothing more reaches the image, and every
// later change or fsync fails with EIO), unmounts, and writes the image out
// as a plain directory, which the next [Mount] takes as its starting point:
// everything in a backing directory at mount time counts as durable.
//
// Two faults real disks have can be switched on ([Options]):
//
//   - Torn writes: at power-off a seeded random prefix (in write order) or
//     subset of each file's unsynced 4 KiB pages reaches the image anyway,
//     as from a disk with a volatile write cache.
//   - Failing fsync with Linux semantics: a chosen fsync fails with EIO and
//     the file's pending pages are dropped — marked clean, never written. The
//     live view still shows the data, later fsyncs succeed, and the data is
//     not in the image (PostgreSQL's "fsyncgate").
//
// It mounts with go-fuse's DirectMount, so it needs root and /dev/fuse; the
// tests of packages using it skip where that is not available ([Available]).
// Everything is modelled in memory and in a scratch directory beside the
// backing directory; nothing is ever fsynced to the real disk.
//
// What it does not model: metadata other than names and sizes (modes are
// the latest ones set, synced or not; timestamps are not kept), extended
// attributes, file locks beyond the kernel's own (flock works, locally),
// O_TMPFILE (refused with EOPNOTSUPP), and mmap beyond what the kernel turns
// into writes.
package crashfs
