package requests

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// answerMany accepts and answers n requests r00, r01… with data, in order.
func answerMany(t *testing.T, b *Book, n int, data json.RawMessage) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("r%02d", i)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.Answer(id, data, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func heldResultBytes(b *Book) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.resultBytes
}

// TestRestartKeepsResultsBound: the journal holds every answer's data until
// a compaction, also the data dropped to keep MaxResultBytes. A restart
// keeps the bound: the dropped answers stay dropped, the journal's room is
// what it was (an 800 KiB POST accepted before the restart is accepted
// after it). Before, the replay loaded every answer again: 66 MB of
// results, the POST refused 429, r00 answered again.
func TestRestartKeepsResultsBound(t *testing.T) {
	dir := fastDir(t)
	const maxBytes = 64 << 20 // the default --request-journal-bytes
	cfg := Config{MaxBytes: maxBytes, Retention: 10 * time.Minute}
	b := testBook(t, dir, cfg)
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	answerMany(t, b, 66, data)
	big := json.RawMessage(`{"message":"` + strings.Repeat("m", 800<<10) + `"}`)
	if _, _, err := b.Accept("", "", big, "before", false); err != nil {
		t.Fatalf("before the restart: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = testBook(t, dir, cfg)
	if n := heldResultBytes(b); n > MaxResultBytes {
		t.Errorf("after the restart the book holds %d bytes of results, bound %d", n, MaxResultBytes)
	}
	if _, _, err := b.Accept("", "", big, "after", false); errors.Is(err, ErrFull) {
		t.Errorf("after the restart an 800 KiB POST is refused (journal full); it was accepted before")
	}
	for i := range 66 {
		id := fmt.Sprintf("r%02d", i)
		want := StatusAnswered
		if i < 66-16 {
			want = StatusDropped
		}
		if v, _ := b.Get(id); v.Status != want {
			t.Errorf("%s after the restart: %s, want %s", id, v.Status, want)
		}
	}
}

// TestRestartKeepsTheDropsMade: an answer dropped stays dropped after a
// restart, also when it is not the one a replay would pick (the oldest):
// here the oldest request is answered last, so the next oldest was dropped.
func TestRestartKeepsTheDropsMade(t *testing.T) {
	dir := fastDir(t)
	cfg := Config{MaxBytes: 64 << 20, Retention: 10 * time.Minute}
	b := testBook(t, dir, cfg)
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	for i := range 17 {
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), fmt.Sprintf("r%02d", i), false); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 17 {
		if _, _, err := b.Answer(fmt.Sprintf("r%02d", (i+1)%17), data, nil); err != nil { // r00 last
			t.Fatal(err)
		}
	}
	want := map[string]string{"r00": StatusAnswered, "r01": StatusDropped, "r02": StatusAnswered}
	for id, st := range want {
		if v, _ := b.Get(id); v.Status != st {
			t.Fatalf("%s before the restart: %s, want %s", id, v.Status, st)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = testBook(t, dir, cfg)
	for id, st := range want {
		if v, _ := b.Get(id); v.Status != st {
			t.Errorf("%s after the restart: %s, want %s as before", id, v.Status, st)
		}
	}
	if n := heldResultBytes(b); n > MaxResultBytes {
		t.Errorf("after the restart the book holds %d bytes of results, bound %d", n, MaxResultBytes)
	}
	views, _, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if st, ok := want[v.ID]; ok && v.Status != st {
			t.Errorf("%s as Load reads it: %s, want %s", v.ID, v.Status, st)
		}
	}
}

// TestRestartBoundsResultsWithoutDropRecords: a journal whose drops were
// not journaled (written by an older supervisor, or the lazy drop records
// lost to a crash) holds every answer's data: the replay drops the oldest
// until the results fit, the same ones at the next restart.
func TestRestartBoundsResultsWithoutDropRecords(t *testing.T) {
	dir := fastDir(t)
	j, _, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*Record { return nil }, nil)
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	now := time.Now()
	var recs []*Record
	for i := range 20 {
		id := fmt.Sprintf("r%02d", i)
		recs = append(recs, &Record{Kind: KindAccepted, ID: id, Body: json.RawMessage(`{"message":"x"}`), At: now.UnixNano(), Deadline: now.Add(time.Hour).UnixNano()},
			&Record{Kind: KindAnswered, ID: id, Data: data, At: now.UnixNano()})
	}
	if err := j.Append(recs...).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{MaxBytes: 64 << 20, Retention: 10 * time.Minute}
	for restart := range 2 {
		b := testBook(t, dir, cfg)
		if n := heldResultBytes(b); n > MaxResultBytes {
			t.Errorf("restart %d: the book holds %d bytes of results, bound %d", restart, n, MaxResultBytes)
		}
		for i := range 20 {
			id := fmt.Sprintf("r%02d", i)
			want := StatusAnswered
			if i < 4 {
				want = StatusDropped
			}
			if v, _ := b.Get(id); v.Status != want {
				t.Errorf("restart %d: %s %s, want %s", restart, id, v.Status, want)
			}
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeldRequestsWithinTheBound: requests held until --request-journal-bytes
// is full cost at most that much heap — here small ones with the longest
// Idempotency-Key allowed (255 bytes), which cost 976 bytes each. Before,
// each was charged its body and 512 bytes: with 8 MiB, 15,947 requests were
// accepted and the heap grew by 14.8 MiB.
func TestHeldRequestsWithinTheBound(t *testing.T) {
	const maxBytes = 8 << 20
	b := testBook(t, fastDir(t), Config{MaxBytes: maxBytes, Retention: time.Hour, Timeout: time.Hour})
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("%08d-aaaa-bbbb-cccc-%012d", w, i)
				key := strings.ReplaceAll(fmt.Sprintf("%-255s", id), " ", "k")
				_, _, err := b.Accept(key, strings.Repeat("d", 64), json.RawMessage(`{"message":""}`), id, false)
				if errors.Is(err, ErrFull) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	heap := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	t.Logf("accepted %d requests under --request-journal-bytes %d MiB: the heap grew %.1f MiB (%d bytes a request)",
		n.Load(), maxBytes>>20, float64(heap)/(1<<20), heap/max(n.Load(), 1))
	if heap > maxBytes {
		t.Errorf("requests held under --request-journal-bytes %d MiB cost %.1f MiB of heap", maxBytes>>20, float64(heap)/(1<<20))
	}
	runtime.KeepAlive(b)
}

// TestSecondAnswerToDroppedResult: a request whose result was dropped
// (MaxResultBytes) was answered: a second request_result for it is a
// duplicate, ignored and counted, and nothing more is journaled. Before, it
// was taken as a late answer (outcome "late", logged as arriving after an
// expiry) and its data appended to the journal again each time.
func TestSecondAnswerToDroppedResult(t *testing.T) {
	b := testBook(t, fastDir(t), Config{MaxBytes: 1 << 30, Retention: 10 * time.Minute})
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	answerMany(t, b, 20, data)
	if v, _ := b.Get("r00"); v.Status != StatusDropped {
		t.Fatalf("r00: %s, want dropped", v.Status)
	}
	before := b.j.Size()
	outcome, _, err := b.Answer("r00", data, nil)
	if !errors.Is(err, ErrDuplicate) {
		t.Errorf("a second answer to r00 (answered, its result dropped): outcome %q, err %v; want ErrDuplicate", outcome, err)
	}
	if n := testutil.ToFloat64(b.cfg.Metrics.duplicates); n != 1 {
		t.Errorf("duplicates counted: %v, want 1", n)
	}
	if after := b.j.Size(); after != before {
		t.Errorf("the journal grew by %d bytes for an ignored answer", after-before)
	}
	if v, _ := b.Get("r00"); v.Status != StatusDropped || v.LateData != nil {
		t.Errorf("r00 after a second answer: %s, late %d bytes; want dropped, nothing kept", v.Status, len(v.LateData))
	}
}

// heldDataBytes is the answers' data the book holds, late answers'
// included, counted request by request.
func heldDataBytes(b *Book) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, r := range b.reqs {
		n += int64(len(r.Data) + len(r.LateData))
	}
	return n
}

// TestLateAnswersBounded: the answers kept beside cancelled or expired
// requests (late_answer) are results too: with the answers' data they stay
// within MaxResultBytes, the oldest dropped first, the newest kept, and a
// restart keeps the drops. Before, every late answer was held: 40 late
// answers of 1 MB held 40 MB, whatever the 16 MiB promise.
func TestLateAnswersBounded(t *testing.T) {
	dir := fastDir(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	cfg := Config{MaxBytes: 1 << 30, Retention: time.Hour, Timeout: time.Minute, Now: func() time.Time { return time.Unix(0, now.Load()) }}
	b := testBook(t, dir, cfg)
	data, _ := json.Marshal(strings.Repeat("r", 1000000))
	var ids []string
	for i := range 40 {
		id := fmt.Sprintf("r%02d", i)
		if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Half cancelled, half expired; each then answered late.
	for _, id := range ids[:20] {
		if _, err := b.Cancel(id); err != nil {
			t.Fatal(err)
		}
	}
	now.Add(int64(2 * time.Minute))
	for _, id := range ids {
		if outcome, _, err := b.Answer(id, data, nil); err != nil || outcome != OutcomeLate {
			t.Fatalf("late answer to %s: %q, %v", id, outcome, err)
		}
	}
	check := func(when string) {
		t.Helper()
		if n := heldDataBytes(b); n > MaxResultBytes {
			t.Errorf("%s: %d bytes of results held, bound %d", when, n, MaxResultBytes)
		}
		if v, _ := b.Get(ids[39]); v.Status != StatusExpired || string(v.LateData) != string(data) {
			t.Errorf("%s: the newest late answer is not kept (%s, %d bytes)", when, v.Status, len(v.LateData))
		}
		if v, _ := b.Get(ids[0]); v.Status != StatusCancelled || v.LateData != nil || v.LateError == nil || v.LateError.Code != "RESULT_DROPPED" {
			t.Errorf("%s: the oldest late answer: %s, %d bytes, error %+v; want its data dropped (RESULT_DROPPED)", when, v.Status, len(v.LateData), v.LateError)
		}
	}
	check("running")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = testBook(t, dir, cfg)
	check("after a restart")
}
