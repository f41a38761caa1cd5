package replica

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/atomicfile"
	"github.com/agent-sidecar/supervisor/wal"
)

// Local is the data directory a Replicator reads.
type Local struct {
	DataDir     string
	WAL         *wal.Log
	Checkpoints *checkpoint.Store
	// HoldTruncation keeps the WAL from being truncated (retention, a
	// rollback) until the returned func is called: while it is held,
	// Floor is stable, so a read that starts at or above it is complete.
	HoldTruncation func() (release func())
	// Journal, when set, is the request journal (DATA_DIR/requests/journal):
	// its durable bytes are uploaded when they changed, as a base and
	// deltas (see syncJournal).
	Journal Journal
}

// Journal is the request journal as the replicator sees it: bytes with a
// version, in a file that only grows until a compaction replaces it. The
// replica knows nothing of its format.
type Journal interface {
	// Version grows each time the journal's durable content changes.
	Version() uint64
	// SnapshotFrom returns the journal's durable bytes (records fsynced,
	// never a torn one) from off on when file is the identity of the
	// journal's current file (as an earlier call returned it, cur) and off
	// at most its durable size — [0, off) unchanged since — and all of them
	// (from 0) otherwise; v is their version. Identities compare with ==.
	SnapshotFrom(file any, off int64) (b []byte, from int64, v uint64, cur any, err error)
}

// Options configure a Replicator.
type Options struct {
	// SyncInterval: durable WAL entries are uploaded at most this long after
	// they became durable (one chunk per interval, however many entries).
	// Default 1s.
	SyncInterval time.Duration
	Logger       *slog.Logger
	// Registerer, when set, receives the supervisor_replica_* metrics.
	Registerer prometheus.Registerer
	Version    string // the supervisor's, recorded in each generation
	// OwnerCheckInterval: before an upload, the generation's claims are
	// listed again when the last look is older than this (before a delete,
	// always), so that a second writer is found. Default 10s.
	OwnerCheckInterval time.Duration
	// ForkGrace: for this long after this run claimed its generation, a
	// chunk another writer uploaded into it is taken for one that has not
	// yet looked at the claims — a running original whose last look came
	// just before the claim removes what it uploaded after the claim at its
	// next look, within its OwnerCheckInterval — and not yet for a fork.
	// Past it, such a chunk is a fork (its writer was killed or cannot
	// delete), and this run starts a generation of its own. Default 30s
	// (three default owner check intervals).
	ForkGrace time.Duration
}

// stateFile, in the data directory, names the generation this directory
// writes, so a restart continues it.
const stateFile = "replica.json"

type localState struct {
	Generation string `json:"generation,omitempty"`
	Replica    string `json:"replica"` // the location it was written to
	// Session: this directory's newest claim on the generation; another
	// claim newer than it means another directory continued it.
	Session string `json:"session,omitempty"`
	// Parent: written by a restore: where the history came from.
	Parent *Position `json:"parent,omitempty"`
}

// errLost: another supervisor claimed the generation (see checkOwner).
var errLost = errors.New("replica: another supervisor writes this generation")

// stallAfter: a pass running longer than this is reported as stalled.
const stallAfter = 15 * time.Second

// maxBackoff caps the wait between attempts after a failure.
const maxBackoff = 30 * time.Second

// Status is the replica's state, for `supervisor status`.
type Status struct {
	URL              string    `json:"url"`
	State            string    `json:"state"` // starting, ok, retrying, stalled, stopped
	Generation       string    `json:"generation,omitempty"`
	UploadedSequence uint64    `json:"uploaded_sequence"`
	DurableSequence  uint64    `json:"durable_sequence"`
	LagEntries       uint64    `json:"lag_entries"`
	LagSeconds       float64   `json:"lag_seconds"`
	Checkpoints      int       `json:"checkpoints"` // in the generation
	LastSuccess      time.Time `json:"last_success,omitzero"`
	LastError        string    `json:"last_error,omitempty"`
	LastErrorKind    string    `json:"last_error_kind,omitempty"`
	// RequestsJournal: the request journal's replication (nil: none).
	RequestsJournal *JournalStatus `json:"requests_journal,omitempty"`
}

// JournalStatus is the request journal's replication state.
type JournalStatus struct {
	// LagWrites: journal writes durable locally and not yet uploaded (0:
	// every request accepted so far is in the replica).
	LagWrites uint64 `json:"lag_writes"`
	// LagSeconds: age of the oldest such write; 0 when caught up.
	LagSeconds   float64   `json:"lag_seconds"`
	Bytes        int64     `json:"uploaded_bytes"` // the journal's size in the replica
	LastUploaded time.Time `json:"last_uploaded,omitzero"`
}

