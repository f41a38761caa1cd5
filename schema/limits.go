package schema

// EnvelopeAllowance is the room allowed around a body whose own limit is
// given separately: a wal_batch frame may be BatchEntries × WALEntry plus
// this, and a checkpoint frame Checkpoint plus this.
const EnvelopeAllowance = 16 << 10

// MaxDepth is the deepest nesting of maps and arrays accepted in a payload
// (the top-level map is depth 1).
const MaxDepth = 64

// Limits are the per-type size limits in bytes (SPEC §2). A zero field means
// its default.
type Limits struct {
	Heartbeat       int // whole frame; default 100 B
	WALEntry        int // whole wal_entry frame, and each wal_batch entry; default 10 KiB
	Metrics         int // whole frame; default 10 KiB
	EvolutionIntent int // whole frame; default 1 MiB
	Checkpoint      int // checkpoint data, uncompressed; the frame may be EnvelopeAllowance larger; default 100 MiB. Also bounds a restore's snapshot.
	Default         int // every other type, whole frame; default 1 MiB
	BatchEntries    int // max entries in a wal_batch; default 100

	// Restore bounds a whole restore frame (snapshot plus WAL tail); default
	// 128 MiB, the wire package's default frame maximum. (Added to the
	// spec's list: a restore carries a checkpoint and may exceed it.)
	Restore int
}

// DefaultLimits returns the limits of SPEC §2.
func DefaultLimits() Limits {
	return Limits{
		Heartbeat:       100,
		WALEntry:        10 << 10,
		Metrics:         10 << 10,
		EvolutionIntent: 1 << 20,
		Checkpoint:      100 << 20,
		Default:         1 << 20,
		BatchEntries:    100,
		Restore:         128 << 20,
	}
}

// withDefaults replaces every non-positive field by its default.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.Heartbeat, d.Heartbeat)
	set(&l.WALEntry, d.WALEntry)
	set(&l.Metrics, d.Metrics)
	set(&l.EvolutionIntent, d.EvolutionIntent)
	set(&l.Checkpoint, d.Checkpoint)
	set(&l.Default, d.Default)
	set(&l.BatchEntries, d.BatchEntries)
	set(&l.Restore, d.Restore)
	return l
}

// frame returns the largest accepted frame of type typ.
func (l *Limits) frame(typ string) int {
	switch typ {
	case TypeHeartbeat:
		return l.Heartbeat
	case TypeWALEntry:
		return l.WALEntry
	case TypeMetrics:
		return l.Metrics
	case TypeEvolutionIntent:
		return l.EvolutionIntent
	case TypeCheckpoint:
		return l.Checkpoint + EnvelopeAllowance
	case TypeWALBatch:
		return l.batchBody() + EnvelopeAllowance
	case TypeRestore:
		return l.Restore
	}
	return l.Default
}

// body returns the cap on a decompressed body of type typ.
func (l *Limits) body(typ string) int {
	switch typ {
	case TypeCheckpoint, TypeRestore:
		return l.Checkpoint
	case TypeWALEntry:
		return l.WALEntry
	case TypeMetrics:
		return l.Metrics
	case TypeWALBatch:
		return l.batchBody()
	}
	return l.Default
}

func (l *Limits) batchBody() int { return l.BatchEntries * l.WALEntry }

// Options configure a [Codec].
type Options struct {
	Limits             Limits   // zero fields → DefaultLimits()
	ExtraWALOperations []string // accepted in addition to the three built-in operations
	// StreamCheckpoints: Decode leaves the body of a compressed checkpoint
	// compressed (Checkpoint.Zstd) instead of materialising up to 100 MiB;
	// the caller validates and inflates it with [Codec.CheckpointData],
	// a stream that never holds the decompressed body.
	StreamCheckpoints bool
}
