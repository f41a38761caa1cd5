package api

import (
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
