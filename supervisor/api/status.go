package api

import (
	"math"
	"os"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// What the status page and GET /v1/status add to Status (issue 26). Every
// value is read from published snapshots, the API's own tables and its
// sampler: building a status never waits on the owner loop.

// Details is what the owner publishes for the status page beyond Status.
type Details struct {
	// RecentRestarts: the newest restarts, oldest first (bounded by the
	// owner).
	RecentRestarts   []RestartRecord
	HeartbeatTimeout time.Duration // --heartbeat-timeout
	WALDir           string        // DATA_DIR/wal: sizes are read from it
	// Trial is the evolution trial under way, nil: none.
	Trial *EvolutionTrial
	// Recorder holds the newest audit records (nil: none).
	Recorder *observe.Recorder
}

// RestartRecord is one restart of the agent.
type RestartRecord struct {
	Time     time.Time `json:"time"`
	Reason   string    `json:"reason"`              // why the previous run ended: crashed, killed, hung, ...
	Restarts int       `json:"restarts"`            // the supervisor's restart count after it
	PID      int       `json:"agent_pid,omitempty"` // the agent process that ended
}

// WALStatus describes the write-ahead log.
type WALStatus struct {
	LastSequence    uint64 `json:"last_sequence"`
	DurableSequence uint64 `json:"durable_sequence"`
	Segments        int    `json:"segments"`
	SizeBytes       int64  `json:"size_bytes"` // of the segment files (pre-allocated)
}

// CheckpointStatus describes the checkpoint store.
type CheckpointStatus struct {
	Newest          string    `json:"newest,omitempty"`
	Watermark       uint64    `json:"watermark"`
	Created         time.Time `json:"created,omitzero"`
	AgeSeconds      float64   `json:"age_seconds,omitempty"`
	SizeBytes       int64     `json:"size_bytes"`        // uncompressed
	StoredSizeBytes int64     `json:"stored_size_bytes"` // on disk
	Retained        int       `json:"retained"`
	Bad             int       `json:"marked_bad"`
	Error           string    `json:"error,omitempty"` // the store could not be listed
}

// RequestCounts counts the requests the supervisor holds, by status: those
// sent within WindowSeconds (--request-retention), and what happened to
// them.
type RequestCounts struct {
	WindowSeconds float64 `json:"window_seconds"`
	InFlight      int     `json:"in_flight"`
	Answered      int     `json:"answered"`
	Failed        int     `json:"failed"`
	Expired       int     `json:"expired"`
	Dropped       int     `json:"dropped"`
	Cancelled     int     `json:"cancelled"`
}

// EvolutionStatus is the evolution under way and the newest decision.
type EvolutionStatus struct {
	Current *EvolutionTrial    `json:"current,omitempty"`
	Last    *EvolutionDecision `json:"last,omitempty"`
}

// EvolutionTrial is an evolution being tested on a shadow.
type EvolutionTrial struct {
	ID                 string    `json:"trial"`
	Target             string    `json:"target"`
	Reason             string    `json:"hypothesis_reason"`
	Started            time.Time `json:"started"`
	BackupCheckpointID string    `json:"backup_checkpoint_id,omitempty"`
}

// EvolutionDecision is the newest evolution decision of this run (its
// audit record): the decision, why, and the evidence.
type EvolutionDecision struct {
	Time            time.Time          `json:"time"`
	Trial           string             `json:"trial,omitempty"`
	Target          string             `json:"target"`
	Decision        string             `json:"decision"`
	Reason          string             `json:"reason"`
	Metrics         map[string]float64 `json:"metrics,omitempty"` // the evidence
	DurationSeconds float64            `json:"duration_seconds,omitempty"`
	PrimaryReports  int                `json:"primary_reports,omitempty"`
	ShadowReports   int                `json:"shadow_reports,omitempty"`
}

// History is the sampler's ring: one point every IntervalSeconds, oldest
// first, over the last ten minutes.
type History struct {
	IntervalSeconds float64   `json:"interval_seconds"`
	Start           time.Time `json:"start,omitzero"` // the oldest point's time
	EntriesPerSec   []float64 `json:"entries_per_second"`
	HeartbeatAge    []float64 `json:"heartbeat_age_seconds"`
}

// Status page bounds.
const (
	statusAuditRecords = 20
	sampleEvery        = 5 * time.Second
	samplePoints       = 120 // ten minutes
	ckptRefresh        = 30 * time.Second
)

// statusState is the status page's own state: the checkpoint cache and the
// sampler.
type statusState struct {
	mu       sync.Mutex
	ckptAt   time.Time // when ckpt was read
	ckpt     CheckpointStatus
	segments int
	walBytes int64
	walAt    time.Time
	// A ring of n samples, the oldest at first, written in place: the
	// sampler runs for the supervisor's whole life, and a fresh copy of the
	// arrays every sampleEvery was most of an idle supervisor's heap
	// growth after the reaper's (issue 31). history copies them out.
	times    [samplePoints]time.Time
	entries  [samplePoints]float64
	hbAge    [samplePoints]float64
	first, n int

	lastAppends float64
	lastAt      time.Time

	kick chan struct{} // asks the sampler to list the checkpoints; nil: not running

	// The last GET /v1/status body, served again for statusCacheFor: under
	// many pollers the status is encoded once, and a request costs a write.
	bodyMu sync.Mutex
	body   []byte
	bodyAt time.Time

	once     sync.Once
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// FullStatus is Status with the status page's details: what GET /v1/status
// answers and `supervisor status --json` prints.
func (s *Server) FullStatus(now time.Time) Status {
	st := s.owner.Status()
	d := s.owner.Details()
	st.GeneratedAt = now.UTC()
	st.HeartbeatTimeoutSeconds = d.HeartbeatTimeout.Seconds()
	if !st.LastHeartbeat.IsZero() && st.PID != 0 {
		st.HeartbeatAgeSeconds = max(0, now.Sub(st.LastHeartbeat).Seconds())
	}
	st.RecentRestarts = d.RecentRestarts
	st.WAL = &WALStatus{LastSequence: st.LastWALSequence, DurableSequence: st.DurableWALSequence}
	st.WAL.Segments, st.WAL.SizeBytes = s.walSize(d.WALDir)
	ck := s.checkpoints(st.NewestCheckpoint, now)
	st.Checkpoints = &ck
	st.Requests = s.requests.counts(now)
	ev := &EvolutionStatus{Current: d.Trial}
	if d.Recorder != nil {
		if rec, ok := d.Recorder.Last(observe.AuditEvolution); ok {
			ev.Last = decisionOf(rec)
		}
		st.Audit = d.Recorder.Recent(statusAuditRecords)
	}
	if ev.Current != nil || ev.Last != nil {
		st.Evolution = ev
	}
	st.History = s.history()
	return st
}

func decisionOf(rec observe.AuditRecord) *EvolutionDecision {
	f := rec.Fields
	str := func(k string) string { v, _ := f[k].(string); return v }
	num := func(k string) float64 { v, _ := f[k].(float64); return v }
	d := &EvolutionDecision{Time: rec.Time, Trial: str("trial"), Target: str("target"), Decision: str("decision"),
		Reason: str("reason"), DurationSeconds: num("duration_seconds"),
		PrimaryReports: int(num("primary_reports")), ShadowReports: int(num("shadow_reports"))}
	if m, ok := f["metrics"].(map[string]any); ok && len(m) > 0 {
		d.Metrics = make(map[string]float64, len(m))
		for k, v := range m {
			if x, ok := v.(float64); ok {
				d.Metrics[k] = x
			}
		}
	}
	return d
}

// checkpoints describes the store from the cache. The directory is read
// on the sampler's goroutine, never on a request's: when the newest
// checkpoint changed, or every ckptRefresh, the sampler is asked to read it
// again (the cache's Newest says which checkpoint it describes). Before the
// sampler runs (no listener yet), it is read here.
func (s *Server) checkpoints(newest string, now time.Time) CheckpointStatus {
	ss := &s.status
	ss.mu.Lock()
	running, first := ss.kick != nil, ss.ckptAt.IsZero()
	stale := first || ss.ckpt.Newest != newest || now.Sub(ss.ckptAt) >= ckptRefresh
	c := ss.ckpt
	ss.mu.Unlock()
	if stale && running {
		select {
		case ss.kick <- struct{}{}:
		default:
		}
	}
	if stale && (!running || first) {
		c = s.refreshCheckpoints(now)
	}
	if !c.Created.IsZero() {
		c.AgeSeconds = max(0, now.Sub(c.Created).Seconds())
	}
	return c
}

// refreshCheckpoints lists the store into the cache.
func (s *Server) refreshCheckpoints(now time.Time) CheckpointStatus {
	c := s.listCheckpoints(s.owner.Status().NewestCheckpoint)
	ss := &s.status
	ss.mu.Lock()
	ss.ckpt, ss.ckptAt = c, now
	ss.mu.Unlock()
	return c
}

func (s *Server) listCheckpoints(newest string) CheckpointStatus {
	c := CheckpointStatus{Newest: newest}
	metas, err := s.owner.CheckpointList()
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.Retained = len(metas)
	for _, m := range metas {
		if m.Bad {
			c.Bad++
		}
		if m.ID == newest {
			c.Watermark, c.Created, c.SizeBytes, c.StoredSizeBytes = m.Watermark, m.Created, m.Size, m.StoredSize
		}
	}
	return c
}

// walSize is the WAL's segment count and bytes, from the cache while it is
// younger than sampleEvery. The directory is listed when someone looks,
// not in the background: an idle supervisor that nobody watches lists
// nothing.
func (s *Server) walSize(dir string) (int, int64) {
	now := time.Now()
	ss := &s.status
	ss.mu.Lock()
	fresh, n, size := !ss.walAt.IsZero() && now.Sub(ss.walAt) < sampleEvery, ss.segments, ss.walBytes
	ss.mu.Unlock()
	if !fresh {
		n, size = s.scanWAL(dir, now)
	}
	return n, size
}

// scanWAL counts the WAL's segment files and their bytes into the cache.
func (s *Server) scanWAL(dir string, now time.Time) (int, int64) {
	n, size := 0, int64(0)
	if dir != "" {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".wal") {
				continue
			}
			if fi, err := e.Info(); err == nil {
				n++
				size += fi.Size()
			}
		}
	}
	ss := &s.status
	ss.mu.Lock()
	ss.segments, ss.walBytes, ss.walAt = n, size, now
	ss.mu.Unlock()
	return n, size
}

