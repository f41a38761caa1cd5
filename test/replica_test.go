package test

// Replication to object storage (SPEC §11, issue 16) through the binary
// against a real MinIO server on loopback (replica/miniotest; without the
// binary these tests skip, or fail under CI).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/replica/miniotest"
	"github.com/agent-sidecar/supervisor/wal"
)

// replicaFlags points a supervisor at prefix in bucket on srv.
func replicaFlags(srv *miniotest.Server, bucket, prefix string) []string {
	return []string{"--replica", "s3://" + bucket + "/" + prefix, "--replica-endpoint", srv.Endpoint(), "--replica-sync-interval", "200ms"}
}

// replicaStatus is the replica part of `supervisor status --json`.
type replicaStatus struct {
	State            string  `json:"state"`
	Generation       string  `json:"generation"`
	UploadedSequence uint64  `json:"uploaded_sequence"`
	DurableSequence  uint64  `json:"durable_sequence"`
	LagEntries       uint64  `json:"lag_entries"`
	LagSeconds       float64 `json:"lag_seconds"`
	LastErrorKind    string  `json:"last_error_kind"`
	Checkpoints      int     `json:"checkpoints"`
	RequestsJournal  *struct {
		LagWrites uint64 `json:"lag_writes"`
		Bytes     int64  `json:"uploaded_bytes"`
	} `json:"requests_journal"`
}

