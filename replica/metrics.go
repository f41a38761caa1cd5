package replica

import (
	"bytes"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the supervisor_replica_* collectors (docs/metrics.md).
type metrics struct {
	bytes       prometheus.Counter
	objects     prometheus.Counter
	errors      *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

// ErrorKinds are the values of supervisor_replica_errors_total's kind label.
var ErrorKinds = []string{"network", "full", "auth", "bucket", "corrupt", "other"}

func newMetrics(reg prometheus.Registerer, r *Replicator) *metrics {
	m := &metrics{
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "supervisor_replica_uploaded_bytes_total",
			Help: "Bytes uploaded to the replica (checkpoints, WAL chunks, small files)."}),
		objects: prometheus.NewCounter(prometheus.CounterOpts{Name: "supervisor_replica_uploaded_objects_total",
			Help: "Objects uploaded to the replica."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "supervisor_replica_errors_total",
			Help: "Failed replica passes, by kind: network, full, auth, bucket, corrupt, other."}, []string{"kind"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "supervisor_replica_last_success_timestamp_seconds",
			Help: "Unix time of the last successful upload to the replica (0: none yet)."}),
	}
	for _, k := range ErrorKinds {
		m.errors.WithLabelValues(k)
	}
	if reg == nil {
		return m
	}
	lagEntries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "supervisor_replica_lag_entries",
		Help: "Durable WAL sequence minus the last sequence uploaded to the replica."},
		func() float64 { return float64(r.Status().LagEntries) })
	lagSeconds := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "supervisor_replica_lag_seconds",
		Help: "Age of the oldest durable WAL entry not yet uploaded to the replica (0 when caught up)."},
		func() float64 {
			now := time.Now()
			r.observe(now) // the run goroutine may be stuck in a request
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.lagLocked(now)
		})
	reg.MustRegister(m.bytes, m.objects, m.errors, m.lastSuccess, lagEntries, lagSeconds)
	if r.local.Journal != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "supervisor_replica_requests_journal_lag_seconds",
			Help: "Age of the oldest durable write to the request journal not yet uploaded to the replica (0 when caught up)."},
			func() float64 {
				now := time.Now()
				r.observe(now)
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.journalLagLocked(now)
			}))
	}
	return m
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
