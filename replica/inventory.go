package replica

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
)

// GenerationInfo is what generation-SHA.json says: who started it.
type GenerationInfo struct {
	ID       string    `json:"id"`
	Created  time.Time `json:"created"`
	Hostname string    `json:"hostname,omitempty"`
	PID      int       `json:"pid,omitempty"`
	Version  string    `json:"version,omitempty"`
	// Base: the chain of WAL chunks starts after this sequence (the local
	// WAL's floor when the generation began).
	Base uint64 `json:"base"`
	// Parent: the restore from this replica the data directory began from
	// (absent: it was not restored from this replica). The parent
	// generation holds that history until this one can be restored.
	Parent *Position `json:"parent,omitempty"`
}

// Position is a point of one generation's history: a restore of
// Generation through Sequence, from checkpoint CheckpointID ("": none).
type Position struct {
	Generation   string `json:"generation"`
	Sequence     uint64 `json:"sequence"`
	CheckpointID string `json:"checkpoint_id,omitempty"`
}

// OwnerClaim is what owners/SESSION-SHA.json says: one supervisor run that
// writes the generation. The newest claim (sessions are version 7 UUIDs,
// ordered by time) is the generation's writer; a run that finds a newer
// claim than its own stops writing there (see Replicator).
type OwnerClaim struct {
	Session  string    `json:"session"`
	Started  time.Time `json:"started"`
	Hostname string    `json:"hostname,omitempty"`
	PID      int       `json:"pid,omitempty"`
	// Head: the generation's WAL chain ended here when the claim was made;
	// the claimant's chunks continue from it.
	Head uint64 `json:"head"`
	// Checkpoints: the claimant's local checkpoints above Head when it
	// claimed (a copied data directory holds them too: a writer that
	// yields never removes them).
	Checkpoints []string `json:"checkpoints,omitempty"`
}

// Generation is one generation as listed.
type Generation struct {
	ID          string
	Info        *GenerationInfo // nil when generation-SHA.json is missing or unreadable
	Checkpoints []object        // by watermark, then id
	Chunks      []object        // by After
	Files       map[string][]object
	// JournalDeltas: the request journal's deltas, by base, then From,
	// the longest first.
	JournalDeltas []object
	Updated       time.Time // the newest object's upload time (server clock)
	// ForkAt is set when two writers' chunks overlap (a copied data
	// directory resumed the same generation): only history up to it is
	// trusted.
	ForkAt *uint64
	// ForkObjects are the first two overlapping chunks.
	ForkObjects []string
	Owners      []object // claims, oldest session first
	Bytes       int64
}

// Inventory is everything under the replica's prefix.
type Inventory struct {
	Generations []*Generation // most recently written first (Default is the one a restore takes)
	Ignored     []string      // keys this layout does not name
}

// listTimeout bounds one listing of the replica (all its pages).
const listTimeout = 2 * time.Minute

// maxIgnored caps the ignored keys kept for a report.
const maxIgnored = 20

// List lists the replica. Generation files are fetched (small); nothing
// else is downloaded.
func (c *Client) List(ctx context.Context) (*Inventory, error) {
	gens, ignored, err := c.listUnder(ctx, generationsDir)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{Ignored: ignored}
	for _, g := range gens {
		inv.Generations = append(inv.Generations, g)
	}
	sort.Slice(inv.Generations, func(i, j int) bool {
		a, b := inv.Generations[i], inv.Generations[j]
		if !a.Updated.Equal(b.Updated) {
			return a.Updated.After(b.Updated)
		}
		return a.ID > b.ID
	})
	return inv, nil
}

