package schema_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/agent-sidecar/supervisor/schema"
)

func TestDecodeExtensions(t *testing.T) {
	entry := walRec("memory_add", 7, obj())
	m, err := schema.Decode(schema.FromAgent, msg("wal_entry", kv{"data", entry}, kv{"ack", true}))
	if err != nil {
		t.Fatal(err)
	}
	if e := m.(*schema.WALEntry); !e.Ack || e.Entry.Sequence != 7 {
		t.Errorf("wal_entry with ack: true decoded as %+v", e)
	}
	m, err = schema.Decode(schema.FromAgent, msg("wal_entry", kv{"data", entry}, kv{"ack", nil}))
	if err != nil || m.(*schema.WALEntry).Ack {
		t.Errorf("ack: nil must count as absent (false); got %v, %v", m, err)
	}
	m, err = schema.Decode(schema.FromAgent, msg("wal_batch", kv{"data", arr(entry, walRec("memory_add", 8, obj()))}, kv{"ack", true}))
	if err != nil || !m.(*schema.WALBatch).Ack {
		t.Errorf("wal_batch with ack: true: %v, %v", m, err)
	}
	m, err = schema.Decode(schema.FromAgent, msg("request_result", kv{"request_id", "r1"}, kv{"data", obj(kv{"answer", "42"})}))
	if err != nil {
		t.Fatal(err)
	}
	if r := m.(*schema.RequestResult); r.RequestID != "r1" || r.Error != nil || !bytes.Equal(r.Data, obj(kv{"answer", "42"})) {
		t.Errorf("request_result with data decoded as %+v", r)
	}
	m, err = schema.Decode(schema.FromAgent, msg("request_result", kv{"request_id", "r2"}, kv{"error", obj(kv{"code", "TOOL_FAILED"}, kv{"message", "no"})}))
	if err != nil {
		t.Fatal(err)
	}
	if r := m.(*schema.RequestResult); r.Data != nil || r.Error == nil || r.Error.Code != "TOOL_FAILED" || r.Error.Message != "no" {
		t.Errorf("request_result with error decoded as %+v", r)
	}
	m, err = schema.Decode(schema.ToAgent, msg("wal_ack", kv{"sequence", uint64(12345)}))
	if err != nil || m.(*schema.WALAck).Sequence != 12345 {
		t.Errorf("wal_ack: %v, %v", m, err)
	}
	m, err = schema.Decode(schema.ToAgent, msg("cancel_request", kv{"request_id", "r9"}))
	if err != nil || m.(*schema.CancelRequest).RequestID != "r9" {
		t.Errorf("cancel_request: %v, %v", m, err)
	}
	m, err = schema.Decode(schema.FromAgent, msg("heartbeat", kv{"accepts", arr("cancel_request", "future_thing")}))
	if err != nil || strings.Join(m.(*schema.Heartbeat).Accepts, ",") != "cancel_request,future_thing" {
		t.Errorf("heartbeat with accepts: %v, %v", m, err)
	}
	for _, v := range []any{nil, arr()} {
		m, err = schema.Decode(schema.FromAgent, msg("heartbeat", kv{"accepts", v}))
		if err != nil || m.(*schema.Heartbeat).Accepts != nil {
			t.Errorf("heartbeat with accepts %v: %v, %v; want no accepts", v, m, err)
		}
	}
	req := obj(kv{"message", "hi"}, kv{"user_id", ""})
	m, err = schema.Decode(schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"data", req}))
	if err != nil || m.(*schema.ProcessRequest).Attempt != 0 {
		t.Errorf("process_request without attempt: %v, %v; want attempt 0 (counts as 1)", m, err)
	}
	m, err = schema.Decode(schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"data", req}, kv{"attempt", uint64(4)}))
	if err != nil || m.(*schema.ProcessRequest).Attempt != 4 {
		t.Errorf("process_request with attempt 4: %v, %v", m, err)
	}
}

