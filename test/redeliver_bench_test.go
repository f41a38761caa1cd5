package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkRedeliver10k: 10,000 requests pending (the request agent reads
// them and never answers), then the supervisor is killed with SIGKILL and
// started again on the same data directory, b.N times. The agent of the new
// supervisor stamps, on its own clock, when its restore arrived and when the
// first and the 10,000th process_request arrived after it (REQAGENT_STAMP):
// the redelivery from the journal (each one journaled as a delivery,
// attempt one higher, before it is sent). Reported: the medians over the
// restarts of restore → first and restore → last, in ms. Build without
// -race for the figure:
//
//	go test -c -o /tmp/t.test ./test && cd test && /tmp/t.test -test.run '^$' -test.bench Redeliver10k -test.benchtime 5x
func BenchmarkRedeliver10k(b *testing.B) {
	const pending = 10000
	dir := filepath.Join(b.TempDir(), "data")
	stamp := filepath.Join(b.TempDir(), "stamp.json")
	opts := supOpts{dataDir: dir, command: []string{testAgentPath}, noEvents: true,
		env: []string{envReqAgent + "=1", "REQAGENT_HOLD=bench", "REQAGENT_STAMP=" + stamp, "REQAGENT_STAMP_N=" + strconv.Itoa(pending)}}
	s := startSup(b, opts)
	s.waitReady()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}
	url := s.url("/v1/requests")
	work := make(chan int)
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				resp, err := client.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"message":"bench-%05d"}`, i)))
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					errs <- fmt.Errorf("POST: %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	go func() {
		for i := range pending {
			work <- i
		}
		close(work)
	}()
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	waitFor(b, 60*time.Second, fmt.Sprintf("supervisor_requests_pending at %d", pending), func() bool {
		return s.metric("supervisor_requests_pending") == pending
	})

	var first, last []time.Duration
	b.ResetTimer()
	for range b.N {
		_ = os.Remove(stamp)
		killSupB(b, s)
		s = startSup(b, opts)
		var st struct {
			Restore int64 `json:"restore_ns"`
			First   int64 `json:"first_ns"`
			Last    int64 `json:"last_ns"`
			N       int   `json:"n"`
		}
		waitFor(b, 5*time.Minute, "the agent's stamps of the redelivery", func() bool {
			data, err := os.ReadFile(stamp)
			return err == nil && json.Unmarshal(data, &st) == nil && st.N == pending
		})
		first = append(first, time.Duration(st.First-st.Restore))
		last = append(last, time.Duration(st.Last-st.Restore))
	}
	b.StopTimer()
	slices.Sort(first)
	slices.Sort(last)
	b.ReportMetric(float64(first[len(first)/2].Microseconds())/1000, "restore-to-first-ms")
	b.ReportMetric(float64(last[len(last)/2].Microseconds())/1000, "restore-to-last-ms")
	b.ReportMetric(float64(last[len(last)-1].Microseconds())/1000, "restore-to-last-max-ms")
}

// killSupB kills the supervisor with SIGKILL and waits for its exit.
func killSupB(b *testing.B, s *sup) {
	b.Helper()
	_ = s.cmd.Process.Kill()
	<-s.done
}
