package test

import (
	"encoding/json"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The evolution judge through the binary (SPEC §6): a primary answering
// requests with ±25% latency noise, a candidate and a control shadow, and a
// client sending requests throughout. EVOLUTION_TRIALS=20 runs every
// scenario 20 times and logs the table; CI runs each once.

// judgeFlags: 2 s minimum trial, 40 s longest.
var judgeFlags = append(append([]string{}, fastFlags...), "--shadow-duration", "2s", "--evolution-max-duration", "40s",
	"--evolution-min-reports", "1", "--max-restarts", "0")

// judgeAgent answers {echo: message} after about 20 ms ±25%.
func judgeAgent(code string, extra ...string) []string {
	return evoAgent(code, append([]string{"--answer", "--answer-echo", "--behaviour", "latency_ms=20 jitter=0.25"}, extra...)...)
}

func evolutionTrials(t *testing.T) int {
	n, err := strconv.Atoi(os.Getenv("EVOLUTION_TRIALS"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// sendRequests posts requests one at a time, each waiting for the primary's
// answer, until the returned stop is called.
func sendRequests(s *sup) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			body := fmt.Sprintf(`{"message": "question %d"}`, i)
			req, _ := http.NewRequestWithContext(ctx, "POST", s.url("/v1/requests?wait=5s"), strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					time.Sleep(20 * time.Millisecond) // the agent is not ready yet
				}
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// judgeRun runs one trial with the candidate's code and returns the
// primary's evolution_result.
func judgeRun(t *testing.T, flags []string, code string, extra ...string) (ev, *sup) {
	t.Helper()
	s := startSup(t, supOpts{flags: append(append([]string{}, judgeFlags...), flags...), agent: judgeAgent(code, extra...)})
	stop := sendRequests(s)
	defer stop()
	return waitResultWithin(t, s, 90*time.Second), s
}

func waitResultWithin(t *testing.T, s *sup, d time.Duration) ev {
	t.Helper()
	var res ev
	waitFor(t, d, "evolution_result on the primary", func() bool {
		if r := roleEvents(s, "evolution_result", "primary"); len(r) > 0 {
			res = r[0]
		}
		return res != nil
	})
	return res
}

func resultMetric(res ev, k string) (float64, bool) {
	m, _ := res["metrics"].(map[string]any)
	v, ok := m[k].(float64)
	return v, ok
}

type judgeScenario struct {
	name     string
	code     string   // the candidate's code
	flags    []string // supervisor flags
	extra    []string // agent flags
	decision string
	reason   string // in the reason
}

var judgeScenarios = []judgeScenario{
	{"equal candidate promoted", "latency_ms=20", nil, nil, "promoted", "latency proven"},
	{"20% slower candidate rejected", "latency_ms=24", nil, nil, "rejected", "latency: the candidate is slower"},
	// Answers are tested through the minimum trial time: long enough for
	// the 100-odd pairs a 10% difference takes to show.
	{"candidate answering 10% differently rejected", "differ=0.1", []string{"--shadow-duration", "12s"}, nil, "rejected", "answers: the candidate disagrees"},
	// An agent whose every two runs answer 30% of requests differently: the
	// control shows the same noise, so an equal candidate is not rejected.
	{"equal candidate of a nondeterministic agent promoted", "latency_ms=20", []string{"--shadow-duration", "6s"},
		[]string{"--behaviour", "latency_ms=20 jitter=0.25 differ=0.3"}, "promoted", "latency proven"},
	{"crashed control inconclusive", "latency_ms=20", nil, []string{"--control-crash-after", "1500ms"}, "rejected", "inconclusive: the control failed"},
}

func TestEvolutionJudgeThroughBinary(t *testing.T) {
	n := evolutionTrials(t)
	for _, sc := range judgeScenarios {
		t.Run(strings.ReplaceAll(sc.name, " ", "_"), func(t *testing.T) {
			right := 0
			var samples []float64
			for i := range n {
				res, s := judgeRun(t, sc.flags, sc.code, sc.extra...)
				got := res.str("decision")
				ok := got == sc.decision && strings.Contains(res.str("reason"), sc.reason)
				smp, _ := resultMetric(res, "samples")
				if c, _ := resultMetric(res, "control"); c != 1 {
					t.Errorf("trial %d: metrics.control = %v, want 1: %v", i, c, res["metrics"])
				}
				samples = append(samples, smp)
				if os.Getenv("JUDGE_DEBUG") != "" {
					b, _ := json.Marshal(evolutionRecord(t, s))
					t.Logf("record: %s\n%s", b, s.out.String())
				}
				if ok {
					right++
				} else {
					t.Logf("trial %d: %s: %s", i, got, res.str("reason"))
					if rec := evolutionRecord(t, s); rec != nil {
						t.Logf("trial %d: bounds over time: %v", i, rec["path"])
					}
				}
			}
			t.Logf("%s: %d of %d trials as expected; pairs per trial %v", sc.name, right, n, samples)
			// One wrong decision in 20 is within the judge's 95% confidence;
			// a single CI run must be right.
			if n == 1 && right != 1 || n > 1 && right < n-1 {
				t.Fatalf("%s: %d of %d trials decided as expected (%s, reason with %q)", sc.name, right, n, sc.decision, sc.reason)
			}
		})
	}
}

// evolutionRecord is the audit log's evolution_decided record of the trial
// (its fields), once written.
func evolutionRecord(t *testing.T, s *sup) map[string]any {
	t.Helper()
	var rec map[string]any
	waitFor(t, 10*time.Second, "the evolution_decided audit record", func() bool {
		for _, r := range auditRecords(t, s.dataDir) {
			if r["kind"] == "evolution_decided" {
				rec, _ = r["fields"].(map[string]any)
			}
		}
		return rec != nil
	})
	return rec
}