// listUnder lists the generations under rel (all of them, or one
// generation's directory), each sorted; ignored holds keys this layout does
// not name (at most maxIgnored).
func (c *Client) listUnder(ctx context.Context, rel string) (map[string]*Generation, []string, error) {
	gens := map[string]*Generation{}
	var ignored []string
	// A listing of many pages may take a while; one that hangs may not.
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	for obj := range c.mc.ListObjects(lctx, c.loc.Bucket, minio.ListObjectsOptions{Prefix: c.loc.key(rel), Recursive: true}) {
		if obj.Err != nil {
			return nil, nil, c.wrap("list", c.loc.String(), obj.Err)
		}
		o, ok := parseKey(c.loc.rel(obj.Key))
		if !ok {
			if len(ignored) < maxIgnored {
				ignored = append(ignored, truncate(obj.Key, 200))
			}
			continue
		}
		o.Size, o.LastModified = obj.Size, obj.LastModified
		g := gens[o.Gen]
		if g == nil {
			g = &Generation{ID: o.Gen, Files: map[string][]object{}}
			gens[o.Gen] = g
		}
		g.Bytes += o.Size
		if o.LastModified.After(g.Updated) {
			g.Updated = o.LastModified
		}
		switch o.Kind {
		case "generation":
			if info, err := c.generationInfo(ctx, o); err == nil {
				g.Info = info
			}
		case "checkpoint":
			g.Checkpoints = append(g.Checkpoints, o)
		case "chunk":
			g.Chunks = append(g.Chunks, o)
		case "file":
			g.Files[o.Name] = append(g.Files[o.Name], o)
		case "journal-delta":
			g.JournalDeltas = append(g.JournalDeltas, o)
		case "owner":
			g.Owners = append(g.Owners, o)
		}
	}
	for _, g := range gens {
		g.sort()
	}
	return gens, ignored, nil
}

func (g *Generation) sort() {
	slices.SortFunc(g.Checkpoints, func(a, b object) int {
		return cmp.Or(cmp.Compare(a.Watermark, b.Watermark), cmp.Compare(a.ID, b.ID))
	})
	slices.SortFunc(g.Chunks, func(a, b object) int {
		return cmp.Or(cmp.Compare(a.After, b.After), cmp.Compare(a.Last, b.Last))
	})
	for _, fs := range g.Files {
		slices.SortFunc(fs, func(a, b object) int { return a.Time.Compare(b.Time) })
	}
	slices.SortFunc(g.JournalDeltas, func(a, b object) int {
		return cmp.Or(a.Base.Compare(b.Base), cmp.Compare(a.From, b.From), cmp.Compare(b.To, a.To), a.Time.Compare(b.Time))
	})
	slices.SortFunc(g.Owners, func(a, b object) int { return cmp.Compare(a.ID, b.ID) })
	// Chunks of one writer never overlap; overlapping ones mean two writers.
	for i := 1; i < len(g.Chunks); i++ {
		if g.Chunks[i].After < g.Chunks[i-1].Last {
			at := g.Chunks[i].After
			g.ForkAt = &at
			g.ForkObjects = []string{g.Chunks[i-1].Key, g.Chunks[i].Key}
			break
		}
	}
}

func (c *Client) generationInfo(ctx context.Context, o object) (*GenerationInfo, error) {
	b, err := c.get(ctx, o, 1<<20)
	if err != nil {
		return nil, err
	}
	var info GenerationInfo
	if err := json.Unmarshal(b, &info); err != nil || info.ID != o.Gen {
		return nil, fmt.Errorf("%w: %s: not this generation's description", ErrCorrupt, o.Key)
	}
	return &info, nil
}

