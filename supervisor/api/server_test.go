package api

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestJSONDepth(t *testing.T) {
	for _, tc := range []struct {
		json string
		want int
	}{
		{`{}`, 1}, {`{"a":1}`, 1}, {`{"a":{"b":[1,{"c":2}]}}`, 4}, {`{"a":[]}`, 2},
	} {
		var v any
		json.Unmarshal([]byte(tc.json), &v)
		if got := jsonDepth(v, 100); got != tc.want {
			t.Errorf("%s: depth %d, want %d", tc.json, got, tc.want)
		}
	}
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	var v any
	json.Unmarshal([]byte(deep), &v)
	if got := jsonDepth(v, maxContextDepth+1); got != maxContextDepth+1 {
		t.Fatalf("5000 deep counted as %d", got)
	}
}

func TestLimitListenerCapsConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// peak is the most connections ever open at once: the cap holds over the
	// whole test, not just at one moment.
	var open, peak, waits atomic.Int64
	ll := newLimitListener(ln, 2, func(d int) {
		n := open.Add(int64(d))
		for {
			if p := peak.Load(); n <= p || peak.CompareAndSwap(p, n) {
				return
			}
		}
	}, func() { waits.Add(1) })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), ReadHeaderTimeout: 300 * time.Millisecond}
	go srv.Serve(ll)
	defer srv.Close()
	var conns []net.Conn
	for range 5 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// Stalled clients time out and free their slots for the rest.
	deadline := time.Now().Add(5 * time.Second)
	for waits.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if waits.Load() == 0 {
		t.Fatal("the cap was never reached")
	}
	// Each stalled client is dropped at the header timeout, so all five get
	// their turn, two at a time.
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 512)); err == nil {
			c.Read(make([]byte, 512)) // a 408 first, then the close
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for open.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := open.Load(); n != 0 {
		t.Fatalf("%d connections still open after the header timeout", n)
	}
	if n := peak.Load(); n != 2 {
		t.Fatalf("at most %d connections were open at once, want the cap, 2", n)
	}
}