// Replicator uploads a data directory to a replica continuously: stored
// checkpoints, durable WAL entries in chunks, the small files. One
// goroutine (started by Start, stopped by Close) does everything; it never
// holds anything the supervisor waits on except HoldTruncation during a
// bounded WAL read.
type Replicator struct {
	c     *Client
	local Local
	opts  Options
	log   *slog.Logger
	met   *metrics

	// Owned by the run goroutine.
	gen    string
	head   uint64            // the chunk chain ends here: entries up to it are uploaded
	ckpts  map[string]object // checkpoint id → its object in the generation
	chunks []object          // the generation's chunks, by After
	files  map[string]object // newest version of each file
	// stamps: each file as last read (size, time, inode), so an unchanged
	// one is not read again at every pass (a ledger may be 256 MiB).
	stamps   map[string]fileStamp
	pending  *pendingChunk   // a chunk whose upload failed: sent again as is
	jChain   *journalChain   // the request journal in gen (nil: none)
	jGarbage []string        // journal objects to delete (a delete that failed, a PUT that may have landed)
	retained string          // local checkpoint ids at the last retention pass
	bad      map[string]bool // local checkpoints that could not be read
	session  string          // this run's claim on gen
	claim    string          // its key
	mine     map[string]bool // keys this run uploaded into gen
	checked  time.Time       // the last look at gen's claims
	claimed  time.Time       // when this run claimed gen (see ForkGrace)

	rewound atomic.Bool // a rollback: start a new generation
	started atomic.Bool

	mu        sync.Mutex
	status    Status
	marks     []mark // durable sequences as first seen, for the lag in seconds
	jMarks    []mark // journal versions as first seen
	jUploaded uint64 // the journal version in the replica
	jStatus   JournalStatus
	passBegan time.Time // the running pass's start (zero: none running)

	stop     chan struct{}
	done     chan struct{}
	cancel   context.CancelFunc
	ctx      context.Context
	stopOnce sync.Once
}

type mark struct {
	seq uint64
	at  time.Time
}

type pendingChunk struct {
	obj  object
	data []byte
}

// New makes a Replicator; Start starts it.
func New(c *Client, local Local, opts Options) *Replicator {
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = time.Second
	}
	if opts.OwnerCheckInterval <= 0 {
		opts.OwnerCheckInterval = 10 * time.Second
	}
	if opts.ForkGrace <= 0 {
		opts.ForkGrace = 30 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replicator{c: c, local: local, opts: opts, log: log.With("component", "replica", "replica", c.loc.String()),
		ckpts: map[string]object{}, files: map[string]object{}, bad: map[string]bool{}, mine: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{}), ctx: ctx, cancel: cancel}
	r.status = Status{URL: c.loc.String(), State: "starting"}
	r.met = newMetrics(opts.Registerer, r)
	return r
}

// Start starts the replicator's goroutine (once).
func (r *Replicator) Start() {
	if r.started.Swap(true) {
		return
	}
	go func() {
		defer close(r.done)
		r.run()
	}()
}

// Close stops the replicator after a final pass that uploads what is
// durable, bounded by flush (then in-flight requests are cancelled). A
// second Close is harmless.
func (r *Replicator) Close(flush time.Duration) {
	r.stopOnce.Do(func() {
		if !r.started.Load() {
			r.cancel()
			return
		}
		t := time.AfterFunc(flush, r.cancel)
		defer t.Stop()
		close(r.stop)
		<-r.done
		r.cancel()
		r.mu.Lock()
		r.status.State = "stopped"
		r.mu.Unlock()
	})
}

// Rewound tells the replicator that the local history was rolled back (an
// operator's --no-wal restore): what it uploaded is no longer this
// directory's history, so it starts a new generation.
func (r *Replicator) Rewound() { r.rewound.Store(true) }