// TestDecodeExtensionsInvalid: every bad input of the extensions is a
// payload error naming the field and the rule.
func TestDecodeExtensionsInvalid(t *testing.T) {
	entry := walRec("memory_add", 7, obj())
	big := strings.Repeat("x", 1<<20)
	for _, c := range []struct {
		name  string
		dir   schema.Direction
		p     []byte
		field string
		rule  schema.Rule
	}{
		{"wal_entry with ack a string", schema.FromAgent, msg("wal_entry", kv{"data", entry}, kv{"ack", "yes"}), "ack", schema.RuleFieldType},
		{"wal_entry with ack an integer", schema.FromAgent, msg("wal_entry", kv{"data", entry}, kv{"ack", 1}), "ack", schema.RuleFieldType},
		{"wal_batch with ack a map", schema.FromAgent, msg("wal_batch", kv{"data", arr(entry)}, kv{"ack", obj()}), "ack", schema.RuleFieldType},
		{"wal_entry with ack twice", schema.FromAgent, msg("wal_entry", kv{"data", entry}, kv{"ack", true}, kv{"ack", false}), "ack", schema.RuleMalformed},
		{"request_result without request_id", schema.FromAgent, msg("request_result", kv{"data", obj()}), "request_id", schema.RuleMissingField},
		{"request_result with an empty request_id", schema.FromAgent, msg("request_result", kv{"request_id", ""}, kv{"data", obj()}), "request_id", schema.RuleFieldValue},
		{"request_result with request_id an integer", schema.FromAgent, msg("request_result", kv{"request_id", 5}, kv{"data", obj()}), "request_id", schema.RuleFieldType},
		{"request_result with both data and error", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"data", obj()},
			kv{"error", obj(kv{"code", "X"}, kv{"message", "m"})}), "", schema.RuleFieldValue},
		{"request_result with neither data nor error", schema.FromAgent, msg("request_result", kv{"request_id", "r"}), "data", schema.RuleMissingField},
		{"request_result with data an array", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"data", arr(1)}), "data", schema.RuleFieldType},
		{"request_result with error a string", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"error", "boom"}), "error", schema.RuleFieldType},
		{"request_result with an empty error code", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"error", obj(kv{"code", ""}, kv{"message", "m"})}), "error.code", schema.RuleFieldValue},
		{"request_result with an error without message", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"error", obj(kv{"code", "X"})}), "error.message", schema.RuleMissingField},
		{"request_result over 1 MiB", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"data", obj(kv{"answer", big})}), "", schema.RuleTooLarge},
		{"request_result compressed", schema.FromAgent, msg("request_result", kv{"request_id", "r"}, kv{"compressed", true}, kv{"compression", "zstd"}, kv{"data", obj()}), "compressed", schema.RuleCompression},
		{"request_result sent to the agent", schema.ToAgent, msg("request_result", kv{"request_id", "r"}, kv{"data", obj()}), "type", schema.RuleWrongDirection},
		{"wal_ack sent by the agent", schema.FromAgent, msg("wal_ack", kv{"sequence", 1}), "type", schema.RuleWrongDirection},
		{"wal_ack without sequence", schema.ToAgent, msg("wal_ack"), "sequence", schema.RuleMissingField},
		{"wal_ack with sequence 0", schema.ToAgent, msg("wal_ack", kv{"sequence", 0}), "sequence", schema.RuleFieldValue},
		{"cancel_request without request_id", schema.ToAgent, msg("cancel_request"), "request_id", schema.RuleMissingField},
		{"cancel_request with an empty request_id", schema.ToAgent, msg("cancel_request", kv{"request_id", ""}), "request_id", schema.RuleFieldValue},
		{"cancel_request with request_id an integer", schema.ToAgent, msg("cancel_request", kv{"request_id", 5}), "request_id", schema.RuleFieldType},
		{"cancel_request over 1 MiB", schema.ToAgent, msg("cancel_request", kv{"request_id", big}), "", schema.RuleTooLarge},
		{"cancel_request compressed", schema.ToAgent, msg("cancel_request", kv{"request_id", "r"}, kv{"compressed", true}, kv{"compression", "zstd"}), "compressed", schema.RuleCompression},
		{"cancel_request sent by the agent", schema.FromAgent, msg("cancel_request", kv{"request_id", "r"}), "type", schema.RuleWrongDirection},
		{"heartbeat with accepts a string", schema.FromAgent, msg("heartbeat", kv{"accepts", "cancel_request"}), "accepts", schema.RuleFieldType},
		{"heartbeat with accepts holding an integer", schema.FromAgent, msg("heartbeat", kv{"accepts", arr("cancel_request", 3)}), "accepts[1]", schema.RuleFieldType},
		{"heartbeat with accepts over 100 B", schema.FromAgent, msg("heartbeat", kv{"accepts", arr(strings.Repeat("c", 90))}), "", schema.RuleTooLarge},
		{"process_request with attempt 0", schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"attempt", 0}, kv{"data", obj(kv{"message", "m"})}), "attempt", schema.RuleFieldValue},
		{"process_request with attempt -1", schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"attempt", -1}, kv{"data", obj(kv{"message", "m"})}), "attempt", schema.RuleFieldValue},
		{"process_request with attempt a string", schema.ToAgent, msg("process_request", kv{"request_id", "r"}, kv{"attempt", "2"}, kv{"data", obj(kv{"message", "m"})}), "attempt", schema.RuleFieldType},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := schema.Decode(c.dir, c.p)
			var ve *schema.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a *ValidationError", err)
			}
			if ve.Field != c.field || ve.Rule != c.rule {
				t.Errorf("field %q rule %q (%v); want field %q rule %q", ve.Field, ve.Rule, err, c.field, c.rule)
			}
		})
	}
}

