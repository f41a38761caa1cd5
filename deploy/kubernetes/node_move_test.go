package kubernetes_test

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMoveToAnotherNode follows docs/operations.md's "Moving an agent to
// another node" with the StatefulSet's own arguments, user and volume layout
// against a real S3 server (MinIO on loopback): the node dies (kill -9 of
// the supervisor and its agent, the volume gone with it), the pod comes back
// on another node with an empty volume and restores from the bucket, losing
// at most what supervisor_replica_lag_entries said; then a drain (SIGTERM)
// moves it once more and loses nothing.
//
// It needs the MinIO server binary in SUPERVISOR_TEST_MINIO (.ci/run sets
// it; SUPERVISOR_REQUIRE_MINIO=1 makes its absence a failure) and curl, to
// create the bucket.
func TestMoveToAnotherNode(t *testing.T) {
	minio := os.Getenv("SUPERVISOR_TEST_MINIO")
	if minio == "" {
		if os.Getenv("SUPERVISOR_REQUIRE_MINIO") == "1" {
			t.Fatal("SUPERVISOR_TEST_MINIO is not set (the MinIO server binary; .ci/run sets it)")
		}
		t.Skip("SUPERVISOR_TEST_MINIO not set: no S3 server to replicate to")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl is needed to create the test bucket")
	}
	p := newPod(t)

	// The bucket, on MinIO.
	const user, secret = "k8s-test-admin", "k8s-test-secret-key"
	endpoint := startMinio(t, minio, user, secret)
	rep := p.flags["replica"]
	m := regexp.MustCompile(`^s3://([^/]+)/(.*)$`).FindStringSubmatch(rep)
	if m == nil {
		t.Fatalf("--replica %q: not s3://BUCKET/PREFIX", rep)
	}
	bucket := m[1]
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT",
			"--aws-sigv4", "aws:amz:"+p.flags["replica-region"]+":s3", "--user", user+":"+secret, endpoint+"/"+bucket).Output()
		if err == nil && string(out) == "200" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cannot create bucket %s: curl %v, HTTP %s", bucket, err, out)
		}
		time.Sleep(200 * time.Millisecond) // MinIO answers 503 while it initialises
	}

	// The pod's environment as the kubelet builds it: the fieldRefs and the
	// Secret's credentials (here MinIO's).
	env := map[string]string{"POD_NAME": "agent-0", "POD_NAMESPACE": "default",
		"AWS_ACCESS_KEY_ID": user, "AWS_SECRET_ACCESS_KEY": secret}
	replica := []string{}
	for _, name := range p.order {
		if strings.HasPrefix(name, "replica") {
			replica = append(replica, "--"+name+"="+expand(p.flags[name], env))
		}
	}
	replica = append(replica, "--replica-endpoint="+endpoint)
	// The demo agent writes a note every 3 s and checkpoints every 30 s; the
	// test has no minutes to spare.
	agentArgs := []string{"--note-every", "50ms", "--checkpoint-every", "500ms"}

	// Node A: the pod runs and replicates.
	nodeA := p.newNode(t)
	a := p.start(t, nodeA, env, replica, agentArgs...)
	a.waitStatus(t, p.url(p.c.ReadinessProbe.HTTPGet.Path), 200)
	a.waitMetric(t, p.url("/metrics"), "supervisor_replica_uploaded_objects_total", func(v float64) bool { return v >= 3 })
	a.waitMetric(t, p.url("/metrics"), "supervisor_wal_last_sequence", func(v float64) bool { return v >= 40 })

	// Node A dies: what the metrics said last, then kill -9 of the
	// supervisor and its agent. The volume goes with the node.
	met := a.metrics(t, p.url("/metrics"))
	// What the replica holds: the lag is counted from the durable sequence
	// (supervisor_replica_lag_entries = durable - uploaded), which may trail
	// the WAL's last appended one, so read the consistent triple from status.
	uploaded := replicaUploaded(t, p.bin, nodeA.dataDir)
	agentPID := a.agentPID(t, p.url("/readyz"))
	_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
	_ = syscall.Kill(agentPID, syscall.SIGKILL)
	a.wait(t, 10*time.Second)
	last, lag := met["supervisor_wal_last_sequence"], met["supervisor_replica_lag_entries"]
	t.Logf("node A killed: WAL at sequence %.0f, replica lag %.0f entries (%.3fs)", last, lag, met["supervisor_replica_lag_seconds"])

	// Node B: a new pod, an empty volume; --replica restores it first.
	nodeB := p.newNode(t)
	b := p.start(t, nodeB, env, replica, agentArgs...)
	b.waitStatus(t, p.url(p.c.ReadinessProbe.HTTPGet.Path), 200)
	restored := b.agentRestoredTo(t)
	t.Logf("node B: the agent was restored to sequence %d", restored)
	if uint64(restored) < uploaded {
		t.Errorf("restored to sequence %d; before the kill the replica held everything up to %d (WAL at %.0f, lag %.0f entries)", restored, uploaded, last, lag)
	}
	if restored == 0 {
		t.Errorf("the agent on node B started empty")
	}

	// A drain: SIGTERM, the final checkpoint and a last upload; node C
	// restores exactly what node B had.
	b.waitMetric(t, p.url("/metrics"), "supervisor_wal_last_sequence", func(v float64) bool { return v >= float64(restored)+20 })
	b.stop(t, p.grace)
	finalB := lastWALSequence(t, p, nodeB)
	nodeC := p.newNode(t)
	c := p.start(t, nodeC, env, replica, agentArgs...)
	c.waitStatus(t, p.url(p.c.ReadinessProbe.HTTPGet.Path), 200)
	if got := c.agentRestoredTo(t); got != finalB {
		t.Errorf("after a drain: restored to sequence %d, node B's WAL ended at %d; a graceful move loses nothing", got, finalB)
	}
	c.stop(t, p.grace)
}

