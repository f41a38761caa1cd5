package evolution

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestPairerPairsAllAnswers(t *testing.T) {
	t0 := time.Unix(0, 0)
	same := AnswerOf(nil, true, "E") // any fixed answer
	other := AnswerOf(nil, true, "F")
	p := NewPairer(true, 4, 0)
	p.Expect("a", t0)
	p.Sending("a", RoleControl, t0.Add(time.Millisecond))
	if _, ok, err := p.Answered("a", RoleCandidate, t0.Add(10*time.Millisecond), other); ok || err != nil {
		t.Fatal("pair complete with one answer")
	}
	if _, _, err := p.Answered("a", RoleCandidate, t0.Add(11*time.Millisecond), other); !errors.Is(err, ErrDuplicateAnswer) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, _, err := p.Answered("zz", RoleControl, t0, same); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatalf("unknown: %v", err)
	}
	if _, ok, _ := p.Answered("a", RolePrimary, t0.Add(5*time.Millisecond), same); ok {
		t.Fatal("pair complete without the control")
	}
	pair, ok, err := p.Answered("a", RoleControl, t0.Add(21*time.Millisecond), same)
	if !ok || err != nil {
		t.Fatalf("pair not complete: %v", err)
	}
	want := Pair{CandidateLatency: 10 * time.Millisecond, ControlLatency: 20 * time.Millisecond,
		CandidateFailed: true, ControlFailed: true, CandidateDisagrees: true}
	if pair != want {
		t.Fatalf("pair %+v, want %+v", pair, want)
	}
	if _, _, err := p.Answered("a", RolePrimary, t0, same); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatalf("answer after the pair: %v", err)
	}
	if _, _, err := p.Answered("a", RoleCandidate, t0, same); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatalf("candidate's answer after the pair: %v", err)
	}
	if d := p.Differing(); len(d) != 1 || d[0].RequestID != "a" {
		t.Fatalf("differing %+v", d)
	}
	// Bounded: the oldest unanswered requests are dropped.
	for i := range 100 {
		p.Expect(fmt.Sprint(i), t0)
	}
	st := p.Stats()
	if st.Pending != 4 || st.Dropped != 96 || st.Pairs != 1 || st.Duplicates != 1 || st.Unknown != 2 /* the control's to zz, the candidate's after the pair; not the primary's */ || st.Mirrored != 101 {
		t.Fatalf("stats %+v", st)
	}
	if len(p.order) > 2*4+1 {
		t.Fatalf("order holds %d ids", len(p.order))
	}
}

func TestPairerWithoutControlComparesWithPrimary(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := NewPairer(false, 0, 0)
	p.Expect("a", t0)
	ok1 := AnswerOf(nil, false, "")
	if _, _, err := p.Answered("a", RoleControl, t0, ok1); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatal("control answer accepted without a control")
	}
	p.Answered("a", RoleCandidate, t0.Add(3*time.Millisecond), ok1)
	pair, ok, _ := p.Answered("a", RolePrimary, t0.Add(2*time.Millisecond), AnswerOf(nil, true, "X"))
	if !ok || pair.ControlLatency != 2*time.Millisecond || !pair.ControlFailed || pair.CandidateFailed || !pair.CandidateDisagrees || pair.ControlDisagrees {
		t.Fatalf("pair %+v", pair)
	}
}

