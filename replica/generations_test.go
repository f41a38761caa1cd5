package replica_test

// Issue 33: generations that hold nothing restorable, a copied data
// directory, a foreign object among the chunks, a store that hangs or is
// full.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/replica/miniotest"
	"github.com/agent-sidecar/supervisor/wal"
)

// clientAt opens a client for prefix in bucket "bkt" through endpoint.
func clientAt(t testing.TB, endpoint, prefix string) *replica.Client {
	t.Helper()
	loc, err := replica.ParseURL("s3://bkt/"+prefix, endpoint, "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := replica.Open(loc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// isCheckpointPut: an upload of a checkpoint object.
func isCheckpointPut(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/checkpoints/")
}

// replicateAll writes 100 entries with a checkpoint at 40 and replicates
// them; it returns the generation.
func replicateAll(t *testing.T, c *replica.Client, dir string) string {
	t.Helper()
	d := openDataDir(t, dir)
	d.append(1, 40)
	d.checkpoint()
	d.append(41, 100)
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitUploaded(t, r, 100)
	gen := r.Status().Generation
	r.Close(5 * time.Second)
	d.wal.Close()
	return gen
}

// A node restores the replica, starts a generation of its own, and is lost
// before its first checkpoint upload: killed while it hangs, or refused
// because the store is full. A third node's restore passes that generation
// over (and says so) and restores everything the first one replicated;
// `replica list` marks it skipped. The refused upload counts as
// kind="full", not "network".
func TestGenerationWithNothingIsSkipped(t *testing.T) {
	for _, fault := range []miniotest.Fault{miniotest.Hang, miniotest.Full} {
		name := map[miniotest.Fault]string{miniotest.Hang: "killed-before-upload", miniotest.Full: "upload-refused"}[fault]
		t.Run(name, func(t *testing.T) {
			srv, c := setup(t, "agents/a")
			genA := replicateAll(t, c, t.TempDir())

			// Node B: restored from A, its checkpoint uploads never land.
			dirB := filepath.Join(t.TempDir(), "b")
			if _, err := c.Restore(context.Background(), dirB, replica.Target{}, nil); err != nil {
				t.Fatal(err)
			}
			proxy := miniotest.StartProxy(t, srv)
			proxy.Set(func(r *http.Request) miniotest.Fault {
				if isCheckpointPut(r) {
					return fault
				}
				return miniotest.Pass
			})
			d := openDataDir(t, dirB)
			d.append(101, 110) // acknowledged locally, never uploaded: the lag
			reg := prometheus.NewRegistry()
			r := replica.New(clientAt(t, proxy.Endpoint(), "agents/a"), d.local(),
				replica.Options{SyncInterval: 50 * time.Millisecond, Registerer: reg})
			r.Start()
			waitFor(t, func() bool { return r.Status().Generation != "" && r.Status().Generation != genA })
			genB := r.Status().Generation
			if fault == miniotest.Full {
				waitFor(t, func() bool { return r.Status().LastErrorKind == "full" })
				if n := testutil.ToFloat64(errorsOfKind(t, reg, "full")); n < 1 {
					t.Fatalf("errors_total{kind=\"full\"} = %v", n)
				}
				if st := r.Status(); !strings.Contains(st.LastError, "XMinioStorageFull") || !strings.Contains(st.LastError, "free space") {
					t.Fatalf("last error %q", st.LastError)
				}
			}
			r.Close(100 * time.Millisecond) // the node is lost
			d.wal.Close()

			var logs strings.Builder
			log := slogTo(&logs)
			inv, err := c.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Generations) != 2 || inv.Generations[0].ID != genB {
				t.Fatalf("generations %v, want B's %s newest", summaryIDs(inv), genB)
			}
			sum := inv.Summary()
			if sum[0].Default || sum[0].NotRestorable == "" || sum[0].RestorableTo != nil || !sum[1].Default {
				t.Fatalf("replica list: %+v", sum)
			}
			if sum[0].Parent == nil || sum[0].Parent.Generation != genA || sum[0].Parent.Sequence != 100 {
				t.Fatalf("B's generation records parent %+v, want %s at 100", sum[0].Parent, genA)
			}
			out := filepath.Join(t.TempDir(), "c")
			res, err := c.Restore(context.Background(), out, replica.Target{}, log)
			if err != nil {
				t.Fatalf("restore on a new node: %v", err)
			}
			if res.Generation != genA || len(res.SkippedGenerations) != 1 || res.SkippedGenerations[0].ID != genB {
				t.Fatalf("restore %+v; want A's generation, B's skipped", res)
			}
			checkRestore(t, out, 40, 100)
			if !strings.Contains(logs.String(), "passed over") || !strings.Contains(logs.String(), genB) {
				t.Fatalf("the skipped generation is not logged:\n%s", logs.String())
			}
		})
	}
}

// A node restores the replica (A's 100 entries, checkpoint at 40), starts
// a generation of its own, uploads its checkpoint, and is lost while the
// WAL above it is in flight: its generation is the newest and restorable,
// to 40 only, while A still holds 41..100. A third node's restore takes A's
// history through 100 (where B began), says why, and `replica list` marks
// A as the default; a restore to a sequence B itself holds is served from
// B.
func TestGenerationBehindItsParentHandsOver(t *testing.T) {
	srv, c := setup(t, "agents/r")
	genA := replicateAll(t, c, t.TempDir())
	dirB := filepath.Join(t.TempDir(), "b")
	if res, err := c.Restore(context.Background(), dirB, replica.Target{}, nil); err != nil || res.LastSequence != 100 {
		t.Fatalf("restore B: %+v %v", res, err)
	}
	proxy := miniotest.StartProxy(t, srv)
	proxy.Set(func(r *http.Request) miniotest.Fault {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/wal/") {
			return miniotest.Hang // lost while its first chunk is in flight
		}
		return miniotest.Pass
	})
	d := openDataDir(t, dirB)
	r := replica.New(clientAt(t, proxy.Endpoint(), "agents/r"), d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitFor(t, func() bool {
		st := r.Status()
		return st.Generation != "" && st.Generation != genA && st.Checkpoints == 1
	})
	genB := r.Status().Generation
	r.Close(50 * time.Millisecond) // the node is lost
	d.wal.Close()

	inv, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Generations) != 2 || inv.Generations[0].ID != genB {
		t.Fatalf("generations %v, want B's %s newest", summaryIDs(inv), genB)
	}
	if last, ok := inv.Generations[0].Restorable(); !ok || last != 40 {
		t.Fatalf("B's generation restorable to %d (%v), want its checkpoint's 40", last, ok)
	}
	if sum := inv.Summary(); sum[0].Default || !sum[1].Default || !strings.Contains(sum[0].PassedOver, "through sequence 100") {
		t.Fatalf("replica list marks %+v default, want A's", sum)
	}
	var logs strings.Builder
	out := filepath.Join(t.TempDir(), "c")
	res, err := c.Restore(context.Background(), out, replica.Target{}, slogTo(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if res.Generation != genA || res.LastSequence != 100 || len(res.SkippedGenerations) != 1 ||
		res.SkippedGenerations[0].ID != genB || res.SkippedGenerations[0].Parent != genA {
		t.Fatalf("restore after B was lost: %+v; want A's generation through 100 (entries 41..100 were replicated), B passed over for its parent", res)
	}
	checkRestore(t, out, 40, 100)
	if !strings.Contains(logs.String(), "behind the restore it began from") || !strings.Contains(logs.String(), genB) {
		t.Fatalf("the hand-over is not logged:\n%s", logs.String())
	}
	out = filepath.Join(t.TempDir(), "d")
	if res, err := c.Restore(context.Background(), out, replica.Target{Sequence: 40}, nil); err != nil || res.Generation != genB || len(res.SkippedGenerations) != 0 {
		t.Fatalf("restore to 40, which B holds: %+v %v; want B's generation", res, err)
	}
}

func summaryIDs(inv *replica.Inventory) []string {
	var ids []string
	for _, g := range inv.Generations {
		ids = append(ids, g.ID)
	}
	return ids
}

func errorsOfKind(t testing.TB, reg *prometheus.Registry, kind string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "supervisor_replica_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return constCollector{v: m.GetCounter().GetValue(), name: "errors"}
				}
			}
		}
	}
	t.Fatalf("no errors_total{kind=%q}", kind)
	return nil
}