// Status is the replica's current state. Safe from any goroutine. A pass
// that has not finished within max(15s, three sync intervals) — the store
// accepts connections but does not answer — is "stalled", whatever the
// last pass said.
func (r *Replicator) Status() Status {
	now := time.Now()
	r.observe(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.status
	st.DurableSequence = r.local.WAL.DurableSequence()
	if st.DurableSequence > st.UploadedSequence {
		st.LagEntries = st.DurableSequence - st.UploadedSequence
	}
	st.LagSeconds = r.lagLocked(now)
	if r.local.Journal != nil {
		js := r.jStatus
		if v := r.local.Journal.Version(); v > r.jUploaded {
			js.LagWrites = v - r.jUploaded
		}
		js.LagSeconds = r.journalLagLocked(now)
		st.RequestsJournal = &js
	}
	if !r.passBegan.IsZero() && st.State != "stopped" {
		if d := now.Sub(r.passBegan); d > max(stallAfter, 3*r.opts.SyncInterval) {
			st.State = "stalled"
			if st.LastError == "" {
				st.LastError = fmt.Sprintf("the store has not answered for %.0fs (an upload or listing in progress); retried when it times out", d.Seconds())
				st.LastErrorKind = "network"
			}
		}
	}
	return st
}

func (r *Replicator) lagLocked(now time.Time) float64 {
	for _, m := range r.marks {
		if m.seq > r.status.UploadedSequence {
			return now.Sub(m.at).Seconds()
		}
	}
	return 0
}

func (r *Replicator) journalLagLocked(now time.Time) float64 {
	for _, m := range r.jMarks {
		if m.seq > r.jUploaded {
			return now.Sub(m.at).Seconds()
		}
	}
	return 0
}

// observe records when the durable sequence (and the journal) moved, for
// the lag in seconds.
func (r *Replicator) observe(now time.Time) {
	d := r.local.WAL.DurableSequence()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local.Journal != nil {
		r.jMarks = addMark(r.jMarks, r.jUploaded, r.local.Journal.Version(), now)
	}
	i := 0
	for i < len(r.marks) && r.marks[i].seq <= r.status.UploadedSequence {
		i++
	}
	r.marks = r.marks[i:]
	if n := len(r.marks); d > r.status.UploadedSequence && (n == 0 || d > r.marks[n-1].seq) {
		if n >= 4096 { // a long outage: keep the oldest, thin the rest
			kept := r.marks[:1]
			for j := 1; j < n; j += 2 {
				kept = append(kept, r.marks[j])
			}
			r.marks = kept
		}
		r.marks = append(r.marks, mark{seq: d, at: now})
	}
}

// addMark drops the marks at or below done and records v first seen at now.
func addMark(marks []mark, done, v uint64, now time.Time) []mark {
	i := 0
	for i < len(marks) && marks[i].seq <= done {
		i++
	}
	marks = marks[i:]
	if n := len(marks); v > done && (n == 0 || v > marks[n-1].seq) {
		if n >= 4096 {
			kept := marks[:1]
			for j := 1; j < n; j += 2 {
				kept = append(kept, marks[j])
			}
			marks = kept
		}
		marks = append(marks, mark{seq: v, at: now})
	}
	return marks
}

func (r *Replicator) run() {
	// observe samples the durable sequence for the lag in seconds; the
	// passes run on their own timer, one sync interval after the previous
	// pass began (or after a back-off).
	poll := min(r.opts.SyncInterval/4, 250*time.Millisecond)
	poll = max(poll, 5*time.Millisecond)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	passTimer := time.NewTimer(0)
	defer passTimer.Stop()
	delay := time.Duration(0)
	for {
		select {
		case <-r.stop:
			r.observe(time.Now())
			if err := r.pass(r.ctx); err != nil {
				r.failed(err)
				r.log.Warn("final replica upload incomplete; the replica lags the data directory", "err", err, "lag_entries", r.Status().LagEntries)
			} else {
				r.succeeded()
			}
			return
		case now := <-tick.C:
			r.observe(now)
		case began := <-passTimer.C:
			r.observe(began)
			if err := r.pass(r.ctx); err != nil {
				r.failed(err)
				if delay == 0 {
					delay = r.opts.SyncInterval
				} else {
					delay = min(delay*2, maxBackoff)
				}
				// Jitter: a fleet that lost its server does not return in step.
				passTimer.Reset(delay/2 + rand.N(delay/2+1))
				continue
			}
			if delay != 0 {
				r.log.Info("replica uploads resumed", "uploaded_sequence", r.head)
			}
			delay = 0
			r.succeeded()
			passTimer.Reset(max(time.Until(began.Add(r.opts.SyncInterval)), 0))
		}
	}
}

func (r *Replicator) failed(err error) {
	kind := Kind(err)
	r.met.errors.WithLabelValues(kind).Inc()
	r.mu.Lock()
	first := r.status.LastError == ""
	r.status.State, r.status.LastError, r.status.LastErrorKind = "retrying", truncate(err.Error(), 500), kind
	r.mu.Unlock()
	if first || kind != "network" {
		r.log.Error("replica upload failed; retrying with back-off (the agent and the local WAL are not affected)", "kind", kind, "err", err)
	}
}

func (r *Replicator) succeeded() {
	r.mu.Lock()
	r.status.State, r.status.LastError, r.status.LastErrorKind = "ok", "", ""
	r.mu.Unlock()
}

// uploaded records a successful PUT.
func (r *Replicator) uploaded(n int64) {
	now := time.Now()
	r.met.bytes.Add(float64(n))
	r.met.objects.Inc()
	r.met.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	r.mu.Lock()
	r.status.LastSuccess = now.UTC()
	r.mu.Unlock()
}

// pass uploads everything not yet in the replica. It returns the first
// failure; the next pass starts over from what was done.
func (r *Replicator) pass(ctx context.Context) error {
	r.mu.Lock()
	r.passBegan = time.Now()
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.passBegan = time.Time{}
		r.mu.Unlock()
	}()
	err := r.passOnce(ctx)
	if errors.Is(err, errLost) {
		// Another supervisor writes this generation now: this one starts
		// its own, from everything it holds (a restorable base).
		if err = r.begin(ctx, true); err != nil {
			r.rewound.Store(true)
			return err
		}
		err = r.passOnce(ctx)
	}
	return err
}

