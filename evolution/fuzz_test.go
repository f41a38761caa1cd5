package evolution

import (
	"testing"
)

// FuzzLedger feeds arbitrary bytes to the ledger file parser: it must never
// panic, and whatever it accepts must survive an encode/parse round trip.
func FuzzLedger(f *testing.F) {
	f.Add([]byte(`{"version":1,"promotions":[]}`))
	f.Add([]byte(`{"version":1,"promotions":[{"id":"a","module":"memory","code":"(def x)","target":"memory_system","reason":"r","backup_checkpoint_id":"0190f1a2-0000-7000-8000-000000000001","at":"2025-06-01T12:00:00+02:00","metrics":{"latency_improvement":-0.15}}]}`))
	f.Add([]byte(`{"version":1,"promotions":[{"id":"a","at":"2025-06-01T12:00:00Z"},{"id":"a","at":"2025-06-01T12:00:00Z"}]}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Add([]byte(`{"version":1,"promotions":[{"id":"a","at":"2025-06-01T12:00:00Z","metrics":{"x":1e999}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ps, err := parseLedger(b)
		if err != nil {
			return
		}
		enc, err := encodeLedger(ps)
		if err != nil {
			t.Fatalf("accepted ledger does not encode: %v", err)
		}
		again, err := parseLedger(enc)
		if err != nil {
			t.Fatalf("re-encoded ledger does not parse: %v\n%s", err, enc)
		}
		if len(again) != len(ps) {
			t.Fatalf("round trip: %d promotions, then %d", len(ps), len(again))
		}
		for i := range ps {
			if !samePromotion(ps[i], again[i]) {
				t.Fatalf("round trip changed promotion %d:\n%+v\n%+v", i, ps[i], again[i])
			}
		}
	})
}
