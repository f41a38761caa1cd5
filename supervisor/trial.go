package supervisor

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

// trial is one evolution under test (SPEC §6): the candidate shadow
// (restored from a pinned backup, hot-reloaded with the proposed code) and,
// with --evolution-control, a control shadow restored from the same backup
// and left on today's code. Every request sent to the primary is mirrored to
// both; the trial pairs their answers (evolution.Pairer) and feeds the pairs
// to the sequential judge (evolution.Judge), which says when to stop.
//
// The owner goroutine alone changes the fields above mu; the API's and the
// agents' reader goroutines mirror requests and deliver answers through the
// safe-for-concurrent-use parts (pairs, mu and what it guards).
type trial struct {
	id        string
	intent    schema.Hypothesis
	backup    checkpoint.Meta
	dir       string    // scratch root of the trial's shadows
	shadows   []*shadow // the candidate first; the control second, if any
	control   bool      // a control shadow runs (--evolution-control)
	collector *evolution.Collector
	pairs     *evolution.Pairer
	started   time.Time
	failure   string         // why the candidate failed, "" while healthy
	ctrlFail  string         // why the control failed (the trial is inconclusive)
	cut       string         // why the trial was cut short (the supervisor stopping)
	final     map[string]any // the evidence recorded at the decision (record)
	decided   bool
	// primaryPG is the primary's process group: memory is compared with it
	// when no control runs.
	primaryPG int
	stopMem   context.CancelFunc
	memDone   chan struct{}

	// mirroring is set (by the owner) once every shadow is up: it has
	// heartbeated and taken its restore (and the candidate its code) off
	// the queue. Requests sent before are not mirrored: a shadow still
	// restoring would answer late for reasons that say nothing of the code.
	mirroring atomic.Bool

	cfg evolution.JudgeConfig
	met *observe.Metrics
	// verdict is signalled (never blocking) when a pair made the judge
	// decide; the owner loop then looks (checkTrial), and concludes the
	// trial if its look decides too.
	verdict chan struct{}
	// settled is the first decided verdict of an owner's look: the
	// decision stands, and later looks (the conclusion's) return it, so
	// that answers arriving in between cannot turn it back to "continue".
	settled *evolution.Verdict

	mu      sync.Mutex
	judge   *evolution.Judge
	memCand meanOf
	memRef  meanOf
}

// shadow is one of a trial's shadow agents with its scratch stores.
type shadow struct {
	role  evolution.Role // evolution.RoleCandidate or evolution.RoleControl
	dir   string
	wal   *wal.Log
	store *checkpoint.Store
	plan  *durable.Plan // its restore, until sent
	agent *agent
	// conn is the shadow's connection for the API's goroutines (mirrored
	// requests); set once, when the shadow starts.
	conn atomic.Pointer[conn.Instance]
}

// name is how logs and reasons call the shadow: "candidate" or "control".
func (sh *shadow) name() string { return sh.role.String() }

// meanOf is a running mean.
type meanOf struct {
	n    int
	mean float64
}

func (m *meanOf) add(x float64) { m.n++; m.mean += (x - m.mean) / float64(m.n) }

// shadowsUp says whether every shadow has heartbeated and its queue holds
// nothing more (its restore and the candidate's code are written).
func (t *trial) shadowsUp() bool {
	for _, sh := range t.shadows {
		if sh.agent.FirstHeartbeatAt().IsZero() || sh.agent.OutQueued() > 0 {
			return false
		}
	}
	return true
}

// candidate is the shadow running the proposed code.
func (t *trial) candidate() *shadow { return t.shadows[0] }

// shadowOf is the trial's shadow running as in, or nil.
func (t *trial) shadowOf(in *conn.Instance) *shadow {
	for _, sh := range t.shadows {
		if sh.agent != nil && sh.agent.Instance == in {
			return sh
		}
	}
	return nil
}

var _ api.Mirror = (*trial)(nil)

// Expect registers a request about to go to the primary (api.Mirror).
func (t *trial) Expect(id string, sent time.Time) {
	if t.mirroring.Load() {
		t.pairs.Expect(id, sent)
	}
}

// Cancel forgets a request the primary could not be sent (api.Mirror).
func (t *trial) Cancel(id string) { t.pairs.Cancel(id) }