func (r *Replicator) passOnce(ctx context.Context) error {
	if r.gen == "" || r.rewound.Load() {
		fresh := r.rewound.Swap(false)
		if err := r.begin(ctx, fresh); err != nil {
			if fresh {
				r.rewound.Store(true)
			}
			return err
		}
	}
	// Looked at before uploads too; here also when there is nothing to
	// upload, so an idle run finds a second writer within the interval.
	if err := r.checkOwner(ctx, false); err != nil {
		return err
	}
	if err := r.syncFiles(ctx); err != nil {
		return err
	}
	if err := r.syncJournal(ctx); err != nil {
		return err
	}
	if err := r.syncCheckpoints(ctx); err != nil {
		return err
	}
	if err := r.syncWAL(ctx); err != nil {
		return err
	}
	return r.retain(ctx)
}

// begin continues the generation this data directory wrote, when the
// replica still has it and the local history has not fallen behind it, or
// starts a new one.
func (r *Replicator) begin(ctx context.Context, fresh bool) error {
	var st localState
	if b, err := os.ReadFile(filepath.Join(r.local.DataDir, stateFile)); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	r.gen, r.head, r.ckpts, r.chunks, r.files, r.pending = "", 0, map[string]object{}, nil, map[string]object{}, nil
	r.stamps = nil
	r.jChain, r.jGarbage = nil, nil
	r.retained, r.session, r.claim, r.mine = "", "", "", map[string]bool{}
	if !fresh && st.Generation != "" && st.Replica == r.c.loc.String() && validGeneration(st.Generation) {
		ok, err := r.resume(ctx, st.Generation, st.Session)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	id, err := newGenerationID()
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	base := r.local.WAL.Floor()
	info := GenerationInfo{ID: id, Created: time.Now().UTC(), Hostname: host, PID: os.Getpid(), Version: r.opts.Version, Base: base}
	if !fresh && st.Generation == "" && st.Replica == r.c.loc.String() && st.Parent != nil {
		info.Parent = st.Parent // restored from this replica: the history continues the parent's
	}
	b, _ := json.Marshal(info)
	if _, err := r.putRaw(ctx, generationKey(id, sum(b)), b); err != nil {
		return err
	}
	r.gen, r.head = id, base
	if err := r.claimGen(ctx, base); err != nil {
		r.gen = ""
		return err
	}
	r.setGen(id)
	r.log.Info("replica: new generation", "generation", id, "wal_from_sequence", base, "fresh_history", fresh, "parent", info.Parent)
	return nil
}

// claimGen records this run as the writer of r.gen: an owner claim in the
// bucket, then its session in replica.json.
func (r *Replicator) claimGen(ctx context.Context, head uint64) error {
	session, err := newGenerationID()
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	c := OwnerClaim{Session: session, Started: time.Now().UTC(), Hostname: host, PID: os.Getpid(), Head: head}
	if metas, err := r.local.Checkpoints.List(); err == nil {
		for _, m := range metas {
			if m.Watermark > head {
				c.Checkpoints = append(c.Checkpoints, m.ID)
			}
		}
	}
	b, _ := json.Marshal(c)
	key := ownerKey(r.gen, session, sum(b))
	if _, err := r.putRaw(ctx, key, b); err != nil {
		return err
	}
	sb, _ := json.Marshal(localState{Generation: r.gen, Replica: r.c.loc.String(), Session: session})
	if err := atomicfile.WriteFile(r.local.DataDir, stateFile, sb); err != nil {
		return fmt.Errorf("replica: record the generation in %s: %w", stateFile, err)
	}
	r.session, r.claim, r.checked, r.claimed = session, key, time.Now(), time.Now()
	return nil
}

// newerClaim lists r.gen's claims and returns the newest one made after
// this run's (nil: none; this run still writes the generation).
func (r *Replicator) newerClaim(ctx context.Context) (*OwnerClaim, error) {
	gens, _, err := r.c.listUnder(ctx, genDir(r.gen)+"owners/")
	if err != nil {
		return nil, err
	}
	g := gens[r.gen]
	if g == nil || len(g.Owners) == 0 || g.Owners[len(g.Owners)-1].ID <= r.session {
		return nil, nil
	}
	o := g.Owners[len(g.Owners)-1]
	b, err := r.c.get(ctx, o, 1<<20)
	if err != nil {
		return nil, err
	}
	var c OwnerClaim
	if err := json.Unmarshal(b, &c); err != nil || c.Session != o.ID {
		return nil, fmt.Errorf("%w: %s: not an owner claim", ErrCorrupt, o.Key)
	}
	return &c, nil
}

// checkOwner looks at r.gen's claims when the last look is older than the
// owner check interval (always when force): errLost when another
// supervisor has claimed the generation since this run did. What this run
// uploaded there after the other's claim is removed first, so the
// generation holds one history: the other's.
func (r *Replicator) checkOwner(ctx context.Context, force bool) error {
	if r.session == "" || (!force && time.Since(r.checked) < r.opts.OwnerCheckInterval) {
		return nil
	}
	other, err := r.newerClaim(ctx)
	if err != nil {
		return err
	}
	r.checked = time.Now()
	if other == nil {
		return r.checkFork(ctx)
	}
	theirs := map[string]bool{}
	for _, id := range other.Checkpoints {
		theirs[id] = true
	}
	var keys []string
	for _, ch := range r.chunks {
		if r.mine[ch.Key] && ch.After >= other.Head {
			keys = append(keys, ch.Key)
		}
	}
	for _, cp := range r.ckpts {
		if r.mine[cp.Key] && cp.Watermark > other.Head && !theirs[cp.ID] {
			keys = append(keys, cp.Key)
		}
	}
	r.log.Error("replica: another supervisor now writes this generation (a copy of this data directory, or a second supervisor with the same --replica); "+
		"this one stops writing there and starts a generation of its own",
		"generation", r.gen, "other_session", other.Session, "other_host", truncate(other.Hostname, 64), "other_pid", other.PID,
		"other_from_sequence", other.Head, "own_objects_removed", len(keys))
	if len(keys) > 0 {
		if err := r.removeRaw(ctx, keys); err != nil {
			r.log.Warn("replica: could not remove this supervisor's objects from the generation it left; a restore of it trusts it only up to the overlap", "err", err)
		}
	}
	return errLost
}

// checkFork lists r.gen's WAL chunks: two that overlap mean another
// writer uploaded into the generation after this run claimed it — a copy
// of this data directory that yielded to this run only after one more
// upload (its last pass within its owner check interval of this run's
// claim, or killed during it). A running writer removes those chunks at its
// next look at the claims, so within ForkGrace of the claim they are left
// to it. Past that, a restore trusts the forked generation only up to the
// fork, so everything this run would upload above it is lost to a restore
// while its status says ok: errLost instead, and the caller starts a
// generation of its own from everything this directory holds.
func (r *Replicator) checkFork(ctx context.Context) error {
	gens, _, err := r.c.listUnder(ctx, genDir(r.gen)+"wal/")
	if err != nil {
		return err
	}
	g := gens[r.gen]
	if g == nil {
		return nil
	}
	// A chunk reaching past what this run uploaded is another writer's:
	// this run's next chunk would overlap it.
	theirs := ""
	for _, ch := range g.Chunks {
		if ch.Last > r.head && !r.mine[ch.Key] {
			theirs = ch.Key
			break
		}
	}
	if g.ForkAt == nil && theirs == "" {
		return nil
	}
	if time.Since(r.claimed) < r.opts.ForkGrace {
		// A running original removes its chunks at its next look at the
		// claims: both writers leaving would strand the generation.
		return nil
	}
	r.log.Error("replica: another writer uploaded into this generation after this supervisor claimed it (a copy of this data directory that stopped only after one more upload); "+
		"a restore would trust it only up to the fork, so this supervisor starts a generation of its own",
		"generation", r.gen, "uploaded_sequence", r.head, "fork_objects", g.ForkObjects, "other_object", theirs)
	return errLost
}

// resume reads generation gen back from the bucket; ok is false when this
// directory cannot continue it: its history does not reach the
// generation's, or another directory continued the generation after this
// one's last claim (session), as a copy of it would.
func (r *Replicator) resume(ctx context.Context, gen, session string) (ok bool, err error) {
	gens, _, err := r.c.listUnder(ctx, genDir(gen))
	if err != nil {
		return false, err
	}
	g := gens[gen]
	if g == nil {
		g = &Generation{ID: gen}
	}
	if g.Info == nil {
		r.log.Warn("replica: the generation this data directory wrote is gone from the replica; starting a new one", "generation", gen)
		return false, nil
	}
	head := g.Info.Base
	for _, ch := range g.Chunks {
		head = max(head, ch.Last)
	}
	if last := r.local.WAL.LastSequence(); last < head || g.ForkAt != nil {
		r.log.Warn("replica: the local history does not continue the generation this data directory wrote (rolled back, restored from a backup, or written by a copy); starting a new one",
			"generation", gen, "replica_head", head, "local_last_sequence", last)
		return false, nil
	}
	if n := len(g.Owners); n > 0 && g.Owners[n-1].ID != session {
		r.log.Warn("replica: another supervisor continued the generation this data directory wrote (a copy of this directory, or a second supervisor with the same --replica); starting a generation of its own",
			"generation", gen, "newest_claim", g.Owners[n-1].ID, "own_claim", session)
		return false, nil
	}
	r.gen, r.head, r.chunks = gen, head, g.Chunks
	if err := r.claimGen(ctx, head); err != nil {
		r.gen = ""
		return false, err
	}
	// Two copies that resumed at once both claimed: the newer claim wins.
	if other, err := r.newerClaim(ctx); err != nil || other != nil {
		r.removeRaw(ctx, []string{r.claim})
		r.gen, r.head, r.chunks = "", 0, nil
		if err != nil {
			return false, err
		}
		r.log.Warn("replica: another supervisor claimed the generation this data directory wrote at the same time; starting a generation of its own",
			"generation", gen, "other_session", other.Session)
		return false, nil
	}
	// The claims before this one are history: one object per restart is
	// enough (a copy still compares the newest claim with its own).
	var old []string
	for _, o := range g.Owners {
		old = append(old, o.Key)
	}
	if len(old) > 0 {
		if err := r.removeRaw(ctx, old); err != nil {
			r.log.Warn("replica: could not delete older owner claims (harmless; retried at the next start)", "err", err)
		}
	}
	for _, cp := range g.Checkpoints {
		r.ckpts[cp.ID] = cp
	}
	for name, vs := range g.Files {
		if name != JournalFile {
			r.files[name] = vs[len(vs)-1]
		}
	}
	r.jChain, r.jGarbage = resumeJournal(g)
	r.setGen(gen)
	r.mu.Lock()
	r.status.UploadedSequence, r.status.Checkpoints = head, len(r.ckpts)
	r.mu.Unlock()
	r.log.Info("replica: continuing this data directory's generation", "generation", gen, "uploaded_sequence", head, "checkpoints", len(r.ckpts))
	return true, nil
}

func (r *Replicator) setGen(gen string) {
	r.mu.Lock()
	r.status.Generation, r.status.Checkpoints = gen, 0
	r.status.UploadedSequence = r.head
	r.mu.Unlock()
}

// put uploads b under rel (relative to the prefix) into a generation this
// run still writes.
func (r *Replicator) put(ctx context.Context, rel string, b []byte) (int64, error) {
	if err := r.checkOwner(ctx, false); err != nil {
		return 0, err
	}
	// Ours from the attempt on: a PUT the client saw fail may still have
	// been stored, and checkFork must not take it for another writer's.
	r.mine[rel] = true
	return r.putRaw(ctx, rel, b)
}

func (r *Replicator) putRaw(ctx context.Context, rel string, b []byte) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout+time.Duration(len(b)>>20)*time.Second)
	defer cancel()
	if _, err := r.c.mc.PutObject(ctx, r.c.loc.Bucket, r.c.loc.key(rel), bytesReader(b), int64(len(b)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true}); err != nil {
		return 0, r.c.wrap("upload", rel, err)
	}
	r.uploaded(int64(len(b)))
	return int64(len(b)), nil
}