func statusOf(t testing.TB, dataDir string) (restarts int, rs replicaStatus) {
	t.Helper()
	code, out, _ := cli(t, "status", "--data-dir", dataDir, "--json")
	if code != 0 {
		return -1, rs
	}
	var st struct {
		Running  bool           `json:"running"`
		Restarts int            `json:"restarts"`
		Replica  *replicaStatus `json:"replica"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if !st.Running { // not up yet (restoring), or gone
		return -1, rs
	}
	if st.Replica == nil {
		t.Fatalf("status --json of a supervisor run with --replica shows no replica:\n%s", out)
	}
	return st.Restarts, *st.Replica
}

// cliEnv runs a supervisor subcommand with extra environment (the
// replica's credentials).
func cliEnv(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// restoredDir is what a restored data directory holds.
type restoredDir struct {
	checkpointID string
	watermark    uint64
	seqs         []uint64          // WAL entries
	tags         map[uint64]string // each entry's tag (scripted agent)
}

func readRestored(t testing.TB, dir string) restoredDir {
	t.Helper()
	ck, err := checkpoint.Open(filepath.Join(dir, "checkpoints"), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := restoredDir{tags: map[uint64]string{}}
	if m, _, _, err := ck.Latest(); err == nil {
		r.checkpointID, r.watermark = m.ID, m.Watermark
	}
	err = wal.ReadDir(filepath.Join(dir, "wal"), 0, func(e wal.Entry) error {
		r.seqs = append(r.seqs, e.Sequence)
		var v struct {
			Params struct {
				Tag string `msgpack:"tag"`
			} `msgpack:"params"`
		}
		if err := msgpack.Unmarshal(e.Data, &v); err != nil {
			t.Fatalf("entry %d: %v", e.Sequence, err)
		}
		r.tags[e.Sequence] = v.Params.Tag
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ackedIDs(events []ev) []string {
	var ids []string
	for _, e := range events {
		if e.str("event") == "ack" {
			ids = append(ids, e.str("checkpoint_id"))
		}
	}
	return ids
}

// TestReplicaKillAndRestoreElsewhere: the agent writes and checkpoints
// while the supervisor replicates; the server then goes away, the agent
// writes 50 more entries, the lag metric says 50, and the supervisor is
// killed with SIGKILL and its data directory deleted. A supervisor on a
// fresh directory with --replica restores an acknowledged checkpoint and
// every entry up to the last uploaded one: exactly what the metric said was
// lost is lost. A point-in-time restore gives the state at a sequence.
func TestReplicaKillAndRestoreElsewhere(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/a")
	gate := filepath.Join(t.TempDir(), "server-down")
	dirA := filepath.Join(t.TempDir(), "data")
	a := startSup(t, scripted(t, dirA, flags, srv.Env(), plan{
		{"log": 200, "rate": 400}, {"checkpoint": true},
		{"log": 200, "rate": 400}, {"checkpoint": true},
		{"log": 100, "rate": 400},
		{"wait_file": gate},
		{"log": 50},
		{"stay": true},
	}))
	waitFor(t, 60*time.Second, "500 entries replicated", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.UploadedSequence == 500 && rs.DurableSequence == 500
	})
	if n := len(ackedIDs(a.allEvents())); n != 2 {
		t.Fatalf("%d checkpoints acknowledged, want 2", n)
	}

	// Point in time, while the replica is whole: the state at 250.
	pitr := filepath.Join(t.TempDir(), "pitr")
	code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", pitr, "--to-sequence", "250"}, flags[:4]...)...)
	if code != 0 {
		t.Fatalf("replica restore --to-sequence 250: exit %d\n%s%s", code, out, stderr)
	}
	p := readRestored(t, pitr)
	if p.watermark != 200 || !slices.Equal(p.seqs, seqRange(201, 250)) || !slices.Contains(ackedIDs(a.allEvents()), p.checkpointID) {
		t.Fatalf("point-in-time restore to 250: checkpoint %s at %d, entries %s", p.checkpointID, p.watermark, summary(p.seqs))
	}

	srv.Stop()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "50 entries durable and not uploaded", func() bool {
		return a.metric("supervisor_replica_lag_entries") == 50
	})
	_, rs := statusOf(t, dirA)
	lag := a.metric("supervisor_replica_lag_entries")
	if rs.DurableSequence != 550 || rs.UploadedSequence != 500 || a.metric("supervisor_replica_lag_seconds") <= 0 {
		t.Fatalf("before the kill: %+v, lag_seconds %v", rs, a.metric("supervisor_replica_lag_seconds"))
	}
	sentA := accepted(a.allEvents())
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.wait(10 * time.Second)
	if err := os.RemoveAll(dirA); err != nil {
		t.Fatal(err)
	}

	srv.Restart()
	dirB := filepath.Join(t.TempDir(), "data")
	b := startSup(t, scripted(t, dirB, flags, srv.Env(), plan{{"stay": true}}))
	start := b.waitEvents("start", 1, 60*time.Second)[0]
	r := restored(t, start)
	if r == nil {
		t.Fatalf("the agent on the new node got no restore:\n%s", tail(b.out.String(), 30))
	}
	if !slices.Contains(ackedIDs(readEvents(filepath.Join(filepath.Dir(dirA), "report.jsonl"))), r.CheckpointID) {
		t.Fatalf("restored checkpoint %s was not acknowledged to the agent", r.CheckpointID)
	}
	want := sentA[:len(sentA)-int(lag)] // everything but what the metric said was not uploaded
	sameSeqs(t, "state restored on the new node", r.state(), want)
	if got := uint64(len(sentA)) - r.LastSequence; float64(got) != lag {
		t.Fatalf("lost %d entries at the kill; the lag metric said %v", got, lag)
	}
	if !strings.Contains(b.out.String(), "data directory restored from the replica") {
		t.Fatalf("no restore reported:\n%s", tail(b.out.String(), 20))
	}
	if auditKinds(t, dirB)["replica_restored"] != 1 {
		t.Fatalf("no replica_restored audit record")
	}
}

// TestReplicaServerOutage: the server is down for 30 s while the agent
// writes and checkpoints. The agent is unaffected (no restart, its entries
// keep being accepted), the errors are counted as network errors, and once
// the server is back the uploads resume with nothing skipped: the replica
// restores every entry.
func TestReplicaServerOutage(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "outage")
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, flags, append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1"), plan{
		{"log": 400, "rate": 50}, {"checkpoint": true},
		{"log": 1000, "rate": 50}, {"checkpoint": true},
		{"log": 600, "rate": 50},
	}))
	waitFor(t, 60*time.Second, "the first entries replicated", func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence >= 100
	})
	srv.Stop()
	_, before := statusOf(t, dir)
	time.Sleep(30 * time.Second) // the outage the issue names
	restarts, during := statusOf(t, dir)
	if restarts != 0 || during.DurableSequence < before.DurableSequence+1000 || during.State != "retrying" || during.LastErrorKind != "network" {
		t.Fatalf("during the outage: restarts %d, replica %+v (before %+v)", restarts, during, before)
	}
	if during.LagSeconds < 20 || s.metric("supervisor_replica_lag_seconds") < 20 {
		t.Fatalf("lag after 30 s down: status %.1fs, metric %v", during.LagSeconds, s.metric("supervisor_replica_lag_seconds"))
	}
	srv.Restart()
	s.waitEvents("plan_done", 1, 90*time.Second)
	waitFor(t, 60*time.Second, "the replica caught up", func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence == 2000 && rs.LagEntries == 0 && rs.State == "ok"
	})
	if n := s.metric("supervisor_replica_errors_total", `kind="network"`); n < 1 {
		t.Fatalf("network errors counted: %v", n)
	}
	if restarts, _ := statusOf(t, dir); restarts != 0 {
		t.Fatalf("the agent restarted %d times", restarts)
	}
	out := filepath.Join(t.TempDir(), "restored")
	code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", out}, flags[:4]...)...)
	if code != 0 {
		t.Fatalf("replica restore: exit %d\n%s%s", code, stdout, stderr)
	}
	r := readRestored(t, out)
	if !slices.Equal(r.seqs, seqRange(r.watermark+1, 2000)) || !slices.Contains(ackedIDs(s.allEvents()), r.checkpointID) {
		t.Fatalf("restored checkpoint %s at %d with entries %s; want every entry through 2000", r.checkpointID, r.watermark, summary(r.seqs))
	}
}

// TestReplicaErrors: wrong credentials and a missing bucket stop a start
// on an empty data directory with a configuration error (exit 2) that says
// so; a corrupted object in the bucket is detected, named, and never
// served — the agent is not started (exit 3) and a manual restore fails.
func TestReplicaErrors(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "e")
	run := func(env []string, flags []string) (int, string) {
		dir := filepath.Join(t.TempDir(), "data")
		o := scripted(t, dir, flags, env, plan{{"stay": true}})
		o.keepAlive = true
		s := startSup(t, o)
		code := s.wait(60 * time.Second)
		if len(s.eventsOf("start")) != 0 {
			t.Fatalf("the agent was started:\n%s", s.out.String())
		}
		return code, s.out.String()
	}
	wrong := append(srv.Env(), "AWS_SECRET_ACCESS_KEY=not-the-secret")
	if code, out := run(wrong, flags); code != 2 || !strings.Contains(out, "access denied") || !strings.Contains(out, "check the credentials") {
		t.Fatalf("wrong credentials: exit %d\n%s", code, tail(out, 10))
	}
	if code, out := run(srv.Env(), replicaFlags(srv, "no-such-bucket", "e")); code != 2 || !strings.Contains(out, `bucket \"no-such-bucket\" does not exist`) {
		t.Fatalf("missing bucket: exit %d\n%s", code, tail(out, 10))
	}

	// A replica with a checkpoint and a WAL chunk after it.
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, flags, append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1"), plan{
		{"log": 100}, {"checkpoint": true}, {"log": 50}, {"stay": true}}))
	waitFor(t, 60*time.Second, "150 entries replicated", func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence == 150
	})
	s.signal(syscall.SIGTERM)
	s.wait(30 * time.Second)
	var chunk string
	for _, k := range srv.Keys("state", "e/") {
		if strings.HasSuffix(k, ".chunk") {
			chunk = k
		}
	}
	if chunk == "" {
		t.Fatal("no WAL chunk in the replica")
	}
	b := srv.Get("state", chunk)
	b[len(b)/2] ^= 0x01
	srv.Put("state", chunk, b)
	name := chunk[strings.LastIndex(chunk, "/")+1:]

	out := filepath.Join(t.TempDir(), "restored")
	code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", out}, flags[:4]...)...)
	if code != 1 || !strings.Contains(stderr, "corrupt") || !strings.Contains(stderr, name) {
		t.Fatalf("restore of a corrupted chunk: exit %d\n%s%s", code, stdout, stderr)
	}
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Fatalf("the failed restore left %d files in the data directory", len(es))
	}
	if code, log := run(srv.Env(), flags); code != 3 || !strings.Contains(log, "corrupt") || !strings.Contains(log, name) {
		t.Fatalf("start from a corrupted replica: exit %d\n%s", code, tail(log, 10))
	}
}

