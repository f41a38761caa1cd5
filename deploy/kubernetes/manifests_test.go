// Package kubernetes_test checks the Kubernetes manifests in this directory:
// every object decodes strictly (unknown or duplicate fields are errors,
// field names are case-sensitive, as the API server decodes them) into its
// type from k8s.io/api or the Prometheus Operator's monitoring/v1; the
// kustomization renders, as `kubectl apply -k` would render it; and the
// manifests agree with each other, with ../prometheus/alerts.yml, and with
// the supervisor binary built from this repository (binary_test.go); the
// Grafana dashboard's queries name only metrics that binary exports
// (grafana_test.go).
//
// This is its own Go module, so that the product's go.mod does not take on
// the Kubernetes API. Once its modules are downloaded, it needs no network.
package kubernetes_test

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kustomizetypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml from ../prometheus/alerts.yml")

// decodeStrict decodes one YAML document into obj the way the API server
// does: duplicate keys, unknown fields and wrongly-cased field names are
// errors, not silently dropped.
func decodeStrict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("%v", strictErrs)
	}
	return nil
}

// newObject returns an empty object of the Go type for a manifest's
// apiVersion and kind. Every kind the manifests may use is listed here; any
// other is an error, never accepted unchecked.
func newObject(gvk schema.GroupVersionKind) (any, error) {
	switch gvk {
	case appsv1.SchemeGroupVersion.WithKind("StatefulSet"):
		return &appsv1.StatefulSet{}, nil
	case corev1.SchemeGroupVersion.WithKind("Service"):
		return &corev1.Service{}, nil
	case corev1.SchemeGroupVersion.WithKind("Secret"):
		return &corev1.Secret{}, nil
	case corev1.SchemeGroupVersion.WithKind("ConfigMap"):
		return &corev1.ConfigMap{}, nil
	case monitoringv1.SchemeGroupVersion.WithKind("PodMonitor"):
		return &monitoringv1.PodMonitor{}, nil
	case monitoringv1.SchemeGroupVersion.WithKind("PrometheusRule"):
		return &monitoringv1.PrometheusRule{}, nil
	}
	return nil, fmt.Errorf("no Go type known for %s (add it to newObject)", gvk)
}

// splitDocs splits a multi-document YAML stream, dropping empty documents
// (a file of only comments).
func splitDocs(t *testing.T, b []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("not YAML: %v", err)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue
		}
		docs = append(docs, doc)
	}
	return docs
}

// decodeDoc decodes one manifest document strictly into its type.
func decodeDoc(doc []byte) (any, schema.GroupVersionKind, error) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, schema.GroupVersionKind{}, err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return nil, schema.GroupVersionKind{}, err
	}
	gvk := gv.WithKind(tm.Kind)
	obj, err := newObject(gvk)
	if err != nil {
		return nil, gvk, err
	}
	if err := decodeStrict(doc, obj); err != nil {
		return nil, gvk, fmt.Errorf("%s: %w", gvk.Kind, err)
	}
	return obj, gvk, nil
}

// kustomization reads kustomization.yaml strictly.
func kustomization(t *testing.T) kustomizetypes.Kustomization {
	t.Helper()
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomizetypes.Kustomization
	if err := decodeStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// Every manifest file, and every document in it, decodes strictly; every
// YAML file here is in the kustomization (none is forgotten). A directory
// among the resources (../grafana) is a kustomization of its own: its
// objects are checked as render builds them.
func TestManifestsDecodeStrictly(t *testing.T) {
	k := kustomization(t)
	if len(k.Resources) == 0 {
		t.Fatal("kustomization.yaml lists no resources")
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f != "kustomization.yaml" && !slices.Contains(k.Resources, f) {
			t.Errorf("%s is not in kustomization.yaml's resources", f)
		}
	}
	for _, f := range k.Resources {
		if fi, err := os.Stat(f); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(f, "kustomization.yaml")); err != nil {
				t.Errorf("resource %s: a directory without a kustomization.yaml", f)
			}
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs := splitDocs(t, b)
		if len(docs) == 0 {
			t.Errorf("%s: no object in it", f)
		}
		for i, doc := range docs {
			if _, _, err := decodeDoc(doc); err != nil {
				t.Errorf("%s, document %d: %v", f, i+1, err)
			}
		}
	}
}