// A replica whose only generations hold nothing is a fresh start
// (ErrEmpty); one whose generations hold data none of which can be restored
// is not (ErrNoTarget).
func TestEmptyGenerationsAreAFreshStart(t *testing.T) {
	srv, c := setup(t, "agents/e")
	proxy := miniotest.StartProxy(t, srv)
	proxy.Set(func(r *http.Request) miniotest.Fault {
		if isCheckpointPut(r) || (r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/wal/")) {
			return miniotest.Full
		}
		return miniotest.Pass
	})
	d := openDataDir(t, t.TempDir())
	d.append(1, 10)
	d.checkpoint()
	r := replica.New(clientAt(t, proxy.Endpoint(), "agents/e"), d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitFor(t, func() bool { return r.Status().LastErrorKind == "full" })
	r.Close(100 * time.Millisecond)
	_, err := c.Restore(context.Background(), filepath.Join(t.TempDir(), "r"), replica.Target{}, nil)
	if !errors.Is(err, replica.ErrEmpty) {
		t.Fatalf("restore of a replica whose one generation holds nothing: %v, want ErrEmpty", err)
	}
}

// A foreign 5-byte object named like a WAL chunk: the restore fails,
// naming it, and writes nothing — never an "empty" success.
func TestForeignObjectAmongChunks(t *testing.T) {
	srv, c := setup(t, "agents/f")
	gen := replicateAll(t, c, t.TempDir())
	body := []byte("hello")
	s := sha256.Sum256(body)
	key := fmt.Sprintf("agents/f/generations/%s/wal/%016x-%016x-%016x-%s.chunk", gen, 0, 5, time.Now().UnixMilli(), hex.EncodeToString(s[:]))
	srv.Put("bkt", key, body)
	out := filepath.Join(t.TempDir(), "r")
	res, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if err == nil || !strings.Contains(err.Error(), key[len("agents/f/"):]) {
		t.Fatalf("restore with a foreign object among the chunks: %+v %v; want an error naming it", res, err)
	}
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Fatalf("the failed restore left %d files", len(es))
	}
	inv, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum := inv.Summary(); !strings.Contains(sum[0].NotRestorable, key[len("agents/f/"):]) {
		t.Fatalf("replica list: %+v", sum[0])
	}
}

