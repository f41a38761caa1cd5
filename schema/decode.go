package schema

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/klauspost/compress/zstd"
	"github.com/vmihailenco/msgpack/v5"
)

// The decoder reads a payload in one bounds-checked pass over its bytes,
// the mirror of the appending encoder (append.go): [Codec.Decode] walks the
// message map once, checking every value (walk) and keeping the span of
// each known key; the type's fields are then read from those spans, which
// are exactly one checked value each. No length is trusted before readHead
// has checked it against the bytes that remain, and msgpack/v5 never sees
// the payload.

// Top-level fields, indexed by the f* constants; topNames is the one list
// of their keys.
const (
	fType = iota
	fTimestamp
	fVersion
	fMetadata
	fCompressed
	fCompression
	fData
	fHypothesis
	fError
	fCheckpointID
	fSize
	fSnapshot
	fWALEntries
	fCode
	fModule
	fBackupCheckpointID
	fSuccess
	fDecision
	fMetrics
	fReason
	fRequestID
	fCreateCheckpoint
	fLastSequence
	fAck      // extension: wal_entry/wal_batch ack
	fSequence // extension: wal_ack sequence
	fAttempt  // extension: process_request attempt
	fAccepts  // extension: heartbeat accepts
	nTop
)

var topNames = [nTop]string{
	fType: "type", fTimestamp: "timestamp", fVersion: "version", fMetadata: "metadata",
	fCompressed: "compressed", fCompression: "compression", fData: "data",
	fHypothesis: "hypothesis", fError: "error", fCheckpointID: "checkpoint_id", fSize: "size",
	fSnapshot: "snapshot", fWALEntries: "wal_entries", fCode: "code", fModule: "module",
	fBackupCheckpointID: "backup_checkpoint_id", fSuccess: "success", fDecision: "decision",
	fMetrics: "metrics", fReason: "reason", fRequestID: "request_id",
	fCreateCheckpoint: "create_checkpoint", fLastSequence: "last_sequence", fAck: "ack", fSequence: "sequence",
	fAttempt: "attempt", fAccepts: "accepts",
}

// topByLen lists, for each key length, the top-level fields of that length:
// a lookup compares a key with one or two names.
var topByLen = func() (t [21][]int8) {
	for i, n := range topNames {
		t[len(n)] = append(t[len(n)], int8(i))
	}
	return t
}()

// topIndex returns the f* index of a message-level key, or -1.
func topIndex(key []byte) int {
	if len(key) >= len(topByLen) {
		return -1
	}
	for _, i := range topByLen[len(key)] {
		if string(key) == topNames[i] {
			return int(i)
		}
	}
	return -1
}

var (
	walNames        = []string{"operation", "params", "sequence"}
	hypothesisNames = []string{"reason", "target", "new_code", "expected_improvement"}
	errorNames      = []string{"code", "message", "stack_trace", "details", "context"}
	requestNames    = []string{"message", "context", "user_id"}
	agentStateNames = []string{"agent_state"}
	statusNames     = []string{"status"}
)

// decodeState is the scratch of one Decode call; it lives on the stack.
type decodeState struct {
	c   *Codec
	typ string // message type once known, for errors
}

// FrameTooLarge is the error for a payload of size bytes above max, the
// largest frame any message may have ([Codec.MaxFrameSizeFor]): rule
// too_large, no type (the payload was not read). A reader that skipped such
// a frame unread reports it with this, as Decode would have.
func FrameTooLarge(size, max int) *ValidationError {
	return &ValidationError{Rule: RuleTooLarge, Reason: fmt.Sprintf("payload of %d bytes is above the largest accepted frame (%d bytes)", size, max)}
}

