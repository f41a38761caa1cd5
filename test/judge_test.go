package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// judgeAgent answers {echo: message} after about 20 ms ±25%. Its own work
// is kept light (20 entries a second, a checkpoint every 500 ms) so that
// what the judge measures is mostly the requests'.
func judgeAgent(code string, extra ...string) []string {
	return evoAgent(code, append([]string{"--answer", "--answer-echo", "--behaviour", "latency_ms=20 jitter=0.25",
		"--wal-rate", "20", "--checkpoint-every", "0", "--checkpoint-interval", "500ms"}, extra...)...)
}

func evolutionTrials(t *testing.T) int {
	n, err := strconv.Atoi(os.Getenv("EVOLUTION_TRIALS"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// sendRequests posts requests one at a time, each waiting for the primary's
// answer and then as long again, until the returned stop is called. The
// pause keeps the agents about half busy: a request sent the moment the
// primary answers would keep each shadow saturated, and whichever fell
// behind first would stay behind, its answers waiting in its queue — a
// real difference, but of the load, not of the code.
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
			time.Sleep(25 * time.Millisecond)
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
	// 40 ms against 48 ms, not 20 against 24: what each request costs
	// besides the agent's work (pipes, scheduling; about 12 ms under -race
	// on a busy 2-core machine) is added to both sides and shrinks the
	// ratio. At 20/24 it measured 1.125, so close to the +10% tolerance
	// that 40 s was not always enough to prove it (2 of 32 trials and one
	// CI run ended inconclusive); at 40/48 it stays near 1.15.
	{"20% slower candidate rejected", "latency_ms=48", nil, []string{"--behaviour", "latency_ms=40 jitter=0.25"}, "rejected", "latency: the candidate is slower"},
	// Answers are tested through the minimum trial time: long enough for
	// the 100-odd pairs a 10% difference takes to show.
	{"candidate answering 10% differently rejected", "differ=0.1", []string{"--shadow-duration", "12s"}, nil, "rejected", "answers: the candidate disagrees"},
	// An agent whose every two runs answer 30% of requests differently: the
	// control shows the same noise, so an equal candidate is not rejected.
	{"equal candidate of a nondeterministic agent promoted", "latency_ms=20", []string{"--shadow-duration", "6s"},
		[]string{"--behaviour", "latency_ms=20 jitter=0.25 differ=0.3"}, "promoted", "latency proven"},
	// Errors likewise: 10% more failures take about 100 pairs to show.
	{"candidate failing 10% more rejected", "latency_ms=20 error_rate=0.1", []string{"--shadow-duration", "12s"}, nil, "rejected", "errors: the candidate fails more often"},
	{"crashed control inconclusive", "latency_ms=20", nil, []string{"--control-crash-after", "1500ms"}, "rejected", "inconclusive: the control failed"},
}

func TestEvolutionJudgeThroughBinary(t *testing.T) {
	n := evolutionTrials(t)
	for _, sc := range judgeScenarios {
		t.Run(strings.ReplaceAll(sc.name, " ", "_"), func(t *testing.T) {
			right := 0
			var samples, ratios []float64
			var wrong []string // the decisions not as expected, with their reasons
			for i := range n {
				// A subtest per trial: its supervisor is stopped before the next starts.
				t.Run(strconv.Itoa(i), func(t *testing.T) {
					res, s := judgeRun(t, sc.flags, sc.code, sc.extra...)
					got := res.str("decision")
					ok := got == sc.decision && strings.Contains(res.str("reason"), sc.reason)
					smp, _ := resultMetric(res, "samples")
					if c, _ := resultMetric(res, "control"); c != 1 {
						t.Errorf("metrics.control = %v, want 1: %v", c, res["metrics"])
					}
					samples = append(samples, smp)
					ratio, _ := resultMetric(res, "latency_ratio")
					ratios = append(ratios, ratio)
					if os.Getenv("JUDGE_DEBUG") != "" {
						b, _ := json.Marshal(evolutionRecord(t, s))
						t.Logf("record: %s\n%s", b, s.out.String())
					}
					if ok {
						right++
						return
					}
					t.Logf("%s: %s", got, res.str("reason"))
					wrong = append(wrong, fmt.Sprintf("trial %d after %v pairs: %s: %s", i, smp, got, res.str("reason")))
					if rec := evolutionRecord(t, s); rec != nil {
						t.Logf("bounds over time: %v", rec["path"])
					}
				})
			}
			t.Logf("%s: %d of %d trials as expected; pairs per trial %v; latency ratios %.3f", sc.name, right, n, samples, ratios)
			// One wrong decision in 20 is within the judge's 95% confidence;
			// a single CI run must be right.
			if n == 1 && right != 1 || n > 1 && right < n-1 {
				t.Fatalf("%s: %d of %d trials decided as expected (%s, reason with %q); the others: %s", sc.name, right, n, sc.decision, sc.reason,
					strings.Join(wrong, "; "))
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

// An operator sees why: the running trial's gauges, the figures in
// evolution_result, the whole evidence in the audit record, and the same
// through `supervisor evolutions` (with the supervisor stopped) and
// GET /v1/evolutions.
func TestEvolutionEvidenceShown(t *testing.T) {
	s := startSup(t, supOpts{flags: append(append([]string{}, judgeFlags...), "--shadow-duration", "5s"), agent: judgeAgent("latency_ms=20")})
	stop := sendRequests(s)
	defer stop()
	waitFor(t, 60*time.Second, "the running trial's gauges", func() bool {
		return s.metric("supervisor_evolution_samples") >= 10 && s.metric("supervisor_evolution_bound", `figure="latency_ratio_high"`) > 0
	})
	res := waitResultWithin(t, s, 90*time.Second)
	stop()
	if res.str("decision") != "promoted" {
		t.Fatalf("an equal candidate: %s: %s", res.str("decision"), res.str("reason"))
	}
	for _, k := range []string{"latency_improvement", "error_rate_change", "memory_increase", "samples", "latency_ratio", "latency_ratio_low",
		"latency_ratio_high", "error_rate_change_low", "error_rate_change_high", "disagreement_excess", "disagreement_excess_high", "confidence", "control"} {
		if _, ok := resultMetric(res, k); !ok {
			t.Errorf("evolution_result.metrics lacks %s: %v", k, res["metrics"])
		}
	}
	if hi, _ := resultMetric(res, "latency_ratio_high"); hi > 1.1 {
		t.Errorf("promoted with latency_ratio_high %v above the +10%% tolerance", hi)
	}
	waitFor(t, 10*time.Second, "the gauges cleared after the decision", func() bool {
		return s.metric("supervisor_evolution_samples") == 0
	})
	rec := evolutionRecord(t, s)
	id, _ := rec["trial"].(string)
	if path, _ := rec["path"].([]any); id == "" || len(path) < 2 || rec["evidence"] == nil || rec["pairs"] == nil {
		t.Fatalf("audit record lacks the evidence: %v", rec)
	}

	code, body := s.get("/v1/evolutions")
	if code != 200 || !strings.Contains(body, id) {
		t.Fatalf("GET /v1/evolutions: %d %s", code, body)
	}
	code, body = s.get("/v1/evolutions/" + id)
	if code != 200 || !strings.Contains(body, `"path"`) || !strings.Contains(body, `"latency_ratio_high"`) {
		t.Fatalf("GET /v1/evolutions/ID: %d %s", code, tail(body, 500))
	}
	if code, _ := s.get("/v1/evolutions/01234567-0000-0000-0000-000000000000"); code != 404 {
		t.Fatalf("GET of an unknown evolution: %d, want 404", code)
	}

	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	code, out, errOut := cli(t, "evolutions", "list", "--data-dir", s.dataDir)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "promoted") {
		t.Fatalf("evolutions list: %d %s %s", code, out, errOut)
	}
	code, out, errOut = cli(t, "evolutions", "show", id, "--data-dir", s.dataDir)
	if code != 0 || !strings.Contains(out, "bounds over time") || !strings.Contains(out, "latency proven") {
		t.Fatalf("evolutions show: %d %s %s", code, out, errOut)
	}
	code, out, _ = cli(t, "evolutions", "show", id, "--json", "--data-dir", s.dataDir)
	var e struct {
		ID     string         `json:"id"`
		Record map[string]any `json:"record"`
	}
	if err := json.Unmarshal([]byte(out), &e); code != 0 || err != nil || e.ID != id || e.Record["path"] == nil {
		t.Fatalf("evolutions show --json: %d %v %s", code, err, tail(out, 300))
	}
}

// Without a control the candidate is compared with the primary, and the
// result says so.
func TestEvolutionWithoutControl(t *testing.T) {
	res, s := judgeRun(t, []string{"--evolution-control=false"}, "latency_ms=20")
	if c, ok := resultMetric(res, "control"); !ok || c != 0 {
		t.Fatalf("metrics.control = %v, want 0: %v", c, res["metrics"])
	}
	if smp, _ := resultMetric(res, "samples"); smp == 0 {
		t.Fatalf("no pairs judged: %v", res)
	}
	if res.str("decision") == "promoted" && !strings.Contains(res.str("reason"), "no control shadow") {
		t.Fatalf("reason does not say the comparison had no control: %s", res.str("reason"))
	}
	if n := len(roleEvents(s, "start", "shadow")); n != 1 {
		t.Fatalf("%d shadows started, want the candidate alone", n)
	}
}

// Agents that answer twice and flood answers to ids never sent: counted,
// ignored, and the trial is still decided on the real pairs.
func TestEvolutionBadAnswersCounted(t *testing.T) {
	res, s := judgeRun(t, nil, "latency_ms=20", "--answer-twice", "--answer-unknown", "5")
	if d := res.str("decision"); d != "promoted" && d != "rejected" {
		t.Fatalf("no decision: %v", res)
	}
	if n := s.metric("supervisor_evolution_answers_ignored_total", `reason="duplicate"`); n < 1 {
		t.Errorf("duplicate answers counted %v", n)
	}
	if n := s.metric("supervisor_evolution_answers_ignored_total", `reason="unknown"`); n < 5 {
		t.Errorf("answers to unknown ids counted %v", n)
	}
	rec := evolutionRecord(t, s)
	p, _ := rec["pairs"].(map[string]any)
	if f64(p["duplicates"]) < 1 || f64(p["unknown"]) < 5 || f64(p["pairs"]) > f64(p["mirrored"]) {
		t.Errorf("audit record's pair counts %v", p)
	}
	// Never skewed: the second answers (identical, or garbage ids) changed
	// no pair: both sides agree with the primary and never failed.
	e, _ := rec["evidence"].(map[string]any)
	for _, k := range []string{"candidate_only_disagreements", "control_only_disagreements", "candidate_only_failures", "control_only_failures"} {
		if v, ok := e[k].(float64); !ok || v != 0 {
			t.Errorf("evidence %s = %v, want 0: %v", k, e[k], rec)
		}
	}
	if c, _ := s.get("/readyz"); c != 200 {
		t.Fatalf("readyz %d after the flood", c)
	}
}

// Shadows that never answer: no pair is ever complete, and the trial ends
// at --evolution-max-duration as inconclusive, not on half the answers.
func TestEvolutionOneSidedAnswersInconclusive(t *testing.T) {
	res, s := judgeRun(t, []string{"--evolution-max-duration", "4s"}, "latency_ms=20", "--shadow-silent")
	if res.str("decision") != "rejected" || !strings.Contains(res.str("reason"), "inconclusive") {
		t.Fatalf("result %s: %s", res.str("decision"), res.str("reason"))
	}
	if smp, _ := resultMetric(res, "samples"); smp != 0 {
		t.Fatalf("%v pairs judged from one side's answers", smp)
	}
	p, _ := evolutionRecord(t, s)["pairs"].(map[string]any)
	if f64(p["mirrored"]) == 0 || f64(p["pairs"]) != 0 {
		t.Fatalf("pair counts %v", p)
	}
}

func f64(v any) float64 { f, _ := v.(float64); return f }