// counts counts the requests the journal holds, by status.
func (t *RequestTable) counts(now time.Time) *RequestCounts {
	c := &RequestCounts{WindowSeconds: t.retention.Seconds()}
	b := t.Book()
	if b == nil {
		return c
	}
	for _, v := range b.List() {
		switch v.Status {
		case requests.StatusPending:
			c.InFlight++
		case requests.StatusAnswered:
			c.Answered++
		case requests.StatusFailed:
			c.Failed++
		case requests.StatusExpired:
			c.Expired++
		case requests.StatusCancelled:
			c.Cancelled++
		case requests.StatusDropped:
			c.Dropped++
		}
	}
	return c
}

// ---- the sampler: entries/s and heartbeat age every sampleEvery

// startSampler starts the sampler once; stopSampler stops it.
func (s *Server) startSampler() {
	ss := &s.status
	ss.once.Do(func() {
		ss.stop, ss.done = make(chan struct{}), make(chan struct{})
		kick := make(chan struct{}, 1)
		ss.mu.Lock()
		ss.kick = kick
		ss.mu.Unlock()
		go func() {
			defer close(ss.done)
			t := time.NewTicker(sampleEvery)
			defer t.Stop()
			s.sample(time.Now())
			for {
				select {
				case <-ss.stop:
					return
				case <-kick:
					s.refreshCheckpoints(time.Now())
				case now := <-t.C:
					s.sample(now)
				}
			}
		}()
	})
}