// Decode checks and decodes one payload that travelled in direction dir:
// the bounds walk (well-formed MessagePack, lengths within the payload,
// nesting at most MaxDepth, no trailing bytes), then the type and its
// direction, the type's size limit, decompression of a v2 body, and every
// field. It returns one of the 16 message types as a pointer, or a
// *ValidationError (which unwraps to ErrInvalidMessage) naming the field
// and the rule.
//
// Raw fields of the result (Metadata, Data, Params, Raw, Snapshot, ...)
// alias payload unless they came out of a compressed body: the caller must
// not modify payload while it uses the message.
func (c *Codec) Decode(dir Direction, payload []byte) (Message, error) {
	if dir != FromAgent && dir != ToAgent {
		return nil, &ValidationError{Rule: RuleWrongDirection, Reason: fmt.Sprintf("unknown direction %d", dir)}
	}
	if max := c.MaxFrameSizeFor(dir); len(payload) > max {
		return nil, FrameTooLarge(len(payload), max)
	}
	s := &decodeState{c: c}
	var top [nTop][]byte
	if err := s.message(payload, &top); err != nil {
		return nil, err
	}
	typ, err := s.messageType(top[fType], dir)
	if err != nil {
		return nil, err
	}
	s.typ = typ
	if limit := c.limits.frame(typ); len(payload) > limit {
		return nil, s.fail("", RuleTooLarge, "%s of %d bytes is over its %d-byte limit", typ, len(payload), limit)
	}
	var h Header
	if err := s.header(&top, &h); err != nil {
		return nil, err
	}
	switch typ {
	case TypeHeartbeat:
		if err := s.noCompression(&top); err != nil {
			return nil, err
		}
		accepts, err := s.accepts(top[fAccepts])
		if err != nil {
			return nil, err
		}
		return &Heartbeat{Header: h, Accepts: accepts}, nil
	case TypeCheckpoint:
		return s.checkpoint(&top, h)
	case TypeWALEntry:
		return s.walEntry(&top, h)
	case TypeWALBatch:
		return s.walBatch(&top, h)
	case TypeEvolutionIntent:
		return s.evolutionIntent(&top, h)
	case TypeMetrics:
		return s.metrics(&top, h)
	case TypeError:
		return s.errorMsg(&top, h)
	case TypeCheckpointAck:
		return s.checkpointAck(&top, h)
	case TypeRestore:
		return s.restore(&top, h)
	case TypeHotReload:
		return s.hotReload(&top, h)
	case TypeEvolutionResult:
		return s.evolutionResult(&top, h)
	case TypeProcessRequest:
		return s.processRequest(&top, h)
	case TypeShutdown:
		return s.shutdown(&top, h)
	case TypeRequestResult:
		return s.requestResult(&top, h)
	case TypeWALAck:
		return s.walAck(&top, h)
	case TypeCancelRequest:
		return s.cancelRequest(&top, h)
	}
	return nil, s.fail("type", RuleUnknownType, "unknown message type %q", typ) // unreachable: messageType knows all types
}

// malformed reports a structural fault of the payload.
func malformed(err *walkError) *ValidationError {
	return &ValidationError{Rule: RuleMalformed, Reason: "payload is not valid MessagePack: " + err.Error()}
}

// message is the one pass over the payload: it walks every key and value of
// the message map (bounds and depth) and keeps the value of each known key
// in top. A structural fault anywhere wins over a key that is not a string
// or occurs twice, so those are reported only once the whole payload has
// been walked.
func (s *decodeState) message(p []byte, top *[nTop][]byte) error {
	if len(p) == 0 || !isMapCode(p[0]) {
		if err := checkValue(p, MaxDepth); err != nil {
			return malformed(err)
		}
		return &ValidationError{Rule: RuleNotMap, Reason: "payload must be a map, got " + describe(p)}
	}
	h, werr := readHead(p, 0)
	if werr != nil {
		return malformed(werr)
	}
	var later *ValidationError
	off := h.pos
	for range int(h.n) {
		k := off
		if off, werr = walk(p, k, 2, MaxDepth); werr != nil {
			return malformed(werr)
		}
		v := off
		if off, werr = walk(p, v, 2, MaxDepth); werr != nil {
			return malformed(werr)
		}
		switch i := -1; {
		case later != nil:
		case !isStrCode(p[k]):
			later = s.fail("", RuleNotMap, "payload must be a map with string keys, found a key that is %s", describe(p[k:]))
		default:
			if i = topIndex(content(p[k:v])); i < 0 {
				break
			}
			if top[i] != nil {
				later = s.fail(topNames[i], RuleMalformed, "key %q occurs more than once", topNames[i])
				break
			}
			top[i] = p[v:off]
		}
	}
	if off != len(p) {
		return malformed(&walkError{off, fmt.Sprintf("%d trailing bytes after the value", len(p)-off)})
	}
	if later != nil {
		return later
	}
	return nil
}

// ---- errors and paths

func (s *decodeState) fail(field string, rule Rule, format string, args ...any) *ValidationError {
	return &ValidationError{Type: s.typ, Field: clip.String(field, maxErrField), Rule: rule, Reason: clip.String(fmt.Sprintf(format, args...), maxErrReason)}
}

// Error texts quote what the agent sent (a key, a type name); they are
// clipped so that an error, and every log line and audit record built from
// it, stays small whatever the agent sends.
const (
	maxErrField  = 128
	maxErrReason = 512
)

// path joins a parent path, an optional array index (-1 for none) and a
// child name; it is only called to build error messages.
func path(parent string, idx int, name string) string {
	p := parent
	if idx >= 0 {
		p += "[" + strconv.Itoa(idx) + "]"
	}
	if name != "" {
		if p != "" {
			p += "."
		}
		p += name
	}
	return p
}

