package schema

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"sort"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/internal/clip"
)

// Encode returns the MessagePack payload of m (without the frame header).
// It writes "type" itself, the current time when Timestamp is 0 (m is not
// modified), version when not 0 (at least 2 when compressed), metadata when
// set, then the type's fields. Output is strict MessagePack that any
// conforming library decodes: a fixmap for the message, str for strings, the
// smallest integer encodings, float64 for numbers, bin only for compressed
// bodies, and number maps with sorted keys. Raw fields (Metadata, Data,
// Params, Raw, Snapshot, WALEntries, Details, Context) are spliced as they
// are, after a bounds walk checks each is one well-formed map.
//
// Encode validates what it sends by the rules Decode applies (required
// fields, sequences, decisions, batch size, the type's size limit) and
// returns a *ValidationError otherwise. It does not restrict WAL operation
// names: the receiving supervisor's --wal-operations decides those.
func (c *Codec) Encode(m Message) ([]byte, error) {
	if rv := reflect.ValueOf(m); m == nil || (rv.Kind() == reflect.Pointer && rv.IsNil()) {
		return nil, &ValidationError{Rule: RuleMissingField, Reason: "cannot encode a nil message"}
	}
	e := &encoder{c: c, typ: m.MessageType()}
	var err error
	switch m := m.(type) {
	case *Heartbeat:
		err = e.heartbeat(m)
	case *Checkpoint:
		err = e.checkpoint(m)
	case *WALEntry:
		err = e.walEntry(m)
	case *WALBatch:
		err = e.walBatch(m)
	case *EvolutionIntent:
		err = e.evolutionIntent(m)
	case *Metrics:
		err = e.metrics(m)
	case *Error:
		err = e.errorMsg(m)
	case *CheckpointAck:
		err = e.checkpointAck(m)
	case *Restore:
		err = e.restore(m)
	case *HotReload:
		e.begin(&m.Header, 3, false)
		e.str("code", m.Code)
		e.str("module", m.Module)
		e.str("backup_checkpoint_id", m.BackupCheckpointID)
	case *EvolutionResult:
		err = e.evolutionResult(m)
	case *ProcessRequest:
		err = e.processRequest(m)
	case *RequestResult:
		err = e.requestResult(m)
	case *WALAck:
		e.begin(&m.Header, 1, false)
		e.key("sequence")
		e.b = AppendUint(e.b, m.Sequence)
	case *CancelRequest:
		err = e.cancelRequest(m)
	case *Shutdown:
		e.begin(&m.Header, 2, false)
		e.str("reason", m.Reason)
		e.key("create_checkpoint")
		e.b = appendBool(e.b, m.CreateCheckpoint)
	default:
		return nil, &ValidationError{Rule: RuleUnknownType, Reason: fmt.Sprintf("cannot encode %T: not a message type of package schema", m)}
	}
	if err == nil {
		err = e.err
	}
	if err != nil {
		return nil, err
	}
	if limit := c.limits.frame(e.typ); len(e.b) > limit {
		return nil, e.fail("", RuleTooLarge, "encoded %s of %d bytes is over its %d-byte limit", e.typ, len(e.b), limit)
	}
	return e.b, nil
}

// encoder accumulates one payload. The first error sticks.
type encoder struct {
	c   *Codec
	typ string
	b   []byte
	err error
}

func (e *encoder) fail(field string, rule Rule, format string, args ...any) *ValidationError {
	return &ValidationError{Type: e.typ, Field: field, Rule: rule, Reason: fmt.Sprintf(format, args...)}
}

func (e *encoder) setErr(err error) {
	if e.err == nil {
		e.err = err
	}
}

// begin starts the payload: a fixmap header counting the common fields plus
// n type fields, then type, timestamp, version and metadata. size is a
// capacity hint added to the envelope.
func (e *encoder) begin(h *Header, n int, compressed bool) {
	e.beginSized(h, n, compressed, 0)
}

