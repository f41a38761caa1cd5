package checkpoint

import (
	"io"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestOrderIgnoresTheClock: checkpoints dated in the future (a wall clock
// that then steps back) neither outrank nor get a new checkpoint pruned
// right after it is stored: the store's order is the order of Saves.
func TestOrderIgnoresTheClock(t *testing.T) {
	dir := t.TempDir()
	future := time.Now().Add(365 * 24 * time.Hour)
	ahead, err := Open(dir, Options{Retain: 2, Now: func() time.Time { return future }})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ahead.Save([]byte{0x80}, 1); err != nil {
			t.Fatal(err)
		}
	}
	st, err := Open(dir, Options{Retain: 2}) // the clock stepped back a year
	if err != nil {
		t.Fatal(err)
	}
	newest, err := st.Save([]byte{0x81, 0xa1, 'k', 0x01}, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Prune(); err != nil {
		t.Fatal(err)
	}
	metas, err := st.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(metas) != 2 || metas[0].ID != newest.ID {
		t.Fatalf("after Prune: %+v; want 2 checkpoints, newest first %s", metas, newest.ID)
	}
	m, _, _, err := st.Latest()
	if err != nil || m.ID != newest.ID || m.Watermark != 7 {
		t.Fatalf("Latest = %+v, %v; want the checkpoint saved last", m, err)
	}
}

// TestNextIDMonotonic: ids strictly grow whatever the clock does, and stay
// valid UUIDv7.
func TestNextIDMonotonic(t *testing.T) {
	now := time.Now()
	prev, err := nextID(uuid.UUID{}, false, now)
	if err != nil {
		t.Fatal(err)
	}
	clocks := []time.Duration{0, 0, -time.Hour, time.Millisecond, -24 * time.Hour, 0, time.Hour}
	for i := range 2000 {
		u, err := nextID(prev, true, now.Add(clocks[i%len(clocks)]))
		if err != nil {
			t.Fatal(err)
		}
		if compareID(u, prev) <= 0 {
			t.Fatalf("id %d: %s is not above %s", i, u, prev)
		}
		if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
			t.Fatalf("id %s: version %d variant %v", u, u.Version(), u.Variant())
		}
		prev = u
	}
	// Counter overflow carries into the timestamp.
	full := prev
	for i := 6; i < 16; i++ {
		full[i] = 0xff
	}
	full[6], full[8] = 0x7f, 0xbf
	u, err := nextID(full, true, now.Add(-time.Hour))
	if err != nil || compareID(u, full) <= 0 || timestamp(u) != timestamp(full)+1 {
		t.Fatalf("after a full counter: %s (%v), want above %s with the next millisecond", u, err, full)
	}
}

// TestStreamSaveIdsGrowToo: the streaming save (compressed checkpoints) takes
// its id from the same monotonic source as Save.
func TestStreamSaveIdsGrowToo(t *testing.T) {
	dir := t.TempDir()
	future := time.Now().Add(365 * 24 * time.Hour)
	ahead, err := Open(dir, Options{Now: func() time.Time { return future }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ahead.Save([]byte{0x80}, 1); err != nil {
		t.Fatal(err)
	}
	st, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.SaveStreamSized(2, 1, func(w io.Writer) error { _, err := w.Write([]byte{0x80}); return err })
	if err != nil {
		t.Fatal(err)
	}
	metas, err := st.List()
	if err != nil || metas[0].ID != m.ID {
		t.Fatalf("List()[0] = %v (%v), want the stream-saved %s", metas[0].ID, err, m.ID)
	}
}
