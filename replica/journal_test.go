package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/replica/miniotest"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// journalRig is a data directory with one WAL entry (a restorable
// generation) and a real request journal, replicated continuously.
type journalRig struct {
	t    *testing.T
	srv  *miniotest.Server
	c    *replica.Client
	d    *dataDir
	j    *requests.Journal
	keep []*requests.Record // what a compaction keeps
	r    *replica.Replicator
	reg  *prometheus.Registry
	n    int
}

func newJournalRig(t *testing.T, prefix string) *journalRig {
	srv, c := setup(t, prefix)
	return openJournalRig(t, srv, c, t.TempDir(), true)
}

// openJournalRig opens the data directory dir (with one WAL entry appended
// when walEntry) and its request journal.
func openJournalRig(t *testing.T, srv *miniotest.Server, c *replica.Client, dir string, walEntry bool) *journalRig {
	d := openDataDir(t, dir)
	if walEntry {
		d.append(1, 1)
	}
	j, _, err := requests.Open(d.dir)
	if err != nil {
		t.Fatal(err)
	}
	g := &journalRig{t: t, srv: srv, c: c, d: d, j: j, reg: prometheus.NewRegistry()}
	j.Start(func() []*requests.Record { return g.keep }, nil)
	t.Cleanup(func() { j.Close() })
	return g
}

func (g *journalRig) start() {
	local := g.d.local()
	local.Journal = g.j
	g.r = replica.New(g.c, local, replica.Options{SyncInterval: 20 * time.Millisecond, Registerer: g.reg})
	g.r.Start()
	g.t.Cleanup(func() { g.r.Close(5 * time.Second) })
}

// add appends a record with a body of n bytes; it returns the bytes the
// journal grew by.
func (g *journalRig) add(n int) int64 {
	g.t.Helper()
	before := g.durable()
	g.n++
	rec := &requests.Record{Kind: requests.KindAccepted, ID: fmt.Sprintf("r%d", g.n), Body: []byte(`"` + strings.Repeat("x", n) + `"`)}
	if err := g.j.Append(rec).Wait(); err != nil {
		g.t.Fatal(err)
	}
	if len(g.keep) < 2 {
		g.keep = append(g.keep, rec)
	}
	return int64(len(g.durable())) - int64(len(before))
}

func (g *journalRig) durable() []byte {
	g.t.Helper()
	b, _, err := g.j.Snapshot()
	if err != nil {
		g.t.Fatal(err)
	}
	return b
}

func (g *journalRig) uploadedBytes() float64 {
	return testutil.ToFloat64(counter(g.t, g.reg, "supervisor_replica_uploaded_bytes_total"))
}

// wait waits until the journal's durable bytes are all in the replica.
func (g *journalRig) wait() {
	g.t.Helper()
	want := int64(len(g.durable()))
	waitFor(g.t, func() bool {
		js := g.r.Status().RequestsJournal
		return js != nil && js.LagWrites == 0 && js.Bytes == want
	})
	waitUploaded(g.t, g.r, g.d.wal.LastSequence()) // the WAL too
}

// objects lists the journal's objects in the bucket: bases and deltas.
func (g *journalRig) objects(prefix string) (bases, deltas []string) {
	for _, k := range g.srv.Keys("bkt", prefix) {
		_, name, ok := strings.Cut(k, "/files/requests-journal/")
		if !ok {
			continue
		}
		if strings.Count(name, "-") == 1 {
			bases = append(bases, k)
		} else {
			deltas = append(deltas, k)
		}
	}
	return bases, deltas
}

// restore restores the replica into a new directory and returns the
// journal restored and the result.
func (g *journalRig) restore() ([]byte, replica.Result) {
	g.t.Helper()
	out := filepath.Join(g.t.TempDir(), "restored")
	res, err := g.c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, replica.JournalPath))
	if err != nil {
		g.t.Fatal(err)
	}
	return b, res
}

func (g *journalRig) restoresExactly(what string) {
	g.t.Helper()
	b, res := g.restore()
	if want := g.durable(); !bytes.Equal(b, want) || res.RequestsJournalBytes != int64(len(want)) || res.RequestsJournalIncomplete != "" || res.RequestsJournalError != "" {
		g.t.Fatalf("%s: restored %d bytes (equal: %v), want the %d durable bytes: %+v", what, len(b), bytes.Equal(b, want), len(want), res)
	}
}