func (e *encoder) beginSized(h *Header, n int, compressed bool, size int) {
	version := h.Version
	if compressed && version < 2 {
		version = 2
	}
	n += 2 // type, timestamp
	if version != 0 {
		n++
	}
	if h.Metadata != nil {
		n++
	}
	if compressed {
		n += 2 // compressed, compression
	}
	// Every message has fewer than 16 top-level fields: one fixmap byte.
	e.b = make([]byte, 0, 64+len(h.Metadata)+size)
	e.b = append(e.b, 0x80|byte(n))
	e.str("type", e.typ)
	ts := h.Timestamp
	if ts == 0 {
		ts = time.Now().Unix()
	}
	e.key("timestamp")
	e.b = AppendInt(e.b, ts)
	if version != 0 {
		if version < 0 {
			e.setErr(e.fail("version", RuleFieldValue, "must be at least 1, got %d", version))
		}
		e.key("version")
		e.b = AppendInt(e.b, int64(version))
	}
	if h.Metadata != nil {
		e.raw("metadata", h.Metadata)
	}
	if compressed {
		e.key("compressed")
		e.b = appendBool(e.b, true)
		e.str("compression", CompressionZstd)
	}
}

func (e *encoder) key(k string) { e.b = AppendStr(e.b, k) }

// str appends key k and the str v, made valid UTF-8 (clip.Valid: invalid
// bytes become \xNN): every str the codec writes is UTF-8, as MessagePack
// requires and strict decoders (Python's msgpack, raw=False) insist.
func (e *encoder) str(k, v string) {
	e.key(k)
	e.b = AppendStr(e.b, clip.Valid(v))
}

// raw appends key k and the raw map v, which must be one well-formed map.
func (e *encoder) raw(k string, v []byte) {
	e.key(k)
	e.rawValue(k, v)
}

func (e *encoder) rawValue(field string, v []byte) {
	if err := checkMap(v); err != "" {
		e.setErr(e.fail(field, RuleMalformed, "%s", err))
		return
	}
	e.b = append(e.b, v...)
}

// checkMap returns why v is not exactly one well-formed MessagePack map.
func checkMap(v []byte) string {
	if werr := checkValue(v, MaxDepth); werr != nil {
		return "raw bytes are not one valid MessagePack value: " + werr.Error()
	}
	if !isMapCode(v[0]) {
		return "raw bytes must encode a map, got " + describe(v)
	}
	return ""
}

// numbers appends a map of numbers with sorted keys; nil encodes {}.
func (e *encoder) numbers(field string, m map[string]float64) {
	// Keys are sorted as written (made valid UTF-8), so a decoded map
	// re-encodes to the same bytes.
	type entry struct{ key, orig string }
	keys := make([]entry, 0, len(m))
	for k := range m {
		keys = append(keys, entry{clip.Valid(k), k})
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].key < keys[j].key })
	e.b = AppendMapHeader(e.b, len(keys))
	for i, k := range keys {
		v := m[k.orig]
		if math.IsNaN(v) || math.IsInf(v, 0) {
			e.setErr(e.fail(path(field, -1, k.key), RuleFieldValue, "must be a finite number, got %v", v))
		}
		if i > 0 && keys[i-1].key == k.key {
			e.setErr(e.fail(path(field, -1, k.key), RuleFieldValue, "two keys are the same once made valid UTF-8 (%q); rename one", k.key))
		}
		e.b = AppendStr(e.b, k.key)
		e.b = appendFloat(e.b, v)
	}
}

func (e *encoder) checkpoint(m *Checkpoint) error {
	if m.Data == nil {
		return e.fail("data", RuleMissingField, "checkpoint data is required (a map)")
	}
	if err := checkMap(m.Data); err != "" {
		return e.fail("data", RuleMalformed, "%s", err)
	}
	if limit := e.c.limits.Checkpoint; len(m.Data) > limit {
		return e.fail("data", RuleTooLarge, "checkpoint data of %d bytes is over its %d-byte limit", len(m.Data), limit)
	}
	if !m.Compress {
		e.beginSized(&m.Header, 1, false, len(m.Data))
		e.key("data")
		e.b = append(e.b, m.Data...)
		return nil
	}
	z, err := compress(nil, m.Data)
	if err != nil {
		return err
	}
	e.beginSized(&m.Header, 1, true, len(z))
	e.key("data")
	e.b = appendBin(e.b, z)
	return nil
}

