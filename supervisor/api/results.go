package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Request API limits (docs/cli.md, docs/operations.md).
const (
	// maxRequestWait caps POST /v1/requests?wait=.
	maxRequestWait = 5 * time.Minute
	// maxResultJSON bounds one result converted to JSON (a 1 MiB MessagePack
	// map of bin values grows by a third in base64).
	maxResultJSON = 4 << 20
)

// resultError is a failed request's error, as the agent sent it (truncated).
type resultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// resultBody converts a result for the HTTP API: data as JSON, or the error
// with its text truncated.
func resultBody(m *schema.RequestResult) (json.RawMessage, *resultError, error) {
	if m.Error != nil {
		return nil, &resultError{Code: clip.String(m.Error.Code, 64), Message: clip.String(m.Error.Message, 4096)}, nil
	}
	data, err := msgpackToJSON(m.Data)
	if err != nil {
		return nil, nil, &schema.ValidationError{Type: schema.TypeRequestResult, Field: "data", Rule: schema.RuleFieldValue,
			Reason: "cannot be given to the HTTP client as JSON: " + err.Error()}
	}
	return data, nil, nil
}

// msgpackToJSON converts a MessagePack value (already bounds-walked by
// schema) to JSON: map keys that are not strings are formatted, bin becomes
// base64, ext becomes {"ext_type", "data"}, NaN and infinities strings.
func msgpackToJSON(raw []byte) (json.RawMessage, error) {
	d := msgpack.NewDecoder(bytes.NewReader(raw))
	v, err := jsonValue(d, 0)
	if err != nil {
		return nil, err
	}
	b, err := marshalNoHTMLEscape(v)
	if err != nil {
		return nil, err
	}
	if len(b) > maxResultJSON {
		return nil, fmt.Errorf("%d bytes of JSON, limit %d", len(b), maxResultJSON)
	}
	return b, nil
}

func jsonValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > schema.MaxDepth {
		return nil, fmt.Errorf("nested deeper than %d", schema.MaxDepth)
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, err := jsonValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				kb, _ := json.Marshal(k)
				ks = string(kb)
			}
			if m[ks], err = jsonValue(d, depth+1); err != nil {
				return nil, err
			}
		}
		return m, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = jsonValue(d, depth+1); err != nil {
				return nil, err
			}
		}
		return a, nil
	case msgpcode.IsExt(c):
		id, n, err := d.DecodeExtHeader()
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		if err := d.ReadFull(b); err != nil {
			return nil, err
		}
		return map[string]any{"ext_type": id, "data": b}, nil
	case msgpcode.IsBin(c):
		return d.DecodeBytes() // []byte: base64 in JSON
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := d.DecodeFloat64()
		if err != nil {
			return nil, err
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Sprint(f), nil
		}
		return f, nil
	}
	return d.DecodeInterfaceLoose() // nil, bool, integers, str, bin
}

// unknownResult is the INVALID_MESSAGE for a result that answers nothing.
func unknownResult(id string, err error) error {
	why := "no process_request with this request_id is awaiting an answer (never sent, or forgotten after --request-retention)"
	if errors.Is(err, errRequestAnswered) {
		why = "this request was already answered; send one request_result per request"
	}
	return &schema.ValidationError{Type: schema.TypeRequestResult, Field: "request_id", Rule: schema.RuleFieldValue,
		Reason: fmt.Sprintf("%q: %s", clip.String(id, 64), why)}
}

// Finish records the primary's result m in the request book: the request's
// outcome (observe.OutcomeAnswered, OutcomeFailed, OutcomeLate for a result
// that arrived after the request expired, was cancelled or set aside — kept
// beside it, not an error — or OutcomeDuplicate for a second answer:
// ignored and counted), how long after acceptance it came, and the trial the
// request was mirrored to. err is the INVALID_MESSAGE to answer (a
// *schema.ValidationError): a result that cannot be given to an HTTP client,
// or one that answers no request the supervisor holds.
func (t *RequestTable) Finish(m *schema.RequestResult) (outcome string, took time.Duration, trial string, err error) {
	data, rerr, err := resultBody(m)
	if err != nil {
		return "", 0, "", err
	}
	b := t.Book()
	if b == nil {
		return "", 0, "", unknownResult(m.RequestID, errRequestUnknown)
	}
	var eb *requests.ErrorBody
	if rerr != nil {
		eb = &requests.ErrorBody{Code: rerr.Code, Message: rerr.Message}
	}
	outcome, took, err = b.Answer(m.RequestID, data, eb)
	switch {
	case errors.Is(err, requests.ErrDuplicate):
		return OutcomeDuplicate, took, "", nil
	case err != nil:
		return "", 0, "", unknownResult(m.RequestID, errRequestUnknown)
	}
	return outcome, took, t.mirrorOf(m.RequestID), nil
}

// OutcomeDuplicate: a second request_result for an answered request.
const OutcomeDuplicate = "duplicate"
