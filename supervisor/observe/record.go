package observe

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Occurrence is one thing the supervisor tells its operator about: one
// description that becomes a log line and, as it says, a counter increment
// and an audit record (Recorder.Record). Failure is data, flowing to one place: call
// sites describe what happened and never pair a log, a counter and an audit
// record by hand.
type Occurrence struct {
	Level slog.Level
	Msg   string
	// Kind is the audit record's kind; "" = not audited.
	Kind string
	// Fields are the audit record's fields, logged as attributes too.
	Fields map[string]any
	// LogOnly are attributes for the log line alone (e.g. durations an
	// operator reads, counts that are not part of the record).
	LogOnly []any
	Count   prometheus.Counter // nil: not counted
	Log     *slog.Logger       // nil: the Recorder's (an instance's carries its pid)
	// Limited: the log line and the audit record are rate-limited (floods
	// of invalid input from an agent); the counter counts every one.
	Limited bool
}

// Recorder is where occurrences go: one logger, one audit log, one rate
// limiter for floods.
type Recorder struct {
	log     *slog.Logger
	limiter *RateLimiter
	// audit is attached once the data directory is locked (AttachAudit);
	// before that, occurrences are logged and counted only.
	audit atomic.Pointer[AuditLog]
}

// NewRecorder returns a Recorder writing to log. Limited occurrences share
// one budget: 20 every 10 s.
func NewRecorder(log *slog.Logger) *Recorder {
	return &Recorder{log: log, limiter: NewRateLimiter(20, 10*time.Second)}
}

// AttachAudit makes a the audit log of every later record. Called once,
// when the data directory has been locked and its audit log opened.
func (r *Recorder) AttachAudit(a *AuditLog) { r.audit.Store(a) }

// AuditLog is the attached audit log (nil before AttachAudit).
func (r *Recorder) AuditLog() *AuditLog { return r.audit.Load() }

// Allow reports whether a rate-limited report may be written now, and how
// many were suppressed before it (the Recorder's budget).
func (r *Recorder) Allow(now time.Time) (ok bool, suppressed int) { return r.limiter.Allow(now) }

// Record logs, counts and audits one occurrence. Safe from any goroutine;
// it never waits on the disk (the audit log queues). A record the audit log
// refuses is reported in the log.
func (r *Recorder) Record(o Occurrence) {
	if o.Count != nil {
		o.Count.Inc()
	}
	suppressed := 0
	if o.Limited {
		var ok bool
		if ok, suppressed = r.limiter.Allow(time.Now()); !ok {
			return // counted; nothing more is built for a flood
		}
	}
	lg := o.Log
	if lg == nil {
		lg = r.log
	}
	attrs := make([]any, 0, 2*len(o.Fields)+len(o.LogOnly)+2)
	for _, k := range slices.Sorted(maps.Keys(o.Fields)) {
		attrs = append(attrs, k, o.Fields[k])
	}
	attrs = append(attrs, o.LogOnly...)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_before", suppressed)
	}
	lg.Log(context.Background(), o.Level, o.Msg, attrs...)
	if a := r.audit.Load(); o.Kind != "" && a != nil {
		if err := a.Record(o.Kind, o.Fields); err != nil {
			lg.Error("audit record not written", "kind", o.Kind, "err", err)
		}
	}
}

// Audit writes an audit record that is not logged (the start and stop
// records, whose log lines say more); a failure is logged.
func (r *Recorder) Audit(kind string, fields map[string]any) {
	a := r.audit.Load()
	if a == nil {
		return
	}
	if err := a.Record(kind, fields); err != nil {
		r.log.Error("audit record not written", "kind", kind, "err", err)
	}
}