// walRecord appends one WAL entry map: Raw when set, else built from the
// fields.
func (e *encoder) walRecord(field string, r *WALRecord) {
	if r.Raw != nil {
		e.rawValue(field, r.Raw)
		return
	}
	if r.Operation == "" {
		e.setErr(e.fail(path(field, -1, "operation"), RuleMissingField, "a WAL operation name is required"))
	}
	if r.Sequence == 0 || r.Sequence > math.MaxInt64 {
		e.setErr(e.fail(path(field, -1, "sequence"), RuleFieldValue, "must be a positive integer at most %d, got %d", int64(math.MaxInt64), r.Sequence))
	}
	e.b = append(e.b, 0x83)
	e.str("operation", r.Operation)
	e.key("params")
	if r.Params == nil {
		e.b = append(e.b, 0x80)
	} else {
		e.rawValue(path(field, -1, "params"), r.Params)
	}
	e.key("sequence")
	e.b = AppendUint(e.b, r.Sequence)
}

func recordSize(r *WALRecord) int {
	if r.Raw != nil {
		return len(r.Raw)
	}
	return 48 + len(r.Operation) + len(r.Params)
}

func (e *encoder) walEntry(m *WALEntry) error {
	e.beginSized(&m.Header, 1+boolField(m.Ack), false, recordSize(&m.Entry))
	e.key("data")
	e.walRecord("data", &m.Entry)
	e.ack(m.Ack)
	return nil
}

func (e *encoder) walBatch(m *WALBatch) error {
	lim := &e.c.limits
	if len(m.Entries) == 0 {
		return e.fail("data", RuleFieldValue, "a wal_batch must hold at least one entry")
	}
	if len(m.Entries) > lim.BatchEntries {
		return e.fail("data", RuleTooLarge, "a wal_batch holds at most %d entries, got %d; split it", lim.BatchEntries, len(m.Entries))
	}
	size := 5
	for i := range m.Entries {
		size += recordSize(&m.Entries[i])
	}
	e.beginSized(&m.Header, 1+boolField(m.Ack), false, size)
	e.key("data")
	e.b = AppendArrayHeader(e.b, len(m.Entries))
	for i := range m.Entries {
		start := len(e.b)
		e.walRecord(path("data", i, ""), &m.Entries[i])
		if n := len(e.b) - start; n > lim.WALEntry {
			e.setErr(e.fail(path("data", i, ""), RuleTooLarge, "entry of %d bytes is over the %d-byte wal_entry limit", n, lim.WALEntry))
		}
	}
	e.ack(m.Ack)
	return nil
}

func (e *encoder) evolutionIntent(m *EvolutionIntent) error {
	h := &m.Hypothesis
	if h.Target == "" {
		return e.fail("hypothesis.target", RuleFieldValue, "must name the module to change")
	}
	if h.NewCode == "" {
		return e.fail("hypothesis.new_code", RuleFieldValue, "must hold the code to try")
	}
	e.beginSized(&m.Header, 1, false, len(h.Reason)+len(h.Target)+len(h.NewCode)+16*len(h.ExpectedImprovement))
	e.key("hypothesis")
	if h.ExpectedImprovement == nil {
		e.b = append(e.b, 0x83)
	} else {
		e.b = append(e.b, 0x84)
	}
	e.str("reason", h.Reason)
	e.str("target", h.Target)
	e.str("new_code", h.NewCode)
	if h.ExpectedImprovement != nil {
		e.key("expected_improvement")
		e.numbers("hypothesis.expected_improvement", h.ExpectedImprovement)
	}
	return nil
}

func (e *encoder) metrics(m *Metrics) error {
	if m.Data == nil {
		return e.fail("data", RuleMissingField, "metrics data is required (a map of numbers)")
	}
	e.beginSized(&m.Header, 1, false, 24*len(m.Data))
	e.key("data")
	e.numbers("data", m.Data)
	return nil
}