// describe names the type of the walked value v for an error message.
func describe(v []byte) string {
	switch k := kindOf(v[0]); k {
	case "integer", "float", "boolean", "nil":
		return k
	case "array", "extension":
		return "an " + k
	default:
		return "a " + k
	}
}

func (s *decodeState) typeErr(field, want string, v []byte) *ValidationError {
	return s.fail(field, RuleFieldType, "must be %s, got %s", want, describe(v))
}

func (s *decodeState) missing(field, what string) *ValidationError {
	return s.fail(field, RuleMissingField, "required field is missing (%s)", what)
}

// ---- readers of one walked value v (exactly one value: its header was
// checked by readHead, so its content is all of v after the header)

// present reports whether a field is there and not nil: optional fields
// sent as nil count as absent.
func present(v []byte) bool { return len(v) > 0 && v[0] != 0xc0 }

func (s *decodeState) str(v []byte, field string) (string, error) {
	if !isStrCode(v[0]) {
		return "", s.typeErr(field, "a string", v)
	}
	return string(content(v)), nil
}

// A string field's rule.
type strRule uint8

const (
	optional strRule = iota // absent or nil reads as ""
	required
	nonEmpty // required, and not ""
)

// strField is one string field: its value (nil when absent), its path, where
// it goes, its rule, and for nonEmpty what it must hold ("name the error").
type strField struct {
	v    []byte
	name string
	dst  *string
	rule strRule
	must string
}

// strs reads string fields in order; the first one that breaks its rule is
// the error.
func (s *decodeState) strs(fields ...strField) error {
	for _, f := range fields {
		var err error
		if f.rule == optional {
			*f.dst, err = s.optStr(f.v, f.name)
		} else {
			*f.dst, err = s.reqStr(f.v, f.name)
		}
		if err != nil {
			return err
		}
		if f.rule == nonEmpty && *f.dst == "" {
			return s.fail(f.name, RuleFieldValue, "must %s, got an empty string", f.must)
		}
	}
	return nil
}

// optStr returns "" for an absent or nil field.
func (s *decodeState) optStr(v []byte, field string) (string, error) {
	if !present(v) {
		return "", nil
	}
	return s.str(v, field)
}

func (s *decodeState) reqStr(v []byte, field string) (string, error) {
	if v == nil {
		return "", s.missing(field, "a string")
	}
	return s.str(v, field)
}

// int reads any MessagePack integer encoding that fits an int64.
func (s *decodeState) int(v []byte, field string) (int64, error) {
	switch c := v[0]; {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c == 0xcc:
		return int64(v[1]), nil
	case c == 0xcd:
		return int64(binary.BigEndian.Uint16(v[1:])), nil
	case c == 0xce:
		return int64(binary.BigEndian.Uint32(v[1:])), nil
	case c == 0xcf: // uint64: may exceed int64
		u := binary.BigEndian.Uint64(v[1:])
		if u > math.MaxInt64 {
			return 0, s.fail(field, RuleFieldValue, "integer %d is out of range (at most %d)", u, int64(math.MaxInt64))
		}
		return int64(u), nil
	case c == 0xd0:
		return int64(int8(v[1])), nil
	case c == 0xd1:
		return int64(int16(binary.BigEndian.Uint16(v[1:]))), nil
	case c == 0xd2:
		return int64(int32(binary.BigEndian.Uint32(v[1:]))), nil
	case c == 0xd3:
		return int64(binary.BigEndian.Uint64(v[1:])), nil
	}
	return 0, s.typeErr(field, "an integer", v)
}

// number reads any integer or float encoding as a finite float64.
func (s *decodeState) number(v []byte, field string) (float64, error) {
	var f float64
	switch c := v[0]; {
	case c == 0xca:
		f = float64(math.Float32frombits(binary.BigEndian.Uint32(v[1:])))
	case c == 0xcb:
		f = math.Float64frombits(binary.BigEndian.Uint64(v[1:]))
	case c == 0xcf:
		return float64(binary.BigEndian.Uint64(v[1:])), nil
	case isIntCode(c):
		n, err := s.int(v, field)
		return float64(n), err
	default:
		return 0, s.typeErr(field, "a number", v)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, s.fail(field, RuleFieldValue, "must be a finite number, got %v", f)
	}
	return f, nil
}

func (s *decodeState) bool(v []byte, field string) (bool, error) {
	if v[0] != 0xc2 && v[0] != 0xc3 {
		return false, s.typeErr(field, "a boolean", v)
	}
	return v[0] == 0xc3, nil
}

