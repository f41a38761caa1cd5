package observe

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// BoundsMetrics show the supervisor's own bounds at work: bytes queued,
// log records dropped, HTTP connections held and refused.
type BoundsMetrics struct {
	CkptQueueBytes prometheus.Gauge
	HTTPConns      prometheus.Gauge
	HTTPWaits      prometheus.Counter
	AuditDropped   prometheus.Counter
}

func NewBoundsMetrics(reg *prometheus.Registry, logDropped func() uint64) *BoundsMetrics {
	a := promauto.With(reg) // built is registered
	b := &BoundsMetrics{
		CkptQueueBytes: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_checkpoint_queue_bytes", Help: "Bytes of checkpoints received and waiting to be stored (compressed ones at their compressed size); bounded, the agent is slowed down beyond it.",
		}),
		HTTPConns: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_http_connections", Help: "HTTP connections open now (capped).",
		}),
		AuditDropped: a.NewCounter(prometheus.CounterOpts{
			Name: "supervisor_audit_dropped_total", Help: "Audit records dropped because the audit log could not be written as fast as they came (a stuck disk); an audit_records_dropped record counts them in the log.",
		}),
		HTTPWaits: a.NewCounter(prometheus.CounterOpts{
			Name: "supervisor_http_connection_cap_waits_total", Help: "Times the HTTP listener reached its connection cap and new clients waited in the backlog.",
		}),
	}
	if logDropped != nil {
		a.NewCounterFunc(prometheus.CounterOpts{
			Name: "supervisor_log_dropped_total", Help: "Log records dropped because the log output (stderr) did not keep up; logging never blocks the supervisor.",
		}, func() float64 { return float64(logDropped()) })
	}
	return b
}
