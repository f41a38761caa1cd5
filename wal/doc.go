// Package wal is the supervisor's write-ahead log: a segmented, crash-safe,
// append-only log of (sequence, opaque bytes) entries, the agent's wal_entry
// and wal_batch entries kept before the agent acts on them (SPEC §4).
//
// The contract: an entry whose Append returned nil (and, under SyncBatch,
// whose WaitDurable returned nil) survives a crash of the process or the
// machine; an Append that returned an error left nothing behind; the entries
// of one Append are recovered all together or not at all; corrupt bytes are
// never served.
//
// # Files
//
// The log lives in one directory: segment files named by their index in
// fixed-width hex (0000000000000001.wal, ...), so lexical order is log
// order; a LOCK file (flock) so only one [Log] opens it; the DURABLE file,
// the durable mark (below); temporary *.tmp files (a segment being created
// or prepared), removed by Open; next-segment.prepared, the next segment
// already zero-filled and fsynced (below), kept between runs; and, after
// corruption, damaged files set aside as NAME.corrupt-TIME, never deleted
// by the log.
//
// Every directory change a durable entry depends on is fsynced: Open
// creates the directory with internal/atomicfile.MkdirAll (each new
// directory's parent fsynced) and fsyncs it after recovery; a new segment
// is fsynced, renamed into place and the directory fsynced before a record
// is written to it; each segment deletion (TruncateBefore, TruncateAfter)
// and each file set aside is followed by a directory fsync.
//
// # Format (version 1, all integers big-endian)
//
// A segment starts with a 32-byte header:
//
//	0   8  magic "SVWAL\r\n\x1a"
//	8   2  format version (1)
//	10  2  header size (32)
//	12  8  segment index (must match the file name)
//	20  8  last sequence in the log before this segment
//	28  4  CRC32C (Castagnoli) of bytes 0..28
//
// then records, back to back. One record holds the entries of one Append,
// which is what makes an Append atomic:
//
//	0   4  CRC32C of bytes 4..40 (the rest of the header)
//	4   1  kind: 1 = entries (0 is never valid, so zeroed space never parses)
//	5   3  zero
//	8   4  number of entries (≥ 1)
//	12  4  payload length
//	16  4  CRC32C of the payload
//	20  4  zero
//	24  8  first sequence in the record
//	32  8  last sequence in the record
//	40  …  payload: per entry, sequence (8), length (4), bytes
//
// Sequences strictly increase across the whole log. A record never spans
// two segments; a segment grows past its size limit only for a record larger
// than the limit. A new version of the format changes the version field;
// this build refuses (and never repairs) segments of another version.
//
// # Preallocation
//
// By default each segment is created at full size, filled with zeros and
// fsynced before it is used (the next one in the background, once the
// active one is half full). Overwriting such a file makes each fsync cheap:
// the filesystem does no allocation or journal work. Zeros after the last
// record read as the end of the data. A prepared file waits as
// next-segment.prepared, and is kept when the log closes or the process
// dies: the next Open adopts it rather than writing a segment's worth of
// zeros again while a restart serves its restore. Options.NoPreallocate
// turns this off (and removes a kept file).
//
// # Durability
//
// Append encodes the entries into a buffer and hands it to the syncer
// goroutine, which writes everything queued with one write and fsyncs
// (fdatasync) per the [SyncPolicy]: SyncAlways before Append returns,
// SyncBatch as soon as nothing more is queued and at least every
// SyncInterval under a flood, SyncNone only when a segment is full and on
// Sync and Close. [Log.WaitDurable] waits for "durable up to sequence S";
// a checkpoint is acknowledged only after it.
//
// # Failures
//
// A failed write or fsync (ErrNoSpace for ENOSPC/EDQUOT, ErrWriteFailed
// otherwise) costs every entry accepted and not yet durable: the bytes
// written for them are cleared (truncated or zeroed, then fsynced) before
// anyone is told, and their sequences are not consumed. An entry that got
// an error is never in the log, not even after a crash (SPEC §4, §9).
//
// A failed fsync is never retried (PostgreSQL's "fsyncgate": Linux may have
// dropped the dirty pages and marked them clean, so a later fsync succeeds
// without the data). It stops the log, under every policy: the
// *[FailedError] names the whole failed range (every accepted entry above
// the durable sequence) and is returned by Append, WaitDurable (above the
// durable sequence), ReadAfter, Sync and TruncateAfter, reported once to
// Options.OnFailure and by [Log.Failure], until [Log.Reopen] clears what the
// failure may have left after the last durable record and recovers the
// directory as Open does. A failed write stops the log the same way under
// SyncBatch and SyncNone (the Appends of the lost entries have returned
// already, so only the FailedError can tell their range); under SyncAlways
// it fails only the Appends waiting for it, which learn it from their own
// call, and the log goes on once the fault clears (a full disk recovers by
// itself).
//
// # The durable mark
//
// DURABLE records a position known to be on disk (segment, offset, last
// sequence), rewritten by a goroutine of its own at most every 100 ms after
// fsyncs moved it, at Open and at a clean Close — off the append path, so it
// may trail the true durable end by that much. Recovery uses it to tell a
// power cut from damage: bytes of the newest segment below it were fsynced,
// so damage there is corruption even when it looks like an interrupted
// write; above it, a torn-looking record is a torn tail even when intact
// records follow it (a disk with a volatile write cache writes the last
// unsynced pages in any order). Without a mark (a log written by an older
// build) recovery judges as below.
//
// # Recovery
//
// Open verifies every record. In the newest segment, an invalid record with
// no valid record after it that looks like an interrupted write (cut short
// by the end of the file, or with zeroed sectors) is a torn tail: it and the
// bytes after it are removed (truncated, or zeroed in a preallocated file)
// and reported in [Recovery.TruncatedBytes]. Anything else is corruption: a
// record failing its checks in an older segment, one followed by a valid
// record, a complete record with a wrong checksum, sequences going
// backwards, a damaged segment header, or a segment missing from the
// numbering. Then the log keeps the good prefix, sets the damaged files
// aside (the segment holding the damage is replaced by its good prefix,
// its original kept under the quarantine name; later segments are renamed),
// logs it loudly and reports a *[CorruptionError] in [Recovery.Corruption].
// Open still succeeds and appends continue after the prefix. An unreadable
// segment (permissions, I/O error) fails Open: the log never skips one.
// Open then fsyncs the directory and the active segment (after a crash of
// the process alone its last records may be only in the page cache) before
// serving anything.
//
// [ReadDir], [Inspect] and [Dump] read a directory the same way without
// changing anything, so they are safe beside a running supervisor.
//
// # Example
//
//	l, err := wal.Open(wal.Options{Dir: filepath.Join(dataDir, "wal")})
//	if err != nil {
//		return err
//	}
//	defer l.Close()
//	if c := l.Recovery().Corruption; c != nil {
//		log.Error("WAL corruption; continuing from the good prefix", "err", c)
//	}
//	res, err := l.Append(wal.Entry{Sequence: 7, Data: raw})
//	var fe *wal.FailedError
//	if errors.As(err, &fe) { // also from WaitDurable, or Options.OnFailure
//		// entries fe.First..fe.Last are not in the log: tell the agent,
//		// then reopen and restore the agent from what the log holds
//		last, err := l.Reopen()
//		...
//	}
//	err = l.WaitDurable(ctx, res.Last) // before acknowledging a checkpoint
//	err = l.ReadAfter(watermark, func(e wal.Entry) error { ... })
package wal