func (s *Server) stopSampler() {
	ss := &s.status
	ss.once.Do(func() {}) // never started: never will be
	if ss.stop != nil {
		ss.stopOnce.Do(func() { close(ss.stop) })
		<-ss.done
	}
}

// sample adds one point: WAL entries appended per second since the last
// point, and the primary's heartbeat age now.
func (s *Server) sample(now time.Time) {
	appends := counterValue(s.opts.Metrics.WALAppends)
	st := s.owner.Status()
	hb := 0.0
	if st.PID != 0 && !st.LastHeartbeat.IsZero() {
		hb = max(0, now.Sub(st.LastHeartbeat).Seconds())
	}
	ss := &s.status
	ss.mu.Lock()
	defer ss.mu.Unlock()
	rate := 0.0
	if !ss.lastAt.IsZero() {
		if dt := now.Sub(ss.lastAt).Seconds(); dt > 0 {
			rate = max(0, appends-ss.lastAppends) / dt
		}
	}
	ss.lastAppends, ss.lastAt = appends, now
	i := (ss.first + ss.n) % samplePoints
	if ss.n == samplePoints {
		ss.first = (ss.first + 1) % samplePoints // the oldest is overwritten
	} else {
		ss.n++
	}
	ss.times[i], ss.entries[i], ss.hbAge[i] = now, round2(rate), round2(hb)
}

// history is the sampler's points.
func (s *Server) history() *History {
	ss := &s.status
	ss.mu.Lock()
	defer ss.mu.Unlock()
	h := &History{IntervalSeconds: sampleEvery.Seconds(),
		EntriesPerSec: make([]float64, ss.n), HeartbeatAge: make([]float64, ss.n)}
	for k := range ss.n {
		i := (ss.first + k) % samplePoints
		h.EntriesPerSec[k], h.HeartbeatAge[k] = ss.entries[i], ss.hbAge[i]
	}
	if ss.n > 0 {
		h.Start = ss.times[ss.first].UTC()
	}
	return h
}

// round2 keeps two decimals: the sparklines need no more, and the JSON
// stays short.
func round2(v float64) float64 { return math.Round(v*100) / 100 }

func counterValue(c interface{ Write(*dto.Metric) error }) float64 {
	if c == nil {
		return 0
	}
	var m dto.Metric
	if err := c.Write(&m); err != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}