// syncFiles uploads a new version of each small file whose content
// changed, and deletes the version it replaces.
func (r *Replicator) syncFiles(ctx context.Context) error {
	for _, name := range replicatedFiles {
		path := filepath.Join(r.local.DataDir, name)
		st, err := stampOf(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("replica: read %s: %w", name, err)
		}
		old, had := r.files[name]
		if had && r.stamps[name] == st {
			continue // unchanged since it was read and found uploaded
		}
		b, err := atomicfile.ReadLimited(path, fileLimit(name))
		if err != nil {
			return fmt.Errorf("replica: read %s: %w", name, err)
		}
		s := sum(b)
		if had && old.SHA == s {
			r.stamp(name, st)
			continue
		}
		now := time.Now()
		key := fileKey(r.gen, name, now, s)
		if _, err := r.put(ctx, key, b); err != nil {
			return err
		}
		r.files[name] = object{Key: key, Kind: "file", Name: name, SHA: s, Time: now}
		r.stamp(name, st)
		if had {
			if err := r.remove(ctx, []string{old.Key}); errors.Is(err, errLost) {
				return err
			}
		}
	}
	return nil
}

// fileStamp tells a file's versions apart without reading it: the
// supervisor replaces these files whole (atomicfile: a new inode).
type fileStamp struct {
	size, mtime int64
	ino         uint64
}

