package wal

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Sentinel errors. Callers branch on them with [errors.Is].
var (
	// ErrClosed is returned by every operation on a Log after Close.
	ErrClosed = errors.New("wal: log is closed")
	// ErrNoSpace means the filesystem holding the WAL is full (ENOSPC or
	// EDQUOT). Nothing of the failed Append was kept. Under SyncAlways the
	// log accepts appends again once space is freed; under the other policies
	// it arrives inside a *FailedError and the log waits for Reopen.
	ErrNoSpace = errors.New("wal: no space left on the device holding the WAL")
	// ErrWriteFailed wraps every other failed write, fsync or segment creation
	// (EIO, EROFS, ...). The log stays readable up to its last good record.
	ErrWriteFailed = errors.New("wal: write to the WAL failed")
	// ErrCorrupt is wrapped by every [*CorruptionError].
	ErrCorrupt = errors.New("wal: corrupt WAL data")
	// ErrOutOfOrder rejects an Append whose entries do not have
	// non-decreasing sequences. Nothing of it is appended.
	ErrOutOfOrder = errors.New("wal: entries of one append are not in increasing sequence order")
	// ErrTooLarge rejects an Append whose record would exceed the format's
	// 1 GiB per-record bound. Nothing of it is appended.
	ErrTooLarge = errors.New("wal: append too large for one record")
	// ErrLocked is returned by Open when another Log (in this or another
	// process) has the directory open.
	ErrLocked = errors.New("wal: directory is in use by another process")
	// ErrSequenceConflict is wrapped by every [*SequenceConflictError].
	ErrSequenceConflict = errors.New("wal: sequence conflict")
	// ErrTruncated is returned by ReadAfter when TruncateBefore removed a
	// segment holding entries it still had to serve.
	ErrTruncated = errors.New("wal: entries were removed while being read")
	// ErrFailed is wrapped by every [*FailedError]: the log stopped after a
	// failed fsync (or a failed write that cost accepted entries) and accepts
	// nothing until [Log.Reopen].
	ErrFailed = errors.New("wal: the log stopped after a failed write or fsync")
)

// FailedError is the log's sticky failed state (SPEC §4, "A failed fsync is
// never retried as if the data were safe"). After a failed fsync the kernel
// may have dropped the dirty pages and marked them clean, so the log never
// writes or fsyncs those entries again: every entry accepted above Durable —
// the range First..Last — was cleared from the disk (or, if even that
// failed, is cleared by Reopen before anything reads the log again) and is
// not in the log, ever. Append, WaitDurable (for a sequence above Durable),
// ReadAfter, Sync and TruncateAfter return it until [Log.Reopen].
//
// It wraps [ErrFailed] and the cause, itself wrapping [ErrNoSpace] or
// [ErrWriteFailed] with the OS error.
type FailedError struct {
	// First and Last bound the failed range: every entry the log accepted
	// with a sequence above Durable, the lowest and the highest. First is 0
	// when no accepted entry was lost (the failure came with nothing
	// waiting); the range is then empty.
	First, Last uint64
	Durable     uint64 // the last sequence on disk: everything at or below it is in the log
	Err         error  // the failed operation
}

func (e *FailedError) Error() string {
	if e.First == 0 {
		return fmt.Sprintf("wal: the log stopped after a failed write or fsync (durable through sequence %d; no accepted entry lost): %v", e.Durable, e.Err)
	}
	return fmt.Sprintf("wal: the log stopped after a failed write or fsync: entries %d..%d are not in the log (durable through sequence %d): %v",
		e.First, e.Last, e.Durable, e.Err)
}

// Unwrap returns [ErrFailed] and the cause.
func (e *FailedError) Unwrap() []error { return []error{ErrFailed, e.Err} }

// syncFailure marks a failed fsync (of a segment or of the directory): it
// always stops the log (see FailedError).
type syncFailure struct{ error }

func (e syncFailure) Unwrap() error { return e.error }

func isSyncFailure(err error) bool {
	var sf syncFailure
	return errors.As(err, &sf)
}

// SequenceConflictError rejects an Append with an entry at or below the
// last sequence that is not a byte-identical replay of the entry the log
// holds there, or one above [MaxSequence]. Nothing
// of that Append was appended. It wraps [ErrSequenceConflict].
type SequenceConflictError struct {
	Sequence     uint64 // the offending entry's sequence
	LastSequence uint64 // the log's last sequence when it was judged
	Reason       string
}

func (e *SequenceConflictError) Error() string {
	return fmt.Sprintf("wal: sequence %d conflicts with the log (last sequence %d): %s", e.Sequence, e.LastSequence, e.Reason)
}

// Unwrap returns [ErrSequenceConflict].
func (e *SequenceConflictError) Unwrap() error { return ErrSequenceConflict }

// CorruptionError reports damaged data in the log: a record failing its
// checksum or structure checks, a damaged segment header, sequences going
// backwards, or a segment missing from the numbering. It wraps [ErrCorrupt].
//
// Open reports it through [Recovery.Corruption] and keeps the good prefix;
// ReadDir and ReadAfter return it after serving the entries before it.
type CorruptionError struct {
	Segment string // base name of the segment file (for a missing segment, the name it should have)
	Offset  int64  // byte offset of the damaged record or header in Segment
	Reason  string // what check failed
	// Moved lists the files Open set aside (renamed with a ".corrupt-TIME"
	// suffix, never deleted) so the log could continue from the good prefix.
	// Empty when reported by ReadDir or ReadAfter, which change nothing.
	Moved []string
	// Covered: the damage lay wholly below the newest checkpoint's
	// watermark; the log continues intact after it (see Recovery.Covered).
	Covered bool
}

func (e *CorruptionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "wal: corrupt data in segment %s at offset %d: %s", e.Segment, e.Offset, e.Reason)
	if e.Covered {
		fmt.Fprintf(&b, "; nothing a restore needs was lost; the damaged segment and those before it were kept for inspection as %s",
			strings.Join(e.Moved, ", "))
	} else if len(e.Moved) > 0 {
		fmt.Fprintf(&b, "; the log was cut there and continues from the entries before it; the damaged files were kept for inspection as %s",
			strings.Join(e.Moved, ", "))
	}
	return b.String()
}

// Unwrap returns [ErrCorrupt].
func (e *CorruptionError) Unwrap() error { return ErrCorrupt }

// ioFailure wraps a failed write-path operation as ErrNoSpace or
// ErrWriteFailed, keeping the OS error in the chain.
func ioFailure(op string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %s: %w (free space on the WAL's filesystem)", ErrNoSpace, op, err)
	}
	return fmt.Errorf("%w: %s: %w (check the disk and the kernel log)", ErrWriteFailed, op, err)
}

// fsyncFailure is ioFailure for a failed fsync: it stops the log.
func fsyncFailure(op string, err error) error {
	return syncFailure{ioFailure(op, err)}
}
