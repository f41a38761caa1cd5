package supervisor

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/vmihailenco/msgpack/v5"
)

// A long trial's record, with the most differing answers at their longest,
// fits an audit record (observe.maxAuditRecord, 16 KiB) with room to spare:
// a larger one would be kept as "truncated" and the evidence lost.
func TestTrialRecordFitsAnAuditRecord(t *testing.T) {
	cfg := evolution.DefaultJudgeConfig()
	tr := &trial{control: true, cfg: cfg, pairs: evolution.NewPairer(true, 0, 0), judge: evolution.NewJudge(cfg),
		met: observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })}
	t0 := time.Now()
	long := func(s string) msgpack.RawMessage {
		b, _ := msgpack.Marshal(map[string]any{"text": strings.Repeat(s, 5000)})
		return b
	}
	for i := range 5000 {
		id := string(rune('a'+i%26)) + strings.Repeat("x", 30) + string(rune(i))
		tr.pairs.Expect(id, t0)
		for _, r := range []evolution.Role{evolution.RolePrimary, evolution.RoleControl, evolution.RoleCandidate} {
			data := long("p")
			if r == evolution.RoleCandidate {
				data = long("c")
			}
			tr.pairs.Sending(id, r, t0)
			if err := tr.answered(r, &schema.RequestResult{RequestID: id, Data: data}, t0.Add(time.Duration(10+i%7)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := json.Marshal(tr.record(tr.verdictNow()))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 12<<10 {
		t.Fatalf("a trial's record is %d bytes; the audit log keeps at most 16 KiB", len(b))
	}
	if d := tr.pairs.Differing(); len(d) != 5 {
		t.Fatalf("%d differing answers kept, want 5", len(d))
	}
}

// The running trial's target and reason, the agent's text, reach
// /v1/status and the status page clipped (an evolution_intent may hold
// 1 MiB): before, each GET carried them whole.
func TestTrialDetailsAreClipped(t *testing.T) {
	s := &Supervisor{}
	tr := &trial{id: "trial-1", intent: schema.Hypothesis{Target: strings.Repeat("T", 600<<10), Reason: strings.Repeat("R", 300<<10)},
		started: time.Now(), backup: checkpoint.Meta{ID: "backup"}}
	s.pub.Store(&view{trial: tr})
	d := apiOwner{s}.Details()
	if d.Trial == nil {
		t.Fatal("no trial in the details")
	}
	if len(d.Trial.Target) > 1024 || len(d.Trial.Reason) > 4096 {
		t.Fatalf("the trial's target (%d bytes) and reason (%d bytes) are published unclipped", len(d.Trial.Target), len(d.Trial.Reason))
	}
}

// A shadow that reads every request and heartbeats but never answers 30% of
// them is judged on those answers: the candidate's silence rejects it (it
// was once promoted with "no worse errors (change +0.000)", the unanswered
// requests left pending, never judged); the control's silence counts
// against the control, not the candidate.
func TestTrialJudgesUnansweredRequests(t *testing.T) {
	for _, tc := range []struct {
		silent       evolution.Role
		ago          time.Duration // the answers' age at the trial's look
		wantDecision string
	}{
		{evolution.RoleCandidate, time.Minute, evolution.VerdictRejected},
		{evolution.RoleControl, time.Minute, evolution.VerdictPromoted},
		// Within the deadlines: nothing is missing yet, but the candidate
		// owes 120 answers the control gave, and is not promoted.
		{evolution.RoleCandidate, 0, evolution.VerdictContinue},
	} {
		t.Run(fmt.Sprintf("%s silent, looked at %v later", tc.silent, tc.ago), func(t *testing.T) {
			cfg := evolution.DefaultJudgeConfig()
			cfg.MinDuration, cfg.MaxDuration = 0, time.Hour
			tr := &trial{control: true, cfg: cfg, pairs: evolution.NewPairer(true, 0, 0), judge: evolution.NewJudge(cfg),
				started: time.Now().Add(-time.Minute), verdict: make(chan struct{}, 1),
				met: observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })}
			data, _ := msgpack.Marshal(map[string]any{"answer": 42})
			// A minute ago, every answer deadline has passed by the trial's look.
			t0 := time.Now().Add(-tc.ago)
			unanswered := 0
			for i := range 400 {
				id := fmt.Sprintf("req-%d", i)
				tr.pairs.Expect(id, t0)
				for _, r := range []evolution.Role{evolution.RolePrimary, evolution.RoleControl, evolution.RoleCandidate} {
					tr.pairs.Sending(id, r, t0)
					if r == tc.silent && i%10 < 3 {
						unanswered++
						continue
					}
					lat := time.Duration(100+(i*37)%20) * time.Millisecond
					if err := tr.answered(r, &schema.RequestResult{RequestID: id, Data: data}, t0.Add(lat)); err != nil {
						t.Fatal(err)
					}
				}
			}
			v := tr.verdictNow()
			t.Logf("%s: %s", v.Decision, v.Reason)
			if v.Decision != tc.wantDecision {
				t.Fatalf("the %s never answered %d of 400 requests (the other shadow answered all): %s, want %s: %s",
					tc.silent, unanswered, v.Decision, tc.wantDecision, v.Reason)
			}
			if tc.wantDecision == evolution.VerdictContinue {
				if e := v.Evidence; e.CandidateMissing != 0 || e.Samples != 400-unanswered {
					t.Fatalf("evidence %+v: want %d pairs and no answer missing yet", e, 400-unanswered)
				}
				return
			}
			missing := map[evolution.Role]int{evolution.RoleCandidate: v.Evidence.CandidateMissing, evolution.RoleControl: v.Evidence.ControlMissing}
			st := tr.pairs.Stats()
			if missing[tc.silent] != unanswered || v.Evidence.Samples != 400 || st.Pending != 0 || st.Pairs != 400-unanswered ||
				!strings.Contains(v.Reason, "no answer by the deadline") {
				t.Fatalf("evidence %+v, pairs %+v, reason %s", v.Evidence, st, v.Reason)
			}
			if d := tr.describe(); !strings.Contains(d, fmt.Sprintf("%d more with an answer missing", unanswered)) {
				t.Fatalf("describe: %s", d)
			}
		})
	}
}

// An evolution whose agent answers in HTML (every '<', '>' and '&' is six
// bytes in JSON) and gives a long reason is still listed with its trial id,
// target, decision and reason by `supervisor evolutions` and
// GET /v1/evolutions: the record once grew past the audit log's 16 KiB and
// was kept as {"truncated": true} alone, the decision lost.
func TestEvolutionRecordOfHTMLAnswersKeepsTheDecision(t *testing.T) {
	cfg := evolution.DefaultJudgeConfig()
	cfg.MinDuration = 0
	met := observe.NewMetrics(func() float64 { return 0 }, func() float64 { return 0 })
	tr := &trial{id: "01a2206f-7fd5-7000-8000-000000000001", control: true, cfg: cfg, pairs: evolution.NewPairer(true, 0, 0),
		judge: evolution.NewJudge(cfg), met: met, collector: evolution.NewCollector(), started: time.Now().Add(-time.Minute),
		verdict: make(chan struct{}, 1),
		intent:  schema.Hypothesis{Target: "memory_system", Reason: strings.Repeat("The memory search ranks blocks by recency. ", 50)}}
	t0 := time.Now().Add(-time.Minute)
	html := func(variant string) msgpack.RawMessage {
		b, _ := msgpack.Marshal(map[string]any{"html": strings.Repeat("<li><b>"+variant+"item</b></li>", 20)})
		return b
	}
	for i := range 2000 {
		id := fmt.Sprintf("01a2206f-8298-785b-88fd-%012d", i)
		tr.pairs.Expect(id, t0)
		for _, r := range []evolution.Role{evolution.RolePrimary, evolution.RoleControl, evolution.RoleCandidate} {
			data := html("")
			if r == evolution.RoleCandidate && i%10 == 0 {
				data = html("v")
			}
			tr.pairs.Sending(id, r, t0)
			if err := tr.answered(r, &schema.RequestResult{RequestID: id, Data: data}, t0.Add(time.Duration(10+i%7)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
	}
	v := tr.verdictNow()
	if v.Decision == evolution.VerdictContinue {
		t.Fatalf("the judge has not decided: %+v", v.Evidence)
	}
	tr.final = tr.record(v)

	path := filepath.Join(t.TempDir(), "audit.jsonl")
	audit, err := observe.OpenAudit(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := observe.NewRecorder(slog.New(slog.DiscardHandler))
	rec.AttachAudit(audit)
	s := &Supervisor{rec: rec, met: met}
	d := evolution.Decision{Decision: v.Decision, Promote: v.Decision == evolution.VerdictPromoted, Reason: v.Reason, Metrics: v.Evidence.Metrics()}
	s.decided(nil, tr, tr.intent, "backup-id", d)
	if err := audit.Close(); err != nil {
		t.Fatal(err)
	}

	evs, _, err := api.ReadEvolutions(path, false)
	if err != nil || len(evs) != 1 {
		t.Fatalf("evolutions listed: %v %+v", err, evs)
	}
	e := evs[0]
	if e.ID != tr.id || e.Target != "memory_system" || e.Decision != v.Decision || e.Reason != v.Reason || e.Samples != v.Evidence.Samples {
		t.Fatalf("listed as %+v; the judge decided %s after %d pairs: %s", e, v.Decision, v.Evidence.Samples, v.Reason)
	}
	full, ok, err := api.FindEvolution(path, tr.id)
	if err != nil || !ok || full.Record["evidence"] == nil {
		t.Fatalf("shown as %v %v %+v", err, ok, full)
	}
}
