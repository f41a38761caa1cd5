package wal

import "fmt"

// SyncPolicy says when appended entries are fsynced (fdatasync on Linux).
type SyncPolicy int

const (
	// SyncBatch (the default) is group commit: the syncer writes entries as
	// they arrive and fsyncs once no more are waiting, at least every
	// Options.SyncInterval under a steady flood, and at once when someone
	// waits in WaitDurable. Append returns before the entries are durable.
	SyncBatch SyncPolicy = iota
	// SyncAlways makes every Append durable before it returns. Concurrent
	// Appends share one fsync.
	SyncAlways
	// SyncNone never fsyncs except when a segment is full and on Sync and
	// Close; the OS decides when data reaches the disk. WaitDurable and
	// DurableSequence then mean "handed to the OS".
	SyncNone
)

// ParseSyncPolicy parses "always", "batch" or "none", the names String
// returns; it is the only parser of them. Its error says what is accepted
// and reads after the name of the setting that held s, as the supervisor
// prints it: "--wal-sync must be always, batch or none, got "fsync"".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch s {
	case "batch":
		return SyncBatch, nil
	case "always":
		return SyncAlways, nil
	case "none":
		return SyncNone, nil
	}
	return 0, fmt.Errorf("must be always, batch or none, got %q", s)
}

// String returns the name ParseSyncPolicy accepts.
func (p SyncPolicy) String() string {
	switch p {
	case SyncBatch:
		return "batch"
	case SyncAlways:
		return "always"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}