// get downloads a whole object of at most limit bytes and verifies its
// SHA-256 against its name.
func (c *Client) get(ctx context.Context, o object, limit int64) ([]byte, error) {
	if o.Size > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, more than the %d such an object may hold", ErrCorrupt, o.Key, o.Size, limit)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout+time.Duration(o.Size>>20)*time.Second)
	defer cancel()
	r, err := c.mc.GetObject(ctx, c.loc.Bucket, c.loc.key(o.Key), minio.GetObjectOptions{})
	if err != nil {
		return nil, c.wrap("download", o.Key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, c.wrap("download", o.Key, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is more than %d bytes", ErrCorrupt, o.Key, limit)
	}
	if got := sum(b); got != o.SHA {
		return nil, fmt.Errorf("%w: %s: SHA-256 is %s…, its name says %s…; the object was changed or damaged in the bucket and is not used",
			ErrCorrupt, o.Key, got[:16], o.SHA[:16])
	}
	return b, nil
}

// reach is the highest sequence a restore from a checkpoint with watermark
// wm (0 and none: from the start) can include without a gap: the end of the
// chain of chunks starting at or below it. limit caps it (fork).
func (g *Generation) reach(wm uint64, fromStart bool, limit uint64) uint64 {
	p := wm
	if fromStart {
		p = 0
	}
	for _, ch := range g.Chunks { // by After: a chain is followed in one pass
		if ch.Last > limit {
			break
		}
		if ch.After <= p && ch.Last > p {
			p = ch.Last
		}
	}
	return p
}

// head is the highest sequence any chunk holds (trusted part only).
func (g *Generation) head() uint64 {
	var h uint64
	for _, ch := range g.Chunks {
		if ch.Last <= g.limit() {
			h = max(h, ch.Last)
		}
	}
	return h
}

func (g *Generation) limit() uint64 {
	if g.ForkAt != nil {
		return *g.ForkAt
	}
	return ^uint64(0)
}

// Restorable is the highest sequence this generation can be restored to
// (0 with ok false: nothing).
func (g *Generation) Restorable() (uint64, bool) {
	p, err := g.plan(Target{}, nil)
	if err != nil {
		return 0, false
	}
	return p.Last, true
}

// Target says what to restore: the newest state (zero value), the state
// at a WAL sequence, or the replica as it was at a time.
type Target struct {
	Generation string    // "" = the Default one
	Sequence   uint64    // > 0: the state right after this sequence
	Time       time.Time // non-zero: the state the replica held at this time
}

// Plan is a restore worked out from a listing.
type Plan struct {
	Generation string
	Checkpoint *object // nil: no checkpoint, entries from the start
	Chunks     []object
	Last       uint64 // the restore ends at this sequence (≥ the checkpoint's watermark)
	Files      []object
	// JournalDeltas: the deltas uploaded after the request journal's base
	// (in Files), by From, the longest first; a restore follows them from
	// the base's end (restoreJournal).
	JournalDeltas []object
	// JournalOnly: the generation holds no agent state, only the request
	// journal (a stateless agent): the restore is the journal alone.
	JournalOnly bool
	// Skipped: newer generations passed over: holding nothing restorable,
	// or (Parent set) behind the parent they were restored from.
	Skipped []SkippedGeneration
	// Target: what was planned: the target asked for, with its Sequence
	// capped where a generation behind its parent hands over to it
	// (handOver). A restore that replans (a corrupt checkpoint) keeps it.
	Target Target
}

// SkippedGeneration is a generation newer than the one a restore took
// that offers no restore at all, and why.
type SkippedGeneration struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
	// Parent: the generation was restorable, but not as far as the restore
	// it began from; its parent, this one, holds that history (handOver).
	Parent string `json:"parent,omitempty"`
}

// holdsData: g holds a checkpoint or a WAL chunk (restorable or not).
func (g *Generation) holdsData() bool { return len(g.Checkpoints) > 0 || len(g.Chunks) > 0 }

// holdsJournal: g holds a base of the request journal.
func (g *Generation) holdsJournal() bool { return len(g.Files[JournalFile]) > 0 }

// journalOnly is the generation a restore takes when no generation holds
// agent state (a checkpoint or a WAL chunk) — an agent that never logs nor
// checkpoints: the most recently written one holding a request journal (nil:
// none). A journal never makes a generation win over agent state another
// one holds: while any generation holds a checkpoint or a WAL chunk, the
// generations holding only a journal are passed over as before (a node that
// restored its parent's state and died before uploading any is not a
// reason to lose that state).
func (inv *Inventory) journalOnly() *Generation {
	for _, g := range inv.Generations {
		if g.holdsData() {
			return nil
		}
	}
	for _, g := range inv.Generations {
		if g.holdsJournal() {
			return g
		}
	}
	return nil
}

// NotRestorable says why g offers no restore ("" when it offers one).
func (g *Generation) NotRestorable() string {
	if !g.holdsData() {
		return "holds no checkpoint and no WAL: its supervisor stopped, or the store refused its uploads, before its first checkpoint was uploaded"
	}
	if _, err := g.plan(Target{}, nil); err != nil {
		return err.Error()
	}
	return ""
}

// Default is the generation a restore takes unless told otherwise: the
// most recently written one that offers a restore (nil: none does).
// Generations written more recently that hold nothing restorable (a node
// that died, or whose uploads were refused, before its first checkpoint was
// uploaded) are passed over: they are never a reason to lose the history an
// older one holds.
//
// A generation that began from a restore of its parent and has not yet
// uploaded that history again (its node was lost, or its uploads refused,
// after its checkpoint and before the WAL above it) hands over to the
// parent: see handOver.
func (inv *Inventory) Default() *Generation {
	for _, g := range inv.Generations {
		if _, ok := g.Restorable(); ok {
			from, _, _ := inv.handOver(g, Target{})
			return from
		}
	}
	return inv.journalOnly()
}

// byID is the generation with this id (nil: none).
func (inv *Inventory) byID(id string) *Generation {
	for _, g := range inv.Generations {
		if g.ID == id {
			return g
		}
	}
	return nil
}

// handOver: g is the newest restorable generation. A node that restored
// generation P through sequence N begins generation g with Parent P@N and
// uploads it again from its first checkpoint on: its checkpoint first, then
// the WAL from the checkpoint's watermark up. Lost in between, g is
// restorable — to its checkpoint — but not as far as P@N, which the bucket
// still holds in P. Restoring g would lose entries acknowledged and
// replicated long before; what g's history holds up to its reach is P's
// through N, so the restore takes P through N instead (following parents
// while the same holds of P), and g's small files and request journal,
// the newer knowledge of that history (planned by the caller). It returns
// the generation to restore the state from, the sequence to stop at (0:
// no cap; from == g), and why g was passed over. Only for the newest state
// or a sequence: a point in time is planned in g as asked.
func (inv *Inventory) handOver(g *Generation, t Target) (from *Generation, upTo uint64, why string) {
	if !t.Time.IsZero() {
		return g, 0, ""
	}
	from = g
	last, ok := g.Restorable()
	if !ok {
		return g, 0, ""
	}
	for range inv.Generations { // a chain of parents, never a cycle
		if from.Info == nil || from.Info.Parent == nil {
			break
		}
		pos := from.Info.Parent
		need := pos.Sequence
		if upTo > 0 {
			need = min(need, upTo)
		}
		if t.Sequence > 0 {
			need = min(need, t.Sequence)
		}
		if last >= need {
			break
		}
		p := inv.byID(pos.Generation)
		if p == nil || p == from {
			break
		}
		pl, err := p.plan(Target{Sequence: need}, nil)
		if err != nil || pl.Last <= last {
			break
		}
		if why == "" {
			why = fmt.Sprintf("began from a restore of generation %s through sequence %d, and can itself be restored only to %d "+
				"(its node was lost, or its uploads refused, before it had uploaded that history again): generation %s still holds it",
				truncate(pos.Generation, 64), pos.Sequence, last, truncate(pos.Generation, 64))
		}
		from, upTo, last = p, need, pl.Last
	}
	return from, upTo, why
}

// Plan chooses what to restore for t. Without t.Generation it plans from
// the Default generation, and Plan.Skipped lists the newer ones passed
// over. When no generation holds any checkpoint or WAL, the newest holding
// a request journal is restored (the journal alone: Plan.JournalOnly; see
// journalOnly). ErrEmpty: no generation holds any checkpoint, WAL or
// request journal (a fresh start); ErrNoTarget: some hold a checkpoint or
// WAL, none can be restored.
func (inv *Inventory) Plan(t Target) (Plan, error) {
	if t.Generation != "" {
		for _, g := range inv.Generations {
			if g.ID == t.Generation {
				if !g.holdsData() && g.holdsJournal() {
					return g.journalOnlyPlan(t)
				}
				return g.plan(t, nil)
			}
		}
		return Plan{}, fmt.Errorf("%w: no generation %q (see `supervisor replica list`)", ErrNoTarget, truncate(t.Generation, 64))
	}
	var skipped []SkippedGeneration
	data := false
	for _, g := range inv.Generations {
		if _, ok := g.Restorable(); ok {
			from, upTo, why := inv.handOver(g, t)
			if from == g {
				p, err := g.plan(t, nil)
				p.Skipped = skipped
				return p, err
			}
			ft := t
			ft.Sequence = upTo
			p, err := from.plan(ft, nil)
			p.Skipped = append(skipped, SkippedGeneration{ID: g.ID, Reason: why, Parent: from.ID})
			if err == nil {
				p.takeFiles(g, t)
			}
			return p, err
		}
		data = data || g.holdsData()
		skipped = append(skipped, SkippedGeneration{ID: g.ID, Reason: g.NotRestorable()})
	}
	if !data {
		if g := inv.journalOnly(); g != nil {
			var skipped []SkippedGeneration
			for _, x := range inv.Generations {
				if x == g {
					break
				}
				skipped = append(skipped, SkippedGeneration{ID: x.ID, Reason: x.NotRestorable()})
			}
			p, err := g.journalOnlyPlan(t)
			p.Skipped = skipped
			return p, err
		}
		switch {
		case len(inv.Generations) > 0:
			return Plan{}, fmt.Errorf("%w: none of its %d generations holds a checkpoint or a WAL chunk (newest: %s, %s)",
				ErrEmpty, len(inv.Generations), inv.Generations[0].ID, inv.Generations[0].NotRestorable())
		case len(inv.Ignored) > 0:
			return Plan{}, fmt.Errorf("%w: no generation, only objects this replica does not write (%s%s); is --replica the right prefix?",
				ErrEmpty, inv.Ignored[0], map[bool]string{true: ", …", false: ""}[len(inv.Ignored) > 1])
		}
		return Plan{}, ErrEmpty
	}
	var why []string
	for _, s := range skipped {
		if len(why) < 3 {
			why = append(why, s.ID+": "+s.Reason)
		}
	}
	return Plan{Skipped: skipped}, fmt.Errorf("%w: no generation can be restored without a gap (%s)", ErrNoTarget, strings.Join(why, "; "))
}

// plan works out a restore from g; exclude lists checkpoint keys not to use
// (found corrupt).
func (g *Generation) plan(t Target, exclude map[string]bool) (Plan, error) {
	limit := g.limit()
	n := limit // the sequence to restore up to
	if t.Sequence > 0 {
		n = min(t.Sequence, limit)
	}
	if !t.Time.IsZero() {
		var nt uint64
		found := false
		for _, ch := range g.Chunks {
			if !ch.Time.After(t.Time) && ch.Last <= limit {
				nt, found = max(nt, ch.Last), true
			}
		}
		for _, cp := range g.Checkpoints {
			if !cp.Time.After(t.Time) && cp.Watermark <= limit {
				nt, found = max(nt, cp.Watermark), true
			}
		}
		if !found {
			return Plan{}, fmt.Errorf("%w: generation %s holds nothing from before %s", ErrNoTarget, g.ID, t.Time.UTC().Format(time.RFC3339))
		}
		n = min(n, nt)
	}
	var best *object
	bestEnd, have := uint64(0), false
	// Without a checkpoint: only when the chain starts at the beginning.
	if r := g.reach(0, true, limit); len(g.Chunks) > 0 && g.Chunks[0].After == 0 {
		bestEnd, have = min(r, n), true
	}
	for i := range g.Checkpoints {
		cp := &g.Checkpoints[i]
		if cp.Watermark > n || exclude[cp.Key] {
			continue
		}
		end := min(g.reach(cp.Watermark, false, limit), n)
		// The newest checkpoint reaching furthest: the shortest replay.
		if !have || end > bestEnd || (end == bestEnd && (best == nil || cp.Watermark >= best.Watermark)) {
			best, bestEnd, have = cp, end, true
		}
	}
	if have && best == nil && bestEnd == 0 {
		// A chain from the start that includes nothing: its first chunks
		// overlap (two writers, or an object no supervisor wrote).
		have = false
	}
	if !have {
		if len(g.Checkpoints) == 0 && len(g.Chunks) == 0 {
			return Plan{}, fmt.Errorf("%w: generation %s holds no checkpoint and no WAL yet", ErrEmpty, g.ID)
		}
		if g.ForkAt != nil && *g.ForkAt <= n {
			return Plan{}, fmt.Errorf("%w: generation %s: its WAL chunks %s and %s overlap after sequence %d (two writers, or an object no supervisor wrote), "+
				"and no checkpoint at or below that point has its WAL after it", ErrNoTarget, g.ID, g.ForkObjects[0], g.ForkObjects[1], *g.ForkAt)
		}
		return Plan{}, fmt.Errorf("%w: generation %s holds no checkpoint at or below sequence %d with its WAL after it", ErrNoTarget, g.ID, n)
	}
	// Entries the replica holds at or below n that this restore cannot
	// include would make it a restore with a gap: refuse.
	if bestEnd < n && (n != limit || t.Sequence > 0) {
		for _, ch := range g.Chunks {
			if ch.Last <= limit && ch.After < n && ch.Last > bestEnd {
				return Plan{}, fmt.Errorf("%w: generation %s can be restored without a gap only up to sequence %d, not %d "+
					"(its WAL from %d on follows a gap: local retention pruned entries before they were uploaded)", ErrNoTarget, g.ID, bestEnd, n, ch.After+1)
			}
		}
	}
	p := Plan{Generation: g.ID, Checkpoint: best, Last: bestEnd, Target: t}
	from := uint64(0)
	if best != nil {
		from = best.Watermark
		p.Last = max(p.Last, best.Watermark)
	}
	pos := from
	for _, ch := range g.Chunks {
		if pos >= p.Last {
			break
		}
		if ch.After <= pos && ch.Last > pos && ch.Last <= limit {
			p.Chunks = append(p.Chunks, ch)
			pos = ch.Last
		}
	}
	g.planFiles(t, &p)
	return p, nil
}

// takeFiles replaces p's small files and request journal with g's where g
// holds them (a generation that handed over to its parent: see handOver).
func (p *Plan) takeFiles(g *Generation, t Target) {
	var own Plan
	g.planFiles(t, &own)
	for _, f := range own.Files {
		p.Files = slices.DeleteFunc(p.Files, func(o object) bool { return o.Name == f.Name })
		if f.Name == JournalFile {
			p.JournalDeltas = own.JournalDeltas
		}
	}
	p.Files = append(p.Files, own.Files...)
}

// planFiles adds the small files and the request journal (its newest base
// at t.Time and the deltas after it uploaded by then) to p.
func (g *Generation) planFiles(t Target, p *Plan) {
	for _, name := range append(replicatedFiles[:len(replicatedFiles):len(replicatedFiles)], JournalFile) {
		vs := g.Files[name]
		for i := len(vs) - 1; i >= 0; i-- {
			if t.Time.IsZero() || !vs[i].Time.After(t.Time) {
				p.Files = append(p.Files, vs[i])
				if name == JournalFile {
					for _, d := range g.JournalDeltas {
						if d.Base.Equal(vs[i].Time) && (t.Time.IsZero() || !d.Time.After(t.Time)) {
							p.JournalDeltas = append(p.JournalDeltas, d)
						}
					}
				}
				break
			}
		}
	}
}

// journalOnlyPlan: a restore of g's request journal (and small files)
// alone, g holding no checkpoint and no WAL.
func (g *Generation) journalOnlyPlan(t Target) (Plan, error) {
	if t.Sequence > 0 {
		return Plan{}, fmt.Errorf("%w: generation %s holds no WAL (only a request journal): there is no sequence %d to restore", ErrNoTarget, g.ID, t.Sequence)
	}
	p := Plan{Generation: g.ID, JournalOnly: true}
	g.planFiles(t, &p)
	for _, f := range p.Files {
		if f.Name == JournalFile {
			return p, nil
		}
	}
	return Plan{}, fmt.Errorf("%w: generation %s holds nothing from before %s", ErrNoTarget, g.ID, t.Time.UTC().Format(time.RFC3339))
}

// CheckpointSummary is one checkpoint as `supervisor replica list` shows it.
type CheckpointSummary struct {
	ID        string    `json:"id"`
	Created   time.Time `json:"created"`
	Watermark uint64    `json:"watermark"`
	Bytes     int64     `json:"bytes"`
}

// GenerationSummary is one generation as `supervisor replica list` shows it.
type GenerationSummary struct {
	ID       string    `json:"id"`
	Created  time.Time `json:"created,omitzero"`
	Hostname string    `json:"hostname,omitempty"`
	Updated  time.Time `json:"updated"`
	// Default: the one a restore takes unless told otherwise (the most
	// recently written).
	Default     bool                `json:"default"`
	Checkpoints []CheckpointSummary `json:"checkpoints"`
	// The WAL held: entries in (WALAfter, WALThrough], in Chunks chunks
	// (with gaps where local retention outran the uploads).
	WALAfter   uint64 `json:"wal_after"`
	WALThrough uint64 `json:"wal_through"`
	Chunks     int    `json:"chunks"`
	Bytes      int64  `json:"bytes"`
	// RestorableTo is the newest sequence a restore reaches without a gap
	// (absent: nothing restorable yet).
	RestorableTo *uint64 `json:"restorable_to,omitempty"`
	// NotRestorable says why there is nothing to restore (a default
	// restore passes such a generation over).
	NotRestorable string `json:"not_restorable,omitempty"`
	// PassedOver: restorable, but a default restore takes its parent's
	// history instead, and why (see Inventory.Default).
	PassedOver  string    `json:"passed_over,omitempty"`
	ForkAt      *uint64   `json:"fork_after_sequence,omitempty"`
	ForkObjects []string  `json:"fork_objects,omitempty"`
	Parent      *Position `json:"parent,omitempty"`
	// Owner: the session of the newest supervisor run that claimed it.
	Owner string `json:"owner,omitempty"`
	// RequestsJournalOnly: the default restore takes this generation's
	// request journal alone (no generation holds agent state).
	RequestsJournalOnly bool `json:"requests_journal_only,omitempty"`
}

// Summary describes every generation, the default one first.
func (inv *Inventory) Summary() []GenerationSummary {
	out := []GenerationSummary{}
	def := inv.Default()
	var behind *Generation // the newest restorable, when it hands over
	why := ""
	for _, g := range inv.Generations {
		if _, ok := g.Restorable(); ok {
			if from, _, w := inv.handOver(g, Target{}); from != g {
				behind, why = g, w
			}
			break
		}
	}
	for _, g := range inv.Generations {
		s := GenerationSummary{ID: g.ID, Updated: g.Updated.UTC(), Default: g == def, Chunks: len(g.Chunks), Bytes: g.Bytes,
			ForkAt: g.ForkAt, ForkObjects: g.ForkObjects, Checkpoints: []CheckpointSummary{}}
		if g.Info != nil {
			s.Created, s.Hostname = g.Info.Created, truncate(g.Info.Hostname, 64) // the bucket's text
			if p := g.Info.Parent; p != nil {
				s.Parent = &Position{Generation: truncate(p.Generation, 64), Sequence: p.Sequence, CheckpointID: truncate(p.CheckpointID, 64)}
			}
		}
		if n := len(g.Owners); n > 0 {
			s.Owner = g.Owners[n-1].ID
		}
		s.NotRestorable = g.NotRestorable()
		if g == behind {
			s.PassedOver = why
		}
		if g == def && !g.holdsData() {
			s.NotRestorable, s.RequestsJournalOnly = "", true
		}
		for _, cp := range g.Checkpoints {
			s.Checkpoints = append(s.Checkpoints, CheckpointSummary{ID: cp.ID, Created: cp.Time, Watermark: cp.Watermark, Bytes: cp.Size})
		}
		if len(g.Chunks) > 0 {
			s.WALAfter, s.WALThrough = g.Chunks[0].After, g.head()
		}
		if last, ok := g.Restorable(); ok {
			s.RestorableTo = &last
		}
		out = append(out, s)
	}
	return out
}