// The store accepts connections and never answers: the status stops saying
// "ok" and shows the lag growing.
func TestStatusWhenTheStoreHangs(t *testing.T) {
	srv, _ := setup(t, "agents/h")
	proxy := miniotest.StartProxy(t, srv)
	d := openDataDir(t, t.TempDir())
	d.append(1, 10)
	r := replica.New(clientAt(t, proxy.Endpoint(), "agents/h"), d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	defer r.Close(100 * time.Millisecond)
	waitUploaded(t, r, 10)
	proxy.Set(func(*http.Request) miniotest.Fault { return miniotest.Hang })
	d.append(11, 20)
	deadline := time.Now().Add(90 * time.Second)
	for r.Status().State != "stalled" {
		if st := r.Status(); time.Now().After(deadline) {
			t.Fatalf("the store hangs; status %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st := r.Status(); st.LagEntries != 10 || st.LagSeconds <= 0 || st.LastError == "" {
		t.Fatalf("stalled status %+v; want the lag (10 entries, seconds) and why", st)
	}
}

// A data directory copied while its supervisor runs, both copies writing
// with the same replica and retention deleting: the copy that claimed the
// generation last keeps it, the other finds the newer claim and starts its
// own; each generation then restores to its writer's last uploaded entry,
// with its writer's entries only.
func TestCopiedDataDirectory(t *testing.T) {
	_, c := setup(t, "agents/copy")
	opts := replica.Options{SyncInterval: 50 * time.Millisecond, OwnerCheckInterval: 100 * time.Millisecond}
	d1, r1, gen, d2 := runAndCopy(t, c, opts)
	defer r1.Close(time.Second)
	r2 := replica.New(c, d2.local(), opts)
	r2.Start()
	defer r2.Close(time.Second)
	waitFor(t, func() bool { return r2.Status().State == "ok" })
	if g := r2.Status().Generation; g != gen {
		t.Fatalf("the copy started %s, want it to continue %s (it holds everything the generation does)", g, gen)
	}
	// Both write their own entries, checkpoint and prune (Retain 2).
	for round := 0; round < 4; round++ {
		for _, x := range []struct {
			d   *dataDir
			tag string
		}{{d1, "one"}, {d2, "two"}} {
			from := x.d.wal.LastSequence() + 1
			x.d.appendTagged(from, from+24, x.tag)
			x.d.checkpoint()
			x.d.appendTagged(from+25, from+29, x.tag)
		}
		time.Sleep(150 * time.Millisecond) // let both upload between rounds
	}
	last := d1.wal.LastSequence() // both: 50 + 4×30
	waitFor(t, func() bool {
		s1, s2 := r1.Status(), r2.Status()
		return s1.UploadedSequence == last && s2.UploadedSequence == last && s1.Generation != gen && s2.Generation == gen
	})
	gen1 := r1.Status().Generation
	r1.Close(5 * time.Second)
	r2.Close(5 * time.Second)

	for _, x := range []struct{ gen, tag string }{{gen1, "one"}, {gen, "two"}} {
		out := filepath.Join(t.TempDir(), x.tag)
		res, err := c.Restore(context.Background(), out, replica.Target{Generation: x.gen}, nil)
		if err != nil {
			t.Fatalf("restore generation %s (%s): %v", x.gen, x.tag, err)
		}
		if res.LastSequence != last {
			t.Fatalf("generation %s (%s) restores to %d, want %d", x.gen, x.tag, res.LastSequence, last)
		}
		_, entries, _ := readBack(t, out)
		for _, e := range entries {
			if e.Sequence > 50 && !strings.HasSuffix(string(e.Data), "-"+x.tag) {
				t.Fatalf("generation %s (%s) holds entry %d %q of the other copy", x.gen, x.tag, e.Sequence, e.Data)
			}
		}
	}
}

// TestOriginalUploadsOnceMoreAfterTheCopyClaims: a copy ("two") of a
// running directory claims its generation; the original ("one"), whose
// last look at the claims came before that (every 10 s by default), uploads
// one more chunk into it while the copy uploads its own: for a moment the
// generation is forked. The original removes its chunk at its next look and
// starts a generation of its own; the copy keeps the generation. Before,
// the copy took the original's chunk for a fork at once and left too (both
// in new generations, the one they shared abandoned).
func TestOriginalUploadsOnceMoreAfterTheCopyClaims(t *testing.T) {
	_, c := setup(t, "agents/once-more")
	var logs1, logs2 strings.Builder
	d1, r1, gen, d2 := runAndCopy(t, c, replica.Options{SyncInterval: 50 * time.Millisecond, Logger: slogTo(&logs1)}) // looks every 10 s
	defer r1.Close(time.Second)
	r2 := startCopy(t, c, d2, gen, replica.Options{SyncInterval: 50 * time.Millisecond, OwnerCheckInterval: 100 * time.Millisecond, Logger: slogTo(&logs2)})
	defer r2.Close(time.Second)
	d1.appendTagged(51, 60, "one")
	waitUploaded(t, r1, 60)
	if g := r1.Status().Generation; g != gen {
		t.Skipf("the original looked at the claims before its upload (generation %s): no fork to test this time", g)
	}
	d2.appendTagged(51, 80, "two")
	waitUploaded(t, r2, 80)
	for deadline := time.Now().Add(40 * time.Second); r1.Status().Generation == gen; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("40 s on, the original still writes the generation the copy claimed")
		}
	}
	d2.appendTagged(81, 120, "two")
	waitUploaded(t, r2, 120)
	if st := r2.Status(); st.Generation != gen {
		t.Fatalf("the copy left the generation (now %s) while the original was still to remove its chunk:\n%s", st.Generation, logs2.String())
	}
	// The original's entries 51..60 may have gone up as one chunk or as
	// several (its sync ticks can fall between the appends).
	if !regexp.MustCompile(`own_objects_removed=[1-9]`).MatchString(logs1.String()) {
		t.Fatalf("the original did not remove the chunks it uploaded after the copy's claim:\n%s", logs1.String())
	}
	r1.Close(5 * time.Second)
	r2.Close(5 * time.Second)
	out := filepath.Join(t.TempDir(), "restored")
	res, err := c.Restore(context.Background(), out, replica.Target{Generation: gen}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.LastSequence != 120 {
		t.Fatalf("restore of %s: %+v; want the copy's entries through 120", gen, res)
	}
	_, entries, _ := readBack(t, out)
	for _, e := range entries {
		if e.Sequence > 50 && !strings.HasSuffix(string(e.Data), "-two") {
			t.Fatalf("the generation holds entry %d %q of the original", e.Sequence, e.Data)
		}
	}
}

// TestForkAfterTheCopyYielded: a copy ("two") of a running directory
// continues its generation and claims it; the original ("one"), whose last
// look at the claims is recent (the default 10 s interval), uploads one
// more chunk into it before it stops: the generation is forked after 50.
// "two" goes on writing; before, it kept uploading into the forked
// generation, its status said ok with no lag, and every restore stopped at
// 50. It now notices the fork at its next look at the claims, starts a
// generation of its own, and a restore reaches all of its 120 entries.
func TestForkAfterTheCopyYielded(t *testing.T) {
	_, c := setup(t, "agents/fork")
	d1, r1, gen, d2 := runAndCopy(t, c, replica.Options{SyncInterval: 50 * time.Millisecond}) // "one" looks every 10 s
	defer r1.Close(time.Second)
	var logs strings.Builder
	r2 := startCopy(t, c, d2, gen, replica.Options{SyncInterval: 50 * time.Millisecond, OwnerCheckInterval: 200 * time.Millisecond,
		ForkGrace: time.Second, Logger: slogTo(&logs)})
	defer r2.Close(time.Second)
	d1.appendTagged(51, 60, "one")
	waitUploaded(t, r1, 60) // into the generation "two" claimed: a fork after 50
	r1.Close(5 * time.Second)

	d2.appendTagged(51, 80, "two")
	d2.checkpoint()
	d2.appendTagged(81, 120, "two")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := r2.Status()
		if st.Generation != gen && st.UploadedSequence == 120 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, the copy still writes the forked generation %s (status %s, uploaded %d, lag %d): a restore of it stops at the fork, 50",
				st.Generation, st.State, st.UploadedSequence, st.LagEntries)
		}
	}
	r2.Close(5 * time.Second)
	if !strings.Contains(logs.String(), "another writer uploaded into this generation") {
		t.Fatalf("the fork is not logged:\n%s", logs.String())
	}
	out := filepath.Join(t.TempDir(), "restored")
	res, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.LastSequence != 120 || res.Generation == gen {
		t.Fatalf("restore: %+v; want two's own generation through 120", res)
	}
	_, entries, _ := readBack(t, out)
	for _, e := range entries {
		if e.Sequence > 50 && !strings.HasSuffix(string(e.Data), "-two") {
			t.Fatalf("the restore holds entry %d %q of the copy that yielded", e.Sequence, e.Data)
		}
	}
}

