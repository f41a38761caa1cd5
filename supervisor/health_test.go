package supervisor

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHealthzFailsWhenTheLoopStalls(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Command = []string{"/bin/true"}
	cfg.LoopStallTimeout = time.Second
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	get := func() (int, map[string]any) {
		rec := httptest.NewRecorder()
		s.api.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		var body map[string]any
		json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body
	}
	s.loopBeat.Store(time.Now().UnixNano())
	if code, _ := get(); code != 200 {
		t.Fatalf("fresh loop: %d", code)
	}
	s.loopBeat.Store(time.Now().Add(-5 * time.Second).UnixNano())
	code, body := get()
	if code != 503 || body["status"] != "stalled" || !strings.Contains(body["reason"].(string), "no progress") {
		t.Fatalf("stalled loop: %d %v", code, body)
	}
}
