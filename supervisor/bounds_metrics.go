package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// boundsMetrics show the supervisor's own bounds at work: bytes queued,
// log records dropped, HTTP connections held and refused.
type boundsMetrics struct {
	ckptQueueBytes prometheus.Gauge
	httpConns      prometheus.Gauge
	httpWaits      prometheus.Counter
	auditDropped   prometheus.Counter
}

func newBoundsMetrics(reg *prometheus.Registry, logDropped func() uint64) *boundsMetrics {
	a := promauto.With(reg) // built is registered
	b := &boundsMetrics{
		ckptQueueBytes: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_checkpoint_queue_bytes", Help: "Bytes of checkpoints received and waiting to be stored (compressed ones at their compressed size); bounded, the agent is slowed down beyond it.",
		}),
		httpConns: a.NewGauge(prometheus.GaugeOpts{
			Name: "supervisor_http_connections", Help: "HTTP connections open now (capped).",
		}),
		auditDropped: a.NewCounter(prometheus.CounterOpts{
			Name: "supervisor_audit_dropped_total", Help: "Audit records dropped because the audit log could not be written as fast as they came (a stuck disk); an audit_records_dropped record counts them in the log.",
		}),
		httpWaits: a.NewCounter(prometheus.CounterOpts{
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
