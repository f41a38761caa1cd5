package evolution

import (
	"errors"
	"sync"
	"time"
)

// Role is an agent's part in a paired trial.
type Role int

const (
	RolePrimary   Role = iota // the agent serving traffic (the answers' reference)
	RoleCandidate             // the shadow running the proposed code
	RoleControl               // the shadow running today's code
	numRoles
)

// String returns "primary", "candidate" or "control".
func (r Role) String() string {
	switch r {
	case RolePrimary:
		return "primary"
	case RoleCandidate:
		return "candidate"
	case RoleControl:
		return "control"
	}
	return "unknown"
}

// Errors of [Pairer.Answered].
var (
	// ErrUnknownAnswer: no mirrored request with this id awaits this agent's
	// answer (never sent to it, or dropped to keep the pairer in bounds).
	ErrUnknownAnswer = errors.New("evolution: answer to a request not awaiting this agent's answer")
	// ErrDuplicateAnswer: this agent already answered this request.
	ErrDuplicateAnswer = errors.New("evolution: second answer to the same request")
	// ErrLateAnswer: this agent's answer came after its answer deadline;
	// the request was already judged with this agent's answer missing.
	ErrLateAnswer = errors.New("evolution: answer after its deadline, already judged missing")
)

// DefaultMaxPending is how many requests a [Pairer] holds awaiting answers;
// each holds three short answers (about 700 bytes), so about 1.4 MiB.
const DefaultMaxPending = 2048

// maxDiffering is how many differing answers are kept as evidence.
const maxDiffering = 5

// The answer deadline. Once one side of the comparison (the candidate, or
// the control — the primary without a control) has answered a request, the
// other is waited for answerWaitFactor × the first side's latency, at least
// answerWaitMin and at most the request timeout given to [NewPairer]; past
// that its answer is missing, a failure (see [Pairer.Expire]). The wait
// scales with the agent's own answer time, so that an agent taking a minute
// per answer is not judged by a deadline made for one taking 20 ms; a
// side ten times slower than the other on a request is not an answer a
// client would wait for alike. The rule is the same for both sides, so two
// equal agents miss it equally often and the test of errors stays fair.
const (
	answerWaitFactor = 10
	answerWaitMin    = time.Second
)

// PairStats counts what a [Pairer] saw.
type PairStats struct {
	Mirrored   int `json:"mirrored"`   // requests sent to every agent of the trial
	Pairs      int `json:"pairs"`      // requests every agent answered (fed to the judge, with the missing below)
	Duplicates int `json:"duplicates"` // second answers to one request, ignored
	Unknown    int `json:"unknown"`    // shadows' answers to requests not awaiting them, ignored
	Dropped    int `json:"dropped"`    // requests forgotten unanswered to stay within bounds (not evidence)
	Pending    int `json:"pending"`    // requests still awaiting an answer
	// CandidateMissing and ControlMissing count the requests one side
	// answered and the other (the control; without a control, the primary)
	// did not within its answer deadline: fed to the judge as the silent
	// side's failures (Pairer.Expire).
	CandidateMissing int `json:"candidate_missing"`
	ControlMissing   int `json:"control_missing"`
	Late             int `json:"late"` // shadows' answers after their deadline, ignored
}

// Differing is a request the candidate answered unlike the primary while the
// control agreed with it (without a control: any candidate difference);
// each answer is its canonical text, truncated.
type Differing struct {
	RequestID string `json:"request_id"`
	Primary   string `json:"primary"`
	Candidate string `json:"candidate"`
	Control   string `json:"control,omitempty"`
}

// Pairer pairs the answers of a trial's agents to the same mirrored
// request: a [Pair] is complete once every agent answered (the primary,
// the candidate and, with a control, the control). A request one side of
// the comparison answered and the other left unanswered past its answer
// deadline becomes a Pair in which the silent side failed ([Pairer.Expire]);
// one neither side answered is no evidence, and waits. It is bounded: at
// most maxPending requests await answers, the oldest forgotten first
// (counted as Dropped, and no evidence either way: the bound is the
// pairer's, not an agent's failure). Safe for concurrent use.
type Pairer struct {
	control    bool
	maxPending int
	maxWait    time.Duration // the longest answer deadline; 0: no cap

	mu        sync.Mutex
	pending   map[string]*pendingPair
	order     []string // ids in the order sent (with ids no longer pending)
	stats     PairStats
	differing []Differing
	// late holds the requests judged with an answer missing, each with the
	// roles whose answer is still owed (a bit per role), so that one
	// arriving after all is ErrLateAnswer rather than an unknown id; the
	// oldest of more than maxPending are forgotten (lateOrder).
	late      map[string]uint8
	lateOrder []string
}

type pendingPair struct {
	sent    [numRoles]time.Time
	latency [numRoles]time.Duration
	answer  [numRoles]Answer
	got     [numRoles]bool
	// deadline is when the side of the comparison that has not answered
	// counts as missing; zero until exactly one side has answered.
	deadline time.Time
}

