package schema

import (
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/vmihailenco/msgpack/v5"
)

// The opt-in extensions for agents that must not act before their entry is
// durable (docs/protocol.md, "Extensions"). An agent that never sends
// ack: true or request_result never receives anything new.
//
//   - wal_entry and wal_batch may carry ack: true ([WALEntry.Ack],
//     [WALBatch.Ack]); the supervisor then answers with a [WALAck] once
//     every entry up to WALAck.Sequence is durable. Acks are cumulative.
//   - request_result ([RequestResult]) is the agent's answer to a
//     process_request: data, or an error {code, message}.
//   - durable requests: process_request carries attempt
//     ([ProcessRequest.Attempt]); an agent that lists "cancel_request" in a
//     heartbeat's accepts ([Heartbeat.Accepts]) may be sent a
//     [CancelRequest] for a request in flight that a caller cancelled.

// CodeRequestFailed is the error code the Go client puts in a request_result
// whose handler returned a plain error.
const CodeRequestFailed = "REQUEST_FAILED"

// WALAck tells the agent that every WAL entry with a sequence up to and
// including Sequence is durable (supervisor → agent). Acks are cumulative:
// one ack answers every ack: true entry at or below Sequence.
type WALAck struct {
	Header
	Sequence uint64
}

// RequestResult is the agent's answer to a process_request (agent →
// supervisor): exactly one of Data and Error is set.
type RequestResult struct {
	Header
	RequestID string
	// Data is the raw bytes of the answer map (aliases the payload on
	// decode); nil when the request failed.
	Data msgpack.RawMessage
	// Error is set when the request failed: Code (not empty) and Message.
	// Only Code and Message are sent and read.
	Error *ErrorBody
}

// CancelRequest tells the agent that a caller cancelled a request it is
// working on: stop its work (supervisor → agent). Sent only to an agent whose
// heartbeats carry "cancel_request" in accepts. An unknown id is ignored.
type CancelRequest struct {
	Header
	RequestID string // not empty
}

func (*WALAck) MessageType() string        { return TypeWALAck }
func (*RequestResult) MessageType() string { return TypeRequestResult }
func (*CancelRequest) MessageType() string { return TypeCancelRequest }

func (s *decodeState) cancelRequest(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &CancelRequest{Header: h}
	if err := s.strs(strField{top[fRequestID], "request_id", &m.RequestID, nonEmpty, "be the request_id of the process_request to cancel"}); err != nil {
		return nil, err
	}
	return m, nil
}

