package requests

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// fastDir is a fresh directory on tmpfs (/dev/shm) when there is one, where
// fsyncs cost nothing: for tests that need many of them.
func fastDir(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "requests-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// TestCompactionKeepsRequestsBeingAccepted: a compaction that runs while
// requests are being accepted keeps every one whose Accept succeeded — also
// one whose record was written to the old file and whose Accept had not yet
// returned when the compaction read the book.
func TestCompactionKeepsRequestsBeingAccepted(t *testing.T) {
	dir := fastDir(t)
	b := testBook(t, dir, Config{MaxBytes: 1 << 30})
	stop := make(chan struct{})
	compactions := make(chan int)
	go func() {
		n := 0
		defer func() { compactions <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			v := b.Journal().Version()
			b.Journal().Compact()
			for b.Journal().Version() == v {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
			n++
		}
	}()
	// A checker reads the journal's durable bytes again and again: every
	// request whose Accept had returned before a read must be in it.
	var mu sync.Mutex
	var accepted []string
	missing := make(chan string, 1)
	checked := make(chan int)
	go func() {
		n := 0
		defer func() { checked <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			acked := slices.Clone(accepted)
			mu.Unlock()
			data, _, err := b.Journal().Snapshot()
			if err != nil {
				t.Error(err)
				return
			}
			rp, err := readAll(bytesFile(t, data))
			if err != nil {
				t.Error(err)
				return
			}
			have := map[string]bool{}
			for _, r := range rp.Records {
				have[r.ID] = true
			}
			for _, id := range acked {
				if !have[id] {
					select {
					case missing <- id:
					default:
					}
				}
			}
			n++
		}
	}()
	const workers, each = 4, 400
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("w%d-%03d", w, i)
				if _, _, err := b.Accept("", "", json.RawMessage(`{"message":"x"}`), id, true); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				accepted = append(accepted, id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	n, reads := <-compactions, <-checked
	select {
	case id := <-missing:
		t.Fatalf("request %s, accepted, was missing from the journal's durable bytes read after its Accept returned (%d compactions)", id, n)
	default:
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	views, _, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, v := range views {
		have[v.ID] = true
	}
	var lost []string
	for _, id := range accepted {
		if !have[id] {
			lost = append(lost, id)
		}
	}
	t.Logf("%d requests accepted during %d compactions; the journal read %d times", len(accepted), n, reads)
	if len(lost) > 0 {
		t.Fatalf("%d of %d accepted requests lost by compactions, e.g. %v", len(lost), len(accepted), lost[:min(5, len(lost))])
	}
}

// TestSameKeyAcceptedAtOnce: two POSTs with one Idempotency-Key at the
// same moment (a client's retry racing its first try) get the one request,
// both of them: the second waits for the first's record and is never told
// the request is unknown while the first is still being acknowledged.
func TestSameKeyAcceptedAtOnce(t *testing.T) {
	b := testBook(t, fastDir(t), Config{MaxBytes: 1 << 30})
	for i := range 300 {
		key := fmt.Sprintf("key-%d", i)
		ids := make(chan string, 2)
		var wg sync.WaitGroup
		for k := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, _, err := b.Accept(key, "digest", json.RawMessage(`{"message":"x"}`), fmt.Sprintf("%s-%d", key, k), false)
				if err != nil {
					t.Errorf("%s, try %d: %v", key, k, err)
					ids <- ""
					return
				}
				ids <- v.ID
			}()
		}
		wg.Wait()
		if a, c := <-ids, <-ids; a != c || a == "" {
			t.Fatalf("%s: the two tries got %q and %q, want one request", key, a, c)
		}
	}
}