func (e *encoder) errorMsg(m *Error) error {
	b := &m.Error
	if b.Code == "" {
		return e.fail("error.code", RuleMissingField, "an error code is required")
	}
	n := 2
	for _, set := range []bool{b.StackTrace != "", b.Details != nil, b.Context != nil} {
		if set {
			n++
		}
	}
	e.beginSized(&m.Header, 1, false, len(b.Message)+len(b.StackTrace)+len(b.Details)+len(b.Context))
	e.key("error")
	e.b = append(e.b, 0x80|byte(n))
	e.str("code", b.Code)
	e.str("message", b.Message)
	if b.StackTrace != "" {
		e.str("stack_trace", b.StackTrace)
	}
	if b.Details != nil {
		e.key("details")
		e.rawValue("error.details", b.Details)
	}
	if b.Context != nil {
		e.key("context")
		e.rawValue("error.context", b.Context)
	}
	return nil
}

func (e *encoder) checkpointAck(m *CheckpointAck) error {
	if m.Size < 0 {
		return e.fail("size", RuleFieldValue, "must not be negative, got %d", m.Size)
	}
	e.begin(&m.Header, 2, false)
	e.str("checkpoint_id", m.CheckpointID)
	e.key("size")
	e.b = AppendInt(e.b, m.Size)
	return nil
}

func (e *encoder) restore(m *Restore) error {
	size := len(m.Snapshot) + len(m.SnapshotZstd) + len(m.CheckpointID) + 32
	for _, w := range m.WALEntries {
		size += len(w)
	}
	rb, err := e.c.NewRestore(m.Header, m.CheckpointID, m.Snapshot, m.SnapshotZstd, m.Compress, m.LastSequence, size)
	if err != nil {
		return err
	}
	for _, w := range m.WALEntries {
		if err := rb.Add(w); err != nil {
			return err
		}
	}
	e.b = rb.Frame()
	return nil
}

// RestoreBuilder assembles a restore payload incrementally: the snapshot
// first, then the WAL entries one at a time as they are read from the log.
// The restore is held once, in the payload being built, and a tail that
// would take it over the restore limit is refused the moment it crosses it,
// before anything larger is allocated. Entries are spliced as they are (the
// agent's own bytes). Get one from [Codec.NewRestore].
type RestoreBuilder struct {
	e       encoder
	countAt int // offset of the wal_entries array32 count
	count   int
	limit   int
	// streamed: bytes of entries counted by Count, which the caller sends
	// after the payload Frame returns (they are its last bytes).
	streamed int64
	// snapAt, snapSize: a snapshot the caller streams (NewRestoreStreamed)
	// goes at offset snapAt of the payload, snapSize bytes; 0: none.
	snapAt   int
	snapSize int64
}

// NewRestoreStreamed starts a restore payload whose snapshot, snapSize
// bytes of one checked data map sent uncompressed (a stored checkpoint,
// decompressed as it is written), is not held: the payload Frame returns
// lacks it, and the caller writes it at offset SnapshotAt — the payload's
// first SnapshotAt bytes, then the snapshot, then the rest. Limits are
// checked with the snapshot counted.
func (c *Codec) NewRestoreStreamed(h Header, checkpointID string, snapSize int64, lastSeq uint64, sizeHint int) (*RestoreBuilder, error) {
	rb := &RestoreBuilder{e: encoder{c: c, typ: TypeRestore}, limit: c.limits.frame(TypeRestore)}
	e := &rb.e
	if limit := c.limits.Checkpoint; snapSize > int64(limit) || snapSize < 1 {
		return nil, e.fail("snapshot", RuleTooLarge, "snapshot of %d bytes is outside 1 to the %d-byte checkpoint limit", snapSize, limit)
	}
	e.beginSized(&h, 4, false, min(max(sizeHint, len(checkpointID)+32), rb.limit))
	if e.err != nil {
		return nil, e.err
	}
	e.str("checkpoint_id", checkpointID)
	e.key("snapshot")
	rb.snapAt, rb.snapSize = len(e.b), snapSize
	e.key("last_sequence")
	e.b = AppendUint(e.b, lastSeq)
	e.key("wal_entries")
	e.b = append(e.b, 0xdd, 0, 0, 0, 0)
	rb.countAt = len(e.b) - 4
	if int64(len(e.b))+snapSize > int64(rb.limit) {
		return nil, e.fail("", RuleTooLarge, "restore of at least %d bytes is over its %d-byte limit", int64(len(e.b))+snapSize, rb.limit)
	}
	return rb, nil
}

