package observe

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/agent-sidecar/supervisor/schema"
)

// maxGenericAgentGauges caps the distinct unknown metric keys an agent may
// create, so a misbehaving agent cannot explode the label cardinality.
const maxGenericAgentGauges = 64

// Metrics holds every Prometheus collector of the supervisor, on its own
// registry. Labels are bounded: message types, directions, error codes, rules,
// restart reasons, decisions and roles — never ids.
type Metrics struct {
	Reg *prometheus.Registry

	AgentUp          *prometheus.GaugeVec
	Restarts         *prometheus.CounterVec
	HeartbeatAge     prometheus.GaugeFunc
	Frames           *prometheus.CounterVec
	FrameBytes       *prometheus.CounterVec
	Invalid          *prometheus.CounterVec
	AgentErrors      prometheus.Counter
	OutboundDropped  prometheus.Counter
	WALAppends       prometheus.Counter
	WALBytes         prometheus.Counter
	WALDuplicates    prometheus.Counter
	WALGaps          prometheus.Counter
	WALErrors        *prometheus.CounterVec
	WALFsync         prometheus.Histogram
	WALFsyncFailures prometheus.Counter
	WALLastSeq       prometheus.GaugeFunc
	Checkpoints      prometheus.Counter
	CheckpointFailed prometheus.Counter
	CheckpointSize   prometheus.Gauge
	CheckpointRaw    prometheus.Gauge
	CheckpointDur    prometheus.Histogram
	CheckpointSkip   prometheus.Counter
	Fallbacks        prometheus.Counter
	RestoreRefused   prometheus.Counter
	Restores         *prometheus.CounterVec
	RestoreEntries   prometheus.Counter
	Evolutions       *prometheus.CounterVec
	// A running evolution trial's evidence (0 between trials): pairs
	// judged, answers ignored (duplicate, unknown id), and each test's
	// estimate and bounds (docs/evolution.md).
	EvolutionSamples  prometheus.Gauge
	EvolutionIgnored  *prometheus.CounterVec
	EvolutionEvidence *prometheus.GaugeVec
	Requests          *prometheus.CounterVec

	AgentLatency  *prometheus.GaugeVec
	AgentErrRate  *prometheus.GaugeVec
	AgentMemory   *prometheus.GaugeVec
	AgentThruput  *prometheus.GaugeVec
	AgentTools    *prometheus.GaugeVec
	AgentBlocks   *prometheus.GaugeVec
	AgentGeneric  *prometheus.GaugeVec
	genericMu     sync.Mutex
	genericKeys   map[string]struct{}
	GenericDenied prometheus.Counter

	ExtensionMetrics // wal_ack and request results (extension_metrics.go)
}