// Send mirrors a request to the shadows in random order (api.Mirror); one
// whose input queue is full misses it, and the request makes no pair.
func (t *trial) Send(id string, frame []byte) {
	if !t.mirroring.Load() {
		return
	}
	order := t.shadows
	if len(order) == 2 && rand.IntN(2) == 1 {
		order = []*shadow{t.shadows[1], t.shadows[0]}
	}
	for _, sh := range order {
		c := sh.conn.Load()
		if c == nil {
			t.pairs.Cancel(id)
			return
		}
		t.pairs.Sending(id, sh.role, time.Now())
		if !c.SendRequest(frame) {
			t.pairs.Cancel(id)
		}
	}
}

// answered takes role's request_result for the pairing (any reader
// goroutine). A completed pair goes to the judge; when the judge decides,
// the owner loop is woken to look (with the answers the candidate owes
// counted, which this judge's look has only as of the last one). err (evolution.ErrUnknownAnswer,
// evolution.ErrDuplicateAnswer) is an answer the trial was not waiting for:
// for a shadow's, an INVALID_MESSAGE; for the primary's (checked by the
// request table), one to a request sent before mirroring began.
// evolution.ErrLateAnswer is an answer after its deadline: the request was
// already judged with it missing (expire).
func (t *trial) answered(role evolution.Role, m *schema.RequestResult, at time.Time) error {
	code := ""
	if m.Error != nil {
		code = m.Error.Code
	}
	pair, done, err := t.pairs.Answered(m.RequestID, role, at, evolution.AnswerOf(m.Data, m.Error != nil, code))
	if err != nil || !done {
		return err
	}
	t.mu.Lock()
	t.judge.Add(pair)
	v := t.judge.Verdict(time.Since(t.started))
	t.mu.Unlock()
	if v.Decision != evolution.VerdictContinue {
		select {
		case t.verdict <- struct{}{}:
		default:
		}
	}
	return nil
}

// expire gives the judge the requests one shadow answered and the other
// left unanswered past its deadline at now, as the silent side's failures
// (evolution.Pairer.Expire).
// The judge also learns how many answers the candidate still owes, so
// that it does not promote before they can be judged missing.
func (t *trial) expire(now time.Time) {
	pairs, owes := t.pairs.Expire(now)
	t.mu.Lock()
	for _, p := range pairs {
		t.judge.Add(p)
	}
	t.judge.SetCandidateOwes(owes)
	t.mu.Unlock()
}

// verdictNow asks the judge (owner loop, on its tick and at the end), once
// the answers missing by now are in, and publishes the evidence to the
// gauges. A verdict to continue carries the evidence so far; once a look
// has decided, every later one returns that decision (settled).
func (t *trial) verdictNow() evolution.Verdict {
	if t.settled != nil {
		return *t.settled
	}
	t.expire(time.Now())
	t.mu.Lock()
	v := t.judge.Verdict(time.Since(t.started))
	if v.Decision == evolution.VerdictContinue {
		v.Evidence = t.judge.Evidence()
	}
	t.mu.Unlock()
	if v.Decision != evolution.VerdictContinue {
		t.settled = &v
	}
	t.publishEvidence(v.Evidence)
	return v
}

// publishEvidence sets the running trial's gauges.
func (t *trial) publishEvidence(e evolution.Evidence) {
	t.met.EvolutionSamples.Set(float64(e.Samples))
	for k, v := range e.Metrics() {
		t.met.EvolutionEvidence.WithLabelValues(k).Set(v)
	}
}

// clearEvidence zeroes the gauges once the trial is decided.
func (t *trial) clearEvidence() {
	t.met.EvolutionSamples.Set(0)
	t.met.EvolutionEvidence.Reset()
}