// The strict decoding is not a formality: a misspelt or misplaced field is
// refused, as the API server would refuse it.
func TestStrictDecodingRefusesMistakes(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: None, selectr: {a: b}}\n",
		"wrong case":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ClusterIP: None}\n",
		"duplicate key": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: None, clusterIP: None}\n",
		"wrong type":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: http}]}\n",
		"unknown kind":  "apiVersion: v1\nkind: Servic\nmetadata: {name: x}\n",
		"PodMonitor unknown field": "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\n" +
			"spec: {selector: {}, podMetricsEndpoints: [{port: http, paths: /metrics}]}\n",
	} {
		if _, _, err := decodeDoc([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error:\n%s", name, doc)
		}
	}
}

// rendered is what `kubectl apply -k` would send: the kustomization built
// with kustomize's own library, each object decoded strictly.
type rendered struct {
	sts      *appsv1.StatefulSet
	services []*corev1.Service
	secrets  map[string]*corev1.Secret
	podMon   *monitoringv1.PodMonitor
	rule     *monitoringv1.PrometheusRule
	configs  map[string]*corev1.ConfigMap // the Grafana dashboard's (../grafana)
}

func render(t *testing.T) rendered {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out := rendered{secrets: map[string]*corev1.Secret{}, configs: map[string]*corev1.ConfigMap{}}
	for _, res := range m.Resources() {
		doc, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, gvk, err := decodeDoc(doc)
		if err != nil {
			t.Fatalf("rendered %s: %v", res.CurId(), err)
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			if out.sts != nil {
				t.Fatal("more than one StatefulSet")
			}
			out.sts = o
		case *corev1.Service:
			out.services = append(out.services, o)
		case *corev1.Secret:
			out.secrets[o.Name] = o
		case *corev1.ConfigMap:
			out.configs[o.Name] = o
		case *monitoringv1.PodMonitor:
			out.podMon = o
		case *monitoringv1.PrometheusRule:
			out.rule = o
		default:
			t.Fatalf("unexpected %s", gvk)
		}
	}
	if out.sts == nil || len(out.services) != 1 || out.podMon == nil || out.rule == nil || len(out.configs) != 1 {
		t.Fatalf("rendered: want a StatefulSet, a Service, a PodMonitor, a PrometheusRule and a ConfigMap (the dashboard); got %+v", out)
	}
	return out
}

// supervisorContainer returns the StatefulSet's supervisor container.
func supervisorContainer(t *testing.T, sts *appsv1.StatefulSet) corev1.Container {
	t.Helper()
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name == "supervisor" {
			return c
		}
	}
	t.Fatal("the StatefulSet has no container named supervisor")
	return corev1.Container{}
}

// runArgs splits the container's arguments: `run`, the supervisor's flags
// as name → value (flags given as --name=value or --name value), and the
// agent command after "--".
func runArgs(t *testing.T, c corev1.Container) (flags map[string]string, order []string, agent []string) {
	t.Helper()
	args := c.Args
	if len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/supervisor" {
		t.Fatalf("command %q, want [/usr/local/bin/supervisor] (the binary's path in the image)", c.Command)
	}
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("args %q: want run [flags] -- AGENT", args)
	}
	flags = map[string]string{}
	i := 1
	for ; i < len(args) && args[i] != "--"; i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			t.Fatalf("argument %q: not a flag; the agent command goes after --", args[i])
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			value = args[i]
		}
		if _, dup := flags[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		flags[name] = value
		order = append(order, name)
	}
	if i >= len(args)-1 {
		t.Fatalf("args %q: want -- AGENT_COMMAND after the flags", args)
	}
	return flags, order, args[i+1:]
}

