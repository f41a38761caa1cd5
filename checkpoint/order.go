package checkpoint

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Checkpoint ids are UUIDv7 and their order is the store's order: List sorts
// by id, never by a clock reading. Save makes every new id greater than
// every id already in the store (RFC 9562's monotonic method: when the
// clock has not moved past the newest id's timestamp, or has stepped
// backwards, the new id takes that timestamp and the next counter value).
// So a wall clock stepping back, or checkpoints dated in the future, can
// neither reorder the store nor get a new checkpoint pruned as "old".

// nextID returns a UUIDv7 for time now that is greater than prev (when
// havePrev).
func nextID(prev uuid.UUID, havePrev bool, now time.Time) (uuid.UUID, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return uuid.UUID{}, err
	}
	setTimestamp(&u, uint64(now.UnixMilli()))
	if !havePrev || compareID(u, prev) > 0 {
		return u, nil
	}
	// Same millisecond or a clock behind the newest id: count up from it.
	u = prev
	if !incrementCounter(&u) {
		setTimestamp(&u, timestamp(prev)+1)
		for i := 6; i < 16; i++ {
			u[i] = 0
		}
	}
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u, nil
}

func timestamp(u uuid.UUID) uint64 {
	var t uint64
	for i := 0; i < 6; i++ {
		t = t<<8 | uint64(u[i])
	}
	return t
}

func setTimestamp(u *uuid.UUID, ms uint64) {
	for i := 5; i >= 0; i-- {
		u[i] = byte(ms)
		ms >>= 8
	}
}

// incrementCounter adds one to the 74 bits after the timestamp (rand_a and
// rand_b, skipping the version and variant bits); false on overflow.
func incrementCounter(u *uuid.UUID) bool {
	// rand_b: the low 62 bits (bytes 8..15 without the two variant bits).
	for i := 15; i >= 8; i-- {
		mask := byte(0xff)
		if i == 8 {
			mask = 0x3f
		}
		v := u[i] & mask
		if v != mask {
			u[i] = u[i]&^mask | (v + 1)
			return true
		}
		u[i] &^= mask // carry
	}
	// rand_a: 12 bits in bytes 6 (low nibble) and 7.
	if u[7] != 0xff {
		u[7]++
		return true
	}
	u[7] = 0
	if u[6]&0x0f != 0x0f {
		u[6]++
		return true
	}
	u[6] &^= 0x0f
	return false
}

func compareID(a, b uuid.UUID) int {
	return strings.Compare(a.String(), b.String())
}

// newestID returns the greatest checkpoint id among the files in dir.
func newestID(dir string) (uuid.UUID, bool, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return uuid.UUID{}, false, err
	}
	var best uuid.UUID
	found := false
	for _, de := range des {
		stem, ok := strings.CutSuffix(de.Name(), ckptSuffix)
		if !ok {
			continue
		}
		u, err := uuid.Parse(stem)
		if err != nil || u.String() != stem {
			continue
		}
		if !found || compareID(u, best) > 0 {
			best, found = u, true
		}
	}
	return best, found, nil
}

// newID returns the id for the next checkpoint (greater than every id in the
// store) and the clock reading it was made from. s.saveMu must be held; the
// caller records the id in s.lastID once the checkpoint is stored.
func (s *Store) newID() (uuid.UUID, time.Time, error) {
	if !s.haveLast {
		last, ok, err := newestID(s.dir)
		if err != nil {
			return uuid.UUID{}, time.Time{}, fmt.Errorf("checkpoint: find the newest id in %s: %w", s.dir, err)
		}
		s.lastID, s.haveLast = last, ok
	}
	now := s.opts.Now()
	u, err := nextID(s.lastID, s.haveLast, now)
	if err != nil {
		return uuid.UUID{}, time.Time{}, fmt.Errorf("checkpoint: new id: %w", err)
	}
	return u, now, nil
}
