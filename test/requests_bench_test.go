package test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRequestJournal: POST /v1/requests → journaled (fsynced) → 202.
// The serial phase times b.N POSTs one at a time, each followed by one raw
// fdatasync of 1 KiB in the data directory (the machine's floor for a
// durable append, measured in the same run under the same conditions); the
// concurrent phase sends 64 clients' POSTs at once (group commit: they
// share fsyncs) and reports requests per second. Build without -race:
//
//	go test -c -o /tmp/t.test ./test && cd test && /tmp/t.test -test.run '^$' -test.bench RequestJournal -test.benchtime 2000x
func BenchmarkRequestJournal(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "data")
	s := startSup(b, supOpts{dataDir: dir, command: []string{testAgentPath}, noEvents: true, env: []string{envReqAgent + "=1"}})
	s.waitReady()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}
	url := s.url("/v1/requests")
	post := func(body string) error {
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST: %d", resp.StatusCode)
		}
		return nil
	}
	probe, err := os.CreateTemp(dir, "fdatasync-probe-*")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(probe.Name())
	defer probe.Close()
	buf := make([]byte, 1024)
	if _, err := probe.WriteAt(make([]byte, 4<<20), 0); err != nil {
		b.Fatal(err)
	}
	_ = probe.Sync()

	lat := make([]time.Duration, b.N)
	raw := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if err := post(`{"message":"bench"}`); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
		buf[0]++
		t1 := time.Now()
		if _, err := probe.WriteAt(buf, int64(i%4096)*1024); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(probe.Fd())); err != nil {
			b.Fatal(err)
		}
		raw[i] = time.Since(t1)
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(raw)
	p50, f50 := lat[b.N/2], raw[b.N/2]
	b.ReportMetric(float64(p50.Microseconds()), "post-p50-µs")
	b.ReportMetric(float64(lat[min(b.N-1, b.N*99/100)].Microseconds()), "post-p99-µs")
	b.ReportMetric(float64(f50.Microseconds()), "fdatasync-p50-µs")
	b.ReportMetric(float64(p50)/float64(f50), "p50-ratio")
	// The HTTP round trip alone (GET /healthz on the same client), for
	// what of the POST is not the journal.
	hz := make([]time.Duration, min(b.N, 1000))
	for i := range hz {
		t0 := time.Now()
		resp, err := client.Get(s.url("/healthz"))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		hz[i] = time.Since(t0)
	}
	slices.Sort(hz)
	b.ReportMetric(float64(hz[len(hz)/2].Microseconds()), "healthz-p50-µs")
	// The floor of a durable POST: an HTTP round trip and an fdatasync.
	b.ReportMetric(float64(p50)/float64(hz[len(hz)/2]+f50), "p50-floor-ratio")

	// 64 concurrent clients.
	const clients = 64
	total := max(20000, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	t0 := time.Now()
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(total) {
				if err := post(`{"message":"bench"}`); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total)/el.Seconds(), "req/s-64-clients")
}
