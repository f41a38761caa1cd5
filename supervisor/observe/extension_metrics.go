package observe

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Outcomes of a request, the label of the request Metrics.
const (
	OutcomeAnswered = "answered" // request_result with data
	OutcomeFailed   = "failed"   // request_result with error
	OutcomeExpired  = "expired"  // no result within --request-retention
	OutcomeLate     = "late"     // a result for a request that had expired: dropped
)

// ExtensionMetrics are the Metrics of the opt-in protocol extensions:
// wal_ack and request results.
type ExtensionMetrics struct {
	WALAcks         prometheus.Counter
	RequestLatency  *prometheus.HistogramVec
	RequestOutcomes *prometheus.CounterVec
}

func newExtensionMetrics(reg prometheus.Registerer) ExtensionMetrics {
	a := promauto.With(reg) // built is registered
	m := ExtensionMetrics{
		WALAcks: a.NewCounter(prometheus.CounterOpts{
			Name: "supervisor_wal_acks_total", Help: "wal_ack messages sent (each acknowledges every entry up to its sequence as durable).",
		}),
		RequestLatency: a.NewHistogramVec(prometheus.HistogramOpts{
			Name: "supervisor_request_duration_seconds", Help: "Time from sending process_request to the primary agent's request_result, by outcome (answered, failed).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20), // 0.5ms .. ~4.4min
		}, []string{"outcome"}),
		RequestOutcomes: a.NewCounterVec(prometheus.CounterOpts{
			Name: "supervisor_request_results_total", Help: "Requests by outcome: answered, failed, expired (no result within --request-timeout; counted by supervisor_requests_expired_total), late (a result after expiry, cancellation or poison, kept beside it).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{OutcomeAnswered, OutcomeFailed, OutcomeExpired, OutcomeLate} {
		m.RequestOutcomes.WithLabelValues(o)
	}
	return m
}