// A chunk the store kept while its answer was lost (the client saw 500 and
// retries the same key) is this run's own: the owner check that runs
// before the retry does not take it for another writer's and start a new
// generation.
func TestChunkStoredWithItsAnswerLostIsOurs(t *testing.T) {
	srv, _ := setup(t, "agents/lost")
	d := openDataDir(t, t.TempDir())
	d.append(1, 30)
	d.checkpoint()
	d.append(31, 50)
	proxy := miniotest.StartProxy(t, srv)
	var once sync.Once
	proxy.Set(func(r *http.Request) miniotest.Fault {
		f := miniotest.Pass
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/wal/") {
			once.Do(func() { f = miniotest.LoseAnswer })
		}
		return f
	})
	var logs strings.Builder
	r := replica.New(clientAt(t, proxy.Endpoint(), "agents/lost"), d.local(),
		replica.Options{SyncInterval: 50 * time.Millisecond, OwnerCheckInterval: time.Millisecond, Logger: slogTo(&logs)})
	r.Start()
	defer r.Close(time.Second)
	waitFor(t, func() bool { return r.Status().Generation != "" })
	gen := r.Status().Generation
	waitUploaded(t, r, 50)
	if g := r.Status().Generation; g != gen || strings.Contains(logs.String(), "another writer") {
		t.Fatalf("a chunk stored with its answer lost was taken for another writer's: generation %s, then %s\n%s", gen, g, logs.String())
	}
}