// SnapshotAt is where a streamed snapshot goes in the payload Frame returns
// (NewRestoreStreamed); 0 when the snapshot is in it.
func (rb *RestoreBuilder) SnapshotAt() int { return rb.snapAt }

// NewRestore starts a restore payload. snapshot is the checkpoint's data map
// (nil: {}); compressed zstd-compresses it (protocol v2). snapshotZstd, when
// not nil, is the snapshot already compressed — one zstd frame of a checked
// data map declaring its content size (a stored checkpoint as it is on
// disk) — sent as it is, compressed, and snapshot is ignored: a 100 MiB
// snapshot is never held decompressed. sizeHint is the expected payload size
// (capacity, capped at the limit). It fails with a *ValidationError when the
// snapshot is not one well-formed map or is over the checkpoint limit.
func (c *Codec) NewRestore(h Header, checkpointID string, snapshot, snapshotZstd []byte, compressed bool, lastSeq uint64, sizeHint int) (*RestoreBuilder, error) {
	rb := &RestoreBuilder{e: encoder{c: c, typ: TypeRestore}, limit: c.limits.frame(TypeRestore)}
	e := &rb.e
	var body []byte
	if snapshotZstd != nil {
		var zh zstd.Header
		if err := zh.Decode(snapshotZstd); err != nil || !zh.HasFCS {
			return nil, e.fail("snapshot", RuleCompression, "a precompressed snapshot must be one zstd frame declaring its content size")
		}
		if limit := c.limits.Checkpoint; zh.FrameContentSize > uint64(limit) {
			return nil, e.fail("snapshot", RuleTooLarge, "snapshot of %d bytes is over the %d-byte checkpoint limit", zh.FrameContentSize, limit)
		}
		body, compressed = snapshotZstd, true
	} else {
		snap := snapshot
		if len(snap) == 0 {
			snap = []byte{0x80}
		}
		if err := checkMap(snap); err != "" {
			return nil, e.fail("snapshot", RuleMalformed, "%s", err)
		}
		if limit := c.limits.Checkpoint; len(snap) > limit {
			return nil, e.fail("snapshot", RuleTooLarge, "snapshot of %d bytes is over the %d-byte checkpoint limit", len(snap), limit)
		}
		body = snap
		if compressed {
			var err error
			if body, err = compress(nil, snap); err != nil {
				return nil, err
			}
		}
	}
	e.beginSized(&h, 4, compressed, min(max(sizeHint, len(body)+len(checkpointID)+32), rb.limit))
	if e.err != nil {
		return nil, e.err
	}
	e.str("checkpoint_id", checkpointID)
	e.key("snapshot")
	if compressed {
		e.b = appendBin(e.b, body)
	} else {
		e.b = append(e.b, body...)
	}
	e.key("last_sequence")
	e.b = AppendUint(e.b, lastSeq)
	e.key("wal_entries")
	// array32 with the count filled in by Frame: entries are added as they
	// are read, before their number is known.
	e.b = append(e.b, 0xdd, 0, 0, 0, 0)
	rb.countAt = len(e.b) - 4
	if len(e.b) > rb.limit {
		return nil, e.fail("", RuleTooLarge, "restore of at least %d bytes is over its %d-byte limit", len(e.b), rb.limit)
	}
	return rb, nil
}

// Add appends one WAL entry map (raw MessagePack). It fails with a
// *ValidationError, leaving the payload as it was, when entry is not one
// well-formed map or would take the restore over its limit. No entry may be
// added after one was counted (Count).
func (rb *RestoreBuilder) Add(entry []byte) error {
	if rb.streamed > 0 {
		return rb.e.fail("wal_entries", RuleMalformed, "an entry added after streamed ones")
	}
	return rb.check(entry, true)
}

// Count checks one WAL entry map as Add does, and counts it, but does not
// append it: the caller sends it, byte for byte and in order with the other
// counted entries, after the payload Frame returns (Streamed bytes). A large
// restore is so never held whole.
func (rb *RestoreBuilder) Count(entry []byte) error { return rb.check(entry, false) }

