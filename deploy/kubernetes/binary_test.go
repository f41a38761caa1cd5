package kubernetes_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The supervisor binary, built once from the parent module (../..) into a
// directory any user may read, so that it can also run as the pod's user.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func supervisorBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "k8s-manifests-bin-")
		if buildErr != nil {
			return
		}
		if buildErr = os.Chmod(buildDir, 0o755); buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "supervisor")
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", builtBin, "./cmd/supervisor")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/supervisor: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// runHelp is what `supervisor run --help` says: its flags, each flag's
// environment variable, and the defaults.
type runHelp struct {
	flags    map[string]bool
	envs     map[string]bool
	defaults map[string]string
}

func readRunHelp(t *testing.T) runHelp {
	t.Helper()
	out, err := exec.Command(supervisorBinary(t), "run", "--help").CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("supervisor run --help: %v", err)
	}
	h := runHelp{flags: map[string]bool{}, envs: map[string]bool{}, defaults: map[string]string{}}
	// "  --shutdown-timeout D  $SUPERVISOR_SHUTDOWN_TIMEOUT\n      on SIGTERM... (default 10s)"
	re := regexp.MustCompile(`(?m)^  --([a-z0-9-]+)(?: [A-Z]+)?  \$(SUPERVISOR_[A-Z0-9_]+)\n      .*?(?:\(default ([^)]*)\))?$`)
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		h.flags[m[1]] = true
		h.envs[m[2]] = true
		if m[3] != "" {
			h.defaults[m[1]] = m[3]
		}
	}
	if !h.flags["data-dir"] || !h.flags["shutdown-timeout"] || h.defaults["shutdown-timeout"] == "" {
		t.Fatalf("cannot read the flags from `supervisor run --help`:\n%s", out)
	}
	return h
}

// Every flag and SUPERVISOR_* variable the StatefulSet gives `supervisor
// run` is one the binary knows. (The --replica flags come with the
// replication package; until it is merged this test fails on them.)
func TestFlagsKnownToBinary(t *testing.T) {
	help := readRunHelp(t)
	r := render(t)
	c := supervisorContainer(t, r.sts)
	flags, order, agent := runArgs(t, c)
	for _, name := range order {
		if !help.flags[name] {
			t.Errorf("--%s: `supervisor run --help` has no such flag", name)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "SUPERVISOR_") && !help.envs[e.Name] {
			t.Errorf("env %s: no flag of `supervisor run` reads it", e.Name)
		}
	}
	// $(VAR) in an argument is expanded by the kubelet only when VAR is in
	// the container's env; otherwise it stays literally in the argument.
	defined := map[string]bool{}
	for _, e := range c.Env {
		defined[e.Name] = true
	}
	for _, a := range c.Args {
		for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				t.Errorf("argument %q uses $(%s), which the container's env does not define", a, m[1])
			}
		}
	}
	// One prefix per pod: two pods of the StatefulSet must never write one
	// replica, and a pod rescheduled elsewhere keeps its name and so its
	// prefix.
	if rep := flags["replica"]; !regexp.MustCompile(`^s3://[a-z0-9][a-z0-9.-]+/.*\$\(POD_NAME\)`).MatchString(rep) {
		t.Errorf("--replica %q: want s3://BUCKET/PREFIX with $(POD_NAME) in the prefix", rep)
	}
	// The HTTP listener is on the container's port, on all addresses, and
	// the request API is protected by a token file from a Secret volume;
	// the probe listener is on the probe port.
	for flag, name := range map[string]string{"http-addr": "http", "probe-addr": "probe"} {
		_, port, err := net.SplitHostPort(flags[flag])
		if err != nil || port != fmt.Sprint(containerPort(t, c, name)) {
			t.Errorf("--%s %q: want 0.0.0.0:%d (the container port %s)", flag, flags[flag], containerPort(t, c, name), name)
		}
	}
	if _, ok := flags["http-allow-remote"]; ok {
		t.Errorf("--http-allow-remote: the request API is protected by --http-token-file; do not open it")
	}
	if tokenSecret(t, r, c, flags["http-token-file"]) == "" {
		t.Errorf("--http-token-file %q: not a key of a Secret mounted in the container", flags["http-token-file"])
	}
	// The supervisor refuses a token file others can read; the kubelet
	// adds only g+r (fsGroup) to the Secret's defaultMode.
	if m := secretMode(t, r, c, flags["http-token-file"]); m&0o077 != 0 {
		t.Errorf("token Secret defaultMode %04o: want 0400 (the supervisor refuses a token file group or others can read; the kubelet adds g+r for fsGroup itself)", m)
	}
	if len(agent) == 0 {
		t.Error("no agent command after --")
	}
}

