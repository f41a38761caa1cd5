package test

// Issue 33 through the binary: a new node lost before its generation's
// first checkpoint upload, a foreign object among the chunks, a store that
// hangs, a copied data directory (SPEC §11).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/replica/miniotest"
)

// proxyFlags points a supervisor at prefix in bucket through a proxy.
func proxyFlags(p *miniotest.Proxy, bucket, prefix string) []string {
	return []string{"--replica", "s3://" + bucket + "/" + prefix, "--replica-endpoint", p.Endpoint(), "--replica-sync-interval", "200ms"}
}

// replicateNodeA runs node A: 200 entries, a checkpoint, 100 more, all
// replicated; then A is killed with SIGKILL and its data directory removed.
// It returns the entries A acknowledged.
func replicateNodeA(t *testing.T, flags, env []string) []uint64 {
	t.Helper()
	dirA := filepath.Join(t.TempDir(), "data")
	a := startSup(t, scripted(t, dirA, flags, env, plan{{"log": 200, "rate": 400}, {"checkpoint": true}, {"log": 100, "rate": 400}, {"stay": true}}))
	waitFor(t, 60*time.Second, "A's 300 entries replicated", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.UploadedSequence == 300 && rs.DurableSequence == 300
	})
	sentA := accepted(a.allEvents())
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.wait(10 * time.Second)
	os.RemoveAll(dirA)
	return sentA
}

// TestReplicaNewNodeLostBeforeFirstUpload: node A replicates 300 entries
// and a checkpoint and is killed with its data directory. Node B restores
// it, begins a generation of its own, accepts a request (its generation
// holds its request journal) and is lost before that generation's
// first checkpoint is in the bucket — killed with SIGKILL while the upload
// hangs, or after the store refused it as full (kind="full"). Node C on an
// empty directory passes B's generation over, says so, and restores
// everything A acknowledged; `replica list` marks B's generation skipped.
func TestReplicaNewNodeLostBeforeFirstUpload(t *testing.T) {
	for _, fault := range []miniotest.Fault{miniotest.Hang, miniotest.Full} {
		name := map[miniotest.Fault]string{miniotest.Hang: "killed", miniotest.Full: "refused"}[fault]
		t.Run(name, func(t *testing.T) {
			srv := miniotest.Start(t)
			srv.MakeBucket("state")
			flags := replicaFlags(srv, "state", "agents/a")
			env := append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1")
			sentA := replicateNodeA(t, flags, env)

			proxy := miniotest.StartProxy(t, srv)
			proxy.Set(func(r *http.Request) miniotest.Fault {
				if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/checkpoints/") {
					return fault
				}
				return miniotest.Pass
			})
			dirB := filepath.Join(t.TempDir(), "data")
			b := startSup(t, scripted(t, dirB, proxyFlags(proxy, "state", "agents/a"), env, plan{{"stay": true}}))
			if r := restored(t, b.waitEvents("start", 1, 60*time.Second)[0]); r == nil || r.LastSequence != 300 {
				t.Fatalf("B restored %+v, want A's 300", r)
			}
			b.waitOutput("replica: new generation", 60*time.Second)
			// A request accepted on B: B's generation holds its request
			// journal (uploaded before checkpoints in a pass), and still
			// never outweighs A's state.
			postRequest(t, b, "accepted on B")
			waitFor(t, 60*time.Second, "B's request journal replicated", func() bool {
				_, rs := statusOf(t, dirB)
				return rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
			})
			if fault == miniotest.Full {
				waitFor(t, 60*time.Second, `B's checkpoint upload refused as kind="full"`, func() bool {
					_, rs := statusOf(t, dirB)
					return rs.LastErrorKind == "full"
				})
				if n := b.metric("supervisor_replica_errors_total", `kind="full"`); n < 1 {
					t.Fatalf(`errors_total{kind="full"} = %v`, n)
				}
			}
			if err := b.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			b.wait(10 * time.Second)

			code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "list"}, flags[:4]...)...)
			if code != 0 || !strings.Contains(out, "nothing (skipped)") || !strings.Contains(out, "skipped by a restore") {
				t.Fatalf("replica list: exit %d\n%s%s", code, out, stderr)
			}
			dirC := filepath.Join(t.TempDir(), "data")
			c := startSup(t, scripted(t, dirC, flags, env, plan{{"stay": true}}))
			r := restored(t, c.waitEvents("start", 1, 60*time.Second)[0])
			if r == nil {
				t.Fatalf("node C started empty:\n%s", tail(c.out.String(), 30))
			}
			sameSeqs(t, "state restored on node C", r.state(), sentA)
			if !strings.Contains(c.out.String(), "passed over") {
				t.Fatalf("node C does not say it passed B's generation over:\n%s", tail(c.out.String(), 30))
			}
		})
	}
}