// TestJournalDeltas: the first upload of the request journal is a base (the
// whole durable prefix); an append is uploaded as a delta holding exactly
// the bytes appended (the bytes uploaded for it are its size); a compaction
// (the file replaced) uploads a new base of the compacted file and deletes
// the old chain. A restore of each state is the durable journal byte for
// byte.
func TestJournalDeltas(t *testing.T) {
	g := newJournalRig(t, "agents/jd")
	for range 8 {
		g.add(8 << 10)
	}
	g.start()
	g.wait()
	bases, deltas := g.objects("agents/jd/")
	if len(bases) != 1 || len(deltas) != 0 {
		t.Fatalf("after the first upload: bases %v, deltas %v; want one base", bases, deltas)
	}
	g.restoresExactly("the base")

	before := g.uploadedBytes()
	grew := g.add(1000)
	g.wait()
	bases, deltas = g.objects("agents/jd/")
	if len(bases) != 1 || len(deltas) != 1 {
		t.Fatalf("after an append: bases %v, deltas %v; want the base and one delta", bases, deltas)
	}
	if got := g.uploadedBytes() - before; got != float64(grew) || int64(len(g.srv.Get("bkt", deltas[0]))) != grew {
		t.Fatalf("an append of %d bytes uploaded %.0f bytes (delta object %d bytes); want the append only", grew, got, len(g.srv.Get("bkt", deltas[0])))
	}
	g.restoresExactly("base + delta")

	// A second, smaller append: a second delta (not merged: the first is
	// more than twice as large).
	grew2 := g.add(100)
	g.wait()
	if _, deltas = g.objects("agents/jd/"); len(deltas) != 2 {
		t.Fatalf("after a second append of %d bytes: deltas %v, want 2", grew2, deltas)
	}
	g.restoresExactly("base + 2 deltas")

	// A compaction replaces the file: a new base of the compacted journal.
	v := g.j.Version()
	before = g.uploadedBytes()
	g.j.Compact()
	waitFor(t, func() bool { return g.j.Version() > v })
	g.wait()
	compacted := int64(len(g.durable()))
	bases, deltas = g.objects("agents/jd/")
	if len(bases) != 1 || len(deltas) != 0 {
		t.Fatalf("after a compaction: bases %v, deltas %v; want one new base, the old chain deleted", bases, deltas)
	}
	if got := g.uploadedBytes() - before; got != float64(compacted) {
		t.Fatalf("after a compaction to %d bytes: %.0f bytes uploaded, want the new base", compacted, got)
	}
	g.restoresExactly("the compacted base")
	g.add(500)
	g.wait()
	g.restoresExactly("the compacted base + a delta")

	// A restart continues the chain without uploading it again.
	g.r.Close(5 * time.Second)
	g.reg = prometheus.NewRegistry()
	g.start()
	grew = g.add(300)
	g.wait()
	if got := g.uploadedBytes(); got > float64(2*grew)+4096 {
		t.Fatalf("after a restart, an append of %d bytes uploaded %.0f bytes: the chain was not continued", grew, got)
	}
	g.restoresExactly("after a restart")
}