// optMap returns v when it is a map, nil when absent or nil.
func (s *decodeState) optMap(v []byte, field string) (msgpack.RawMessage, error) {
	if !present(v) {
		return nil, nil
	}
	if !isMapCode(v[0]) {
		return nil, s.typeErr(field, "a map", v)
	}
	return msgpack.RawMessage(v), nil
}

func (s *decodeState) reqMap(v []byte, field string) (msgpack.RawMessage, error) {
	if v == nil {
		return nil, s.missing(field, "a map")
	}
	if !isMapCode(v[0]) {
		return nil, s.typeErr(field, "a map", v)
	}
	return msgpack.RawMessage(v), nil
}

// mustHead is the header of the walked value v.
func mustHead(v []byte) head {
	h, err := readHead(v, 0)
	if err != nil {
		// Only reachable if a caller reads bytes walk never checked.
		panic("schema: header of unchecked bytes: " + err.Error())
	}
	return h
}

// elems calls fn with each element of the walked array or map v (for a map,
// keys and values alternate: element 2i is a key, 2i+1 its value), until fn
// fails. Elements are found with skip: v was walked, so their headers are
// known to fit.
func elems(v []byte, fn func(i int, e []byte) error) error {
	h := mustHead(v)
	off := h.pos
	for i := range int(h.n) * int(h.per) {
		end := skip(v, off)
		if err := fn(i, v[off:end]); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// fields finds the values of names in the map v (already known to be a map)
// and stores them in out, by index; absent names stay nil. With strict,
// every key must be a string; otherwise other keys are skipped. A name that
// occurs twice is malformed: two readers of the same bytes must not disagree
// about which value counts.
func (s *decodeState) fields(v []byte, field string, names []string, out [][]byte, strict bool) error {
	j := -1 // index in names of the key just read; -1 for a key not wanted
	return elems(v, func(i int, e []byte) error {
		if i%2 == 1 {
			if j >= 0 {
				out[j] = e
			}
			return nil
		}
		j = -1
		if !isStrCode(e[0]) {
			if strict {
				return s.fail(field, RuleFieldType, "keys must be strings, found a key that is %s", describe(e))
			}
			return nil
		}
		key := content(e)
		for k, name := range names {
			if string(key) == name {
				if out[k] != nil {
					return s.fail(path(field, -1, name), RuleMalformed, "key %q occurs more than once", name)
				}
				j = k
				break
			}
		}
		return nil
	})
}

// numberMap decodes a map of string keys to numbers.
func (s *decodeState) numberMap(v []byte, field string) (map[string]float64, error) {
	if !isMapCode(v[0]) {
		return nil, s.typeErr(field, "a map of numbers", v)
	}
	out := make(map[string]float64, mustHead(v).n)
	var key []byte
	err := elems(v, func(i int, e []byte) error {
		if i%2 == 0 {
			if !isStrCode(e[0]) {
				return s.fail(field, RuleFieldType, "keys must be strings, found a key that is %s", describe(e))
			}
			key = content(e)
			return nil
		}
		f, err := s.number(e, "")
		if err != nil {
			err.(*ValidationError).Field = clip.String(path(field, -1, string(key)), maxErrField)
			return err
		}
		// Keys are made valid UTF-8 here, as Encode writes them, so a
		// decoded map re-encodes to the same bytes and two keys that
		// differ only in invalid bytes are caught as the duplicate they
		// become.
		k := clip.Valid(string(key))
		if _, dup := out[k]; dup {
			return s.fail(path(field, -1, k), RuleMalformed, "key %q occurs more than once", k)
		}
		out[k] = f
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ---- common fields

func (s *decodeState) messageType(v []byte, dir Direction) (string, error) {
	if v == nil {
		return "", s.missing("type", "a string naming the message type")
	}
	if !isStrCode(v[0]) {
		return "", s.typeErr("type", "a string", v)
	}
	name := content(v)
	if len(name) == 0 {
		return "", s.fail("type", RuleUnknownType, "message type is empty")
	}
	for i, t := range allTypes {
		if string(name) != t {
			continue
		}
		if allDirections[i]&dir == 0 {
			s.typ = t
			if dir == FromAgent {
				return "", s.fail("type", RuleWrongDirection, "%s is sent by the supervisor to the agent, never by the agent", t)
			}
			return "", s.fail("type", RuleWrongDirection, "%s is sent by the agent to the supervisor, never to the agent", t)
		}
		return t, nil
	}
	return "", s.fail("type", RuleUnknownType, "unknown message type %q (valid from this side: %s)", clip.Bytes(name, 64), typeList(dir))
}

func typeList(dir Direction) string {
	var b bytes.Buffer
	for i, t := range Types(dir) {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t)
	}
	return b.String()
}

func (s *decodeState) header(top *[nTop][]byte, h *Header) error {
	ts := top[fTimestamp]
	if ts == nil {
		return s.missing("timestamp", "an integer, Unix seconds")
	}
	if !isIntCode(ts[0]) {
		return s.fail("timestamp", RuleFieldType, "must be an integer (Unix seconds), got %s", describe(ts))
	}
	var err error
	if h.Timestamp, err = s.int(ts, "timestamp"); err != nil {
		return err
	}
	h.Version = 1
	if v := top[fVersion]; present(v) {
		n, err := s.int(v, "version")
		if err != nil {
			return err
		}
		if n < 1 || n > math.MaxInt32 {
			return s.fail("version", RuleFieldValue, "must be a protocol version of at least 1, got %d", n)
		}
		h.Version = int(n)
	}
	h.Metadata, err = s.optMap(top[fMetadata], "metadata")
	return err
}

// body returns the value of the body field idx (data or snapshot),
// decompressed when the message says compressed: true. field names it;
// limit caps the decompressed size.
func (s *decodeState) body(top *[nTop][]byte, idx int, field string, limit int) (v []byte, compressed bool, err error) {
	zdata, compressed, err := s.compressedBody(top, idx, field)
	if err != nil || !compressed {
		return top[idx], false, err
	}
	out, err := s.c.decompress(zdata, limit)
	if err != nil {
		if errors.Is(err, errOverLimit) {
			return nil, false, s.fail(field, RuleCompression, "compressed body is over the %d-byte limit of %s: %v", limit, s.typ, err)
		}
		return nil, false, s.fail(field, RuleCompression, "compressed body does not decompress: %v", err)
	}
	if werr := checkValue(out, MaxDepth); werr != nil {
		return nil, false, s.fail(field, RuleMalformed, "decompressed body is not one valid MessagePack value: %v", werr)
	}
	return out, true, nil
}

// compressedBody returns the zstd bytes of body field idx when the message
// says compressed: true (ok false when it is not compressed), after checking
// compression and the field's encoding.
func (s *decodeState) compressedBody(top *[nTop][]byte, idx int, field string) (zdata []byte, ok bool, err error) {
	comp := top[fCompressed]
	if !present(comp) {
		return nil, false, nil
	}
	if compressed, err := s.bool(comp, "compressed"); err != nil || !compressed {
		return nil, false, err
	}
	algo := top[fCompression]
	if !present(algo) {
		return nil, false, s.fail("compression", RuleCompression, "compressed is true but compression is missing; it must be %q", CompressionZstd)
	}
	if !isStrCode(algo[0]) {
		return nil, false, s.fail("compression", RuleCompression, "must be the string %q, got %s", CompressionZstd, describe(algo))
	}
	if name := content(algo); string(name) != CompressionZstd {
		return nil, false, s.fail("compression", RuleCompression, "unsupported compression %q; only %q is supported", clip.Bytes(name, 32), CompressionZstd)
	}
	raw := top[idx]
	if raw == nil {
		return nil, false, s.missing(field, "compressed bytes")
	}
	zdata, ok = s.compressedBytes(raw)
	if !ok {
		if isStrCode(raw[0]) {
			return nil, false, s.fail(field, RuleCompression, "compressed body is a string but not base64")
		}
		return nil, false, s.fail(field, RuleCompression, "compressed body must be binary (or a base64 string), got %s", describe(raw))
	}
	return zdata, true, nil
}

// noCompression rejects compressed: true on a type without a body field.
func (s *decodeState) noCompression(top *[nTop][]byte) error {
	if v := top[fCompressed]; present(v) {
		on, err := s.bool(v, "compressed")
		if err != nil {
			return err
		}
		if on {
			return s.fail("compressed", RuleCompression, "%s messages cannot be compressed (only checkpoint, wal_entry, wal_batch, metrics and restore bodies)", s.typ)
		}
	}
	return nil
}

// ---- agent → supervisor

func (s *decodeState) checkpoint(top *[nTop][]byte, h Header) (Message, error) {
	limit := s.c.limits.Checkpoint
	if s.c.stream {
		zdata, ok, err := s.compressedBody(top, fData, "data")
		if err != nil {
			return nil, err
		}
		if ok {
			var hd zstd.Header
			if err := hd.Decode(zdata); err != nil {
				return nil, s.fail("data", RuleCompression, "compressed body does not decompress: not a zstd frame: %v", err)
			}
			if hd.HasFCS && hd.FrameContentSize > uint64(limit) {
				return nil, s.fail("data", RuleCompression, "compressed body is over the %d-byte limit of %s: the zstd frame declares %d bytes", limit, s.typ, hd.FrameContentSize)
			}
			// The frame aliases the payload, which the wire reader does not
			// reuse; the caller keeps the compressed bytes only.
			return &Checkpoint{Header: h, Zstd: zdata, Compress: true}, nil
		}
	}
	data, compressed, err := s.body(top, fData, "data", limit)
	if err != nil {
		return nil, err
	}
	if data, err = s.reqMap(data, "data"); err != nil {
		return nil, err
	}
	if len(data) > limit {
		return nil, s.fail("data", RuleTooLarge, "checkpoint data of %d bytes is over its %d-byte limit", len(data), limit)
	}
	status, err := s.checkpointStatus(data)
	if err != nil {
		return nil, err
	}
	return &Checkpoint{Header: h, Data: data, Compress: compressed, Status: status}, nil
}

// checkpointStatus validates data.agent_state.status when present. The
// agent's data map may use any keys; only these two are interpreted.
func (s *decodeState) checkpointStatus(data []byte) (string, error) {
	var as [1][]byte
	if err := s.fields(data, "data", agentStateNames, as[:], false); err != nil {
		return "", err
	}
	state, err := s.optMap(as[0], "data.agent_state")
	if err != nil || state == nil {
		return "", err
	}
	var st [1][]byte
	if err := s.fields(state, "data.agent_state", statusNames, st[:], false); err != nil {
		return "", err
	}
	if !present(st[0]) {
		return "", nil
	}
	if !isStrCode(st[0][0]) {
		return "", s.typeErr("data.agent_state.status", "a string", st[0])
	}
	switch v := content(st[0]); string(v) {
	case StatusIdle:
		return StatusIdle, nil
	case StatusThinking:
		return StatusThinking, nil
	case StatusActing:
		return StatusActing, nil
	case StatusEvolving:
		return StatusEvolving, nil
	default:
		return "", s.fail("data.agent_state.status", RuleFieldValue, "must be one of idle, thinking, acting, evolving; got %q", clip.Bytes(v, 32))
	}
}

// Whose WAL records are read: the agent's own (operation limited to the
// codec's set) or ones a supervisor stored and now sends back in a restore
// (already checked by that supervisor, whose set the agent need not know).
const (
	fromAgent = true
	stored    = false
)

// walRecord decodes {operation, params, sequence}; agent is fromAgent or
// stored. parent and idx locate the record ("data", -1 or "data", 3);
// paths are only built for errors, so the happy path allocates nothing for
// them.
func (s *decodeState) walRecord(v []byte, parent string, idx int, agent bool) (WALRecord, error) {
	r, err := s.walRecordAt(v, agent)
	if err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			ve.Field = path(parent, idx, ve.Field)
		}
	}
	return r, err
}

// walRecordAt is walRecord with fields named relative to the record. A
// stored record's operation is not kept (Operation is empty): only its raw
// bytes travel on.
func (s *decodeState) walRecordAt(v []byte, agent bool) (WALRecord, error) {
	if !isMapCode(v[0]) {
		return WALRecord{}, s.typeErr("", "a map {operation, params, sequence}", v)
	}
	var f [3][]byte
	if err := s.fields(v, "", walNames, f[:], true); err != nil {
		return WALRecord{}, err
	}
	r := WALRecord{Raw: msgpack.RawMessage(v)}
	op := f[0]
	switch {
	case op == nil:
		return r, s.missing("operation", "a string")
	case !isStrCode(op[0]):
		return r, s.typeErr("operation", "a string", op)
	}
	name := content(op)
	if canon, ok := s.c.ops[string(name)]; ok {
		r.Operation = canon
	} else if agent || len(name) == 0 {
		return r, s.fail("operation", RuleFieldValue,
			"%q is not an accepted WAL operation (accepted: %s); to accept it, add it to the supervisor's --wal-operations", clip.Bytes(name, 64), s.c.opNames)
	}
	var err error
	if r.Params, err = s.reqMap(f[1], "params"); err != nil {
		return r, err
	}
	if f[2] == nil {
		return r, s.missing("sequence", "a positive integer")
	}
	n, err := s.int(f[2], "sequence")
	if err != nil {
		return r, err
	}
	if n <= 0 {
		return r, s.fail("sequence", RuleFieldValue, "must be a positive integer, got %d", n)
	}
	r.Sequence = uint64(n)
	return r, nil
}

func (s *decodeState) walEntry(top *[nTop][]byte, h Header) (Message, error) {
	data, _, err := s.body(top, fData, "data", s.c.limits.WALEntry)
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, s.missing("data", "a map {operation, params, sequence}")
	}
	r, err := s.walRecord(data, "data", -1, fromAgent)
	if err != nil {
		return nil, err
	}
	ack, err := s.ackFlag(top)
	if err != nil {
		return nil, err
	}
	return &WALEntry{Header: h, Entry: r, Ack: ack}, nil
}

func (s *decodeState) walBatch(top *[nTop][]byte, h Header) (Message, error) {
	lim := &s.c.limits
	data, _, err := s.body(top, fData, "data", lim.batchBody())
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, s.missing("data", "an array of WAL entries")
	}
	if !isArrayCode(data[0]) {
		return nil, s.typeErr("data", "an array of WAL entries", data)
	}
	n := int(mustHead(data).n)
	if n == 0 {
		return nil, s.fail("data", RuleFieldValue, "a wal_batch must hold at least one entry")
	}
	if n > lim.BatchEntries {
		return nil, s.fail("data", RuleTooLarge, "a wal_batch holds at most %d entries, got %d; split it", lim.BatchEntries, n)
	}
	entries := make([]WALRecord, n)
	err = elems(data, func(i int, e []byte) error {
		if len(e) > lim.WALEntry {
			return s.fail(path("data", i, ""), RuleTooLarge, "entry of %d bytes is over the %d-byte wal_entry limit", len(e), lim.WALEntry)
		}
		var err error
		entries[i], err = s.walRecord(e, "data", i, fromAgent)
		return err
	})
	if err != nil {
		return nil, err
	}
	ack, err := s.ackFlag(top)
	if err != nil {
		return nil, err
	}
	return &WALBatch{Header: h, Entries: entries, Ack: ack}, nil
}

