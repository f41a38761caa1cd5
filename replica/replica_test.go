package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/replica/miniotest"
	"github.com/agent-sidecar/supervisor/wal"
)

// dataDir is a data directory a test writes like the supervisor does.
type dataDir struct {
	t    testing.TB
	dir  string
	wal  *wal.Log
	ckpt *checkpoint.Store
	mu   sync.RWMutex // the supervisor's truncation lock
}

func openDataDir(t testing.TB, dir string) *dataDir {
	t.Helper()
	ck, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{Retain: 2})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), NoPreallocate: true, SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	d := &dataDir{t: t, dir: dir, wal: w, ckpt: ck}
	t.Cleanup(func() { w.Close() })
	return d
}

func entryData(seq uint64) []byte {
	return []byte(fmt.Sprintf("entry-%d-%s", seq, strings.Repeat("x", int(seq%50))))
}

func (d *dataDir) append(from, to uint64) {
	d.t.Helper()
	for s := from; s <= to; s++ {
		if _, err := d.wal.Append(wal.Entry{Sequence: s, Data: entryData(s)}); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := d.wal.Sync(); err != nil {
		d.t.Fatal(err)
	}
}

// checkpoint stores one at the WAL's last sequence and applies retention
// as the supervisor does.
func (d *dataDir) checkpoint() checkpoint.Meta {
	d.t.Helper()
	wm := d.wal.LastSequence()
	m, err := d.ckpt.Save([]byte(fmt.Sprintf("state-through-%d", wm)), wm)
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.ckpt.Prune(); err != nil {
		d.t.Fatal(err)
	}
	if old, ok := d.ckpt.OldestRetainedWatermark(); ok {
		d.mu.Lock()
		_, err = d.wal.TruncateBefore(old)
		d.mu.Unlock()
		if err != nil {
			d.t.Fatal(err)
		}
	}
	return m
}

func (d *dataDir) local() replica.Local {
	return replica.Local{DataDir: d.dir, WAL: d.wal, Checkpoints: d.ckpt,
		HoldTruncation: func() func() { d.mu.RLock(); return d.mu.RUnlock }}
}

// setup starts MinIO with a bucket "bkt" and opens a client on prefix in it.
func setup(t testing.TB, prefix string) (*miniotest.Server, *replica.Client) {
	t.Helper()
	srv := miniotest.Start(t)
	srv.MakeBucket("bkt")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	loc, err := replica.ParseURL("s3://bkt/"+prefix, srv.Endpoint(), "us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := replica.Open(loc)
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func waitUploaded(t testing.TB, r *replica.Replicator, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for r.Status().UploadedSequence < seq {
		if time.Now().After(deadline) {
			t.Fatalf("replica did not reach sequence %d: %+v", seq, r.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readBack lists what a restored data directory holds: its checkpoint's
// watermark and every WAL entry.
func readBack(t testing.TB, dir string) (wm uint64, entries []wal.Entry, floor uint64) {
	t.Helper()
	ck, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m, _, _, err := ck.Latest(); err == nil {
		wm = m.Watermark
	}
	w, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), NoPreallocate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.ReadAfter(0, func(e wal.Entry) error {
		entries = append(entries, wal.Entry{Sequence: e.Sequence, Data: bytes.Clone(e.Data)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return wm, entries, w.Floor()
}

// checkRestore asserts the restore is the checkpoint at wm plus every entry
// after it through last, byte for byte, with no gap.
func checkRestore(t testing.TB, dir string, wantWM, last uint64) {
	t.Helper()
	wm, entries, floor := readBack(t, dir)
	if wm != wantWM || floor != wm {
		t.Fatalf("restored checkpoint watermark %d (WAL floor %d), want %d", wm, floor, wantWM)
	}
	if uint64(len(entries)) != last-wm {
		t.Fatalf("restored %d entries after %d, want %d (through %d)", len(entries), wm, last-wm, last)
	}
	for i, e := range entries {
		if e.Sequence != wm+1+uint64(i) || !bytes.Equal(e.Data, entryData(e.Sequence)) {
			t.Fatalf("entry %d: sequence %d %q", i, e.Sequence, e.Data)
		}
	}
}

func TestReplicateAndRestore(t *testing.T) {
	srv, c := setup(t, "agents/a1")
	d := openDataDir(t, t.TempDir())
	d.append(1, 40)
	cp1 := d.checkpoint()
	d.append(41, 100)
	reg := prometheus.NewRegistry()
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond, Registerer: reg})
	r.Start()
	defer r.Close(5 * time.Second)
	waitUploaded(t, r, 100)
	if st := r.Status(); st.Checkpoints != 1 || st.LagEntries != 0 || st.Generation == "" {
		t.Fatalf("status %+v", st)
	}

	// Newest state: the checkpoint plus every entry after it.
	out := filepath.Join(t.TempDir(), "restored")
	res, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.CheckpointID != cp1.ID || res.LastSequence != 100 {
		t.Fatalf("restore %+v", res)
	}
	checkRestore(t, out, 40, 100)

	// Point in time: up to sequence 70 exactly.
	out = filepath.Join(t.TempDir(), "pitr")
	if _, err := c.Restore(context.Background(), out, replica.Target{Sequence: 70}, nil); err != nil {
		t.Fatal(err)
	}
	checkRestore(t, out, 40, 70)

	// As the replica was at a time: before the next entries, the state at 100.
	at := time.Now()
	time.Sleep(5 * time.Millisecond) // chunk times are in milliseconds
	d.append(101, 120)
	waitUploaded(t, r, 120)
	out = filepath.Join(t.TempDir(), "time")
	if _, err := c.Restore(context.Background(), out, replica.Target{Time: at}, nil); err != nil {
		t.Fatal(err)
	}
	checkRestore(t, out, 40, 100)
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("metrics lint: %v %v", err, problems)
	}

	// An idle data directory costs no requests.
	before := testutil.ToFloat64(counter(t, reg, "supervisor_replica_uploaded_objects_total"))
	time.Sleep(300 * time.Millisecond) // six sync intervals with nothing new
	if after := testutil.ToFloat64(counter(t, reg, "supervisor_replica_uploaded_objects_total")); after != before {
		t.Fatalf("idle: %v objects uploaded", after-before)
	}

	// A busy one batches: 200 entries in a few chunks, not 200.
	d.append(121, 300)
	waitUploaded(t, r, 300)
	chunks := 0
	for _, k := range srv.Keys("bkt", "agents/a1/") {
		if strings.HasSuffix(k, ".chunk") {
			chunks++
		}
	}
	if chunks > 10 {
		t.Fatalf("%d chunks for 300 entries in two bursts: not batched", chunks)
	}
}

func counter(t testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return constCollector{v: mf.GetMetric()[0].GetCounter().GetValue(), name: name}
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

type constCollector struct {
	v    float64
	name string
}

func (c constCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc(c.name, "x", nil, nil)
}

func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "x", nil, nil), prometheus.CounterValue, c.v)
}

// A restart on the same data directory continues its generation without
// uploading again what the bucket holds (only a claim that it writes it).
func TestResumeSameGeneration(t *testing.T) {
	srv, c := setup(t, "agents/a1")
	d := openDataDir(t, t.TempDir())
	d.append(1, 30)
	d.checkpoint()
	d.append(31, 60)
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitUploaded(t, r, 60)
	gen := r.Status().Generation
	r.Close(5 * time.Second)

	reg := prometheus.NewRegistry()
	r2 := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond, Registerer: reg})
	r2.Start()
	defer r2.Close(5 * time.Second)
	waitFor(t, func() bool { return r2.Status().State == "ok" })
	if st := r2.Status(); st.Generation != gen || st.UploadedSequence != 60 {
		t.Fatalf("after restart: %+v, want generation %s at 60", st, gen)
	}
	// Nothing again but the restart's owner claim (a small JSON object).
	if n := testutil.ToFloat64(counter(t, reg, "supervisor_replica_uploaded_objects_total")); n != 1 {
		t.Fatalf("restart uploaded %v objects, want only its owner claim", n)
	}
	claims := 0
	for _, k := range srv.Keys("bkt", "agents/a1/") {
		if strings.Contains(k, "/owners/") {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("%d owner claims after a restart; the older one is deleted", claims)
	}
	d.append(61, 70)
	waitUploaded(t, r2, 70)
	if st := r2.Status(); st.Generation != gen {
		t.Fatalf("generation changed: %+v", st)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Local retention deletes WAL entries the replica never got (the server
// was down): the replica continues from the newest checkpoint and never
// offers a restore across the gap.
func TestGapAfterLocalRetention(t *testing.T) {
	srv, c := setup(t, "agents/a1")
	d := openDataDir(t, t.TempDir())
	d.append(1, 20)
	d.checkpoint()
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	defer r.Close(5 * time.Second)
	waitUploaded(t, r, 20)

	srv.Stop()
	// While it is down: many entries, checkpoints, retention (Retain 2).
	for i := 0; i < 4; i++ {
		d.append(d.wal.LastSequence()+1, d.wal.LastSequence()+200)
		d.checkpoint()
	}
	d.append(d.wal.LastSequence()+1, d.wal.LastSequence()+10)
	last := d.wal.LastSequence()
	floor := d.wal.Floor()
	if floor <= 20 {
		t.Fatalf("test setup: retention kept everything (floor %d)", floor)
	}
	waitFor(t, func() bool { return r.Status().LastErrorKind == "network" })
	srv.Restart()
	waitUploaded(t, r, last)
	// The bucket follows local retention: the checkpoints pruned locally
	// (Retain 2) are gone from it, and so are the chunks no kept one needs.
	local, _ := d.ckpt.List()
	oldest := local[len(local)-1].Watermark
	waitFor(t, func() bool {
		var ckpts, stale int
		for _, k := range srv.Keys("bkt", "agents/a1/") {
			switch {
			case strings.HasSuffix(k, ".ckpt"):
				ckpts++
			case strings.HasSuffix(k, ".chunk") && strings.Contains(k, "/wal/"):
				parts := strings.Split(k[strings.LastIndex(k, "/")+1:], "-")
				if last, _ := strconv.ParseUint(parts[1], 16, 64); last <= oldest {
					stale++
				}
			}
		}
		return ckpts == len(local) && stale == 0
	})

	// The newest restore: a retained checkpoint and everything after it.
	out := filepath.Join(t.TempDir(), "r")
	res, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.LastSequence != last || res.Watermark < floor {
		t.Fatalf("restore %+v; want through %d from a checkpoint at or above %d", res, last, floor)
	}
	checkRestore(t, out, res.Watermark, last)
	// A point inside the gap cannot be restored without one: refused.
	_, err = c.Restore(context.Background(), filepath.Join(t.TempDir(), "gap"), replica.Target{Sequence: 100}, nil)
	if !errors.Is(err, replica.ErrNoTarget) {
		t.Fatalf("restore inside the gap: %v, want ErrNoTarget", err)
	}
}

// A corrupted object is detected by its checksum and never served.
func TestCorruptChunkNeverServed(t *testing.T) {
	srv, c := setup(t, "agents/a1")
	d := openDataDir(t, t.TempDir())
	d.append(1, 10)
	d.checkpoint()
	d.append(11, 50)
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitUploaded(t, r, 50)
	r.Close(5 * time.Second)
	var chunk string
	for _, k := range srv.Keys("bkt", "agents/a1/") {
		if strings.HasSuffix(k, ".chunk") {
			chunk = k
		}
	}
	b := srv.Get("bkt", chunk)
	b[len(b)-1] ^= 0xff
	srv.Put("bkt", chunk, b)
	out := filepath.Join(t.TempDir(), "r")
	_, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if !errors.Is(err, replica.ErrCorrupt) || !strings.Contains(err.Error(), chunk[len("agents/a1/"):]) {
		t.Fatalf("restore of a corrupted chunk: %v; want ErrCorrupt naming it", err)
	}
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Fatalf("a failed restore left %v in the data directory", es)
	}
}

func TestWrongCredentialsAndMissingBucket(t *testing.T) {
	srv, _ := setup(t, "agents/a1")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
	loc, _ := replica.ParseURL("s3://bkt/x", srv.Endpoint(), "")
	c, _ := replica.Open(loc)
	if err := c.Check(context.Background()); !errors.Is(err, replica.ErrAuth) || replica.Kind(err) != "auth" {
		t.Fatalf("wrong secret: %v", err)
	}
	// No credentials anywhere: unsigned requests, refused, and the error
	// says where credentials come from (the EC2 metadata endpoint is never
	// asked, so this does not wait for it).
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "missing"))
	c, _ = replica.Open(loc)
	if err := c.Check(context.Background()); !errors.Is(err, replica.ErrAuth) || !strings.Contains(err.Error(), "no credentials were found") {
		t.Fatalf("no credentials: %v", err)
	}
	// The shared credentials file, profile AWS_PROFILE.
	file := filepath.Join(t.TempDir(), "credentials")
	os.WriteFile(file, []byte("[other]\naws_access_key_id = "+miniotest.AccessKey+"\naws_secret_access_key = "+miniotest.SecretKey+"\n"), 0o600)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
	t.Setenv("AWS_PROFILE", "other")
	c, _ = replica.Open(loc)
	if err := c.Check(context.Background()); err != nil {
		t.Fatalf("credentials from the shared file: %v", err)
	}
	loc, _ = replica.ParseURL("s3://nobucket/x", srv.Endpoint(), "")
	c, _ = replica.Open(loc)
	if err := c.Check(context.Background()); !errors.Is(err, replica.ErrBucket) || !strings.Contains(err.Error(), "nobucket") {
		t.Fatalf("missing bucket: %v", err)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url, endpoint  string
		bucket, prefix string
		bad            bool
	}{
		{url: "s3://b/p/q", bucket: "b", prefix: "p/q"},
		{url: "s3://b", bucket: "b"},
		{url: "s3://b/p/", endpoint: "http://127.0.0.1:9000", bucket: "b", prefix: "p"},
		{url: "http://b/p", bad: true},
		{url: "s3:///p", bad: true},
		{url: "s3://b/p", endpoint: "ftp://x", bad: true},
		{url: "s3://b/p", endpoint: "http://x/path", bad: true},
		{url: "s3://b/a//c", bad: true},
	} {
		loc, err := replica.ParseURL(tc.url, tc.endpoint, "")
		if tc.bad {
			if !errors.Is(err, replica.ErrBadURL) {
				t.Errorf("%s %s: %v, want ErrBadURL", tc.url, tc.endpoint, err)
			}
			continue
		}
		if err != nil || loc.Bucket != tc.bucket || loc.Prefix != tc.prefix {
			t.Errorf("%s: %+v %v", tc.url, loc, err)
		}
	}
}

// A fresh volume mounted as the data directory has lost+found: it is still
// empty, so a start with --replica restores it.
func TestIsEmptyDataDir(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"LOCK", "lost+found", ".replica-restore"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := replica.IsEmptyDataDir(dir); !ok || err != nil {
		t.Fatalf("LOCK, lost+found and a staging dir: empty %v %v", ok, err)
	}
	if ok, _ := replica.IsEmptyDataDir(filepath.Join(dir, "missing")); !ok {
		t.Fatal("a missing directory is empty")
	}
	if err := os.Mkdir(filepath.Join(dir, "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	if ok, _ := replica.IsEmptyDataDir(dir); ok {
		t.Fatal("a directory with a WAL is not empty")
	}
}

// A corrupted checkpoint is passed over for an older one that reaches as
// far (its WAL tail is in the replica), and it is never served.
func TestCorruptCheckpointPassedOver(t *testing.T) {
	srv, c := setup(t, "agents/a1")
	d := openDataDir(t, t.TempDir())
	d.append(1, 10)
	older := d.checkpoint()
	d.append(11, 20)
	newer := d.checkpoint()
	d.append(21, 30)
	r := replica.New(c, d.local(), replica.Options{SyncInterval: 50 * time.Millisecond})
	r.Start()
	waitUploaded(t, r, 30)
	waitFor(t, func() bool { return r.Status().Checkpoints == 2 })
	r.Close(5 * time.Second)
	corrupt := func(id string) string {
		for _, k := range srv.Keys("bkt", "agents/a1/") {
			if strings.Contains(k, id) {
				b := srv.Get("bkt", k)
				b[len(b)-3] ^= 0x10
				srv.Put("bkt", k, b)
				return k
			}
		}
		t.Fatalf("no object for checkpoint %s", id)
		return ""
	}
	corrupt(newer.ID)
	out := filepath.Join(t.TempDir(), "r")
	res, err := c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.CheckpointID != older.ID || res.LastSequence != 30 || len(res.Skipped) != 1 || res.Skipped[0] != newer.ID {
		t.Fatalf("restore %+v; want the older checkpoint through 30, the newer skipped", res)
	}
	checkRestore(t, out, 10, 30)

	// Both corrupt: this generation's WAL still starts at the beginning, so
	// the complete history without a checkpoint is a restore too.
	corrupt(older.ID)
	out = filepath.Join(t.TempDir(), "r2")
	res, err = c.Restore(context.Background(), out, replica.Target{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.CheckpointID != "" || res.LastSequence != 30 || len(res.Skipped) != 2 {
		t.Fatalf("restore %+v; want no checkpoint and every entry through 30", res)
	}
	checkRestore(t, out, 0, 30)
}
