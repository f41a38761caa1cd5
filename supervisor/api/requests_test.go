package api

import (
	"errors"
	"testing"
	"time"

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

// TestShadowAnswers: the shadow may answer only requests mirrored to its
// trial, once each; its answers never complete the primary's request.
func TestShadowAnswers(t *testing.T) {
	tb, clk := newTestTable(time.Minute)
	tb.addMirror("mirrored", "trial-1")
	clk.advance(30 * time.Millisecond)
	if _, err := tb.shadowAnswer("mirrored", "trial-2"); !errors.Is(err, errRequestUnknown) {
		t.Errorf("another trial's shadow: %v, want errRequestUnknown", err)
	}
	if _, err := tb.shadowAnswer("primary-only", "trial-1"); !errors.Is(err, errRequestUnknown) {
		t.Errorf("a request not mirrored: %v, want errRequestUnknown", err)
	}
	took, err := tb.shadowAnswer("mirrored", "trial-1")
	if err != nil || took != 30*time.Millisecond {
		t.Errorf("shadow answer: %v, %v", took, err)
	}
	if _, err := tb.shadowAnswer("mirrored", "trial-1"); !errors.Is(err, errRequestAnswered) {
		t.Errorf("second shadow answer: %v, want errRequestAnswered", err)
	}
	if trial := tb.mirrorOf("mirrored"); trial != "trial-1" {
		t.Errorf("mirrorOf: %q", trial)
	}
}