// sampleMemory samples each shadow's process group's RSS from /proc every
// interval until ctx ends, and gives the judge the means (without a control
// the primary's group is the reference). Started and stopped by the owner.
func (t *trial) sampleMemory(ctx context.Context, every time.Duration) {
	defer close(t.memDone)
	tick := time.NewTicker(every)
	defer tick.Stop()
	pg := func(sh *shadow) int {
		if c := sh.conn.Load(); c != nil {
			return c.Proc().ID()
		}
		return 0
	}
	for {
		cand, okC := agentproc.GroupRSS(pg(t.candidate()))
		refPG := t.primaryPG
		if t.control {
			refPG = pg(t.shadows[1])
		}
		ref, okR := agentproc.GroupRSS(refPG)
		// Sampled once mirroring began (the shadows are up and serving the
		// same traffic); the judge gets the means once minMemorySamples
		// are in, so that one sample at a garbage collector's peak decides
		// nothing.
		if okC && okR && t.mirroring.Load() {
			t.mu.Lock()
			t.memCand.add(float64(cand))
			t.memRef.add(float64(ref))
			if t.memCand.n >= minMemorySamples {
				t.judge.SetMemory(t.memCand.mean, t.memRef.mean)
			}
			t.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// minMemorySamples is how many memory samples of each shadow the judge
// needs before it compares memory (at memorySampleInterval: 2.5 s).
const minMemorySamples = 5

// stopSampling stops the memory sampler and waits for it (owner only).
func (t *trial) stopSampling() {
	if t.stopMem != nil {
		t.stopMem()
		<-t.memDone
		t.stopMem = nil
	}
}

// close releases the scratch stores and removes the scratch directory.
func (t *trial) close() {
	for _, sh := range t.shadows {
		if sh.wal != nil {
			_ = sh.wal.Close()
		}
	}
	_ = os.RemoveAll(t.dir)
}

// record is the whole evidence of a decided trial, for the audit log and
// `supervisor evolutions show` (docs/evolution.md).
func (t *trial) record(v evolution.Verdict) map[string]any {
	t.mu.Lock()
	path := pathRecord(thin(t.judge.Path(), maxPathPoints))
	memC, memR := t.memCand.mean, t.memRef.mean
	t.mu.Unlock()
	rec := map[string]any{
		"control":   t.control,
		"pairs":     t.pairs.Stats(),
		"evidence":  v.Evidence,
		"path":      path,
		"differing": t.pairs.Differing(),
		"memory":    map[string]float64{"candidate_bytes": memC, "reference_bytes": memR},
		"config": map[string]any{"confidence": t.cfg.Confidence, "max_latency_increase": t.cfg.MaxLatencyIncrease,
			"max_error_rate_increase": t.cfg.MaxErrorRateIncrease, "max_disagreement": t.cfg.MaxDisagreement,
			"max_memory_increase": t.cfg.MaxMemoryIncrease, "min_duration_seconds": t.cfg.MinDuration.Seconds(),
			"max_duration_seconds": t.cfg.MaxDuration.Seconds()},
	}
	if v.Inconclusive {
		rec["inconclusive"] = true
	}
	return rec
}

// maxPathPoints bounds the bounds' path kept in an audit record (a record
// is at most 16 KiB: observe.maxAuditRecord).
const maxPathPoints = 32

// pathRecord is the path as the audit record keeps it: figures rounded to
// 4 decimals.
func pathRecord(path []evolution.PathPoint) []map[string]float64 {
	r := func(x float64) float64 { return math.Round(x*1e4) / 1e4 }
	out := make([]map[string]float64, 0, len(path))
	for _, p := range path {
		out = append(out, map[string]float64{"pairs": float64(p.Pairs), "latency_ratio": r(p.LatencyRatio),
			"latency_ratio_low": r(p.LatencyRatioLow), "latency_ratio_high": r(p.LatencyRatioHigh),
			"error_rate_change_low": r(p.ErrorRateChangeLow), "error_rate_change_high": r(p.ErrorRateChangeHigh),
			"disagreement_excess": r(p.DisagreementExcess), "disagreement_excess_high": r(p.DisagreementExcessHigh)})
	}
	return out
}

// thin keeps at most n points of s, evenly spaced, always the last.
func thin[T any](s []T, n int) []T {
	if len(s) <= n {
		return append([]T(nil), s...)
	}
	out := make([]T, 0, n)
	for i := range n - 1 {
		out = append(out, s[i*(len(s)-1)/(n-1)])
	}
	return append(out, s[len(s)-1])
}

// describe is a trial's one-line summary for logs.
func (t *trial) describe() string {
	st := t.pairs.Stats()
	d := fmt.Sprintf("%d pairs of %d mirrored requests", st.Pairs, st.Mirrored)
	if st.CandidateMissing > 0 || st.ControlMissing > 0 {
		d += fmt.Sprintf(", %d more with an answer missing (the candidate's %d, the other side's %d)",
			st.CandidateMissing+st.ControlMissing, st.CandidateMissing, st.ControlMissing)
	}
	return d
}