// A request one side answered and the other did not by its deadline is
// judged as the silent side's failure; the rule is the same for both sides.
func TestPairerJudgesAMissingAnswerAsTheSilentSidesFailure(t *testing.T) {
	t0 := time.Unix(0, 0)
	ok1 := AnswerOf(nil, false, "")
	for _, tc := range []struct {
		name           string
		silent, spoken Role
		want           Pair
	}{
		{"candidate silent", RoleCandidate, RoleControl,
			Pair{ControlLatency: 10 * time.Millisecond, CandidateFailed: true, CandidateMissing: true, CandidateDisagrees: true}},
		{"control silent", RoleControl, RoleCandidate,
			Pair{CandidateLatency: 10 * time.Millisecond, ControlFailed: true, ControlMissing: true, ControlDisagrees: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPairer(true, 0, 0)
			p.Expect("a", t0)
			p.Answered("a", RolePrimary, t0.Add(5*time.Millisecond), ok1)
			if _, done, err := p.Answered("a", tc.spoken, t0.Add(10*time.Millisecond), ok1); done || err != nil {
				t.Fatalf("answered: done %v, %v", done, err)
			}
			// The silent side gets max(10 × 10 ms, 1 s) after the answer;
			// until then the candidate, if silent, owes it.
			wantOwes := 0
			if tc.silent == RoleCandidate {
				wantOwes = 1
			}
			if got, owes := p.Expire(t0.Add(10*time.Millisecond + answerWaitMin - 1)); len(got) != 0 || owes != wantOwes {
				t.Fatalf("before the deadline: judged %+v, the candidate owes %d, want none and %d", got, owes, wantOwes)
			}
			got, _ := p.Expire(t0.Add(10*time.Millisecond + answerWaitMin))
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("expired %+v, want [%+v]", got, tc.want)
			}
			if again, owes := p.Expire(t0.Add(time.Hour)); len(again) != 0 || owes != 0 {
				t.Fatalf("judged twice: %+v (owes %d)", again, owes)
			}
			if _, _, err := p.Answered("a", tc.silent, t0.Add(2*time.Second), ok1); !errors.Is(err, ErrLateAnswer) {
				t.Fatalf("late answer: %v", err)
			}
			if _, _, err := p.Answered("a", tc.silent, t0.Add(3*time.Second), ok1); !errors.Is(err, ErrUnknownAnswer) {
				t.Fatalf("second late answer: %v", err)
			}
			if _, _, err := p.Answered("a", tc.spoken, t0.Add(3*time.Second), ok1); !errors.Is(err, ErrUnknownAnswer) {
				t.Fatalf("the answered side's second answer: %v", err)
			}
			st := p.Stats()
			missing := map[Role]int{RoleCandidate: st.CandidateMissing, RoleControl: st.ControlMissing}
			if missing[tc.silent] != 1 || missing[tc.spoken] != 0 || st.Pairs != 0 || st.Pending != 0 || st.Late != 1 || st.Unknown != 2 || st.Dropped != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// The deadline follows the first answer's latency (10×, at least 1 s) and
// is capped by the request timeout given to NewPairer.
func TestPairerAnswerDeadline(t *testing.T) {
	t0 := time.Unix(0, 0)
	ok1 := AnswerOf(nil, false, "")
	for _, tc := range []struct {
		name     string
		maxWait  time.Duration
		latency  time.Duration
		deadline time.Duration // after the first answer
	}{
		{"fast agent: the floor", 0, 20 * time.Millisecond, time.Second},
		{"slow agent: 10 × its latency", 0, 2 * time.Second, 20 * time.Second},
		{"capped by the request timeout", 5 * time.Second, 2 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPairer(true, 0, tc.maxWait)
			p.Expect("a", t0)
			p.Answered("a", RolePrimary, t0.Add(tc.latency), ok1)
			at := t0.Add(tc.latency)
			p.Answered("a", RoleControl, at, ok1)
			if got, _ := p.Expire(at.Add(tc.deadline - time.Millisecond)); len(got) != 0 {
				t.Fatalf("judged %v after the answer, before its deadline %v", tc.deadline-time.Millisecond, tc.deadline)
			}
			if got, _ := p.Expire(at.Add(tc.deadline)); len(got) != 1 || !got[0].CandidateMissing {
				t.Fatalf("at the deadline: %+v", got)
			}
		})
	}
}

// What is not the agents' doing is no evidence: requests neither shadow
// answered wait (a trial that ends judges nothing of them), requests evicted
// for room are Dropped, and a side that answers in time, even slowly, makes
// an ordinary pair.
func TestPairerMissingIsOnlyOneSidesSilence(t *testing.T) {
	t0 := time.Unix(0, 0)
	ok1 := AnswerOf(nil, false, "")
	p := NewPairer(true, 2, 0)
	p.Expect("both-silent", t0)
	p.Answered("both-silent", RolePrimary, t0.Add(time.Millisecond), ok1)
	p.Expect("slow", t0)
	p.Answered("slow", RolePrimary, t0.Add(time.Millisecond), ok1)
	p.Answered("slow", RoleControl, t0.Add(time.Millisecond), ok1)
	if pair, done, _ := p.Answered("slow", RoleCandidate, t0.Add(900*time.Millisecond), ok1); !done || pair.CandidateMissing { // within the 1 s floor
		t.Fatalf("slow answer in time: pair %+v, %v", pair, done)
	}
	p.Expect("evicted", t0)
	p.Answered("evicted", RoleControl, t0.Add(time.Millisecond), ok1)
	if got, _ := p.Expire(t0.Add(500 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("expired %+v", got)
	}
	p.Expect("x", t0.Add(600*time.Millisecond)) // room: "both-silent" goes
	p.Expect("y", t0.Add(600*time.Millisecond)) // room: "evicted" goes before its deadline
	if got, _ := p.Expire(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("expired %+v: neither an eviction nor two silent shadows is evidence", got)
	}
	if _, _, err := p.Answered("evicted", RoleCandidate, t0.Add(time.Second), ok1); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatalf("answer to an evicted request: %v", err)
	}
	st := p.Stats()
	if st.Dropped != 2 || st.CandidateMissing != 0 || st.ControlMissing != 0 || st.Pending != 2 || st.Pairs != 1 || st.Unknown != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Both shadows answered: the pair awaits only the primary, never expires.
	p.Answered("x", RoleControl, t0.Add(time.Second), ok1)
	p.Answered("x", RoleCandidate, t0.Add(time.Second), ok1)
	if got, _ := p.Expire(t0.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("expired %+v", got)
	}
	if pair, done, _ := p.Answered("x", RolePrimary, t0.Add(2*time.Hour), ok1); !done || pair.CandidateMissing || pair.ControlMissing {
		t.Fatalf("pair %+v, %v", pair, done)
	}
}

// Without the primary's answer at the deadline nobody's agreement is known;
// without a control the primary is the side compared, and its silence
// counts against it.
func TestPairerMissingWithoutThePrimary(t *testing.T) {
	t0 := time.Unix(0, 0)
	ok1 := AnswerOf(nil, false, "")
	p := NewPairer(true, 0, 0)
	p.Expect("a", t0)
	p.Answered("a", RoleControl, t0.Add(10*time.Millisecond), ok1)
	got, _ := p.Expire(t0.Add(time.Hour))
	want := Pair{ControlLatency: 10 * time.Millisecond, CandidateFailed: true, CandidateMissing: true}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("expired %+v, want [%+v]", got, want)
	}
	if _, _, err := p.Answered("a", RolePrimary, t0.Add(2*time.Hour), ok1); !errors.Is(err, ErrLateAnswer) {
		t.Fatalf("the primary's late answer: %v", err)
	}
	if st := p.Stats(); st.Late != 0 || st.Unknown != 0 {
		t.Fatalf("the primary's late answer counted: %+v", st)
	}

	q := NewPairer(false, 0, 0)
	q.Expect("b", t0)
	q.Answered("b", RoleCandidate, t0.Add(10*time.Millisecond), ok1)
	got, _ = q.Expire(t0.Add(time.Hour))
	want = Pair{CandidateLatency: 10 * time.Millisecond, ControlFailed: true, ControlMissing: true}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("no control, primary silent: expired %+v, want [%+v]", got, want)
	}
	q.Expect("c", t0)
	q.Answered("c", RolePrimary, t0.Add(10*time.Millisecond), ok1)
	got, _ = q.Expire(t0.Add(time.Hour))
	want = Pair{ControlLatency: 10 * time.Millisecond, CandidateFailed: true, CandidateMissing: true, CandidateDisagrees: true}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("no control, candidate silent: expired %+v, want [%+v]", got, want)
	}
}

