package supervisor

import (
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
// never sent or is already answered. A result for an expired request is
// counted as late and dropped without a reply: the agent did nothing wrong,
// it was slow.
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
		t.collector.AddResult(evolution.Primary, outcome == observe.OutcomeFailed, took)
	}
}

// shadowResult collects the shadow's answers to mirrored requests for the
// evolution decision; they never reach an HTTP client.
func (s *Supervisor) shadowResult(in *conn.Instance, t *trial, m *schema.RequestResult) {
	took, err := s.api.Requests().ShadowAnswer(m.RequestID, t.id)
	if err != nil {
		s.invalidMessage(in, err)
		return
	}
	t.collector.AddResult(evolution.Shadow, m.Error != nil, took)
}