func TestPrometheusRuleIsAlertsYML(t *testing.T) {
	alerts, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	want := prometheusRuleFile(t, alerts)
	if *update {
		if err := os.WriteFile("prometheusrule.yaml", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("prometheusrule.yaml is not ../prometheus/alerts.yml wrapped in a PrometheusRule; regenerate it:\n" +
			"  cd deploy/kubernetes && go test -run TestPrometheusRuleIsAlertsYML -update")
	}
	// And independently of how the file is made: the same groups and rules.
	var spec monitoringv1.PrometheusRuleSpec
	if err := decodeStrict(alerts, &spec); err != nil {
		t.Fatalf("alerts.yml does not decode as a PrometheusRule spec: %v", err)
	}
	obj, _, err := decodeDoc(got)
	if err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	rule := obj.(*monitoringv1.PrometheusRule)
	if !reflect.DeepEqual(rule.Spec, spec) {
		t.Errorf("the PrometheusRule's rules differ from alerts.yml's:\n got %+v\nwant %+v", rule.Spec, spec)
	}
	n := 0
	for _, g := range spec.Groups {
		n += len(g.Rules)
	}
	if n < 12 {
		t.Errorf("%d rules, want at least the 12 of alerts.yml", n)
	}
}

// prometheusRuleFile wraps alerts.yml (from its groups: line on, comments
// and all) in a PrometheusRule.
func prometheusRuleFile(t *testing.T, alerts []byte) []byte {
	t.Helper()
	s := string(alerts)
	i := strings.Index(s, "\ngroups:\n")
	if i < 0 {
		t.Fatal("alerts.yml has no top-level groups: line")
	}
	var b strings.Builder
	b.WriteString(`# Generated from ../prometheus/alerts.yml: do not edit. After changing the rules there:
#   cd deploy/kubernetes && go test -run TestPrometheusRuleIsAlertsYML -update
# Your Prometheus must select it: add the label its ruleSelector wants (e.g.
# release: kube-prometheus-stack). The SupervisorDown rule matches
# job="agent-supervisor", which podmonitor.yaml gives the targets.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: agent-supervisor
  labels:
    app.kubernetes.io/name: agent-supervisor
spec:
`)
	for _, line := range strings.SplitAfter(s[i+1:], "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// The objects refer to each other by the names and ports they really have.
func TestManifestsAgreeWithEachOther(t *testing.T) {
	r := render(t)
	sts, svc := r.sts, r.services[0]
	pod := sts.Spec.Template
	c := supervisorContainer(t, sts)

	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("StatefulSet serviceName %q, Service is %q", sts.Spec.ServiceName, svc.Name)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want None (headless, for the StatefulSet's DNS names)", svc.Spec.ClusterIP)
	}
	for name, sel := range map[string]map[string]string{"Service": svc.Spec.Selector, "StatefulSet": sts.Spec.Selector.MatchLabels, "PodMonitor": r.podMon.Spec.Selector.MatchLabels} {
		if len(sel) == 0 {
			t.Errorf("%s: empty selector", name)
		}
		for k, v := range sel {
			if pod.Labels[k] != v {
				t.Errorf("%s selects %s=%s, which the pod template does not carry", name, k, v)
			}
		}
	}

	// Two ports: http (the request API, behind the Service) and probe
	// (--probe-addr: the probes and /metrics, which no client of the
	// request API can crowd out).
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if len(c.Ports) != 2 || ports["http"] == 0 || ports["probe"] == 0 {
		t.Fatalf("container ports %+v: want two, named http and probe", c.Ports)
	}
	port := ports["http"]
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" || svc.Spec.Ports[0].Port != port {
		t.Errorf("Service ports %+v: want port %d, targetPort http (the probe port stays out of it)", svc.Spec.Ports, port)
	}
	if a := pod.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != fmt.Sprint(ports["probe"]) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape true, port %d (probe), path /metrics", a, ports["probe"])
	}
	eps := r.podMon.Spec.PodMetricsEndpoints
	if len(eps) != 1 || eps[0].Port == nil || *eps[0].Port != "probe" || eps[0].Path != "/metrics" {
		t.Errorf("PodMonitor endpoints %+v: want port probe, path /metrics", eps)
	}
	// SupervisorDown matches up{job="agent-supervisor"}: the PodMonitor
	// must produce that job label.
	if jl := r.podMon.Spec.JobLabel; jl == "" || pod.Labels[jl] != "agent-supervisor" {
		t.Errorf("PodMonitor jobLabel %q: the pod's label of that name is %q, want agent-supervisor (the job the alert rules match)", jl, pod.Labels[jl])
	}

	// Probes: by name on the probe port; the paths are checked against a
	// running supervisor in binary_test.go.
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet probe", name)
			continue
		}
		if p.HTTPGet.Port.String() != "probe" {
			t.Errorf("%s probe on port %s, want probe (--probe-addr)", name, p.HTTPGet.Port.String())
		}
		if p.TimeoutSeconds < 1 || p.PeriodSeconds <= p.TimeoutSeconds {
			t.Errorf("%s probe: timeoutSeconds %d, periodSeconds %d: want a timeout shorter than the period", name, p.TimeoutSeconds, p.PeriodSeconds)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe path %q, want /healthz (the supervisor's own health; it stays 200 while the agent restarts)", c.LivenessProbe.HTTPGet.Path)
	}
	if c.StartupProbe != nil && c.StartupProbe.HTTPGet != nil && c.StartupProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("startup probe path %q, want /healthz", c.StartupProbe.HTTPGet.Path)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe path %q, want /readyz (the agent up and heartbeating)", c.ReadinessProbe.HTTPGet.Path)
	}

	// Secrets the pod refers to are in the manifests, with the keys it uses.
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		s := r.secrets[ref.Name]
		if s == nil {
			t.Errorf("env %s: Secret %q is not in the manifests", e.Name, ref.Name)
			continue
		}
		if _, ok := s.StringData[ref.Key]; !ok && (ref.Optional == nil || !*ref.Optional) {
			t.Errorf("env %s: Secret %q has no key %q", e.Name, ref.Name, ref.Key)
		}
	}
	for _, name := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
		}) {
			t.Errorf("env %s: want it from a Secret (the replica's credentials)", name)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && r.secrets[v.Secret.SecretName] == nil {
			t.Errorf("volume %s: Secret %q is not in the manifests", v.Name, v.Secret.SecretName)
		}
	}

	// Image: the kustomization's images: entry applies to the container.
	k := kustomization(t)
	if len(k.Images) != 1 || !strings.HasPrefix(c.Image, k.Images[0].NewName+":") {
		t.Errorf("image %q: want kustomization.yaml's images: entry (%+v) applied", c.Image, k.Images)
	}
}