// The ids kept to recognise late answers are bounded like the pending ones.
func TestPairerLateAnswersBounded(t *testing.T) {
	t0 := time.Unix(0, 0)
	ok1 := AnswerOf(nil, false, "")
	p := NewPairer(true, 4, 0)
	for i := range 100 {
		id := fmt.Sprint(i)
		p.Expect(id, t0)
		p.Answered(id, RoleControl, t0, ok1)
		if got, _ := p.Expire(t0.Add(time.Hour)); len(got) != 1 {
			t.Fatalf("request %d: expired %d", i, len(got))
		}
	}
	if len(p.late) > 4 || len(p.lateOrder) > 4 {
		t.Fatalf("%d late ids kept (%d in order), bound 4", len(p.late), len(p.lateOrder))
	}
	if _, _, err := p.Answered("99", RoleCandidate, t0, ok1); !errors.Is(err, ErrLateAnswer) {
		t.Fatalf("newest late answer: %v", err)
	}
	if _, _, err := p.Answered("0", RoleCandidate, t0, ok1); !errors.Is(err, ErrUnknownAnswer) {
		t.Fatalf("oldest late answer, forgotten: %v", err)
	}
}

// What the candidate owes is its excess over the other side's: under
// steady traffic each side is the second to answer some requests for a
// moment, and an equal candidate must not be held for owing those.
func TestPairerOwesTheExcessOnly(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok1 := AnswerOf(nil, false, "")
	p := NewPairer(true, 0, 0)
	for _, tc := range []struct {
		id    string
		first Role
	}{{"a", RoleControl}, {"b", RoleCandidate}, {"c", RoleControl}} {
		p.Expect(tc.id, t0)
		p.Answered(tc.id, RolePrimary, t0.Add(5*time.Millisecond), ok1)
		p.Answered(tc.id, tc.first, t0.Add(10*time.Millisecond), ok1)
	}
	// The candidate owes a and c, the control b: an excess of 1.
	if got, owes := p.Expire(t0.Add(20 * time.Millisecond)); len(got) != 0 || owes != 1 {
		t.Fatalf("judged %+v, owes %d; want none and 1 (2 owed by the candidate, 1 by the control)", got, owes)
	}
	p.Answered("b", RoleControl, t0.Add(30*time.Millisecond), ok1)
	if _, owes := p.Expire(t0.Add(40 * time.Millisecond)); owes != 2 {
		t.Fatalf("owes %d once the control answered b, want 2", owes)
	}
}
