package supervisor

import (
	"errors"
	"fmt"
	"time"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// primaryResult handles the primary's answer: it completes the request (and
// wakes a POST waiting for it), or is an INVALID_MESSAGE for an id that was
// never sent or is already answered. A result for an expired or cancelled
// request is counted as late and kept beside it (late_answer in GET)
// without a reply: the agent did nothing wrong, it was slow.
func (s *Supervisor) primaryResult(in *conn.Instance, m *schema.RequestResult) {
	outcome, took, trial, err := s.api.Requests().Finish(m)
	if err != nil {
		s.invalidMessage(in, err)
		return
	}
	if outcome == api.OutcomeDuplicate {
		// A redelivered request that finished twice: the first answer
		// stands (counted in supervisor_request_results_duplicate_total).
		if ok, sup := s.rec.Allow(time.Now()); ok {
			in.Log().Info("request_result for a request already answered; ignored", "request_id", clip.String(m.RequestID, 64), "suppressed_before", sup)
		}
		return
	}
	s.met.RequestOutcomes.WithLabelValues(outcome).Inc()
	if outcome == observe.OutcomeLate {
		if ok, sup := s.rec.Allow(time.Now()); ok {
			in.Log().Info("request_result arrived after its request expired, was cancelled or set aside; kept beside it", "request_id", clip.String(m.RequestID, 64),
				"after", took.Round(time.Millisecond), "request_retention", s.cfg.RequestRetention, "suppressed_before", sup)
		}
		return
	}
	s.met.RequestLatency.WithLabelValues(outcome).Observe(took.Seconds())
	if t := s.current().trial; t != nil && trial != "" && trial == t.id {
		// Checked by the table above: a first answer to a request sent.
		_ = t.answered(evolution.RolePrimary, m, time.Now())
	}
}

// shadowResult pairs a shadow's answer to a mirrored request for the trial's
// judge; it never reaches an HTTP client. An answer the trial was not
// waiting for (a request not mirrored to it, a second answer) is counted
// and answered INVALID_MESSAGE, like the primary's; one that came after
// its deadline (the request was judged with it missing) is only counted.
func (s *Supervisor) shadowResult(in *conn.Instance, t *trial, sh *shadow, m *schema.RequestResult) {
	err := t.answered(sh.role, m, time.Now())
	if err == nil {
		return
	}
	if errors.Is(err, evolution.ErrLateAnswer) {
		// Slow, not wrong: the request was judged with this answer
		// missing; nothing to tell the shadow.
		s.met.EvolutionIgnored.WithLabelValues("late").Inc()
		return
	}
	why, reason := "no request with this request_id was mirrored to this shadow and awaits its answer", "unknown"
	if errors.Is(err, evolution.ErrDuplicateAnswer) {
		why, reason = "this request was already answered; send one request_result per request", "duplicate"
	}
	s.met.EvolutionIgnored.WithLabelValues(reason).Inc()
	s.invalidMessage(in, &schema.ValidationError{Type: schema.TypeRequestResult, Field: "request_id", Rule: schema.RuleFieldValue,
		Reason: fmt.Sprintf("%q: %s", clip.String(m.RequestID, 64), why)})
}