// Non-root, with a volume the non-root user can write, and a kubelet that
// leaves the supervisor's data directory as the supervisor made it.
func TestPodSecurity(t *testing.T) {
	r := render(t)
	spec := r.sts.Spec.Template.Spec
	c := supervisorContainer(t, r.sts)
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Fatalf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
	}
	if *psc.RunAsUser != 65532 || psc.RunAsGroup == nil || *psc.RunAsGroup != 65532 {
		t.Errorf("runAsUser/runAsGroup: want 65532, the image's nonroot user (USER 65532:65532)")
	}
	if psc.FSGroup == nil || *psc.FSGroup != *psc.RunAsGroup {
		t.Errorf("fsGroup %s: want the user's group, so the volume is writable for it", deref(psc.FSGroup))
	}
	// The default (Always) re-applies g+rwx,setgid to every directory of
	// the volume at each mount: the supervisor would then refuse its own
	// data directory (TestFSGroupVolume shows it).
	if psc.FSGroupChangePolicy == nil || *psc.FSGroupChangePolicy != corev1.FSGroupChangeOnRootMismatch {
		t.Errorf("fsGroupChangePolicy %s: want OnRootMismatch", deref(psc.FSGroupChangePolicy))
	}
	csc := c.SecurityContext
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want allowPrivilegeEscalation false and all capabilities dropped", csc)
	}

	// The data directory: a subdirectory of the PVC's mount (the volume
	// root is group-writable; the supervisor creates the subdirectory 0700).
	flags, _, _ := runArgs(t, c)
	dataDir := flags["data-dir"]
	if len(r.sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("want one volumeClaimTemplate, got %d", len(r.sts.Spec.VolumeClaimTemplates))
	}
	claim := r.sts.Spec.VolumeClaimTemplates[0]
	if !slices.Contains(claim.Spec.AccessModes, corev1.ReadWriteOnce) {
		t.Errorf("volumeClaimTemplate access modes %v: want ReadWriteOnce (one writer)", claim.Spec.AccessModes)
	}
	mount := mountOf(t, c, claim.Name)
	rel, err := filepath.Rel(mount, dataDir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		t.Errorf("--data-dir %q: want a subdirectory of the volume mounted at %s", dataDir, mount)
	}
}

// deref prints what p points to, or "unset".
func deref[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// mountOf returns where volume name is mounted in c.
func mountOf(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m.MountPath
		}
	}
	t.Fatalf("volume %s is not mounted in the container", name)
	return ""
}
