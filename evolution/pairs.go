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
)

// DefaultMaxPending is how many requests a [Pairer] holds awaiting answers;
// each holds three short answers (about 700 bytes), so about 1.4 MiB.
const DefaultMaxPending = 2048

// maxDiffering is how many differing answers are kept as evidence.
const maxDiffering = 5

// PairStats counts what a [Pairer] saw.
type PairStats struct {
	Mirrored   int `json:"mirrored"`   // requests sent to every agent of the trial
	Pairs      int `json:"pairs"`      // requests every agent answered (fed to the judge)
	Duplicates int `json:"duplicates"` // second answers to one request, ignored
	Unknown    int `json:"unknown"`    // shadows' answers to requests not awaiting them, ignored
	Dropped    int `json:"dropped"`    // requests forgotten unanswered to stay within bounds
	Pending    int `json:"pending"`    // requests still awaiting an answer
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
// the candidate and, with a control, the control). It is bounded: at most
// maxPending requests await answers, the oldest forgotten first (counted
// as Dropped). Safe for concurrent use.
type Pairer struct {
	control    bool
	maxPending int

	mu        sync.Mutex
	pending   map[string]*pendingPair
	order     []string // ids in the order sent (with ids no longer pending)
	stats     PairStats
	differing []Differing
}

type pendingPair struct {
	sent    [numRoles]time.Time
	latency [numRoles]time.Duration
	answer  [numRoles]Answer
	got     [numRoles]bool
}

// NewPairer returns a Pairer for a trial with or without a control shadow;
// maxPending ≤ 0 means [DefaultMaxPending].
func NewPairer(control bool, maxPending int) *Pairer {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	return &Pairer{control: control, maxPending: maxPending, pending: map[string]*pendingPair{}}
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
	for _, r := range p.roles() {
		if !pp.got[r] {
			return Pair{}, false, nil
		}
	}
	delete(p.pending, id)
	p.stats.Pairs++
	return p.pairOf(id, pp), true, nil
}

// pairOf builds the judge's pair: without a control the primary stands in
// for it (its latency and failures; the candidate's raw disagreement).
func (p *Pairer) pairOf(id string, pp *pendingPair) Pair {
	prim, cand := pp.answer[RolePrimary], pp.answer[RoleCandidate]
	ref := RolePrimary
	if p.control {
		ref = RoleControl
	}
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