// containerPort is the number of c's port named name.
func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("the container has no port named %s", name)
	return 0
}

// tokenSecret returns the token that the Secret mounted at the directory of
// path holds under path's base name ("" if none is).
func tokenSecret(t *testing.T, r rendered, c corev1.Container, path string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if filepath.Dir(path) != m.MountPath {
			continue
		}
		for _, v := range r.sts.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && r.secrets[v.Secret.SecretName] != nil {
				return r.secrets[v.Secret.SecretName].StringData[filepath.Base(path)]
			}
		}
	}
	return ""
}

// secretMode is the mode the kubelet gives the files of the Secret volume
// mounted at path's directory (0644 unless defaultMode says otherwise).
func secretMode(t *testing.T, r rendered, c corev1.Container, path string) fs.FileMode {
	t.Helper()
	for _, m := range c.VolumeMounts {
		for _, v := range r.sts.Spec.Template.Spec.Volumes {
			if m.MountPath == filepath.Dir(path) && v.Name == m.Name && v.Secret != nil {
				if v.Secret.DefaultMode == nil {
					return 0o644
				}
				return fs.FileMode(*v.Secret.DefaultMode)
			}
		}
	}
	t.Fatalf("no Secret volume mounted at %s", filepath.Dir(path))
	return 0
}

// On SIGTERM the agent gets --shutdown-timeout to checkpoint and exit, its
// final checkpoint up to --shutdown-timeout again to be stored, the HTTP
// server up to 2 s to close, and the replica a last upload of up to 5 s
// (supervisor/supervisor.go, supervisor/replica.go): the kubelet must not
// SIGKILL before that. 10 s cover the close, the upload and the WAL's sync.
func TestGracePeriodAboveShutdownTimeout(t *testing.T) {
	help := readRunHelp(t)
	r := render(t)
	flags, _, _ := runArgs(t, supervisorContainer(t, r.sts))
	v, ok := flags["shutdown-timeout"]
	if !ok {
		v = help.defaults["shutdown-timeout"]
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("--shutdown-timeout %q: %v", v, err)
	}
	g := r.sts.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		t.Fatal("terminationGracePeriodSeconds not set (the default, 30s, is not derived from --shutdown-timeout)")
	}
	if grace, need := time.Duration(*g)*time.Second, 2*d+10*time.Second; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %s, want more than 2 x --shutdown-timeout + 10s = %s", grace, need)
	}
}

// pod is the StatefulSet's pod as this test can run it: the built binary
// with the container's arguments, as the pod's user (when the test runs as
// root and can switch users), on "nodes" whose volumes are prepared the way
// the kubelet prepares one for fsGroup.
type pod struct {
	bin       string
	r         rendered
	c         corev1.Container
	flags     map[string]string
	order     []string
	agent     []string
	asPodUser bool
	uid, gid  uint32
	fsGroup   int
	addr      string // loopback address for --http-addr
	probeAddr string // loopback address for --probe-addr
	token     string
	grace     time.Duration
}