// expand replaces $(VAR) as the kubelet does in a container's arguments.
func expand(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// startMinio runs a MinIO server on a free loopback port until the test
// ends and returns its URL once it answers.
func startMinio(t *testing.T, bin, user, secret string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "server", "--quiet", "--address", addr, "--console-address", "127.0.0.1:0", t.TempDir())
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+user, "MINIO_ROOT_PASSWORD="+secret, "MINIO_BROWSER=off")
	sp := startProc(t, cmd)
	url := "http://" + addr
	sp.waitStatus(t, url+"/minio/health/live", 200)
	return url
}

// metrics reads the supervisor's /metrics into name (with labels) → value.
func (p *supervisorProc) metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	body := p.get(t, url, 200)
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// waitMetric polls until the metric satisfies ok (30 s at most).
func (p *supervisorProc) waitMetric(t *testing.T, url, name string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, found := p.metrics(t, url)[name]
		if found && ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %v (present: %v) after 30 s; output:\n%s", name, v, found, p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *supervisorProc) agentPID(t *testing.T, readyz string) int {
	t.Helper()
	var body struct {
		PID int `json:"agent_pid"`
	}
	resp, err := httpClient.Get(readyz)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.PID == 0 {
		t.Fatalf("/readyz: no agent_pid (%v)", err)
	}
	return body.PID
}

// agentRestoredTo returns the sequence the demo agent says it was restored
// to (its "restored" log line, which the supervisor's JSON log carries).
func (p *supervisorProc) agentRestoredTo(t *testing.T) int {
	t.Helper()
	// The agent's stderr reaches the supervisor's log on a goroutine of its
	// own: readiness can come first (a CI run read the output a moment after
	// "restore sent", before the agent's line was relayed).
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var rec struct {
				Msg  string `json:"msg"`
				Line struct {
					Msg     string `json:"msg"`
					LastSeq string `json:"last_seq"`
				} `json:"line"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "agent output" || rec.Line.Msg != "restored" {
				continue
			}
			n, err := strconv.Atoi(rec.Line.LastSeq)
			if err != nil {
				t.Fatalf("restored line %q: %v", line, err)
			}
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent logged no \"restored\" line within 30 s (was it started empty?); output:\n%s", p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lastWALSequence asks `supervisor status --json` what the stopped
// supervisor's data directory holds.
func lastWALSequence(t *testing.T, p *pod, n *node) int {
	t.Helper()
	cmd := exec.Command(p.bin, "status", "--json", "--data-dir", n.dataDir)
	if p.asPodUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid, Groups: []uint32{uint32(p.fsGroup)}}}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("supervisor status: %v\n%s", err, out)
	}
	var st struct {
		Last *int `json:"last_wal_sequence"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Last == nil {
		t.Fatalf("supervisor status --json: no last_wal_sequence (%v): %s", err, out)
	}
	return *st.Last
}

// replicaUploaded is the last WAL sequence the replica holds, from
// `supervisor status --json` (whose replica fields are read together:
// durable_sequence - lag_entries = uploaded_sequence).
func replicaUploaded(t *testing.T, bin, dataDir string) uint64 {
	t.Helper()
	out, err := exec.Command(bin, "status", "--data-dir", dataDir, "--json").Output()
	if err != nil {
		t.Fatalf("supervisor status: %v", err)
	}
	var st struct {
		Replica *struct {
			Uploaded uint64 `json:"uploaded_sequence"`
			Durable  uint64 `json:"durable_sequence"`
			Lag      uint64 `json:"lag_entries"`
		} `json:"replica"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Replica == nil {
		t.Fatalf("supervisor status --json has no replica state (%v): %s", err, out)
	}
	if st.Replica.Durable-st.Replica.Lag != st.Replica.Uploaded {
		t.Fatalf("status: durable %d - lag %d != uploaded %d", st.Replica.Durable, st.Replica.Lag, st.Replica.Uploaded)
	}
	return st.Replica.Uploaded
}