func (s *decodeState) evolutionIntent(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	hv, err := s.reqMap(top[fHypothesis], "hypothesis")
	if err != nil {
		return nil, err
	}
	var f [4][]byte
	if err := s.fields(hv, "hypothesis", hypothesisNames, f[:], true); err != nil {
		return nil, err
	}
	m := &EvolutionIntent{Header: h}
	hy := &m.Hypothesis
	if err := s.strs(
		strField{f[0], "hypothesis.reason", &hy.Reason, required, ""},
		strField{f[1], "hypothesis.target", &hy.Target, nonEmpty, "name the module to change"},
		strField{f[2], "hypothesis.new_code", &hy.NewCode, nonEmpty, "hold the code to try"},
	); err != nil {
		return nil, err
	}
	if present(f[3]) {
		if hy.ExpectedImprovement, err = s.numberMap(f[3], "hypothesis.expected_improvement"); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (s *decodeState) metrics(top *[nTop][]byte, h Header) (Message, error) {
	data, _, err := s.body(top, fData, "data", s.c.limits.Metrics)
	if err != nil {
		return nil, err
	}
	if data == nil {
		return nil, s.missing("data", "a map of numbers")
	}
	m, err := s.numberMap(data, "data")
	if err != nil {
		return nil, err
	}
	for _, k := range KnownMetrics {
		v, ok := m[k.Name]
		if !ok {
			continue
		}
		if v < 0 || (k.Max > 0 && v > k.Max) {
			if k.Max > 0 {
				return nil, s.fail("data."+k.Name, RuleFieldValue, "must be between 0 and %g, got %g", k.Max, v)
			}
			return nil, s.fail("data."+k.Name, RuleFieldValue, "must not be negative, got %g", v)
		}
	}
	return &Metrics{Header: h, Data: m}, nil
}

func (s *decodeState) errorMsg(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	ev, err := s.reqMap(top[fError], "error")
	if err != nil {
		return nil, err
	}
	var f [5][]byte
	if err := s.fields(ev, "error", errorNames, f[:], true); err != nil {
		return nil, err
	}
	m := &Error{Header: h}
	b := &m.Error
	if err := s.strs(
		strField{f[0], "error.code", &b.Code, nonEmpty, "name the error"},
		strField{f[1], "error.message", &b.Message, required, ""},
		strField{f[2], "error.stack_trace", &b.StackTrace, optional, ""},
	); err != nil {
		return nil, err
	}
	if b.Details, err = s.optMap(f[3], "error.details"); err != nil {
		return nil, err
	}
	if b.Context, err = s.optMap(f[4], "error.context"); err != nil {
		return nil, err
	}
	return m, nil
}

// ---- supervisor → agent

func (s *decodeState) checkpointAck(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &CheckpointAck{Header: h}
	var err error
	if m.CheckpointID, err = s.reqStr(top[fCheckpointID], "checkpoint_id"); err != nil {
		return nil, err
	}
	if top[fSize] == nil {
		return nil, s.missing("size", "an integer, bytes stored")
	}
	if m.Size, err = s.int(top[fSize], "size"); err != nil {
		return nil, err
	}
	if m.Size < 0 {
		return nil, s.fail("size", RuleFieldValue, "must not be negative, got %d", m.Size)
	}
	return m, nil
}

func (s *decodeState) restore(top *[nTop][]byte, h Header) (Message, error) {
	limit := s.c.limits.Checkpoint
	snap, compressed, err := s.body(top, fSnapshot, "snapshot", limit)
	if err != nil {
		return nil, err
	}
	m := &Restore{Header: h, Compress: compressed}
	if m.CheckpointID, err = s.reqStr(top[fCheckpointID], "checkpoint_id"); err != nil {
		return nil, err
	}
	if m.Snapshot, err = s.reqMap(snap, "snapshot"); err != nil {
		return nil, err
	}
	if len(m.Snapshot) > limit {
		return nil, s.fail("snapshot", RuleTooLarge, "snapshot of %d bytes is over the %d-byte checkpoint limit", len(m.Snapshot), limit)
	}
	if present(top[fLastSequence]) {
		n, err := s.int(top[fLastSequence], "last_sequence")
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, s.fail("last_sequence", RuleFieldValue, "must not be negative, got %d", n)
		}
		m.LastSequence = uint64(n)
	}
	wv := top[fWALEntries]
	if !present(wv) {
		return m, nil
	}
	if !isArrayCode(wv[0]) {
		return nil, s.typeErr("wal_entries", "an array of WAL entries", wv)
	}
	// The records are checked and kept as the raw bytes the agent once sent;
	// nothing decoded from them is kept.
	m.WALEntries = make([]msgpack.RawMessage, mustHead(wv).n)
	err = elems(wv, func(i int, e []byte) error {
		if _, err := s.walRecord(e, "wal_entries", i, stored); err != nil {
			return err
		}
		m.WALEntries[i] = msgpack.RawMessage(e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (s *decodeState) hotReload(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &HotReload{Header: h}
	if err := s.strs(
		strField{top[fCode], "code", &m.Code, required, ""},
		strField{top[fModule], "module", &m.Module, required, ""},
		strField{top[fBackupCheckpointID], "backup_checkpoint_id", &m.BackupCheckpointID, optional, ""},
	); err != nil {
		return nil, err
	}
	return m, nil
}

func (s *decodeState) evolutionResult(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &EvolutionResult{Header: h}
	var err error
	if top[fSuccess] == nil {
		return nil, s.missing("success", "a boolean")
	}
	if m.Success, err = s.bool(top[fSuccess], "success"); err != nil {
		return nil, err
	}
	if m.Decision, err = s.reqStr(top[fDecision], "decision"); err != nil {
		return nil, err
	}
	if err := checkDecision(m.Success, m.Decision); err != "" {
		return nil, s.fail("decision", RuleFieldValue, "%s", err)
	}
	if present(top[fMetrics]) {
		if m.Metrics, err = s.numberMap(top[fMetrics], "metrics"); err != nil {
			return nil, err
		}
	}
	if m.Reason, err = s.optStr(top[fReason], "reason"); err != nil {
		return nil, err
	}
	return m, nil
}

// checkDecision returns why decision (with success) is invalid, or "".
func checkDecision(success bool, decision string) string {
	switch decision {
	case DecisionPromoted:
		if !success {
			return `decision "promoted" requires success true`
		}
	case DecisionRejected:
		if success {
			return `decision "rejected" requires success false`
		}
	default:
		if len(decision) > 32 {
			decision = decision[:32] + "..."
		}
		return fmt.Sprintf("must be %q or %q, got %q", DecisionPromoted, DecisionRejected, decision)
	}
	return ""
}

func (s *decodeState) processRequest(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &ProcessRequest{Header: h}
	var err error
	if m.RequestID, err = s.reqStr(top[fRequestID], "request_id"); err != nil {
		return nil, err
	}
	if m.Attempt, err = s.attempt(top[fAttempt]); err != nil {
		return nil, err
	}
	dv, err := s.reqMap(top[fData], "data")
	if err != nil {
		return nil, err
	}
	var f [3][]byte
	if err := s.fields(dv, "data", requestNames, f[:], true); err != nil {
		return nil, err
	}
	if err := s.strs(strField{f[0], "data.message", &m.Data.Message, required, ""}); err != nil {
		return nil, err
	}
	if m.Data.Context, err = s.optMap(f[1], "data.context"); err != nil {
		return nil, err
	}
	if err := s.strs(strField{f[2], "data.user_id", &m.Data.UserID, optional, ""}); err != nil {
		return nil, err
	}
	return m, nil
}

func (s *decodeState) shutdown(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &Shutdown{Header: h}
	var err error
	if m.Reason, err = s.optStr(top[fReason], "reason"); err != nil {
		return nil, err
	}
	if v := top[fCreateCheckpoint]; present(v) {
		if m.CreateCheckpoint, err = s.bool(v, "create_checkpoint"); err != nil {
			return nil, err
		}
	}
	return m, nil
}
