package requests

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/vmihailenco/msgpack/v5"
)

// Reasons a POST is refused (supervisor_requests_rejected_total).
const (
	rejectFull     = "journal_full" // 429
	rejectDiskFull = "disk_full"    // 507
)

// Metrics are the book's Prometheus metrics (docs/operations.md).
type Metrics struct {
	pending, inflight, stored, oldest, journalBytes, resultBytes prometheus.Gauge
	accepted, delivered, expired, cancelled, poison              prometheus.Counter
	duplicates                                                   prometheus.Counter
	rejectedVec                                                  *prometheus.CounterVec
}

// NewMetrics registers the book's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	a := promauto.With(reg)
	g := func(name, help string) prometheus.Gauge {
		return a.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return a.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		pending:      g("supervisor_requests_pending", "Requests accepted (journaled) and not yet answered, expired, cancelled or set aside, in flight or waiting."),
		inflight:     g("supervisor_requests_in_flight", "Pending requests delivered to the current agent and not answered yet."),
		stored:       g("supervisor_requests_retained", "Requests the journal holds for GET /v1/requests/ID: pending, and finished ones kept for --request-retention."),
		resultBytes:  g("supervisor_request_results_retained_bytes", "Bytes of answers' data held for GET /v1/requests/ID (at most 16 MiB; over it the oldest are dropped)."),
		oldest:       g("supervisor_requests_oldest_pending_age_seconds", "Age of the oldest pending request (0: none); the RequestsStuck alert watches it."),
		journalBytes: g("supervisor_request_journal_bytes", "Size of the request journal file (DATA_DIR/requests/journal), bounded by --request-journal-bytes."),
		accepted:     c("supervisor_requests_accepted_total", "Requests journaled (fsynced) and answered 202."),
		delivered:    c("supervisor_requests_delivered_total", "process_request deliveries to the agent, redeliveries included."),
		expired:      c("supervisor_requests_expired_total", "Requests not answered within --request-timeout (REQUEST_EXPIRED)."),
		cancelled:    c("supervisor_requests_cancelled_total", "Requests cancelled by DELETE /v1/requests/ID or `supervisor requests cancel`."),
		poison:       c("supervisor_requests_poison_total", "Requests set aside after --request-max-attempts agent deaths with them in flight (REQUEST_POISON)."),
		duplicates:   c("supervisor_request_results_duplicate_total", "request_result messages for a request already answered: ignored (a redelivered request that finished twice)."),
		rejectedVec: a.NewCounterVec(prometheus.CounterOpts{Name: "supervisor_requests_rejected_total",
			Help: "POST /v1/requests refused by the journal: journal_full (429, --request-journal-bytes), disk_full (507)."}, []string{"reason"}),
	}
	m.rejectedVec.WithLabelValues(rejectFull)
	m.rejectedVec.WithLabelValues(rejectDiskFull)
	return m
}

func (m *Metrics) rejected(reason string) { m.rejectedVec.WithLabelValues(reason).Inc() }

func msgpackMarshal(v any) ([]byte, error) { return msgpack.Marshal(v) }