// accepts reads a heartbeat's optional accepts: an array of strings (nil
// when absent, nil or empty).
func (s *decodeState) accepts(v []byte) ([]string, error) {
	if !present(v) {
		return nil, nil
	}
	if !isArrayCode(v[0]) {
		return nil, s.typeErr("accepts", "an array of message type names", v)
	}
	n := mustHead(v).n
	if n == 0 {
		return nil, nil
	}
	out := make([]string, 0, n)
	err := elems(v, func(i int, e []byte) error {
		str, err := s.str(e, path("accepts", i, ""))
		if err != nil {
			return err
		}
		out = append(out, str)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// attempt reads a process_request's optional attempt: a positive integer, 0
// when absent or nil.
func (s *decodeState) attempt(v []byte) (uint64, error) {
	if !present(v) {
		return 0, nil
	}
	n, err := s.int(v, "attempt")
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, s.fail("attempt", RuleFieldValue, "must be a positive integer, got %d", n)
	}
	return uint64(n), nil
}

func (e *encoder) heartbeat(m *Heartbeat) error {
	if len(m.Accepts) == 0 {
		e.begin(&m.Header, 0, false)
		return nil
	}
	size := 0
	for _, a := range m.Accepts {
		size += len(a) + 1
	}
	e.beginSized(&m.Header, 1, false, size)
	e.key("accepts")
	e.b = AppendArrayHeader(e.b, len(m.Accepts))
	for _, a := range m.Accepts {
		e.b = AppendStr(e.b, clip.Valid(a))
	}
	return nil
}

func (e *encoder) cancelRequest(m *CancelRequest) error {
	if m.RequestID == "" {
		return e.fail("request_id", RuleMissingField, "a request_id is required")
	}
	e.beginSized(&m.Header, 1, false, len(m.RequestID))
	e.str("request_id", m.RequestID)
	return nil
}

// requestErrorNames are the fields read from request_result.error.
var requestErrorNames = []string{"code", "message"}

// ackFlag reads the optional ack field of a wal_entry or wal_batch: a
// boolean, false when absent or nil.
func (s *decodeState) ackFlag(top *[nTop][]byte) (bool, error) {
	v := top[fAck]
	if !present(v) {
		return false, nil
	}
	return s.bool(v, "ack")
}

func (s *decodeState) walAck(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	v := top[fSequence]
	if v == nil {
		return nil, s.missing("sequence", "a positive integer")
	}
	n, err := s.int(v, "sequence")
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, s.fail("sequence", RuleFieldValue, "must be a positive integer, got %d", n)
	}
	return &WALAck{Header: h, Sequence: uint64(n)}, nil
}

func (s *decodeState) requestResult(top *[nTop][]byte, h Header) (Message, error) {
	if err := s.noCompression(top); err != nil {
		return nil, err
	}
	m := &RequestResult{Header: h}
	err := s.strs(strField{top[fRequestID], "request_id", &m.RequestID, nonEmpty, "be the request_id of the process_request answered"})
	if err != nil {
		return nil, err
	}
	data, ev := top[fData], top[fError]
	switch {
	case present(data) && present(ev):
		return nil, s.fail("", RuleFieldValue, "has both data and error; send data for an answer or error for a failure, not both")
	case !present(data) && !present(ev):
		return nil, s.missing("data", "a map with the answer, or an error {code, message}")
	case present(data):
		if m.Data, err = s.reqMap(data, "data"); err != nil {
			return nil, err
		}
		return m, nil
	}
	if _, err := s.reqMap(ev, "error"); err != nil {
		return nil, err
	}
	var f [2][]byte
	if err := s.fields(ev, "error", requestErrorNames, f[:], true); err != nil {
		return nil, err
	}
	b := &ErrorBody{}
	if err := s.strs(
		strField{f[0], "error.code", &b.Code, nonEmpty, "name the error"},
		strField{f[1], "error.message", &b.Message, required, ""},
	); err != nil {
		return nil, err
	}
	m.Error = b
	return m, nil
}

func (e *encoder) requestResult(m *RequestResult) error {
	if m.RequestID == "" {
		return e.fail("request_id", RuleMissingField, "a request_id is required")
	}
	switch {
	case m.Data != nil && m.Error != nil:
		return e.fail("", RuleFieldValue, "has both data and error; set exactly one")
	case m.Data == nil && m.Error == nil:
		return e.fail("data", RuleMissingField, "a request_result needs data or an error")
	case m.Error != nil && m.Error.Code == "":
		return e.fail("error.code", RuleMissingField, "an error code is required")
	}
	size := len(m.RequestID) + len(m.Data)
	if m.Error != nil {
		size += len(m.Error.Code) + len(m.Error.Message)
	}
	e.beginSized(&m.Header, 2, false, size)
	e.str("request_id", m.RequestID)
	if m.Data != nil {
		e.raw("data", m.Data)
		return nil
	}
	e.key("error")
	e.b = append(e.b, 0x82)
	e.str("code", m.Error.Code)
	e.str("message", m.Error.Message)
	return nil
}

// ack appends ack: true when set; absent means false.
func (e *encoder) ack(on bool) {
	if on {
		e.key("ack")
		e.b = appendBool(e.b, true)
	}
}

func boolField(on bool) int {
	if on {
		return 1
	}
	return 0
}
