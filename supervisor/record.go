package supervisor

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// occurrence is one thing the supervisor tells its operator about: one
// description that becomes a log line and, as it says, a counter increment
// and an audit record (record). Failure is data, flowing to one place: call
// sites describe what happened and never pair a log, a counter and an audit
// record by hand.
type occurrence struct {
	level slog.Level
	msg   string
	// kind is the audit record's kind; "" = not audited.
	kind string
	// fields are the audit record's fields, logged as attributes too.
	fields map[string]any
	// logOnly are attributes for the log line alone (e.g. durations an
	// operator reads, counts that are not part of the record).
	logOnly []any
	count   prometheus.Counter // nil: not counted
	log     *slog.Logger       // nil: the supervisor's (an instance's carries its pid)
	// limited: the log line and the audit record are rate-limited (floods
	// of invalid input from an agent); the counter counts every one.
	limited bool
}

// record logs, counts and audits one occurrence. Safe from any goroutine;
// it never waits on the disk (the audit log queues).
func (s *Supervisor) record(o occurrence) {
	if o.count != nil {
		o.count.Inc()
	}
	suppressed := 0
	if o.limited {
		var ok bool
		if ok, suppressed = s.limiter.allow(time.Now()); !ok {
			return // counted; nothing more is built for a flood
		}
	}
	lg := o.log
	if lg == nil {
		lg = s.log
	}
	attrs := make([]any, 0, 2*len(o.fields)+len(o.logOnly)+2)
	for _, k := range slices.Sorted(maps.Keys(o.fields)) {
		attrs = append(attrs, k, o.fields[k])
	}
	attrs = append(attrs, o.logOnly...)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_before", suppressed)
	}
	lg.Log(context.Background(), o.level, o.msg, attrs...)
	if o.kind != "" {
		if err := s.audit.Record(o.kind, o.fields); err != nil {
			lg.Error("audit record not written", "kind", o.kind, "err", err)
		}
	}
}
