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
	p := NewPairer(true, 4)
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
	p := NewPairer(false, 0)
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