func TestEncodeExtensionsRoundTrip(t *testing.T) {
	h := schema.Header{Timestamp: 1705392000, Version: 1} // decoding fills in version 1
	for _, m := range []schema.Message{
		&schema.WALEntry{Header: h, Entry: schema.WALRecord{Operation: "memory_add", Sequence: 3, Params: schema.RawMap(nil)}, Ack: true},
		&schema.WALBatch{Header: h, Entries: []schema.WALRecord{{Operation: "memory_add", Sequence: 3}, {Operation: "state_update", Sequence: 4}}, Ack: true},
		&schema.WALAck{Header: h, Sequence: 1 << 40},
		&schema.CancelRequest{Header: h, RequestID: "0b9f"},
		&schema.Heartbeat{Header: h, Accepts: []string{schema.TypeCancelRequest}},
		&schema.ProcessRequest{Header: h, RequestID: "r", Data: schema.RequestData{Message: "m"}, Attempt: 2},
		&schema.RequestResult{Header: h, RequestID: "r", Data: schema.RawMap(map[string]any{"answer": 42})},
		&schema.RequestResult{Header: h, RequestID: "r", Error: &schema.ErrorBody{Code: "TOOL_FAILED", Message: "timeout"}},
	} {
		p, err := schema.Encode(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		dir := schema.FromAgent
		switch m.MessageType() {
		case schema.TypeWALAck, schema.TypeCancelRequest, schema.TypeProcessRequest:
			dir = schema.ToAgent
		}
		got, err := schema.Decode(dir, p)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		again, err := schema.Encode(got)
		if err != nil || !bytes.Equal(again, p) {
			t.Errorf("%T does not round-trip: %x vs %x (%v)", m, again, p, err)
		}
	}
	// Without ack the encoding is the seed's: no ack key at all.
	p, _ := schema.Encode(&schema.WALEntry{Entry: schema.WALRecord{Operation: "memory_add", Sequence: 3}})
	if bytes.Contains(p, []byte("ack")) {
		t.Errorf("a wal_entry without ack must not carry the key: %x", p)
	}
	// Without attempt or accepts the encodings are the seed's: no key at all.
	p, _ = schema.Encode(&schema.ProcessRequest{RequestID: "r", Data: schema.RequestData{Message: "m"}})
	if bytes.Contains(p, []byte("attempt")) {
		t.Errorf("a process_request with attempt 0 must not carry the key: %x", p)
	}
	p, _ = schema.Encode(&schema.Heartbeat{Accepts: []string{}})
	if bytes.Contains(p, []byte("accepts")) {
		t.Errorf("a heartbeat without accepts must not carry the key: %x", p)
	}
	if _, err := schema.Encode(&schema.CancelRequest{}); !errors.Is(err, schema.ErrInvalidMessage) {
		t.Errorf("Encode(cancel_request without request_id) = %v, want an invalid message", err)
	}
	for _, bad := range []*schema.RequestResult{
		{RequestID: "", Data: schema.RawMap(nil)},
		{RequestID: "r"},
		{RequestID: "r", Data: schema.RawMap(nil), Error: &schema.ErrorBody{Code: "X"}},
		{RequestID: "r", Error: &schema.ErrorBody{}},
	} {
		if _, err := schema.Encode(bad); !errors.Is(err, schema.ErrInvalidMessage) {
			t.Errorf("Encode(%+v) = %v, want an invalid message", bad, err)
		}
	}
}