// NewPairer returns a Pairer for a trial with or without a control shadow;
// maxPending ≤ 0 means [DefaultMaxPending]. maxWait caps the answer
// deadline (the request timeout: a client would not wait longer either);
// ≤ 0 means no cap.
func NewPairer(control bool, maxPending int, maxWait time.Duration) *Pairer {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	return &Pairer{control: control, maxPending: maxPending, maxWait: max(maxWait, 0),
		pending: map[string]*pendingPair{}, late: map[string]uint8{}}
}

// reference is the role the candidate is compared with: the control, or
// without one the primary.
func (p *Pairer) reference() Role {
	if p.control {
		return RoleControl
	}
	return RolePrimary
}

// roles are the agents whose answers a pair needs.
func (p *Pairer) roles() []Role {
	if p.control {
		return []Role{RolePrimary, RoleCandidate, RoleControl}
	}
	return []Role{RolePrimary, RoleCandidate}
}

// Expect registers a request about to be sent to the primary (at
// primarySent) and mirrored to the shadows: call it before the primary's
// send, so that no answer can come before it, then Sending for each shadow.
func (p *Pairer) Expect(id string, primarySent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[id]; ok {
		return
	}
	for len(p.pending) >= p.maxPending && len(p.order) > 0 {
		old := p.order[0]
		p.order = p.order[1:]
		if _, ok := p.pending[old]; ok {
			delete(p.pending, old)
			p.stats.Dropped++
		}
	}
	if len(p.order) > 2*p.maxPending { // compact: forget ids already paired
		kept := make([]string, 0, len(p.pending)+1)
		for _, o := range p.order {
			if _, ok := p.pending[o]; ok {
				kept = append(kept, o)
			}
		}
		p.order = kept
	}
	pp := &pendingPair{}
	for r := range pp.sent {
		pp.sent[r] = primarySent
	}
	p.pending[id] = pp
	p.order = append(p.order, id)
	p.stats.Mirrored++
}

// Sending records when the request is handed to role's agent; call it
// before the send.
func (p *Pairer) Sending(id string, role Role, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp := p.pending[id]; pp != nil && role >= 0 && role < numRoles {
		pp.sent[role] = at
	}
}

// Cancel forgets an expected request that could not be sent to every agent
// (an input queue was full): it will make no pair.
func (p *Pairer) Cancel(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[id]; ok {
		delete(p.pending, id)
		p.stats.Mirrored--
	}
}

// Answered records role's answer to request id, read at at. It returns the
// completed pair when this was the last answer it needed. An answer to a
// request not awaiting it is [ErrUnknownAnswer], a second one
// [ErrDuplicateAnswer]; both change nothing, and are counted (an unknown
// id only for a shadow: the primary's answers are checked by the request
// table, and one to a request sent before mirroring began is expected).
func (p *Pairer) Answered(id string, role Role, at time.Time, a Answer) (Pair, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pending[id]
	if pp == nil && role >= 0 && role < numRoles && p.late[id]&(1<<role) != 0 {
		if p.late[id] &^= 1 << role; p.late[id] == 0 {
			delete(p.late, id)
		}
		if role != RolePrimary {
			p.stats.Late++
		}
		return Pair{}, false, ErrLateAnswer
	}
	if pp == nil || role < 0 || role >= numRoles || (role == RoleControl && !p.control) {
		if role != RolePrimary {
			// The primary's answers are checked by the request table;
			// one it has for the trial but the pairer does not was sent
			// before mirroring began (or was dropped), nothing wrong.
			p.stats.Unknown++
		}
		return Pair{}, false, ErrUnknownAnswer
	}
	if pp.got[role] {
		p.stats.Duplicates++
		return Pair{}, false, ErrDuplicateAnswer
	}
	pp.got[role], pp.answer[role], pp.latency[role] = true, a, max(at.Sub(pp.sent[role]), 0)
	if ref := p.reference(); role == RoleCandidate || role == ref {
		if pp.got[RoleCandidate] != pp.got[ref] {
			pp.deadline = at.Add(p.answerWait(pp.latency[role]))
		} else {
			pp.deadline = time.Time{} // both sides answered: the pair awaits only the primary
		}
	}
	for _, r := range p.roles() {
		if !pp.got[r] {
			return Pair{}, false, nil
		}
	}
	delete(p.pending, id)
	p.stats.Pairs++
	return p.pairOf(id, pp), true, nil
}

// answerWait is how long the silent side is waited for after the other
// side answered in latency.
func (p *Pairer) answerWait(latency time.Duration) time.Duration {
	w := max(answerWaitFactor*latency, answerWaitMin)
	if p.maxWait > 0 {
		w = min(w, p.maxWait)
	}
	return w
}

