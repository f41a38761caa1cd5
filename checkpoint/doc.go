// Package checkpoint stores an agent's checkpoints: one zstd-compressed file
// per checkpoint, written atomically, verified on every load, pruned by a
// retention rule that honours pins and keeps bad checkpoints for forensics.
//
// The store knows nothing of messages or processes. [Store.Save] takes the
// checkpoint's raw bytes (the agent's MessagePack data) and a WAL watermark;
// [Store.Load] gives the same bytes back, or an error wrapping [ErrCorrupt].
//
// # Files
//
// A store is one directory, DATA_DIR/checkpoints/, holding:
//
//	<id>.ckpt            a checkpoint; id is a version 7 (time-ordered) UUID
//	<id>.pin             marker: pinned (an evolution's backup), JSON {pinned_at}
//	<id>.bad             marker: marked bad (a poison checkpoint), JSON {reason, marked_at}
//	restore-point.json   restore point for the next start, JSON {checkpoint_id, no_wal, set_at}
//	*.tmp                a write in progress (or interrupted): never read
//
// Every file is written the same way (internal/atomicfile): a temporary file
// beside the target (name ending in .tmp, flock-ed by its writer), fsync,
// rename over the final name, fsync of the directory. So a reader — in this process or
// another, such as `supervisor checkpoints list` while the supervisor runs —
// sees a complete file or none. [Open] removes temporary files that no live
// writer holds (left by a crash); the lock keeps it from removing one that
// another process is still writing. Ids are validated with [ParseID] at
// every entry point, so no id can name a file outside the directory.
//
// Any failed fsync fails the operation (SPEC §4). A Save whose directory
// fsync fails after the rename removes the checkpoint again (and fsyncs the
// directory), so a checkpoint answered CHECKPOINT_FAILED is never restored
// later, not even after a power cut; [Open] creates the directory with
// internal/atomicfile.MkdirAll, which fsyncs the parent of each directory it
// creates. docs/durability.md lists every fsync an acknowledgement waits for.
//
// A .ckpt file is a 68-byte header — magic "SUPVCKPT", format version 1,
// the id, creation time, WAL watermark, uncompressed size, compressed body
// length, CRC-32C of the uncompressed data, CRC-32C of the header — followed
// by exactly one zstd frame (with its own content checksum). The layout is in
// format.go. List and Stat read the header alone; it is checked against the
// file (the id must match the name, the body length the file size, the
// size Options.MaxSize), so truncation is visible without decompressing.
//
// # Integrity and bounds
//
// The checksum is CRC-32C over the uncompressed data. It is there to catch
// accidental damage (bit rot, torn or misdirected writes, a bug), not a
// forger — anyone who can write the directory can write a valid file — and
// it costs about 6 ms per 100 MiB with SSE 4.2, where SHA-256 costs 70 ms
// with SHA-NI and about 250 ms without, a large part of the 0.5 s load
// budget. The zstd frame's own XXH64 checksum is verified too.
//
// [Store.Load] never allocates from what a file claims beyond
// Options.MaxSize: a header claiming more is corrupt; the output buffer is
// the header's size and does not grow, so a body that decodes to more (a
// zstd bomb) fails after one extra byte; the decoder's window is capped at
// the same size (8 MiB for small checkpoints). A truncated or bit-flipped
// file, a lying header and a bomb all return errors wrapping ErrCorrupt.
//
// # Level
//
// The default level is zstd.SpeedFastest. On a realistic 100 MiB checkpoint
// (MessagePack memory blocks with float embeddings and text; see
// BenchmarkSaveLevel100MiB), on 2 cores, it stores in about 0.3 s at a
// ratio of 0.74; SpeedDefault takes about 0.4 s for 0.71 and
// SpeedBetterCompression 0.75 s for 0.71. Float embeddings barely compress
// at any level, so 4% of space is not worth a third more time, and the
// fastest level keeps the most headroom under the 1 s budget on a busy
// machine. Checkpoints of 4 MiB and more are compressed by parallel jobs on
// every core, with a 1 MiB window (jobs of 4 MiB), which costs no
// measurable ratio on this data and keeps the encoder's memory small.
//
// # Retention
//
// Checkpoints are ordered newest first by creation time, then id.
// [Store.Prune] keeps the newest Options.Retain good checkpoints and every
// pinned one. Bad checkpoints (marked with [Store.MarkBad], or whose header
// cannot be read) do not count toward Retain; they are kept for forensics
// while newer than the Retain-th newest good one, and pruned like the rest
// once older. With fewer than Retain good checkpoints nothing is pruned.
// [Store.OldestRetainedWatermark] gives the WAL position below which no
// retained checkpoint needs the log.
//
// Pins and bad marks are the marker files above. A checkpoint file is
// removed before its markers, so a crash between leaves an orphan marker
// (removed by the next Prune), never a bad checkpoint without its mark.
//
// # Recovery
//
// [Store.Latest] returns the newest checkpoint that is not marked bad and
// loads cleanly, with the list of newer ones it passed over and why (each
// error wraps [ErrMarkedBad], [ErrCorrupt] or an I/O error), for the caller
// to log and count. [Store.Previous] does the same below a given checkpoint,
// for falling back from a poison one.
//
// The restore point ([Store.SetRestorePoint], [Store.PeekRestorePoint],
// [Store.TakeRestorePoint]) is what `supervisor restore` records, with a
// supervisor running or not: the next start of the agent (the next
// supervisor's first, after a crash) restores from that checkpoint, and the
// supervisor clears it once it has acted on it.
//
// # Concurrency
//
// A Store is safe for concurrent use. Saves run one at a time, and so do
// the other writes (pins, marks, Prune, the restore point), but a long Save
// does not hold up a MarkBad; reads run alongside both. One process writes a store at a time (the
// supervisor holds DATA_DIR/LOCK); any number may read it.
package checkpoint