func stampOf(path string) (fileStamp, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileStamp{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileStamp{size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino}, nil
}

func (r *Replicator) stamp(name string, st fileStamp) {
	if r.stamps == nil {
		r.stamps = map[string]fileStamp{}
	}
	r.stamps[name] = st
}

// syncCheckpoints uploads every stored checkpoint not yet in the
// generation, newest first (the newest makes the replica restorable
// soonest), each file as it is stored.
func (r *Replicator) syncCheckpoints(ctx context.Context) error {
	metas, err := r.local.Checkpoints.List()
	if err != nil {
		return fmt.Errorf("replica: list checkpoints: %w", err)
	}
	for _, m := range metas {
		if m.Bad || r.bad[m.ID] {
			continue
		}
		if _, ok := r.ckpts[m.ID]; ok {
			continue
		}
		obj, err := r.uploadCheckpoint(ctx, m)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned meanwhile
		}
		if err != nil {
			return err
		}
		r.ckpts[m.ID] = obj
		r.mu.Lock()
		r.status.Checkpoints = len(r.ckpts)
		r.mu.Unlock()
	}
	return nil
}

func (r *Replicator) uploadCheckpoint(ctx context.Context, m checkpoint.Meta) (object, error) {
	path := filepath.Join(r.local.Checkpoints.Dir(), m.ID+".ckpt")
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return object{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return object{}, err
	}
	if err := r.checkOwner(ctx, false); err != nil {
		return object{}, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, fi.Size())); err != nil {
		r.bad[m.ID] = true
		return object{}, fmt.Errorf("replica: read checkpoint %s: %w", m.ID, err)
	}
	s := hex.EncodeToString(h.Sum(nil))
	key := checkpointKey(r.gen, m.Watermark, m.ID, s)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout+time.Duration(fi.Size()>>20)*time.Second)
	defer cancel()
	// The file is immutable once stored: the SHA-256 of the first read is
	// the one of the bytes sent (a restore checks it anyway).
	if _, err := r.c.mc.PutObject(ctx, r.c.loc.Bucket, r.c.loc.key(key), io.NewSectionReader(f, 0, fi.Size()), fi.Size(),
		minio.PutObjectOptions{ContentType: "application/octet-stream", PartSize: 16 << 20, NumThreads: 2}); err != nil {
		return object{}, r.c.wrap("upload", key, err)
	}
	r.uploaded(fi.Size())
	r.mine[key] = true
	r.log.Info("replica: checkpoint uploaded", "checkpoint_id", m.ID, "watermark", m.Watermark, "bytes", fi.Size())
	return object{Key: key, Kind: "checkpoint", Gen: r.gen, ID: m.ID, Watermark: m.Watermark, SHA: s, Size: fi.Size()}, nil
}

