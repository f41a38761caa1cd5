package schema

import (
	"errors"
	"fmt"
	"sort"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/vmihailenco/msgpack/v5"
)

// Rule names the validation rule a message broke. It is the machine-readable
// part of an INVALID_MESSAGE reply (error.details.rule) and a metric label.
type Rule string

const (
	RuleMalformed      Rule = "malformed"       // not valid MessagePack, trailing bytes, too deep, duplicate key
	RuleNotMap         Rule = "not_map"         // the payload is not a map
	RuleMissingField   Rule = "missing_field"   // a required field is absent
	RuleFieldType      Rule = "field_type"      // a field has the wrong MessagePack type
	RuleFieldValue     Rule = "field_value"     // a field's value is out of range or not in its enumeration
	RuleUnknownType    Rule = "unknown_type"    // type is empty or not one of the 13
	RuleWrongDirection Rule = "wrong_direction" // a known type sent by the wrong side
	RuleTooLarge       Rule = "too_large"       // over the type's size limit
	RuleCompression    Rule = "compression"     // bad compression flags or a body that does not decompress within the limit
)

// ErrInvalidMessage is the sentinel every [*ValidationError] unwraps to.
var ErrInvalidMessage = errors.New("invalid message")

// ValidationError says which field of which message broke which rule, and
// why. Decode and Encode return it for every payload problem.
type ValidationError struct {
	Type   string // message type if known
	Field  string // dotted path, e.g. "data.sequence", "data[3].params"; "" for the whole payload
	Rule   Rule
	Reason string // human sentence
}

// Error returns e.g. `invalid wal_entry message: data.sequence: must be a
// positive integer, got 0 (field_value)`.
func (e *ValidationError) Error() string {
	what := "invalid message"
	if e.Type != "" {
		what = "invalid " + e.Type + " message"
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s (%s)", what, e.Field, e.Reason, e.Rule)
	}
	return fmt.Sprintf("%s: %s (%s)", what, e.Reason, e.Rule)
}

// Unwrap returns [ErrInvalidMessage].
func (e *ValidationError) Unwrap() error { return ErrInvalidMessage }

// RuleOf returns the rule err broke, or "" when err is not (and does not
// wrap) a [*ValidationError].
func RuleOf(err error) Rule {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve.Rule
	}
	return ""
}

// ErrorReply builds the supervisor's INVALID_MESSAGE reply to a payload
// error: {type: error, error: {code: "INVALID_MESSAGE", message, details:
// {type, field, rule}}}. details holds the keys that are known: type and
// field only when not empty. An err that is not a *ValidationError is
// reported with rule "malformed". Timestamp is left 0 (Encode sets now).
func ErrorReply(err error) *Error {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		msg := "invalid message"
		if err != nil {
			msg = err.Error()
		}
		ve = &ValidationError{Rule: RuleMalformed, Reason: clip.String(msg, maxErrReason)}
	}
	details := map[string]any{"rule": string(ve.Rule)}
	if ve.Type != "" {
		details["type"] = ve.Type
	}
	if ve.Field != "" {
		details["field"] = ve.Field
	}
	return NewError(CodeInvalidMessage, ve.Error(), details)
}

// NewError builds an error message with any code (CodeWALFull etc.), a
// human message and optional details (nil for none). details must hold
// values MessagePack can encode (strings, numbers, bools, maps, slices);
// a value that cannot be encoded is replaced by its fmt %v string. Strings
// in details (keys and values, nested ones too) are made valid UTF-8
// (clip.Valid), as Encode does with the code and the message: the reply
// often quotes the agent's own bytes.
func NewError(code, message string, details map[string]any) *Error {
	m := &Error{Error: ErrorBody{Code: code, Message: message}}
	if len(details) > 0 {
		details = validStrings(details).(map[string]any)
		raw, err := MarshalMap(details)
		if err != nil {
			safe := make(map[string]any, len(details))
			keys := make([]string, 0, len(details))
			for k := range details {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				safe[k] = fmt.Sprint(details[k])
			}
			raw, _ = MarshalMap(safe) // strings always encode
		}
		m.Error.Details = raw
	}
	return m
}

// MarshalMap encodes v (a map or a struct) as a MessagePack map with sorted
// keys and compact integers, for use as a RawMessage field (metadata,
// params, context, snapshot...): the one compact encoder of the project, so
// the same value always gives the same bytes. A value that encodes as nil
// (a nil map or pointer) gives the empty map {}. It fails if v does not
// encode to a map.
func MarshalMap(v any) (msgpack.RawMessage, error) {
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	var buf rawBuffer
	enc.Reset(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("schema: encoding %T as a MessagePack map: %w", v, err)
	}
	if len(buf) == 1 && buf[0] == 0xc0 {
		return msgpack.RawMessage{0x80}, nil
	}
	if len(buf) == 0 || !isMapCode(buf[0]) {
		return nil, fmt.Errorf("schema: %T does not encode to a MessagePack map", v)
	}
	return msgpack.RawMessage(buf), nil
}

// RawMap is [MarshalMap] for tests and clients building literal maps. It
// panics if v holds a value MessagePack cannot encode; a nil map encodes {}.
func RawMap(v map[string]any) msgpack.RawMessage {
	if v == nil {
		return msgpack.RawMessage{0x80}
	}
	raw, err := MarshalMap(v)
	if err != nil {
		panic(err)
	}
	return raw
}

// rawBuffer is a minimal io.Writer collecting bytes.
type rawBuffer []byte

func (b *rawBuffer) Write(p []byte) (int, error) {
	*b = append(*b, p...)
	return len(p), nil
}

// validStrings returns v with every string in it, map keys included, made
// valid UTF-8 by clip.Valid. Values of other types are returned as they are.
func validStrings(v any) any {
	switch v := v.(type) {
	case string:
		return clip.Valid(v)
	case []string:
		out := make([]string, len(v))
		for i, s := range v {
			out[i] = clip.Valid(s)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = validStrings(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[clip.Valid(k)] = validStrings(e)
		}
		return out
	case map[string]string:
		out := make(map[string]string, len(v))
		for k, e := range v {
			out[clip.Valid(k)] = clip.Valid(e)
		}
		return out
	}
	return v
}