// TestReplicaTwoSupervisorsOnePrefix: a second supervisor started on
// another node while the first still runs (a split brain during a
// reschedule) restores the first one's state and writes a generation of its
// own; the two histories never mix, and a restore takes one generation
// whole — the most recently written unless --generation names another.
func TestReplicaTwoSupervisorsOnePrefix(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "shared")
	env := append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1")
	dirA := filepath.Join(t.TempDir(), "data")
	a := startSup(t, scripted(t, dirA, flags, env, plan{
		{"log": 100, "rate": 200}, {"checkpoint": true}, {"log": 300, "rate": 100}}))
	waitFor(t, 60*time.Second, "A's checkpoint replicated", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.UploadedSequence >= 150
	})
	dirB := filepath.Join(t.TempDir(), "data")
	gate := filepath.Join(t.TempDir(), "a-stopped")
	b := startSup(t, scripted(t, dirB, flags, env, plan{{"log": 200, "rate": 100, "tag": "b"}, {"wait_file": gate}, {"log": 10, "tag": "b"}}))
	base := restored(t, b.waitEvents("start", 1, 60*time.Second)[0])
	if base == nil {
		t.Fatal("B got no restore from A's generation")
	}
	a.waitEvents("plan_done", 1, 60*time.Second)
	waitFor(t, 60*time.Second, "B's 200 entries", func() bool { return len(accepted(b.allEvents())) == 200 })
	_, ra := statusOf(t, dirA)
	_, rb := statusOf(t, dirB)
	if ra.Generation == rb.Generation {
		t.Fatalf("both write generation %s", ra.Generation)
	}
	waitFor(t, 30*time.Second, "both caught up", func() bool {
		_, ra = statusOf(t, dirA)
		_, rb = statusOf(t, dirB)
		return ra.LagEntries == 0 && rb.LagEntries == 0 && ra.UploadedSequence == 400
	})
	a.signal(syscall.SIGTERM)
	a.wait(30 * time.Second)
	// B writes last: its generation is the default.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b.waitEvents("plan_done", 1, 60*time.Second)
	waitFor(t, 30*time.Second, "B's last entries replicated", func() bool {
		_, rb = statusOf(t, dirB)
		return rb.UploadedSequence == base.LastSequence+210 && rb.LagEntries == 0
	})
	code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "list", "--json"}, flags[:4]...)...)
	if code != 0 {
		t.Fatalf("replica list: exit %d %s", code, stderr)
	}
	var list struct {
		Generations []struct {
			ID           string  `json:"id"`
			Default      bool    `json:"default"`
			RestorableTo *uint64 `json:"restorable_to"`
		} `json:"generations"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Generations) != 2 {
		t.Fatalf("replica list: %v\n%s", err, out)
	}
	for _, g := range []struct {
		id   string
		tag  string
		sup  *sup
		last uint64
	}{{ra.Generation, "", a, 400}, {rb.Generation, "b", b, rb.UploadedSequence}} {
		args := []string{"replica", "restore", "--data-dir", filepath.Join(t.TempDir(), "r")}
		if g.tag == "" {
			args = append(args, "--generation", g.id) // not the default
		}
		dir := args[3]
		code, stdout, stderr := cliEnv(t, srv.Env(), append(args, flags[:4]...)...)
		if code != 0 {
			t.Fatalf("restore generation %s: exit %d\n%s%s", g.id, code, stdout, stderr)
		}
		r := readRestored(t, dir)
		if !slices.Equal(r.seqs, seqRange(r.watermark+1, g.last)) {
			t.Fatalf("generation %s: entries %s after %d, want through %d", g.id, summary(r.seqs), r.watermark, g.last)
		}
		for _, s := range r.seqs {
			own := g.tag
			if g.tag == "b" && s <= base.LastSequence {
				own = "" // B's history begins with A's, as restored
			}
			if r.tags[s] != own {
				t.Fatalf("generation %s holds entry %d of the other supervisor (tag %q)", g.id, s, r.tags[s])
			}
		}
		acked := ackedIDs(g.sup.allEvents())
		if g.tag == "b" {
			acked = append(acked, base.CheckpointID)
		}
		if !slices.Contains(acked, r.checkpointID) {
			t.Fatalf("generation %s restored checkpoint %s, not one of its supervisor's", g.id, r.checkpointID)
		}
	}
	if !list.Generations[0].Default || list.Generations[0].ID != rb.Generation {
		t.Fatalf("default generation %s, want B's %s (the most recently written)", list.Generations[0].ID, rb.Generation)
	}
}

// TestReplicaFollowsRollback: an operator rolls the agent back to an older
// checkpoint without its WAL (`supervisor restore --no-wal`). The history
// after it is abandoned locally, so the replica must not offer it either:
// the supervisor starts a new generation, and a restore from the replica
// gives the rolled-back state and what came after it — never the
// abandoned entries.
func TestReplicaFollowsRollback(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "rollback")
	dir := filepath.Join(t.TempDir(), "data")
	s := startSup(t, scripted(t, dir, flags, append(srv.Env(), "AGENT_NO_FINAL_CHECKPOINT=1"),
		plan{{"log": 100}, {"checkpoint": true}, {"log": 100}, {"checkpoint": true}, {"log": 50}},
		plan{{"log": 20, "tag": "after"}}))
	waitFor(t, 60*time.Second, "250 entries replicated", func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence == 250
	})
	_, before := statusOf(t, dir)
	acks := ackedIDs(s.allEvents())
	if len(acks) != 2 {
		t.Fatalf("acks %v", acks)
	}
	if code, out, stderr := cli(t, "restore", "--data-dir", dir, "--checkpoint", acks[0], "--no-wal"); code != 0 {
		t.Fatalf("restore --no-wal: exit %d %s%s", code, out, stderr)
	}
	s.waitEvents("plan_done", 2, 60*time.Second)
	var after replicaStatus
	waitFor(t, 60*time.Second, "the rolled-back history replicated", func() bool {
		_, after = statusOf(t, dir)
		return after.Generation != before.Generation && after.UploadedSequence == 120 && after.LagEntries == 0
	})
	out := filepath.Join(t.TempDir(), "restored")
	code, stdout, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", out}, flags[:4]...)...)
	if code != 0 {
		t.Fatalf("replica restore: exit %d\n%s%s", code, stdout, stderr)
	}
	r := readRestored(t, out)
	if r.checkpointID != acks[0] || !slices.Equal(r.seqs, seqRange(101, 120)) {
		t.Fatalf("restored checkpoint %s with %s; want %s (the rollback's) with 101..120", r.checkpointID, summary(r.seqs), acks[0])
	}
	for _, seq := range r.seqs {
		if r.tags[seq] != "after" {
			t.Fatalf("entry %d of the abandoned history restored", seq)
		}
	}
}

// TestReplicaRequestsFollowTheAgent: requests accepted (202) on a node whose
// agent does not answer them are replicated with the request journal; the
// node is lost (kill -9, data directory gone), a supervisor on an empty data
// directory restores the replica and its agent answers every one of them
// there: GET on the new node shows each answered.
func TestReplicaRequestsFollowTheAgent(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/r")
	dirA := filepath.Join(t.TempDir(), "data")
	logA := filepath.Join(t.TempDir(), "agent-a.jsonl")
	a := reqSup(t, dirA, logA, append(srv.Env(), "REQAGENT_HOLD=job", "REQAGENT_WAL_ONE=1"), flags...)
	var ids []string
	for i := range 5 {
		ids = append(ids, postRequest(t, a, fmt.Sprintf("job-%d", i)))
	}
	waitFor(t, 60*time.Second, "the WAL entry and every accepted request replicated", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.UploadedSequence == 1 && rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
	})
	for _, id := range ids {
		if code, v := getRequest(t, a, id); code != 200 || v.Status != "pending" {
			t.Fatalf("request %s on the first node: %d %+v, want pending", id, code, v)
		}
	}
	killSup(t, a)
	if err := os.RemoveAll(dirA); err != nil {
		t.Fatal(err)
	}

	dirB := filepath.Join(t.TempDir(), "data")
	logB := filepath.Join(t.TempDir(), "agent-b.jsonl")
	b := reqSup(t, dirB, logB, srv.Env(), flags...)
	for i, id := range ids {
		v := waitStatus(t, b, id, "answered", 60*time.Second)
		var data map[string]any
		_ = json.Unmarshal(v.Data, &data)
		if data["echo"] != fmt.Sprintf("job-%d", i) {
			t.Errorf("request %s answered %s on the new node, want echo job-%d", id, v.Data, i)
		}
		if len(deliveries(logB, id)) == 0 {
			t.Errorf("request %s was never delivered to the new node's agent", id)
		}
	}
	if !strings.Contains(b.out.String(), "data directory restored from the replica") {
		t.Fatalf("no restore reported:\n%s", tail(b.out.String(), 20))
	}
}

// TestReplicaStatelessAgentRequestsFollow: an agent that never logs a WAL
// entry nor checkpoints (stateless) holds requests it never answers; the
// replica then holds no agent state, only the request journal. The node is
// lost (kill -9, data directory gone): a supervisor on an empty data
// directory restores the journal alone and its agent answers every pending
// request. That node is stateless too and is lost in turn with requests it
// held: the next node restores the newest journal (the second node's, which
// holds the first node's requests answered and its own pending), not the
// first one's.
func TestReplicaStatelessAgentRequestsFollow(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/s")
	replicated := func(dir string) func() bool {
		return func() bool {
			_, rs := statusOf(t, dir)
			return rs.Generation != "" && rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
		}
	}
	dirA := filepath.Join(t.TempDir(), "data")
	a := reqSup(t, dirA, filepath.Join(t.TempDir(), "agent-a.jsonl"), append(srv.Env(), "REQAGENT_HOLD=job"), flags...)
	var ids []string
	for i := range 5 {
		ids = append(ids, postRequest(t, a, fmt.Sprintf("job-%d", i)))
	}
	waitFor(t, 60*time.Second, "every accepted request replicated", replicated(dirA))
	if _, rs := statusOf(t, dirA); rs.UploadedSequence != 0 {
		t.Fatalf("the stateless agent's replica holds WAL entries (uploaded through %d)", rs.UploadedSequence)
	}
	killSup(t, a)
	if err := os.RemoveAll(dirA); err != nil {
		t.Fatal(err)
	}

	dirB := filepath.Join(t.TempDir(), "data")
	logB := filepath.Join(t.TempDir(), "agent-b.jsonl")
	b := reqSup(t, dirB, logB, append(srv.Env(), "REQAGENT_HOLD=late"), flags...)
	for i, id := range ids {
		v := waitStatus(t, b, id, "answered", 60*time.Second)
		var data map[string]any
		_ = json.Unmarshal(v.Data, &data)
		if data["echo"] != fmt.Sprintf("job-%d", i) || len(deliveries(logB, id)) == 0 {
			t.Errorf("request %s on the new node: answered %s, delivered %v; want echo job-%d, delivered there", id, v.Data, deliveries(logB, id), i)
		}
	}
	if !strings.Contains(b.out.String(), "data directory restored from the replica") {
		t.Fatalf("no restore reported:\n%s", tail(b.out.String(), 20))
	}
	late := []string{postRequest(t, b, "late-0"), postRequest(t, b, "late-1")}
	waitFor(t, 60*time.Second, "the second node's journal replicated", func() bool {
		_, rs := statusOf(t, dirB)
		return replicated(dirB)() && rs.RequestsJournal.LagWrites == 0
	})
	killSup(t, b)
	if err := os.RemoveAll(dirB); err != nil {
		t.Fatal(err)
	}

	dirC := filepath.Join(t.TempDir(), "data")
	c := reqSup(t, dirC, filepath.Join(t.TempDir(), "agent-c.jsonl"), srv.Env(), flags...)
	for _, id := range late {
		waitStatus(t, c, id, "answered", 60*time.Second)
	}
	for _, id := range ids {
		if code, v := getRequest(t, c, id); code != 200 || v.Status != "answered" {
			t.Fatalf("request %s answered on the second node: %d %+v on the third, want answered", id, code, v)
		}
	}
}

// TestReplicaRequestJournalDeltas: after the request journal's first upload
// (a base), a request accepted later reaches the bucket as a delta of about
// its own size, not the whole journal again; a delta missing from the
// bucket (a gap before later ones) is found by `replica restore`, which
// restores the journal up to it (the requests before it, none after) and
// says the journal was incomplete.
func TestReplicaRequestJournalDeltas(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/jd")
	dir := filepath.Join(t.TempDir(), "data")
	a := reqSup(t, dir, filepath.Join(t.TempDir(), "agent.jsonl"), append(srv.Env(), "REQAGENT_HOLD=job", "REQAGENT_WAL_ONE=1"), flags...)
	replicated := func() bool {
		_, rs := statusOf(t, dir)
		return rs.UploadedSequence == 1 && rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
	}
	journal := func() (base string, baseSize int, deltas map[string]int) {
		deltas = map[string]int{}
		for _, k := range srv.Keys("state", "agents/jd/") {
			_, name, ok := strings.Cut(k, "/files/requests-journal/")
			switch {
			case !ok:
			case strings.Count(name, "-") == 1:
				base, baseSize = k, len(srv.Get("state", k))
			default:
				deltas[k] = len(srv.Get("state", k))
			}
		}
		return base, baseSize, deltas
	}
	first := postRequest(t, a, "job-0 "+strings.Repeat("a", 20000))
	waitFor(t, 60*time.Second, "the first request replicated", replicated)
	// A larger request, then a small one: two deltas (a delta is merged
	// with the one before it only when that one is less than twice its size).
	second := postRequest(t, a, "job-1 "+strings.Repeat("b", 5000))
	waitFor(t, 60*time.Second, "the second request replicated", replicated)
	third := postRequest(t, a, "job-2")
	waitFor(t, 60*time.Second, "the third request replicated", replicated)
	base, baseSize, deltas := journal()
	if base == "" || baseSize < 20000 || len(deltas) < 2 {
		t.Fatalf("the journal in the bucket: base %q of %d bytes, deltas %v; want a base holding the first request and deltas after it", base, baseSize, deltas)
	}
	for k, n := range deltas {
		if n >= baseSize {
			t.Fatalf("a delta of %d bytes (%s), the base is %d: the journal was uploaded again, not what changed", n, k, baseSize)
		}
	}
	killSup(t, a)

	// The first delta deleted: the next ones follow a gap; the journal is
	// restored up to the base.
	var firstDelta string
	for k := range deltas {
		if firstDelta == "" || k < firstDelta { // BASE-FROM-…: the lowest FROM
			firstDelta = k
		}
	}
	if err := srv.Client().RemoveObject(context.Background(), "state", firstDelta, minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", restored}, flags[:4]...)...)
	if code != 0 {
		t.Fatalf("replica restore: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, "requests:     journal INCOMPLETE in the replica") || !strings.Contains(stderr, "request journal in the replica is incomplete") {
		t.Fatalf("replica restore with the journal's deltas missing:\n%s%s", out, stderr)
	}
	c, list, _ := cli(t, "requests", "list", "--data-dir", restored, "--json")
	if c != 0 || !strings.Contains(list, first) || strings.Contains(list, second) || strings.Contains(list, third) {
		t.Fatalf("restored journal: %d %s; want the first request (in the base), not the later ones (after the missing delta)", c, list)
	}
}

// TestReplicaDamagedRequestJournal: a request journal object changed in the
// bucket (its bytes no longer match the SHA-256 in its name) is refused
// loudly — `replica restore` says the requests were not restored, a start
// on an empty data directory logs it — and the rest of the data directory
// is restored: the supervisor starts and serves, no crash loop.
func TestReplicaDamagedRequestJournal(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket("state")
	flags := replicaFlags(srv, "state", "agents/d")
	dirA := filepath.Join(t.TempDir(), "data")
	logA := filepath.Join(t.TempDir(), "agent-a.jsonl")
	a := reqSup(t, dirA, logA, append(srv.Env(), "REQAGENT_HOLD=job", "REQAGENT_WAL_ONE=1"), flags...)
	postRequest(t, a, "job-0")
	waitFor(t, 60*time.Second, "the WAL entry and the request replicated", func() bool {
		_, rs := statusOf(t, dirA)
		return rs.UploadedSequence == 1 && rs.RequestsJournal != nil && rs.RequestsJournal.LagWrites == 0 && rs.RequestsJournal.Bytes > 0
	})
	killSup(t, a)
	var key string
	for _, k := range srv.Keys("state", "agents/d/") {
		// The base (NANOS-SHA), not a delta (BASE-FROM-TO-NANOS-SHA).
		if _, name, ok := strings.Cut(k, "/files/requests-journal/"); ok && strings.Count(name, "-") == 1 {
			key = k
		}
	}
	if key == "" {
		t.Fatalf("no request journal object in the bucket: %v", srv.Keys("state", "agents/d/"))
	}
	b := srv.Get("state", key)
	b[len(b)/2] ^= 0xff
	srv.Put("state", key, b)

	restored := filepath.Join(t.TempDir(), "restored")
	code, out, stderr := cliEnv(t, srv.Env(), append([]string{"replica", "restore", "--data-dir", restored}, flags[:4]...)...)
	if code != 0 || !strings.Contains(out, "requests:     NOT restored: the request journal in the replica is damaged") ||
		!strings.Contains(stderr, "request journal in the replica is damaged") {
		t.Fatalf("replica restore of a damaged journal: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := os.Stat(filepath.Join(restored, "requests", "journal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a damaged journal was written into the restored directory (%v)", err)
	}

	dirB := filepath.Join(t.TempDir(), "data")
	s := reqSup(t, dirB, filepath.Join(t.TempDir(), "agent-b.jsonl"), srv.Env(), flags...)
	id := postRequest(t, s, "fresh")
	waitStatus(t, s, id, "answered", 60*time.Second)
	if !strings.Contains(s.out.String(), "the request journal in the replica is damaged and is not restored") {
		t.Fatalf("the start did not say the journal was refused:\n%s", tail(s.out.String(), 20))
	}
}