func newPod(t *testing.T) *pod {
	t.Helper()
	p := &pod{bin: supervisorBinary(t), r: render(t)}
	p.c = supervisorContainer(t, p.r.sts)
	psc := p.r.sts.Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsUser == nil || psc.RunAsGroup == nil || psc.FSGroup == nil {
		t.Fatalf("pod securityContext %+v: want runAsUser, runAsGroup and fsGroup (TestPodSecurity says more)", psc)
	}
	p.uid, p.gid, p.fsGroup = uint32(*psc.RunAsUser), uint32(*psc.RunAsGroup), int(*psc.FSGroup)
	p.flags, p.order, p.agent = runArgs(t, p.c)
	p.asPodUser = os.Geteuid() == 0
	if !p.asPodUser {
		t.Log("not root: the supervisor runs as this user, not as the pod's")
	}
	p.token = tokenSecret(t, p.r, p.c, p.flags["http-token-file"])
	p.grace = time.Duration(*p.r.sts.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	ln.Close()
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.probeAddr = ln.Addr().String()
	ln.Close()
	return p
}

// node is one node's copy of the pod's volumes: the claim's volume and the
// token Secret's file.
type node struct {
	vol, dataDir, tokenFile string
}

// newNode makes a node with a fresh volume, as the kubelet leaves one with
// fsGroup: group fsGroup, mode |= 0770 and setgid.
func (p *pod) newNode(t *testing.T) *node {
	t.Helper()
	root, err := os.MkdirTemp("", "k8s-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	mustChmod(t, root, 0o755)
	n := &node{vol: filepath.Join(root, "volume"), tokenFile: filepath.Join(root, "token")}
	if err := os.Mkdir(n.vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if p.asPodUser {
		mustChown(t, n.vol, 0, p.fsGroup)
	}
	mustChmod(t, n.vol, 0o775|fs.ModeSetgid)
	rel, _ := filepath.Rel(mountOf(t, p.c, p.r.sts.Spec.VolumeClaimTemplates[0].Name), p.flags["data-dir"])
	n.dataDir = filepath.Join(n.vol, rel)
	// The token, as the Secret volume presents it: root:fsGroup, defaultMode
	// plus the g+r the kubelet adds for fsGroup (SetVolumeOwnership's
	// read-only mask, 0440).
	if err := os.WriteFile(n.tokenFile, []byte(p.token), 0o600); err != nil {
		t.Fatal(err)
	}
	if p.asPodUser {
		mustChown(t, n.tokenFile, 0, p.fsGroup)
		mustChmod(t, n.tokenFile, secretMode(t, p.r, p.c, p.flags["http-token-file"])|0o440)
	}
	return n
}

// start starts the pod on n: the StatefulSet's arguments with paths and the
// address moved into the test's reach, $(VAR)s expanded from env as the
// kubelet expands them, the --replica flags replaced by replica (none: left
// out), and agentArgs appended to the agent's command.
func (p *pod) start(t *testing.T, n *node, env map[string]string, replica []string, agentArgs ...string) *supervisorProc {
	t.Helper()
	args := []string{"run"}
	for _, name := range p.order {
		v := p.flags[name]
		switch {
		case strings.HasPrefix(name, "replica"):
			continue
		case name == "data-dir":
			v = n.dataDir
		case name == "http-addr":
			v = p.addr
		case name == "probe-addr":
			v = p.probeAddr
		case name == "http-token-file":
			v = n.tokenFile
		}
		if v == "" && p.flags[name] == "" {
			args = append(args, "--"+name) // a boolean flag given bare
			continue
		}
		args = append(args, "--"+name+"="+v)
	}
	args = append(args, replica...)
	args = append(args, "--")
	for _, a := range p.agent {
		if a == p.c.Command[0] {
			a = p.bin // the built-in demo agent, as in the image
		}
		args = append(args, a)
	}
	args = append(args, agentArgs...)
	cmd := exec.Command(p.bin, args...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.asPodUser {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: p.uid, Gid: p.gid, Groups: []uint32{uint32(p.fsGroup)}}
	}
	return startProc(t, cmd)
}

func (p *pod) url(path string) string { return "http://" + p.addr + path }

// probeURL is path on the probe listener, where the kubelet probes.
func (p *pod) probeURL(path string) string { return "http://" + p.probeAddr + path }

// The probes' paths answer on a supervisor started with the StatefulSet's
// own arguments, as the pod's user, on a volume prepared as the kubelet
// prepares one for fsGroup; /metrics and the probes need no token, the
// request API does. It then survives the pod's restart on the same volume,
// and shows why fsGroupChangePolicy must be OnRootMismatch. (The --replica
// flags are left out: there is no bucket here; TestMoveToAnotherNode has one.)
func TestFSGroupVolume(t *testing.T) {
	p := newPod(t)
	c := p.c
	n := p.newNode(t)

	// First start, on the fresh volume.
	sp := p.start(t, n, nil, nil)
	sp.waitStatus(t, p.probeURL(c.StartupProbe.HTTPGet.Path), 200)
	sp.waitStatus(t, p.probeURL(c.LivenessProbe.HTTPGet.Path), 200)
	sp.waitStatus(t, p.probeURL(c.ReadinessProbe.HTTPGet.Path), 200)
	if body := sp.get(t, p.probeURL("/metrics"), 200); !strings.Contains(body, "supervisor_build_info{") {
		t.Errorf("/metrics without a token: no supervisor_build_info in it")
	}
	if code := sp.post(t, p.url("/v1/requests"), ""); code != http.StatusUnauthorized {
		t.Errorf("POST /v1/requests without the token: %d, want 401", code)
	}
	if code := sp.post(t, p.url("/v1/requests"), p.token); code != http.StatusAccepted && code != http.StatusOK {
		t.Errorf("POST /v1/requests with the Secret's token: %d, want 202 or 200", code)
	}
	fi, err := os.Stat(n.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: mode %v, want 0700 (created by the supervisor)", n.dataDir, fi.Mode())
	}
	if st := fi.Sys().(*syscall.Stat_t); p.asPodUser && st.Uid != p.uid {
		t.Errorf("%s: owned by uid %d, want the pod's user %d", n.dataDir, st.Uid, p.uid)
	}
	sp.stop(t, p.grace)

	// The pod restarts on the same volume. With OnRootMismatch the kubelet
	// leaves it alone: the root is already group fsGroup and g+rwx.
	sp = p.start(t, n, nil, nil)
	sp.waitStatus(t, p.url(c.ReadinessProbe.HTTPGet.Path), 200)
	sp.stop(t, p.grace)

	// With fsGroupChangePolicy Always, the kubelet would walk the volume at
	// this mount: every directory |= 0770 and setgid, every file |= 0660.
	// The supervisor then refuses its data directory (exit 2) — which is
	// why the manifest says OnRootMismatch.
	err = filepath.WalkDir(n.vol, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&fs.ModeSymlink != 0 || fi.Mode()&fs.ModeSocket != 0 {
			return err
		}
		mask := fs.FileMode(0o660)
		if d.IsDir() {
			mask |= 0o110 | fs.ModeSetgid
		}
		return os.Chmod(path, fi.Mode()&(fs.ModePerm|fs.ModeSetgid)|mask)
	})
	if err != nil {
		t.Fatal(err)
	}
	sp = p.start(t, n, nil, nil)
	code, stderr := sp.wait(t, 30*time.Second)
	if code != 2 || !strings.Contains(stderr, "writable by group") {
		t.Errorf("after a recursive fsGroup change: exit %d, want 2 with \"writable by group\"; stderr:\n%s", code, stderr)
	}
}

type supervisorProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	code   int
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startProc(t *testing.T, cmd *exec.Cmd) *supervisorProc {
	t.Helper()
	p := &supervisorProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := cmd.Wait()
		p.code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitStatus polls url until it answers want; it fails if the supervisor
// exits first, or after 30 s.
func (p *supervisorProc) waitStatus(t *testing.T, url string, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("the supervisor exited (%d) while waiting for %s; its output:\n%s", p.code, url, p.stderr)
		default:
		}
		resp, err := httpClient.Get(url)
		if err == nil {
			b, _ := readAll(resp)
			if resp.StatusCode == want {
				return
			}
			if resp.StatusCode == http.StatusNotFound {
				t.Fatalf("%s: 404, the supervisor has no such endpoint", url)
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no %d within 30 s (last: %s); output:\n%s", url, want, last, p.stderr)
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func readAll(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err := b.ReadFrom(resp.Body)
	return b.String(), err
}

func (p *supervisorProc) get(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := readAll(resp)
	if resp.StatusCode != want {
		t.Errorf("GET %s: %d, want %d: %s", url, resp.StatusCode, want, body)
	}
	return body
}

func (p *supervisorProc) post(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(`{"message":"hello from the manifest test"}`))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(resp)
	return resp.StatusCode
}

// stop sends SIGTERM, as the kubelet does, and wants a clean exit within
// the pod's grace period.
func (p *supervisorProc) stop(t *testing.T, grace time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	code, out := p.wait(t, grace)
	if code != 0 {
		t.Fatalf("after SIGTERM: exit %d, want 0; output:\n%s", code, out)
	}
	t.Logf("stopped cleanly %s after SIGTERM (grace period %s)", time.Since(began).Round(time.Millisecond), grace)
}

func (p *supervisorProc) wait(t *testing.T, limit time.Duration) (int, string) {
	t.Helper()
	select {
	case <-p.done:
		return p.code, p.stderr.String()
	case <-time.After(limit):
		t.Fatalf("the supervisor did not exit within %s; output:\n%s", limit, p.stderr)
		return 0, ""
	}
}

func mustChmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func mustChown(t *testing.T, path string, uid, gid int) {
	t.Helper()
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}
