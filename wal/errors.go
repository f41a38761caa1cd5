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
	// EDQUOT). Nothing of the failed Append was kept; the log retries by itself
	// and accepts appends again once space is freed.
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
)

// SequenceConflictError rejects an Append with an entry at or below the
// last sequence that is not a byte-identical replay of the entry the log
// holds there, or one that jumps more than [MaxSequenceGap] above it. Nothing
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
		return fmt.Errorf("%w: %s: %w (free space on the WAL's filesystem; the log retries and resumes by itself)", ErrNoSpace, op, err)
	}
	return fmt.Errorf("%w: %s: %w (check the disk and the kernel log; the log retries and resumes by itself if the fault clears)", ErrWriteFailed, op, err)
}