// runAndCopy runs directory "one" (entries 1..50, a checkpoint at 30)
// replicated with opts until all is uploaded, then copies it, as a volume
// clone would, into directory "two" (opened, not replicating yet).
func runAndCopy(t *testing.T, c *replica.Client, opts replica.Options) (d1 *dataDir, r1 *replica.Replicator, gen string, d2 *dataDir) {
	t.Helper()
	dir1 := filepath.Join(t.TempDir(), "one")
	d1 = openDataDir(t, dir1)
	d1.append(1, 30)
	d1.checkpoint()
	d1.append(31, 50)
	r1 = replica.New(c, d1.local(), opts)
	r1.Start()
	waitUploaded(t, r1, 50)
	gen = r1.Status().Generation
	dir2 := filepath.Join(t.TempDir(), "two")
	if out, err := exec.Command("cp", "-a", dir1, dir2).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v %s", err, out)
	}
	return d1, r1, gen, openDataDir(t, dir2)
}

// startCopy starts a replicator on the copy d2 made by runAndCopy and
// waits until it continues generation gen.
func startCopy(t *testing.T, c *replica.Client, d2 *dataDir, gen string, opts replica.Options) *replica.Replicator {
	t.Helper()
	r2 := replica.New(c, d2.local(), opts)
	r2.Start()
	waitFor(t, func() bool { return r2.Status().State == "ok" })
	if g := r2.Status().Generation; g != gen {
		r2.Close(time.Second)
		t.Fatalf("the copy started %s, want it to continue %s", g, gen)
	}
	return r2
}

