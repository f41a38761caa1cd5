package api

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// fakeClock is a settable clock for the request table.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newTestTable(retention time.Duration) (*RequestTable, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1705392000, 0)}
	tb := newRequestTable(retention, observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 }))
	tb.now = clk.now
	return tb, clk
}

func TestRequestTableLifecycle(t *testing.T) {
	tb, clk := newTestTable(time.Minute)
	r, _ := tb.add("a", "")
	if v, _ := tb.view("a"); v.Status != statusPending {
		t.Errorf("new request is %q, want pending", v.Status)
	}
	clk.advance(20 * time.Millisecond)
	outcome, took, _, err := tb.finish("a", json.RawMessage(`{"x":1}`), nil)
	if err != nil || outcome != observe.OutcomeAnswered || took != 20*time.Millisecond {
		t.Fatalf("finish = %q %v %v", outcome, took, err)
	}
	select {
	case <-r.done:
	default:
		t.Fatal("a waiter was not woken by the answer")
	}
	if v, _ := tb.view("a"); v.Status != statusAnswered || string(v.Data) != `{"x":1}` {
		t.Errorf("view %+v", v)
	}
	if _, _, _, err := tb.finish("a", json.RawMessage(`{}`), nil); !errors.Is(err, errRequestAnswered) {
		t.Errorf("second result = %v, want errRequestAnswered", err)
	}
	if _, _, _, err := tb.finish("never-sent", json.RawMessage(`{}`), nil); !errors.Is(err, errRequestUnknown) {
		t.Errorf("result for an unknown id = %v, want errRequestUnknown", err)
	}
	tb.add("b", "")
	if o, _, _, _ := tb.finish("b", nil, &resultError{Code: "TOOL_FAILED", Message: "m"}); o != observe.OutcomeFailed {
		t.Errorf("error result outcome %q", o)
	}
	if v, _ := tb.view("b"); v.Status != statusFailed || v.Error.Code != "TOOL_FAILED" {
		t.Errorf("view %+v", v)
	}

	// A request unanswered for the retention expires; its late result is
	// dropped (no error), and it is forgotten a retention later.
	tb.add("slow", "")
	clk.advance(time.Minute)
	if v, _ := tb.view("slow"); v.Status != statusExpired {
		t.Errorf("unanswered request after the retention is %q, want expired", v.Status)
	}
	if o, _, _, err := tb.finish("slow", json.RawMessage(`{}`), nil); o != observe.OutcomeLate || err != nil {
		t.Errorf("late result = %q, %v; want late, nil", o, err)
	}
	if got := testutil.ToFloat64(tb.met.RequestOutcomes.WithLabelValues(observe.OutcomeExpired)); got != 1 {
		t.Errorf("expired counter %v", got)
	}
	clk.advance(time.Minute + time.Second)
	for _, id := range []string{"a", "b", "slow"} {
		if _, ok := tb.view(id); ok {
			t.Errorf("%s still held after twice the retention", id)
		}
	}
	if _, _, _, err := tb.finish("slow", json.RawMessage(`{}`), nil); !errors.Is(err, errRequestUnknown) {
		t.Errorf("result for a forgotten request = %v, want errRequestUnknown", err)
	}
}

func TestRequestTableBounded(t *testing.T) {
	tb, clk := newTestTable(time.Hour)
	tb.maxCount, tb.maxBytes = 3, 10
	held := func(want ...string) {
		t.Helper()
		if len(tb.recs) != len(want) {
			t.Errorf("%d held, want %v", len(tb.recs), want)
		}
		for _, id := range want {
			if _, ok := tb.view(id); !ok {
				t.Errorf("%s was forgotten; want %v held", id, want)
			}
		}
	}
	// At the count cap with every request pending (an agent that never
	// answers), a new one is refused: none accepted is forgotten.
	tb.add("p1", "")
	clk.advance(time.Second)
	tb.add("p2", "")
	tb.add("p3", "")
	if _, err := tb.add("p4", ""); !errors.Is(err, errTableFull) {
		t.Errorf("add at the cap with all pending: %v, want errTableFull", err)
	}
	held("p1", "p2", "p3")
	// With a finished one, it goes first.
	tb.finish("p1", json.RawMessage(`{}`), nil)
	if _, err := tb.add("p4", ""); err != nil {
		t.Fatal(err)
	}
	held("p2", "p3", "p4")
	// Over the byte budget, the oldest results are dropped; their requests
	// stay, saying so.
	tb.finish("p2", json.RawMessage(`"123456"`), nil)
	clk.advance(time.Second)
	tb.finish("p3", json.RawMessage(`"123456"`), nil)
	held("p2", "p3", "p4")
	if tb.bytes != 8 {
		t.Errorf("%d bytes counted, want 8", tb.bytes)
	}
	if v, _ := tb.view("p2"); v.Status != statusDropped || v.Data != nil || v.Error == nil || v.Error.Code != "RESULT_DROPPED" {
		t.Errorf("p2 after its result was dropped: %+v", v)
	}
	if v, _ := tb.view("p3"); v.Status != statusAnswered || string(v.Data) != `"123456"` {
		t.Errorf("p3, the newest result: %+v", v)
	}
}

func TestMsgpackToJSON(t *testing.T) {
	raw, _ := schema.MarshalMap(map[string]any{"s": "x", "n": -3, "f": 1.5, "a": []any{true, nil}, "m": map[string]any{"k": uint64(1 << 63)}})
	raw = append([]byte{raw[0] + 1, 0xa1, 'b', 0xc4, 2, 1, 2}, raw[1:]...) // b: bin
	got, err := msgpackToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"a":[true,null],"b":"AQI=","f":1.5,"m":{"k":9223372036854775808},"n":-3,"s":"x"}`
	if string(got) != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	// Non-string keys and ext values still give JSON.
	odd := []byte{0x82, 0x01, 0xa1, 'x', 0xa1, 'e', 0xd4, 0x05, 0xff}
	if got, err := msgpackToJSON(odd); err != nil || string(got) != `{"1":"x","e":{"data":"/w==","ext_type":5}}` {
		t.Errorf("got %s, %v", got, err)
	}
}