// NewMetrics builds every collector on a new registry (promauto.With:
// built is registered). heartbeatAge and walLastSeq are read at scrape time
// from their owners; extra collectors (the build info) are registered too.
func NewMetrics(heartbeatAge, walLastSeq func() float64, extra ...prometheus.Collector) *Metrics {
	m := &Metrics{Reg: prometheus.NewRegistry(), genericKeys: map[string]struct{}{}}
	m.Reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := promauto.With(m.Reg)

	m.AgentUp = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_up", Help: "1 while the agent process is running and has sent its first heartbeat, else 0.",
	}, []string{"role"})
	m.Restarts = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_agent_restarts_total", Help: "Agent restarts, by the reason the previous run ended.",
	}, []string{"reason"})
	m.HeartbeatAge = a.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "supervisor_agent_heartbeat_age_seconds", Help: "Seconds since the primary agent's last heartbeat (0 before the first).",
	}, heartbeatAge)
	m.Frames = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_frames_total", Help: "Valid frames exchanged with agents, by direction (in: from the agent) and message type.",
	}, []string{"direction", "type"})
	m.FrameBytes = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_frame_bytes_total", Help: "Payload bytes of frames exchanged with agents, by direction.",
	}, []string{"direction"})
	m.Invalid = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_invalid_frames_total", Help: "Frames rejected, by error code (INVALID_MESSAGE for payload errors, FRAMING_ERROR for a broken stream) and rule.",
	}, []string{"code", "rule"})
	m.AgentErrors = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_agent_reported_errors_total", Help: "error messages sent by the agent.",
	})
	m.OutboundDropped = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_outbound_queue_full_total", Help: "Messages to the agent refused because its input queue was full (back-pressure: requests get 503).",
	})
	m.WALAppends = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_wal_appends_total", Help: "WAL entries appended.",
	})
	m.WALBytes = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_wal_append_bytes_total", Help: "Bytes of WAL entries appended (entry payloads).",
	})
	m.WALDuplicates = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_wal_duplicates_total", Help: "WAL entries skipped because their sequence was at or below the last appended.",
	})
	m.WALGaps = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_wal_gaps_total", Help: "Gaps in WAL sequence numbers (allowed, logged).",
	})
	m.WALErrors = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_wal_errors_total", Help: "WAL appends that failed, by the error code reported to the agent.",
	}, []string{"code"})
	m.WALFsync = a.NewHistogram(prometheus.HistogramOpts{
		Name: "supervisor_wal_fsync_duration_seconds", Help: "Duration of WAL group-commit fsyncs.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15), // 100µs .. ~1.6s
	})
	m.WALFsyncFailures = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_wal_fsync_failures_total", Help: "Times the WAL stopped after a failed fsync or write: the entries not yet durable were refused (WAL_FAILED, their whole range), the log reopened from the disk and the agent restarted from it.",
	})
	m.WALLastSeq = a.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "supervisor_wal_last_sequence", Help: "Highest sequence appended to the WAL.",
	}, walLastSeq)
	m.Checkpoints = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_checkpoints_total", Help: "Checkpoints stored and acknowledged.",
	})
	m.CheckpointFailed = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_checkpoint_failures_total", Help: "Checkpoints that could not be stored (CHECKPOINT_FAILED sent).",
	})
	m.CheckpointSize = a.NewGauge(prometheus.GaugeOpts{
		Name: "supervisor_checkpoint_stored_bytes", Help: "Size on disk of the newest stored checkpoint (compressed).",
	})
	m.CheckpointRaw = a.NewGauge(prometheus.GaugeOpts{
		Name: "supervisor_checkpoint_uncompressed_bytes", Help: "Uncompressed size of the newest stored checkpoint.",
	})
	m.CheckpointDur = a.NewHistogram(prometheus.HistogramOpts{
		Name: "supervisor_checkpoint_duration_seconds", Help: "Time from a checkpoint frame's arrival to its acknowledgement (WAL wait, compress, fsync).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1ms .. ~8s
	})
	m.CheckpointSkip = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_checkpoint_corrupt_total", Help: "Checkpoints skipped at restore because they failed their checksum or could not be read.",
	})
	m.Fallbacks = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_crash_loop_fallbacks_total", Help: "Crash loops answered by restoring from an older checkpoint with its whole WAL tail (--fallback-on-crash-loop).",
	})
	m.RestoreRefused = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_restore_refused_total", Help: "Agent starts refused because no complete restore (a checkpoint plus every WAL entry after it) could be built.",
	})
	m.Restores = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_restores_total", Help: "restore messages sent, by trigger (start, operator).",
	}, []string{"trigger"})
	m.RestoreEntries = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_restore_wal_entries_total", Help: "WAL entries replayed in restore messages.",
	})
	m.Evolutions = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_evolutions_total", Help: "Evolution decisions, by decision.",
	}, []string{"decision"})
	m.EvolutionSamples = a.NewGauge(prometheus.GaugeOpts{
		Name: "supervisor_evolution_samples", Help: "Pairs of answers judged in the running evolution trial (0: none running).",
	})
	m.EvolutionIgnored = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_evolution_answers_ignored_total", Help: "Shadows' answers left out of evolution trials, by reason (duplicate, unknown id, late: after its deadline, already judged missing).",
	}, []string{"reason"})
	m.EvolutionEvidence = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_evolution_bound", Help: "The running evolution trial's current estimates and confidence bounds, by figure (latency_ratio_low, ...).",
	}, []string{"figure"})
	m.Requests = a.NewCounterVec(prometheus.CounterOpts{
		Name: "supervisor_http_requests_total", Help: "POST /v1/requests calls, by HTTP status code.",
	}, []string{"code"})

	role := []string{"role"}
	m.AgentLatency = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_latency_seconds", Help: "Latency the agent reported (avg, p50, p95, p99), converted from milliseconds.",
	}, []string{"role", "stat"})
	m.AgentErrRate = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_error_ratio", Help: "Error rate the agent reported (0..1).",
	}, role)
	m.AgentMemory = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_memory_bytes", Help: "Memory usage the agent reported.",
	}, role)
	m.AgentThruput = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_throughput_per_second", Help: "Throughput the agent reported.",
	}, role)
	m.AgentTools = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_active_tools", Help: "Active tools the agent reported.",
	}, role)
	m.AgentBlocks = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_memory_blocks", Help: "Memory blocks the agent reported.",
	}, role)
	m.AgentGeneric = a.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_agent_reported_value", Help: "Other numeric values the agent reported in Metrics, by key (at most 64 distinct keys).",
	}, []string{"role", "key"})
	m.GenericDenied = a.NewCounter(prometheus.CounterOpts{
		Name: "supervisor_agent_reported_keys_dropped_total", Help: "Agent metric values dropped because the distinct-key cap was reached.",
	})

	for _, r := range []string{"primary", "shadow"} {
		m.AgentUp.WithLabelValues(r).Set(0)
	}
	// Series the alert rules (deploy/prometheus/alerts.yml) use exist at 0
	// from the start, so increase() and rate() see the first event.
	// Zero series for the decisions, so that a dashboard shows 0 before the
	// first evolution, not "no data" (the values are evolution's
	// DecisionPromoted and DecisionRejected).
	for _, d := range []string{"promoted", "rejected"} {
		m.Evolutions.WithLabelValues(d)
	}
	for _, r := range restartReasons {
		m.Restarts.WithLabelValues(r)
	}
	for _, code := range []string{"WAL_FULL", "WAL_FAILED", "SEQUENCE_CONFLICT"} {
		m.WALErrors.WithLabelValues(code)
	}
	m.Reg.MustRegister(extra...)
	m.ExtensionMetrics = newExtensionMetrics(m.Reg)
	return m
}