var errChunkFull = errors.New("chunk full")

// syncWAL uploads the durable entries after the chain's head in chunks.
// When local retention has let entries after the head go before they were
// uploaded, the chain restarts at the WAL's floor — only once a checkpoint
// at or above the floor is in the replica, so that every entry uploaded
// from then on belongs to a restore without a gap.
func (r *Replicator) syncWAL(ctx context.Context) error {
	if p := r.pending; p != nil {
		if _, err := r.put(ctx, p.obj.Key, p.data); err != nil {
			return err
		}
		r.chunkDone(p.obj)
	}
	durable := r.local.WAL.DurableSequence()
	for r.head < durable {
		release := r.local.HoldTruncation()
		if floor := r.local.WAL.Floor(); floor > r.head {
			release()
			if !r.haveCheckpointFrom(floor) {
				return nil // the next pass uploads the checkpoints first
			}
			r.log.Warn("replica: local retention deleted WAL entries before they were uploaded; the replica's WAL continues from the newest checkpoints (no restore from the replica spans the gap)",
				"uploaded_sequence", r.head, "wal_floor", floor)
			r.head = floor
			continue
		}
		b := &chunkBuilder{after: r.head}
		err := r.local.WAL.ReadAfter(r.head, func(e wal.Entry) error {
			if e.Sequence > durable {
				return errChunkFull
			}
			b.add(e)
			if b.raw.Len() >= chunkTarget {
				return errChunkFull
			}
			return nil
		})
		release()
		if err != nil && !errors.Is(err, errChunkFull) {
			return fmt.Errorf("replica: read the local WAL after sequence %d: %w", r.head, err)
		}
		if b.count == 0 {
			return nil // rolled back meanwhile: Rewound starts a new generation
		}
		now := time.Now()
		data := b.encode(now)
		obj := object{Key: chunkKey(r.gen, b.after, b.last, now, sum(data)), Kind: "chunk", Gen: r.gen, After: b.after, Last: b.last, Time: now.UTC(), Size: int64(len(data))}
		if _, err := r.put(ctx, obj.Key, data); err != nil {
			// Sent again as is: one chunk per position, even when the
			// failed PUT did land.
			r.pending = &pendingChunk{obj: obj, data: data}
			return err
		}
		r.chunkDone(obj)
	}
	return nil
}