func (d *dataDir) appendTagged(from, to uint64, tag string) {
	d.t.Helper()
	for s := from; s <= to; s++ {
		if _, err := d.wal.Append(wal.Entry{Sequence: s, Data: []byte(fmt.Sprintf("entry-%d-%s", s, tag))}); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := d.wal.Sync(); err != nil {
		d.t.Fatal(err)
	}
}

func slogTo(w *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedWriter{w: w}, nil))
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestLargeEvolutionLedgerReplicates: an evolution ledger over 16 MiB (17
// modules promoted with 1 MiB of code each, within its own 256 MiB bound)
// is uploaded and restored like a small one, and the checkpoints and WAL
// around it too. Before, every pass failed reading it ("larger than its
// limit") before anything else was uploaded: replication stopped for good.
func TestLargeEvolutionLedgerReplicates(t *testing.T) {
	if replica.MaxLedgerBytes != evolution.MaxLedgerSize {
		t.Fatalf("replica.MaxLedgerBytes %d, evolution.MaxLedgerSize %d: the replica must carry any ledger the supervisor keeps", replica.MaxLedgerBytes, evolution.MaxLedgerSize)
	}
	_, c := setup(t, "agents/ledger")
	dir := t.TempDir()
	d := openDataDir(t, dir)
	led, err := evolution.OpenLedger(filepath.Join(dir, "evolution.json"))
	if err != nil {
		t.Fatal(err)
	}
	code := strings.Repeat("x = 1\n", (1<<20)/6) // ~1 MiB: one evolution_intent's most
	for i := range 17 {
		if err := led.Record(evolution.Promotion{Module: fmt.Sprintf("mod%d", i), Code: code, Target: "t", Reason: "r"}); err != nil {
			t.Fatalf("record promotion %d: %v", i, err)
		}
	}
	ledger, err := os.ReadFile(filepath.Join(dir, "evolution.json"))
	if err != nil || len(ledger) <= 16<<20 {
		t.Fatalf("the ledger is %d bytes (%v), want over 16 MiB", len(ledger), err)
	}
	d.append(1, 40)
	d.checkpoint()
	d.append(41, 100)
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	defer r.Close(time.Second)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := r.Status()
		if st.UploadedSequence == 100 && st.Checkpoints == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, replication with a %d-byte ledger: %+v", len(ledger), st)
		}
	}
	r.Close(5 * time.Second)
	d.wal.Close()
	out := filepath.Join(t.TempDir(), "restored")
	if _, err := c.Restore(context.Background(), out, replica.Target{}, nil); err != nil {
		t.Fatal(err)
	}
	checkRestore(t, out, 40, 100)
	if got, err := os.ReadFile(filepath.Join(out, "evolution.json")); err != nil || !bytes.Equal(got, ledger) {
		t.Fatalf("the restored ledger is %d bytes (%v), want the %d uploaded", len(got), err, len(ledger))
	}
}

// TestBucketTextIsClipped: a generation description written by someone
// with the bucket's write access, naming a parent of 300 KB, is shown by
// `replica list` clipped, like its host name.
func TestBucketTextIsClipped(t *testing.T) {
	srv, c := setup(t, "agents/t")
	gen := "01a2299f-0000-7000-8000-000000000001"
	info, _ := json.Marshal(map[string]any{"id": gen, "created": time.Now().UTC(), "hostname": strings.Repeat("h", 300<<10),
		"parent": map[string]any{"generation": strings.Repeat("g", 300<<10), "sequence": 7, "checkpoint_id": strings.Repeat("c", 300<<10)}})
	s := sha256.Sum256(info)
	srv.Put("bkt", "agents/t/generations/"+gen+"/generation-"+hex.EncodeToString(s[:])+".json", info)
	inv, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sum := inv.Summary()
	if len(sum) != 1 || sum[0].Parent == nil {
		t.Fatalf("replica list: %+v", sum)
	}
	if p := sum[0].Parent; len(p.Generation) > 100 || len(p.CheckpointID) > 100 || len(sum[0].Hostname) > 100 || p.Sequence != 7 {
		t.Fatalf("replica list shows the bucket's text unclipped: parent %d and %d bytes, host %d bytes", len(p.Generation), len(p.CheckpointID), len(sum[0].Hostname))
	}
}