// TestJournalDeltaFaults: a delta missing from the bucket or damaged is
// found by the restore, which restores the journal up to it — the base and
// the deltas before it, exactly those bytes, never a journal with a hole —
// and says so (Result.RequestsJournalIncomplete).
func TestJournalDeltaFaults(t *testing.T) {
	g := newJournalRig(t, "agents/jf")
	for range 8 {
		g.add(8 << 10)
	}
	g.start()
	g.wait()
	base := len(g.durable())
	g.add(4000)
	g.wait()
	first := len(g.durable())
	g.add(1000) // less than half the first delta: not merged with it
	g.wait()
	all := g.durable()
	g.r.Close(5 * time.Second)
	_, deltas := g.objects("agents/jf/")
	if len(deltas) != 2 {
		t.Fatalf("deltas %v, want 2", deltas)
	}
	g.restoresExactly("intact")

	// The second delta damaged: the base and the first delta.
	b := g.srv.Get("bkt", deltas[1])
	b[len(b)/2] ^= 0xff
	g.srv.Put("bkt", deltas[1], b)
	got, res := g.restore()
	if !bytes.Equal(got, all[:first]) || !strings.Contains(res.RequestsJournalIncomplete, "SHA-256") {
		t.Fatalf("second delta damaged: restored %d bytes, want the first %d; %q", len(got), first, res.RequestsJournalIncomplete)
	}

	// The first delta deleted: the base alone (the second follows a gap).
	if err := g.srv.Client().RemoveObject(context.Background(), "bkt", deltas[0], minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	got, res = g.restore()
	if !bytes.Equal(got, all[:base]) || !strings.Contains(res.RequestsJournalIncomplete, "missing") {
		t.Fatalf("first delta deleted: restored %d bytes, want the base's %d; %q", len(got), base, res.RequestsJournalIncomplete)
	}
	t.Logf("incomplete journal reported as: %s", res.RequestsJournalIncomplete)
}

// TestJournalUploadProportional: with a large journal (16 MiB;
// JOURNAL_TEST_MIB=64 for the default --request-journal-bytes), each small
// append costs an upload of about its own size — deltas, merged now and then
// — not the journal: the figure is the bytes uploaded per byte appended,
// and the chain a restore downloads stays short.
func TestJournalUploadProportional(t *testing.T) {
	g := newJournalRig(t, "agents/jp")
	mib := 16
	if n, err := strconv.Atoi(os.Getenv("JOURNAL_TEST_MIB")); err == nil && n > 0 {
		mib = n
	}
	for range mib {
		g.add(1<<20 - 1024)
	}
	size := len(g.durable())
	g.start()
	g.wait()
	before := g.uploadedBytes()
	var appended int64
	const changes = 100
	for range changes {
		appended += g.add(1000)
		g.wait()
	}
	uploaded := g.uploadedBytes() - before
	bases, deltas := g.objects("agents/jp/")
	t.Logf("journal %d bytes; %d changes appended %d bytes and uploaded %.0f (%.2f bytes per byte appended, %.0f per change; "+
		"a whole upload per change would be %d); chain: %d base, %d deltas",
		size, changes, appended, uploaded, uploaded/float64(appended), uploaded/changes, size, len(bases), len(deltas))
	if uploaded > 8*float64(appended) || len(bases) != 1 || len(deltas) > 10 {
		t.Fatalf("uploads not proportional to the change: %.0f bytes for %d appended; chain %d deltas", uploaded, appended, len(deltas))
	}
	g.restoresExactly("after 100 deltas")
}

// TestJournalOnlyRestore: an agent that never logs nor checkpoints leaves a
// replica holding only the request journal; a restore takes it alone (no
// WAL, no checkpoint written) and says so.
func TestJournalOnlyRestore(t *testing.T) {
	srv, c := setup(t, "agents/jo")
	g := openJournalRig(t, srv, c, t.TempDir(), false)
	g.add(2000)
	g.start()
	g.wait()
	g.add(100)
	g.wait()
	g.r.Close(5 * time.Second)
	inv, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum := inv.Summary(); len(sum) != 1 || !sum[0].Default || !sum[0].RequestsJournalOnly || sum[0].NotRestorable != "" {
		t.Fatalf("replica list: %+v; want the generation the default, journal only", sum)
	}
	b, res := g.restore()
	if !bytes.Equal(b, g.durable()) || !res.RequestsJournalOnly || res.Entries != 0 || res.CheckpointID != "" {
		t.Fatalf("journal-only restore: %d bytes (want %d), %+v", len(b), len(g.durable()), res)
	}
	if _, err := c.Restore(context.Background(), filepath.Join(t.TempDir(), "x"), replica.Target{Sequence: 5}, nil); !errors.Is(err, replica.ErrNoTarget) {
		t.Fatalf("a sequence of a journal-only replica: %v, want ErrNoTarget", err)
	}
}

// TestJournalOnlyGenerationNeverWinsOverState: node A replicates agent
// state and its journal; node B restores it, starts its own generation,
// and is lost after its journal was uploaded but before any of its
// checkpoints or WAL (the store refused them). B's generation is newer and
// holds a journal, yet a restore takes A's: a journal alone never outweighs
// agent state (the fresh-node data loss stays fixed).
func TestJournalOnlyGenerationNeverWinsOverState(t *testing.T) {
	srv, c := setup(t, "agents/js")
	a := openJournalRig(t, srv, c, t.TempDir(), true)
	a.add(3000)
	a.d.append(2, 40)
	a.d.checkpoint()
	a.start()
	a.wait()
	a.r.Close(5 * time.Second)
	genA := a.r.Status().Generation
	aJournal := a.durable()

	dirB := filepath.Join(t.TempDir(), "b")
	if _, err := c.Restore(context.Background(), dirB, replica.Target{}, nil); err != nil {
		t.Fatal(err)
	}
	proxy := miniotest.StartProxy(t, srv)
	proxy.Set(func(r *http.Request) miniotest.Fault {
		if r.Method == http.MethodPut && (strings.Contains(r.URL.Path, "/checkpoints/") || strings.Contains(r.URL.Path, "/wal/")) {
			return miniotest.Full
		}
		return miniotest.Pass
	})
	b := openJournalRig(t, srv, clientAt(t, proxy.Endpoint(), "agents/js"), dirB, false)
	b.add(500)
	b.start()
	waitFor(t, func() bool {
		js := b.r.Status().RequestsJournal
		return js != nil && js.LagWrites == 0 && js.Bytes == int64(len(b.durable()))
	})
	genB := b.r.Status().Generation
	b.r.Close(100 * time.Millisecond) // the node is lost
	if genB == "" || genB == genA {
		t.Fatalf("B's generation %q (A's %s)", genB, genA)
	}

	inv, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Generations) != 2 || inv.Generations[0].ID != genB || len(inv.Generations[0].Files[replica.JournalFile]) != 1 {
		t.Fatalf("generations %v; want B's %s newest, holding its journal", summaryIDs(inv), genB)
	}
	got, res := a.restore()
	if res.Generation != genA || res.RequestsJournalOnly || res.CheckpointID == "" || !bytes.Equal(got, aJournal) {
		t.Fatalf("restore took %s (journal only %v, checkpoint %q, journal %d bytes); want A's %s with its state and journal (%d bytes)",
			res.Generation, res.RequestsJournalOnly, res.CheckpointID, len(got), genA, len(aJournal))
	}
	if len(res.SkippedGenerations) != 1 || res.SkippedGenerations[0].ID != genB {
		t.Fatalf("skipped %+v, want B's %s", res.SkippedGenerations, genB)
	}
}