// restartReasons are the values of supervisor_agent_restarts_total's reason
// label (docs/operations.md).
var restartReasons = []string{"crashed", "exited", "killed", "hung", "start_timeout",
	"framing_error", "read_error", "unresponsive", "spawn_failed", "wal_failed"}

// agentReport converts an agent's Metrics message to base units. The
// known keys are schema's one list (schema.KnownMetrics).
func (m *Metrics) AgentReport(role string, data map[string]float64) {
	for k, v := range data {
		switch k {
		case schema.MetricAvgLatency:
			m.AgentLatency.WithLabelValues(role, "avg").Set(v / 1000)
		case schema.MetricP50Latency:
			m.AgentLatency.WithLabelValues(role, "p50").Set(v / 1000)
		case schema.MetricP95Latency:
			m.AgentLatency.WithLabelValues(role, "p95").Set(v / 1000)
		case schema.MetricP99Latency:
			m.AgentLatency.WithLabelValues(role, "p99").Set(v / 1000)
		case schema.MetricErrorRate:
			m.AgentErrRate.WithLabelValues(role).Set(v)
		case schema.MetricMemoryUsage:
			m.AgentMemory.WithLabelValues(role).Set(v)
		case schema.MetricThroughput:
			m.AgentThruput.WithLabelValues(role).Set(v)
		case schema.MetricActiveTools:
			m.AgentTools.WithLabelValues(role).Set(v)
		case schema.MetricMemoryBlocks:
			m.AgentBlocks.WithLabelValues(role).Set(v)
		default:
			m.genericMu.Lock()
			_, known := m.genericKeys[k]
			if !known && len(m.genericKeys) < maxGenericAgentGauges {
				m.genericKeys[k] = struct{}{}
				known = true
			}
			m.genericMu.Unlock()
			if known {
				m.AgentGeneric.WithLabelValues(role, k).Set(v)
			} else {
				m.GenericDenied.Inc()
			}
		}
	}
}

// walSynced is the WAL's OnSync hook.
func (m *Metrics) WALSynced(d time.Duration, _ int, _ int) {
	m.WALFsync.Observe(d.Seconds())
}