// CountStreamed counts n WAL entries of size bytes together as Count counts
// one, without seeing them: the caller knows their number and size from
// where they are stored, and checks each (CheckEntry) as it sends it. It
// fails with a *ValidationError, counting nothing, when they would take the
// restore over its limit.
func (rb *RestoreBuilder) CountStreamed(n int, size int64) error {
	e := &rb.e
	if total := int64(len(e.b)) + rb.snapSize + rb.streamed + size; total > int64(rb.limit) {
		return e.fail("wal_entries", RuleTooLarge, "restore of %d bytes with %d WAL entries would be over its %d-byte limit",
			total, rb.count+n, rb.limit)
	}
	rb.streamed += size
	rb.count += n
	return nil
}

// CheckEntry fails with a *ValidationError when entry is not one
// well-formed MessagePack map, as Add and Count do: for the entries counted
// by CountStreamed, as they are sent.
func CheckEntry(entry []byte) error {
	if err := checkMap(entry); err != "" {
		return &ValidationError{Type: TypeRestore, Field: "wal_entries", Rule: RuleMalformed, Reason: err}
	}
	return nil
}

// Streamed is the bytes of the entries counted by Count.
func (rb *RestoreBuilder) Streamed() int64 { return rb.streamed }

func (rb *RestoreBuilder) check(entry []byte, add bool) error {
	e := &rb.e
	if int64(len(e.b))+rb.snapSize+rb.streamed+int64(len(entry)) > int64(rb.limit) {
		return e.fail("wal_entries", RuleTooLarge, "restore of %d bytes with %d WAL entries would be over its %d-byte limit",
			int64(len(e.b))+rb.snapSize+rb.streamed+int64(len(entry)), rb.count+1, rb.limit)
	}
	if err := checkMap(entry); err != "" {
		return e.fail(path("wal_entries", rb.count, ""), RuleMalformed, "%s", err)
	}
	if add {
		e.b = append(e.b, entry...)
	} else {
		rb.streamed += int64(len(entry))
	}
	rb.count++
	return nil
}

// Len is the payload's size so far, streamed entries and snapshot included.
func (rb *RestoreBuilder) Len() int { return len(rb.e.b) + int(rb.snapSize) + int(rb.streamed) }

// Entries is the number of WAL entries added.
func (rb *RestoreBuilder) Entries() int { return rb.count }

// Frame finishes the payload and returns it — without the entries counted
// by Count, which follow it on the wire. The builder must not be used after.
func (rb *RestoreBuilder) Frame() []byte {
	binary.BigEndian.PutUint32(rb.e.b[rb.countAt:], uint32(rb.count))
	return rb.e.b
}

func (e *encoder) evolutionResult(m *EvolutionResult) error {
	if why := checkDecision(m.Success, m.Decision); why != "" {
		return e.fail("decision", RuleFieldValue, "%s", why)
	}
	e.beginSized(&m.Header, 4, false, len(m.Reason)+24*len(m.Metrics))
	e.key("success")
	e.b = appendBool(e.b, m.Success)
	e.str("decision", m.Decision)
	e.key("metrics")
	e.numbers("metrics", m.Metrics)
	e.str("reason", m.Reason)
	return nil
}

func (e *encoder) processRequest(m *ProcessRequest) error {
	d := &m.Data
	n := 2
	if d.Context != nil {
		n++
	}
	top := 2
	if m.Attempt > 0 {
		top++
	}
	e.beginSized(&m.Header, top, false, len(m.RequestID)+len(d.Message)+len(d.Context)+len(d.UserID))
	e.str("request_id", m.RequestID)
	if m.Attempt > 0 {
		e.key("attempt")
		e.b = AppendUint(e.b, m.Attempt)
	}
	e.key("data")
	e.b = append(e.b, 0x80|byte(n))
	e.str("message", d.Message)
	if d.Context != nil {
		e.key("context")
		e.rawValue("data.context", d.Context)
	}
	e.str("user_id", d.UserID)
	return nil
}

// ---- MessagePack primitives not exported (see append.go for the rest)

func appendFloat(b []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}
