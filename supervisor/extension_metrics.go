package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Outcomes of a request, the label of the request metrics.
const (
	outcomeAnswered = "answered" // request_result with data
	outcomeFailed   = "failed"   // request_result with error
	outcomeExpired  = "expired"  // no result within --request-retention
	outcomeLate     = "late"     // a result for a request that had expired: dropped
)

// extensionMetrics are the metrics of the opt-in protocol extensions:
// wal_ack and request results.
type extensionMetrics struct {
	walAcks         prometheus.Counter
	requestLatency  *prometheus.HistogramVec
	requestOutcomes *prometheus.CounterVec
	requestsStored  prometheus.Gauge
	requestBytes    prometheus.Gauge
}

func newExtensionMetrics(reg prometheus.Registerer) extensionMetrics {
	a := promauto.With(reg) // built is registered
	m := extensionMetrics{
		walAcks: a.NewCounter(prometheus.CounterOpts{
			Name: "supervisor_wal_acks_total", Help: "wal_ack messages sent (each acknowledges every entry up to its sequence as durable).",
		}),
		requestLatency: a.NewHistogramVec(prometheus.HistogramOpts{
			Name: "supervisor_request_duration_seconds", Help: "Time from sending process_request to the primary agent's request_result, by outcome (answered, failed).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20), // 0.5ms .. ~4.4min
		}, []string{"outcome"}),
		requestOutcomes: a.NewCounterVec(prometheus.CounterOpts{
			Name: "supervisor_request_results_total", Help: "Requests by outcome: answered, failed, expired (no result within --request-retention), late (a result after expiry, dropped).",
		}, []string{"outcome"}),
		requestsStored: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_requests_retained", Help: "Requests held for GET /v1/requests/ID (pending and finished).",
		}),
		requestBytes: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_request_results_retained_bytes", Help: "Bytes of request results held for GET /v1/requests/ID.",
		}),
	}
	for _, o := range []string{outcomeAnswered, outcomeFailed, outcomeExpired, outcomeLate} {
		m.requestOutcomes.WithLabelValues(o)
	}
	return m
}