// TestReplicaNewNodeLostBeforeItsWAL: node A replicates 300 entries with a
// checkpoint at 200 and is killed with its data directory. Node B restores
// it, begins a generation of its own, accepts a request, uploads its
// request journal and its checkpoint (at 200), and is killed with SIGKILL
// while the WAL above the checkpoint hangs: its generation is the newest
// and restorable, to 200 only. Node C on an empty directory restores all
// 300 entries A acknowledged (from A's generation, through where B began)
// with B's request journal, and says why; `replica list` marks A's
// generation the default.
func TestReplicaNewNodeLostBeforeItsWAL(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/a")
	env := append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1")
	sentA := replicateNodeA(t, flags, env)

	proxy := miniotest.StartProxy(t, srv)
	proxy.Set(func(r *http.Request) miniotest.Fault {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/wal/") {
			return miniotest.Hang
		}
		return miniotest.Pass
	})
	dirB := filepath.Join(t.TempDir(), "data")
	b := startSup(t, scripted(t, dirB, proxyFlags(proxy, "state", "agents/a"), env, plan{{"stay": true}}))
	if r := restored(t, b.waitEvents("start", 1, 60*time.Second)[0]); r == nil || r.LastSequence != 300 {
		t.Fatalf("B restored %+v, want A's 300", r)
	}
	id := postRequest(t, b, "accepted on B")
	waitFor(t, 60*time.Second, "B's request journal and checkpoint replicated", func() bool {
		_, rs := statusOf(t, dirB)
		return rs.Checkpoints == 1 && rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
	})
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	b.wait(10 * time.Second)

	code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "list", "--json"}, flags[:4]...)...)
	var list struct {
		Generations []struct {
			Default      bool    `json:"default"`
			RestorableTo *uint64 `json:"restorable_to"`
		} `json:"generations"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Generations) != 2 {
		t.Fatalf("replica list --json: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if g := list.Generations[0]; g.Default || g.RestorableTo == nil || *g.RestorableTo != 200 || !list.Generations[1].Default {
		t.Fatalf("replica list: B's generation (newest) should be restorable to 200 and A's the default:\n%s", out)
	}
	dirC := filepath.Join(t.TempDir(), "data")
	c := startSup(t, scripted(t, dirC, flags, env, plan{{"stay": true}}))
	r := restored(t, c.waitEvents("start", 1, 60*time.Second)[0])
	if r == nil {
		t.Fatalf("node C started empty:\n%s", tail(c.out.String(), 30))
	}
	sameSeqs(t, "state restored on node C", r.state(), sentA)
	if code, v := getRequest(t, c, id); code != 200 {
		t.Fatalf("the request accepted on B: %d %+v on node C, want it restored with B's journal", code, v)
	}
	if !strings.Contains(c.out.String(), "behind the restore it began from") {
		t.Fatalf("node C does not say why it passed B's generation over:\n%s", tail(c.out.String(), 30))
	}
}

// TestReplicaForeignChunkObject: a 5-byte object no supervisor wrote, named
// like a WAL chunk: `replica restore` exits non-zero naming it and leaves
// the directory empty.
func TestReplicaForeignChunkObject(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "f")
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, flags, append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1"), plan{{"log": 50}, {"checkpoint": true}, {"log": 20}, {"stay": true}}))
	var gen string
	waitFor(t, 60*time.Second, "70 entries replicated", func() bool {
		_, rs := statusOf(t, dir)
		gen = rs.Generation
		return rs.UploadedSequence == 70
	})
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	body := []byte("hello")
	sum := sha256.Sum256(body)
	name := fmt.Sprintf("%016x-%016x-%016x-%s.chunk", 0, 5, time.Now().UnixMilli(), hex.EncodeToString(sum[:]))
	srv.Put("state", "f/generations/"+gen+"/wal/"+name, body)
	out := filepath.Join(t.TempDir(), "restored")
	code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", out}, flags[:4]...)...)
	if code == 0 || !strings.Contains(stderr, name) {
		t.Fatalf("restore with a foreign object among the chunks: exit %d\n%s%s", code, stdout, stderr)
	}
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Fatalf("the failed restore left %d files", len(es))
	}
}

// TestReplicaStatusWhenStoreHangs: the store stops answering (connections
// accepted, no reply): `supervisor status` stops saying ok — the replica
// is "stalled" — and shows the lag.
func TestReplicaStatusWhenStoreHangs(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	proxy := miniotest.StartProxy(t, srv)
	gate := filepath.Join(t.TempDir(), "hung")
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, proxyFlags(proxy, "state", "h"), append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1"),
		plan{{"log": 50}, {"wait_file": gate}, {"log": 20}, {"stay": true}}))
	waitFor(t, 60*time.Second, "50 entries replicated", func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence == 50 && rs.State == "ok"
	})
	proxy.Set(func(*http.Request) miniotest.Fault { return miniotest.Hang })
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var rs replicaStatus
	waitFor(t, 120*time.Second, "the replica reported stalled", func() bool {
		_, rs = statusOf(t, dir)
		return rs.State == "stalled"
	})
	if rs.LagEntries != 20 || rs.LagSeconds <= 0 {
		t.Fatalf("stalled: %+v; want the lag shown", rs)
	}
	code, out, _ := cli(t, "status", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "stalled") || !strings.Contains(out, "lag 20 entries") {
		t.Fatalf("supervisor status: exit %d\n%s", code, out)
	}
	_ = s
}

// TestReplicaCopiedDataDirectory: a data directory is copied and both
// copies run with the same replica, checkpointing with retention. The copy
// started second finds that the other one claimed the generation after it
// was copied and starts a generation of its own; retention on either never
// touches the other's; each generation restores to its writer's last
// replicated entry, with its writer's entries only.
func TestReplicaCopiedDataDirectory(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := append(replicaFlags(srv, "state", "copy"), "--checkpoint-retain", "2")
	env := append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1")
	dirA := filepath.Join(t.TempDir(), "data")
	a := startSup(t, scripted(t, dirA, flags, env, plan{{"log": 100}, {"checkpoint": true}, {"log": 20}, {"stay": true}}))
	var gen string
	waitFor(t, 60*time.Second, "120 entries replicated", func() bool {
		_, rs := statusOf(t, dirA)
		gen = rs.Generation
		return rs.UploadedSequence == 120
	})
	a.signal(syscall.SIGTERM)
	a.wait(30 * time.Second)
	dirB := filepath.Join(t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", dirA, dirB).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v %s", err, out)
	}
	os.Remove(filepath.Join(filepath.Dir(dirA), "report.jsonl"))
	// Both wait until both run: each starts where the generation ends.
	gate := filepath.Join(t.TempDir(), "both-up")
	work := func(tag string) plan {
		p := plan{{"wait_file": gate}}
		for i := 0; i < 4; i++ {
			p = append(p, map[string]any{"log": 40, "tag": tag}, map[string]any{"checkpoint": true})
		}
		return append(p, map[string]any{"log": 10, "tag": tag}, map[string]any{"stay": true})
	}
	a2 := startSup(t, scripted(t, dirA, flags, env, work("a")))
	waitFor(t, 60*time.Second, "A continues its generation", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.Generation == gen && rs.State == "ok"
	})
	b := startSup(t, scripted(t, dirB, flags, env, work("b")))
	waitFor(t, 60*time.Second, "the copy replicating", func() bool {
		_, rs := statusOf(t, dirB)
		return rs.Generation != "" && rs.State == "ok"
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var ra, rb replicaStatus
	for _, x := range []struct {
		s   *sup
		dir string
		rs  *replicaStatus
	}{{a2, dirA, &ra}, {b, dirB, &rb}} {
		x.s.waitEvents("staying", 1, 120*time.Second)
		waitFor(t, 60*time.Second, "caught up", func() bool {
			_, *x.rs = statusOf(t, x.dir)
			return x.rs.UploadedSequence == 120+170 && x.rs.LagEntries == 0
		})
	}
	if ra.Generation != gen || rb.Generation == gen {
		t.Fatalf("A writes %s, the copy %s; want A in %s and the copy in one of its own", ra.Generation, rb.Generation, gen)
	}
	if !strings.Contains(b.out.String(), "another supervisor continued the generation") {
		t.Fatalf("the copy does not say why it started a generation of its own:\n%s", tail(b.out.String(), 20))
	}
	for _, x := range []struct {
		gen, tag string
		s        *sup
	}{{ra.Generation, "a", a2}, {rb.Generation, "b", b}} {
		dir := filepath.Join(t.TempDir(), "r")
		code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", dir, "--generation", x.gen}, flags[:4]...)...)
		if code != 0 {
			t.Fatalf("restore generation %s: exit %d\n%s%s", x.gen, code, stdout, stderr)
		}
		r := readRestored(t, dir)
		if !slices.Equal(r.seqs, seqRange(r.watermark+1, 290)) {
			t.Fatalf("generation %s (%s): entries %s after %d, want through 290", x.gen, x.tag, summary(r.seqs), r.watermark)
		}
		for _, seq := range r.seqs {
			if seq > 120 && r.tags[seq] != x.tag {
				t.Fatalf("generation %s (%s) holds entry %d of the other copy (tag %q)", x.gen, x.tag, seq, r.tags[seq])
			}
		}
	}
}

// TestReplicaCopiedWhileRunning: the data directory is copied while its
// supervisor runs, and the copy is started with the same replica. The copy
// continues the generation (it holds everything the generation does, and
// the running supervisor's claim was the newest); the running one finds
// the copy's newer claim before its next upload or delete, removes what it
// wrote there since, and starts a generation of its own. Both then write,
// checkpoint and prune; each generation restores to its writer's last
// replicated entry, with its writer's entries only.
func TestReplicaCopiedWhileRunning(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := append(replicaFlags(srv, "state", "live"), "--checkpoint-retain", "2")
	env := append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1")
	gate := filepath.Join(t.TempDir(), "copy-up")
	work := func(tag string) plan {
		p := plan{{"wait_file": gate}}
		for i := 0; i < 4; i++ {
			p = append(p, map[string]any{"log": 40, "tag": tag, "rate": 200}, map[string]any{"checkpoint": true})
		}
		return append(p, map[string]any{"log": 10, "tag": tag}, map[string]any{"stay": true})
	}
	dirA := filepath.Join(t.TempDir(), "data")
	a := startSup(t, scripted(t, dirA, flags, env, append(plan{{"log": 100}, {"checkpoint": true}, {"log": 20}}, work("a")...)))
	var gen string
	waitFor(t, 60*time.Second, "120 entries replicated", func() bool {
		_, rs := statusOf(t, dirA)
		gen = rs.Generation
		return rs.UploadedSequence == 120 && rs.LagEntries == 0
	})
	dirB := filepath.Join(t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", dirA, dirB).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v %s", err, out)
	}
	b := startSup(t, scripted(t, dirB, flags, env, work("b")))
	waitFor(t, 60*time.Second, "the copy continues the generation", func() bool {
		_, rs := statusOf(t, dirB)
		return rs.Generation == gen && rs.State == "ok"
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var ra, rb replicaStatus
	for _, x := range []struct {
		s   *sup
		dir string
		rs  *replicaStatus
	}{{a, dirA, &ra}, {b, dirB, &rb}} {
		x.s.waitEvents("staying", 1, 120*time.Second)
		waitFor(t, 90*time.Second, "caught up", func() bool {
			_, *x.rs = statusOf(t, x.dir)
			return x.rs.UploadedSequence == 120+170 && x.rs.LagEntries == 0
		})
	}
	if rb.Generation != gen || ra.Generation == gen {
		t.Fatalf("the copy writes %s, the original %s; want the copy in %s and the original in one of its own", rb.Generation, ra.Generation, gen)
	}
	if !strings.Contains(a.out.String(), "another supervisor now writes this generation") {
		t.Fatalf("the original does not say why it left the generation:\n%s", tail(a.out.String(), 20))
	}
	for _, x := range []struct{ gen, tag string }{{ra.Generation, "a"}, {rb.Generation, "b"}} {
		dir := filepath.Join(t.TempDir(), "r")
		code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", dir, "--generation", x.gen}, flags[:4]...)...)
		if code != 0 {
			t.Fatalf("restore generation %s: exit %d\n%s%s", x.gen, code, stdout, stderr)
		}
		r := readRestored(t, dir)
		if !slices.Equal(r.seqs, seqRange(r.watermark+1, 290)) {
			t.Fatalf("generation %s (%s): entries %s after %d, want through 290", x.gen, x.tag, summary(r.seqs), r.watermark)
		}
		for _, seq := range r.seqs {
			if seq > 120 && r.tags[seq] != x.tag {
				t.Fatalf("generation %s (%s) holds entry %d of the other copy (tag %q)", x.gen, x.tag, seq, r.tags[seq])
			}
		}
	}
}