// Expire judges the requests one side of the comparison answered and the
// other has not by its answer deadline (at or before now): each becomes a
// [Pair] in which the silent side failed, returned in the order the
// requests were sent, for the judge. The silent side's answer is then
// [ErrLateAnswer]. A request no side answered is left waiting: a trial that
// ends, or shadows that both stall, say nothing of the candidate. An answer
// read before Expire runs counts, even if read after its deadline.
//
// candidateOwes is how many more answers the candidate owes than the other
// side, still within their deadline (requests one side answered and the
// other not yet): answers that may yet go missing, for
// [Judge.SetCandidateOwes]. It is the excess over the other side's, not the
// candidate's count: under steady traffic each side is often the second to
// answer a request for a moment (an equal candidate owes as many answers as
// the control at any look, some 20 at 200 requests a second of 1 s ± 20%),
// and counting those alone held the promotion of an equal candidate for
// good (a simulation: 0 of 200 promoted at 40 owed). The trial calls Expire
// on every look; it walks the pending requests (at most about 3 ×
// maxPending ids).
func (p *Pairer) Expire(now time.Time) (pairs []Pair, candidateOwes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Pair
	otherOwes := 0
	for _, id := range p.order {
		pp := p.pending[id]
		if pp == nil || pp.deadline.IsZero() {
			continue
		}
		if now.Before(pp.deadline) {
			if !pp.got[RoleCandidate] {
				candidateOwes++
			} else {
				otherOwes++
			}
			continue
		}
		delete(p.pending, id)
		out = append(out, p.missingPairOf(pp))
		var owed uint8
		for _, r := range p.roles() {
			if !pp.got[r] {
				owed |= 1 << r
			}
		}
		p.late[id] = owed
		p.lateOrder = append(p.lateOrder, id)
		if len(p.lateOrder) > p.maxPending {
			delete(p.late, p.lateOrder[0])
			p.lateOrder = p.lateOrder[1:]
		}
	}
	return out, max(candidateOwes-otherOwes, 0)
}

// missingPairOf builds the judge's pair for a request one side left
// unanswered past its deadline: that side failed. Its latency is left out
// (zero; the judge takes latency only from pairs where neither side
// failed): the time waited is only a lower bound of an answer that may
// never come, and a made-up figure in d = ln(candidate/control) would
// depend on the deadline, not on the agents, so the latency confidence
// sequence would no longer be about the agents' answer times. Leaving such
// pairs out of latency is what the judge already does with errors; a
// candidate slow enough to miss deadlines is charged in the test of
// errors instead, with the same rule for the control. With the primary's
// answer in, the silent side also disagrees with it (it did not give the
// primary's answer, as an error does not); without it neither side's
// agreement is known, and both count as agreeing (no evidence).
func (p *Pairer) missingPairOf(pp *pendingPair) Pair {
	ref := p.reference()
	candMissing, refMissing := !pp.got[RoleCandidate], !pp.got[ref]
	if candMissing {
		p.stats.CandidateMissing++
	} else {
		p.stats.ControlMissing++
	}
	pair := Pair{CandidateMissing: candMissing, ControlMissing: refMissing,
		CandidateFailed: candMissing || pp.answer[RoleCandidate].Failed, ControlFailed: refMissing || pp.answer[ref].Failed}
	if !candMissing {
		pair.CandidateLatency = pp.latency[RoleCandidate]
	}
	if !refMissing {
		pair.ControlLatency = pp.latency[ref]
	}
	if prim := pp.answer[RolePrimary]; pp.got[RolePrimary] {
		pair.CandidateDisagrees = candMissing || pp.answer[RoleCandidate].Digest != prim.Digest
		if p.control {
			pair.ControlDisagrees = refMissing || pp.answer[RoleControl].Digest != prim.Digest
		}
	}
	return pair
}

// pairOf builds the judge's pair: without a control the primary stands in
// for it (its latency and failures; the candidate's raw disagreement).
func (p *Pairer) pairOf(id string, pp *pendingPair) Pair {
	prim, cand := pp.answer[RolePrimary], pp.answer[RoleCandidate]
	ref := p.reference()
	pair := Pair{
		CandidateLatency: pp.latency[RoleCandidate], ControlLatency: pp.latency[ref],
		CandidateFailed: cand.Failed, ControlFailed: pp.answer[ref].Failed,
		CandidateDisagrees: cand.Digest != prim.Digest,
	}
	if p.control {
		pair.ControlDisagrees = pp.answer[RoleControl].Digest != prim.Digest
	}
	if pair.CandidateDisagrees && !pair.ControlDisagrees && len(p.differing) < maxDiffering {
		d := Differing{RequestID: id, Primary: prim.Text, Candidate: cand.Text}
		if p.control {
			d.Control = pp.answer[RoleControl].Text
		}
		p.differing = append(p.differing, d)
	}
	return pair
}

// Stats returns the counts so far.
func (p *Pairer) Stats() PairStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Pending = len(p.pending)
	return s
}

// Differing returns up to 5 requests the candidate answered differently.
func (p *Pairer) Differing() []Differing {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Differing(nil), p.differing...)
}