func (r *Replicator) chunkDone(obj object) {
	r.pending = nil
	r.head = obj.Last
	r.chunks = append(r.chunks, obj)
	r.mu.Lock()
	r.status.UploadedSequence = obj.Last
	r.mu.Unlock()
}

func (r *Replicator) haveCheckpointFrom(seq uint64) bool {
	for _, cp := range r.ckpts {
		if cp.Watermark >= seq {
			return true
		}
	}
	return false
}

// retain makes the bucket follow local retention: checkpoints the store
// pruned are deleted, and chunks that end at or below the oldest kept
// checkpoint's watermark (no kept checkpoint needs them). It runs when the
// local set of checkpoints changed, and never deletes the generation's last
// checkpoint.
func (r *Replicator) retain(ctx context.Context) error {
	metas, err := r.local.Checkpoints.List()
	if err != nil {
		return nil // listing failed: nothing is deleted on a guess
	}
	local := map[string]bool{}
	ids := ""
	for _, m := range metas {
		local[m.ID] = true
		ids += m.ID
	}
	if ids == r.retained {
		return nil
	}
	var keep, drop []object
	for id, cp := range r.ckpts {
		if local[id] && !r.bad[id] {
			keep = append(keep, cp)
		} else {
			drop = append(drop, cp)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	minWM := keep[0].Watermark
	for _, cp := range keep {
		minWM = min(minWM, cp.Watermark)
	}
	var keys []string
	for _, cp := range drop {
		keys = append(keys, cp.Key)
	}
	var chunks []object
	for _, ch := range r.chunks {
		if ch.Last <= minWM {
			keys = append(keys, ch.Key)
		} else {
			chunks = append(chunks, ch)
		}
	}
	if len(keys) > 0 {
		if err := r.remove(ctx, keys); err != nil {
			return err
		}
		r.log.Info("replica: retention deleted objects local retention no longer needs", "objects", len(keys), "oldest_kept_watermark", minWM)
	}
	for _, cp := range drop {
		delete(r.ckpts, cp.ID)
	}
	r.chunks = chunks
	r.retained = ids
	r.mu.Lock()
	r.status.Checkpoints = len(r.ckpts)
	r.mu.Unlock()
	return nil
}

// remove deletes objects of a generation this run still writes (its claims
// are looked at first, every time: retention never deletes from a
// generation another supervisor took over).
func (r *Replicator) remove(ctx context.Context, keys []string) error {
	if err := r.checkOwner(ctx, true); err != nil {
		return err
	}
	return r.removeRaw(ctx, keys)
}

// removeRaw deletes objects (one multi-object request per 1,000).
func (r *Replicator) removeRaw(ctx context.Context, keys []string) error {
	ch := make(chan minio.ObjectInfo, len(keys))
	for _, k := range keys {
		ch <- minio.ObjectInfo{Key: r.c.loc.key(k)}
	}
	close(ch)
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	for e := range r.c.mc.RemoveObjects(ctx, r.c.loc.Bucket, ch, minio.RemoveObjectsOptions{}) {
		if e.Err != nil {
			return r.c.wrap("delete", e.ObjectName, e.Err)
		}
	}
	return nil
}
