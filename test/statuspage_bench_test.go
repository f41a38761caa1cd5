package test

import (
	"io"
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkStatusLatency measures GET /v1/status at 100 requests/s for 10 s
// while the reference agent floods the WAL (about 20 000 1 KiB entries/s,
// a checkpoint every second): p50 and p99 as the client sees them, keep-
// alive connection included, beside the same for GET /healthz in the same
// moments (healthz-*: the machine's share). Issue 26's figure: p99 ≤ 1 ms. Run it with
// -benchtime=1x.
func BenchmarkStatusLatency(b *testing.B) {
	for i := 0; i < b.N; i++ {
		s := startSup(b, supOpts{noEvents: true, agent: []string{"--wal-rate", "20000", "--wal-batch", "16", "--entry-size", "1024",
			"--memory-limit", "1000", "--checkpoint-interval", "1s", "--heartbeat-interval", "1s"}})
		waitFor(b, 30*time.Second, "agent ready", func() bool { c, _ := s.get("/readyz"); return c == 200 })
		time.Sleep(2 * time.Second) // the flood under way
		seq0 := s.metric("supervisor_wal_last_sequence")
		start := time.Now()
		// Interleaved with the same number of GET /healthz, which does next
		// to nothing, on a connection of its own: what the machine (the
		// scheduler, the client, the flood) adds to any request, measured
		// in the same moments.
		lat, base := paced(b, s.url("/v1/status"), s.url("/healthz"), 1000)
		flood := (s.metric("supervisor_wal_last_sequence") - seq0) / time.Since(start).Seconds()
		b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
		b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
		b.ReportMetric(ms(base[len(base)/2]), "healthz-p50-ms")
		b.ReportMetric(ms(base[len(base)*99/100]), "healthz-p99-ms")
		b.ReportMetric(flood, "wal-entries/s")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// paced GETs url n times at 100 requests/s on one keep-alive connection,
// and baseURL between them (as many, on another), and returns both
// latencies, sorted.
func paced(b *testing.B, url, baseURL string, n int) (lat, base []time.Duration) {
	get := func(c *http.Client, url string) time.Duration {
		t0 := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(t0)
	}
	c1 := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	c2 := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer c1.CloseIdleConnections()
	defer c2.CloseIdleConnections()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		lat = append(lat, get(c1, url))
		<-tick.C
		base = append(base, get(c2, baseURL))
	}
	slices.Sort(lat)
	slices.Sort(base)
	return lat, base
}

// BenchmarkStatusPageCPU measures what an open status page costs the
// supervisor process: its CPU share (from /proc/PID/stat) over 30 s beside
// an idle agent with no page, then over 30 s with the page open — GET / once
// and GET /v1/status every 2 s, as status.js refreshes. Issue 26's figure:
// the difference < 0.5% of a core. Run it with -benchtime=1x.
func BenchmarkStatusPageCPU(b *testing.B) {
	for i := 0; i < b.N; i++ {
		s := startSup(b, supOpts{noEvents: true, agent: []string{"--heartbeat-interval", "1s", "--metrics-interval", "10s",
			"--wal-rate", "10", "--checkpoint-interval", "10s"}})
		waitFor(b, 30*time.Second, "agent ready", func() bool { c, _ := s.get("/readyz"); return c == 200 })
		time.Sleep(3 * time.Second) // settle
		pid := s.cmd.Process.Pid
		const window = 30 * time.Second
		cpu0, _ := procStat(b, pid)
		time.Sleep(window)
		cpu1, _ := procStat(b, pid)
		if c, _ := s.get("/"); c != 200 {
			b.Fatalf("GET /: %d", c)
		}
		client := &http.Client{}
		end := time.Now().Add(window)
		for time.Now().Before(end) {
			resp, err := client.Get(s.url("/v1/status"))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			time.Sleep(2 * time.Second)
		}
		cpu2, _ := procStat(b, pid)
		idle := 100 * float64(cpu1-cpu0) / float64(window)
		open := 100 * float64(cpu2-cpu1) / float64(window)
		b.ReportMetric(idle, "%cpu-no-page")
		b.ReportMetric(open, "%cpu-page-open")
		b.ReportMetric(open-idle, "%cpu-page-cost")
	}
}
