// Package replica keeps a copy of a supervisor's data directory in
// S3-compatible object storage and rebuilds a data directory from it (SPEC
// §11; docs/replication.md is the operator's guide).
//
// A [Replicator] uploads, on one goroutine of its own: every stored
// checkpoint file as it is, the WAL's durable entries in immutable chunks
// (one per sync interval at most, none while nothing changes), the small
// files (the evolution ledger, the agent's protocol version), and the
// request journal as a base and deltas (journal.go). It
// retries with back-off and never holds anything the supervisor waits on,
// except Local.HoldTruncation during one bounded WAL read. [Client.Restore]
// plans from one listing and rebuilds a data directory; [Client.List]
// describes the replica.
//
// # Layout
//
// Under PREFIX/generations/GEN/ (GEN a version 7 UUID):
//
//	generation-SHA.json            who started the generation (GenerationInfo)
//	checkpoints/WM-ID-SHA.ckpt     a checkpoint file, byte for byte
//	wal/AFTER-LAST-MS-SHA.chunk    the WAL entries with sequences in (AFTER, LAST]
//	files/NAME/NANOS-SHA           a version of evolution.json or agent.json, or
//	                               (NAME requests-journal) a base of the request journal
//	files/requests-journal/BASE-FROM-TO-NANOS-SHA
//	                               a delta of the request journal: its bytes [FROM, TO)
//	                               after the base of version BASE (NANOS)
//
// The request journal only grows between two compactions, so each change
// is uploaded as a delta of its own size after the base (the whole journal
// file's durable prefix); a compaction (a new file) starts a new base, and
// so does a chain whose deltas would outgrow the base; deltas merge so that
// a chain stays about log2 long (journal.go). A restore follows the newest
// base's deltas from its end, each verified and starting where the
// previous ended; a missing or damaged delta ends the journal there — the
// newest consistent prefix, never one with a hole — and the restore says
// so (Result.RequestsJournalIncomplete).
//
// Numbers are 16 hex digits, so lexical order is numeric order; SHA is the
// SHA-256 of the object, verified on every download: a corrupt object is
// [ErrCorrupt], named, and never served. The chunk format is in chunk.go.
//
// # Generations
//
// A generation is one line of history written by one data directory
// (DATA_DIR/replica.json names it). A restart continues it when the local
// WAL reaches at least its newest chunk and no other directory claimed it
// since this one last did (owners/SESSION-SHA.json, [OwnerClaim]); anything
// else — a restored or rolled-back directory ([Replicator.Rewound]), a
// second supervisor on the prefix, a copy of the directory — starts a new
// one. A running replicator that finds a newer claim on its generation
// (looked for every OwnerCheckInterval, and before every delete) removes
// what it wrote there after the other's start and begins its own; one that
// finds another writer's chunk past its own uploads still there ForkGrace
// after its claim (a copy that yielded after one more upload and was killed
// before it removed it) begins its own too. A restore takes one generation
// whole: the most recently written that offers a restore
// ([Inventory.Default]; newer ones holding nothing restorable are passed
// over and reported) unless [Target] names another.
//
// The request journal alone does not make a generation restorable, except
// when no generation of the replica holds a checkpoint or a WAL chunk (an
// agent that never logs nor checkpoints): then the newest generation that
// holds a journal is restored, the journal alone ([Plan].JournalOnly). So a
// journal never wins over agent state another generation holds: a node
// that restored its parent's state, uploaded its journal and died before
// its first checkpoint or chunk is passed over for the parent, as before.
//
// # The restore invariant
//
// A restore is one checkpoint plus every entry after its watermark up to
// the last uploaded one, without a gap. Chunks form chains: each starts
// where the previous ended. When local retention deleted entries before
// they were uploaded, the chain restarts at the WAL's floor only once a
// checkpoint at or above it is in the replica, and a restore follows chains,
// never gaps ([ErrNoTarget] for a point inside one). A restored WAL starts
// after the checkpoint's watermark (wal.Options.StartAfter), so its floor
// says it holds nothing below: should the checkpoint later fail to load,
// the supervisor refuses to start rather than restore a partial state.
package replica
