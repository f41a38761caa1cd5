package kubernetes_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/heatmap"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// The Grafana dashboard, ../grafana/supervisor.json: its JSON has the shape
// of Grafana's dashboard model, every PromQL expression in it parses with
// Prometheus's own parser once Grafana's variables are substituted, and
// every metric it names is one the supervisor binary exports — read from
// the /metrics of the binary built from this repository, run with an agent
// that gives every panel something to show. ../grafana/kustomization.yaml
// ships it as a ConfigMap for Grafana's dashboard sidecar.

const dashboardFile = "../grafana/supervisor.json"

// dashboardModel is the part of Grafana's dashboard JSON model the checks
// below read (TestDashboardSchema decodes the whole of it with Grafana's own
// types) (https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
type dashboardModel struct {
	ID            *int        `json:"id"`
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []dashVariable `json:"list"`
	} `json:"templating"`
}

type dashPanel struct {
	ID          int          `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	GridPos     *gridPos     `json:"gridPos"`
	Datasource  *dsRef       `json:"datasource"`
	Targets     []dashTarget `json:"targets"`
	Collapsed   bool         `json:"collapsed"`
	Panels      []dashPanel  `json:"panels"` // a row's, when it is collapsed
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashTarget struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	Format       string `json:"format"`
	Datasource   *dsRef `json:"datasource"`
}

type dashVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *dsRef          `json:"datasource"`
	IncludeAll bool            `json:"includeAll"`
	Multi      bool            `json:"multi"`
	AllValue   string          `json:"allValue"`
}

// The variables every query filters by: the data source, and the job and
// instance (the scrape target: one supervisor) of the series.
const (
	dsVar       = "datasource"
	dsUID       = "${datasource}"
	filterJob   = "job"
	filterInst  = "instance"
	varSentinel = "grafanavar_" // a variable's stand-in value in a parsed query
)

// panelTypes are the panel types the dashboard may use, all built into
// Grafana; each but row has its options' type registered in
// TestDashboardSchema.
var panelTypes = []string{"row", "timeseries", "stat", "heatmap"}

func readDashboard(t *testing.T) (dashboardModel, []byte) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboardModel
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: not Grafana's dashboard model: %v", dashboardFile, err)
	}
	return d, b
}

// allPanels is every panel, a collapsed row's included.
func (d dashboardModel) allPanels() []dashPanel {
	var out []dashPanel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// grafanaVarRef matches Grafana's variable syntaxes: $name, ${name},
// ${name:format}, ${name.field} and the old [[name]], [[name:format]].
var grafanaVarRef = regexp.MustCompile(`\$\{(\w+)(?:[.:][^}]*)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)`)

// grafanaGlobals are the global variables a Prometheus query may use, with
// a value of the right kind for the parser.
var grafanaGlobals = map[string]string{
	"__rate_interval": "1m", "__interval": "1m", "__range": "1h",
	"__interval_ms": "60000", "__range_s": "3600", "__range_ms": "3600000",
}

// substitute replaces Grafana's variables in s as Grafana would before
// sending the query: globals by a value of their kind, the dashboard's own
// by varSentinel+name (a valid label value and regular expression, which
// the checks below look for). It reports variables defined nowhere.
func substitute(s string, defined map[string]bool) (string, error) {
	var errs []error
	out := grafanaVarRef.ReplaceAllStringFunc(s, func(ref string) string {
		m := grafanaVarRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := grafanaGlobals[name]; ok {
			return v
		}
		if strings.HasPrefix(name, "__") {
			errs = append(errs, fmt.Errorf("%s: not a Grafana global variable this check knows (add it to grafanaGlobals if Grafana has it)", ref))
			return ref
		}
		if !defined[name] {
			errs = append(errs, fmt.Errorf("%s: no such variable in the dashboard's templating", ref))
			return ref
		}
		return varSentinel + name
	})
	return out, errors.Join(errs...)
}

// The dashboard imports into Grafana's model: a uid, a schema version of
// Grafana 9.4 to 12, no numeric id (import creates one), the data source,
// job and instance variables; panels with unique ids, a place on the
// 24-column grid that no other panel takes, and (rows aside) queries with a
// refId and an expression on the ${datasource} data source; every variable
// used anywhere is defined.
func TestDashboardModel(t *testing.T) {
	d, raw := readDashboard(t)
	if d.UID == "" || len(d.UID) > 40 || d.Title == "" {
		t.Errorf("uid %q, title %q: want both, the uid at most 40 characters", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 42 {
		t.Errorf("schemaVersion %d: want 36..42 (Grafana 9.4 to 12)", d.SchemaVersion)
	}
	if d.ID != nil {
		t.Errorf("id %d: want null, so that an import creates the dashboard instead of overwriting one", *d.ID)
	}

	defined := map[string]bool{}
	vars := map[string]dashVariable{}
	for _, v := range d.Templating.List {
		if defined[v.Name] {
			t.Errorf("variable %s defined twice", v.Name)
		}
		defined[v.Name] = true
		vars[v.Name] = v
	}
	if v := vars[dsVar]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable %s: type %q, query %s; want a datasource variable over prometheus data sources", dsVar, v.Type, v.Query)
	}
	for _, name := range []string{filterJob, filterInst} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("no %s variable", name)
			continue
		}
		if q := variableQuery(t, v); v.Type != "query" || !strings.HasPrefix(q, "label_values(") {
			t.Errorf("variable %s: type %q, query %q; want a query variable with label_values(...)", name, v.Type, q)
		}
		if v.Datasource == nil || v.Datasource.UID != dsUID {
			t.Errorf("variable %s: datasource %+v, want uid %s", name, v.Datasource, dsUID)
		}
		if v.IncludeAll && v.AllValue != ".*" {
			t.Errorf("variable %s: allValue %q with includeAll; want .* (the queries match it with =~)", name, v.AllValue)
		}
	}
	for _, v := range d.Templating.List {
		if _, err := substitute(variableQuery(t, v), defined); err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
		}
	}

	for i, p := range d.Panels {
		for _, q := range d.Panels[:i] {
			if p.GridPos != nil && q.GridPos != nil && overlap(*p.GridPos, *q.GridPos) {
				t.Errorf("panel %d (%q) at %+v overlaps panel %d (%q) at %+v", p.ID, p.Title, *p.GridPos, q.ID, q.Title, *q.GridPos)
			}
		}
	}
	ids := map[int]string{}
	for _, p := range d.allPanels() {
		name := fmt.Sprintf("panel %d (%q)", p.ID, p.Title)
		if p.ID <= 0 {
			t.Errorf("%s: want a positive id", name)
		} else if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", name, other)
		}
		ids[p.ID] = p.Title
		if !slices.Contains(panelTypes, p.Type) {
			t.Errorf("%s: type %q, want one of %v", name, p.Type, panelTypes)
		}
		if p.Title == "" {
			t.Errorf("%s: no title", name)
		}
		g := p.GridPos
		if g == nil || g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v, want w 1..24, h ≥ 1, x+w ≤ 24", name, g)
		}
		for _, s := range []string{p.Title, p.Description} {
			if _, err := substitute(s, defined); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		if p.Type == "row" {
			if len(p.Targets) > 0 {
				t.Errorf("%s: a row with queries", name)
			}
			continue
		}
		if len(p.Panels) > 0 {
			t.Errorf("%s: panels inside a %s (only rows hold panels)", name, p.Type)
		}
		if p.Datasource == nil || p.Datasource.UID != dsUID {
			t.Errorf("%s: datasource %+v, want uid %s (the data source variable)", name, p.Datasource, dsUID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", name)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: refId %q empty or repeated", name, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s, query %s: no expr", name, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != dsUID {
				t.Errorf("%s, query %s: datasource %+v, want uid %s", name, tg.RefID, tg.Datasource, dsUID)
			}
			for _, s := range []string{tg.Expr, tg.LegendFormat} {
				if _, err := substitute(s, defined); err != nil {
					t.Errorf("%s, query %s: %v", name, tg.RefID, err)
				}
			}
			if p.Type == "heatmap" && tg.Format != "heatmap" {
				t.Errorf("%s, query %s: format %q, want heatmap (buckets as a heatmap, not as series)", name, tg.RefID, tg.Format)
			}
		}
	}
	// Every ${...} in the file is one of the above (none hides in a field
	// this test does not read).
	for _, m := range grafanaVarRef.FindAllStringSubmatch(string(raw), -1) {
		// $__all: the value of a variable's "All" option, not a reference.
		if name := m[1] + m[2] + m[3]; !defined[name] && grafanaGlobals[name] == "" && name != "__all" {
			t.Errorf("%s: %s is used but not a dashboard variable", dashboardFile, m[0])
		}
	}
}

// The dashboard decodes strictly into the types of Grafana's Foundation SDK,
// generated from the schemas Grafana itself validates dashboards with: the
// dashboard, each panel type's options and field config, and the
// Prometheus queries. A misspelt field, a missing required one or a value of
// the wrong type is an error, as it is not in Grafana's lenient import.
func TestDashboardSchema(t *testing.T) {
	_, raw := readDashboard(t)
	rt := cog.NewRuntime()
	rt.RegisterPanelcfgVariant(timeseries.VariantConfig())
	rt.RegisterPanelcfgVariant(stat.VariantConfig())
	rt.RegisterPanelcfgVariant(heatmap.VariantConfig())
	rt.RegisterDataqueryVariant(prometheus.VariantConfig())
	var d dashboard.Dashboard
	// UnmarshalJSONStrict returns a nil cog.BuildErrors as a non-nil error.
	if err := d.UnmarshalJSONStrict(raw); err != nil {
		var be cog.BuildErrors
		if !errors.As(err, &be) || len(be) > 0 {
			t.Errorf("%s does not decode into Grafana's dashboard schema:\n%v", dashboardFile, err)
		}
	}
	if err := d.Validate(); err != nil {
		var be cog.BuildErrors
		if !errors.As(err, &be) || len(be) > 0 {
			t.Errorf("%s: %v", dashboardFile, err)
		}
	}
}

func overlap(a, b gridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// variableQuery is a variable's query as a string (Grafana stores a query
// variable's as {"query": ...}, a datasource variable's as a plain string).
func variableQuery(t *testing.T, v dashVariable) string {
	t.Helper()
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &q); err != nil {
		t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
	}
	if v.Definition != "" && v.Definition != q.Query {
		t.Errorf("variable %s: definition %q differs from its query %q", v.Name, v.Definition, q.Query)
	}
	return q.Query
}

// labelValuesQuery matches Grafana's label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// Every query of every panel, and every variable's, parses with
// Prometheus's parser after Grafana's substitutions; it filters by the job
// and instance variables; every metric it names is exported by the binary
// (a histogram through its _bucket, _sum and _count series); rate(),
// irate() and increase() take counters only, histogram_quantile() buckets
// only; and every panel shows at least one metric.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	d, _ := readDashboard(t)
	exported := exportedMetrics(t)
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
	}
	p := parser.NewParser(parser.Options{})

	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := substitute(variableQuery(t, v), defined)
		if err != nil {
			continue // TestDashboardModel reports it
		}
		m := labelValuesQuery.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		ms, err := p.ParseMetricSelector(m[1])
		if err != nil {
			t.Errorf("variable %s: selector %q: %v", v.Name, m[1], err)
			continue
		}
		if name := metricName(ms); exported[name] == "" {
			t.Errorf("variable %s: metric %q is not one the supervisor exports", v.Name, name)
		}
	}

	for _, pn := range d.allPanels() {
		if pn.Type == "row" {
			continue
		}
		metrics := 0
		for _, tg := range pn.Targets {
			where := fmt.Sprintf("panel %q, query %s", pn.Title, tg.RefID)
			q, err := substitute(tg.Expr, defined)
			if err != nil {
				continue // TestDashboardModel reports it
			}
			expr, err := p.ParseExpr(q)
			if err != nil {
				t.Errorf("%s: %v\n\t%s", where, err, q)
				continue
			}
			for _, e := range checkQuery(expr, exported) {
				t.Errorf("%s: %v\n\t%s", where, e, tg.Expr)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if _, ok := n.(*parser.VectorSelector); ok {
					metrics++
				}
				return nil
			})
		}
		if metrics == 0 {
			t.Errorf("panel %q: no query selects a metric", pn.Title)
		}
	}
}

// checkQuery checks a parsed query against the exported metrics (name →
// type, a histogram's series as "histogram").
func checkQuery(expr parser.Expr, exported map[string]string) []error {
	var errs []error
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			name := metricName(n.LabelMatchers)
			switch {
			case name == "":
				errs = append(errs, fmt.Errorf("%s: a selector without a metric name", n))
			case exported[name] == "":
				errs = append(errs, fmt.Errorf("metric %q: the supervisor exports no such metric (docs/operations.md#metrics lists them)", name))
			}
			for _, want := range []string{filterJob, filterInst} {
				if !slices.ContainsFunc(n.LabelMatchers, func(m *labels.Matcher) bool {
					return m.Name == want && m.Type == labels.MatchRegexp && m.Value == varSentinel+want
				}) {
					errs = append(errs, fmt.Errorf("%s: does not filter by %s=~\"$%s\"", n, want, want))
				}
			}
		case *parser.Call:
			switch n.Func.Name {
			case "rate", "irate", "increase":
				for _, name := range selectedNames(n.Args[0]) {
					if typ := exported[name]; typ != "" && typ != "counter" && typ != "histogram" {
						errs = append(errs, fmt.Errorf("%s() of %s, a %s: want a counter", n.Func.Name, name, typ))
					}
				}
			case "histogram_quantile":
				for _, name := range selectedNames(n.Args[1]) {
					if !strings.HasSuffix(name, "_bucket") || exported[name] != "histogram" {
						errs = append(errs, fmt.Errorf("histogram_quantile() over %s: want a histogram's _bucket series", name))
					}
				}
			}
		}
		return nil
	})
	return errs
}

func metricName(ms []*labels.Matcher) string {
	for _, m := range ms {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

func selectedNames(e parser.Node) []string {
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, metricName(vs.LabelMatchers))
		}
		return nil
	})
	return out
}

// The kustomization ships the dashboard, byte for byte, as a ConfigMap with
// a fixed name, labelled for Grafana's dashboard sidecar, small enough for
// `kubectl apply`.
func TestDashboardConfigMap(t *testing.T) {
	_, raw := readDashboard(t)
	r := render(t)
	var found bool
	for name, cm := range r.configs {
		data, ok := cm.Data["supervisor.json"]
		if !ok {
			continue
		}
		found = true
		if data != string(raw) {
			t.Errorf("ConfigMap %s: supervisor.json differs from %s", name, dashboardFile)
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("ConfigMap %s: labels %v, want grafana_dashboard: \"1\" (what Grafana's sidecar looks for)", name, cm.Labels)
		}
		if name != "agent-supervisor-dashboard" {
			t.Errorf("ConfigMap %s: want the fixed name agent-supervisor-dashboard (disableNameSuffixHash: a new name at every change would leave the old dashboard behind)", name)
		}
		// Client-side `kubectl apply` keeps the whole object in its
		// last-applied-configuration annotation; annotations hold 256 KiB.
		j, err := json.Marshal(cm)
		if err != nil {
			t.Fatal(err)
		}
		if len(j) > 200<<10 {
			t.Errorf("ConfigMap %s: %d bytes as JSON; kubectl apply's annotation holds at most 256 KiB, keep a margin", name, len(j))
		}
		t.Logf("ConfigMap %s: %d bytes of dashboard, %d as JSON", name, len(data), len(j))
	}
	if !found {
		t.Errorf("no rendered ConfigMap holds supervisor.json (kustomization.yaml's resources should include ../grafana)")
	}
}

// exportedMetrics is every metric name the supervisor binary exports, with
// its type (scrapeBinary).
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	m, err := scrapeBinary(t)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// scrapeBinary runs the supervisor so that every family of metrics has a
// series: a family with labels and no series yet is not in /metrics at all.
// First with the test agent (internal/testagent, as the end-to-end tests
// run it) logging, checkpointing, reporting its figures, answering a
// request and proposing an evolution that a shadow trial decides; then, on
// the same data directory, with --replica towards an endpoint nobody
// listens on (a non-empty data directory is not restored first, and the
// failed uploads are counted) and an agent that sends an invalid frame.
func scrapeBinary(t *testing.T) (map[string]string, error) {
	bin := supervisorBinary(t)
	agent, err := testAgentBinary()
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	out := map[string]string{}

	run := func(flags, agentArgs []string, want ...string) error {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		args := append([]string{"run", "--data-dir", dataDir, "--http-addr", addr, "--log-format", "json"}, flags...)
		args = append(args, "--", agent)
		args = append(args, agentArgs...)
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "SUPERVISOR_TEST_AGENT=1"}
		sp := startProc(t, cmd)
		sp.waitStatus(t, "http://"+addr+"/readyz", 200)
		if slices.Contains(want, "supervisor_request_duration_seconds_bucket") {
			if code := sp.post(t, "http://"+addr+"/v1/requests?wait=20s", ""); code != 200 {
				return fmt.Errorf("POST /v1/requests?wait=20s: %d, want 200 (answered); output:\n%s", code, sp.stderr)
			}
		}
		var missing []string
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got := metricTypes(sp.get(t, "http://"+addr+"/metrics", 200))
			missing = missing[:0]
			for _, name := range want {
				if got[name] == "" {
					missing = append(missing, name)
				}
			}
			if len(missing) == 0 || time.Now().After(deadline) {
				for k, v := range got {
					out[k] = v
				}
				break
			}
		}
		sp.stop(t, 60*time.Second)
		if len(missing) > 0 {
			return fmt.Errorf("after 60 s, /metrics has no %v; output:\n%s", missing, sp.stderr)
		}
		return nil
	}

	closed, err := freeAddr() // nothing listens there once freeAddr returns
	if err != nil {
		return nil, err
	}
	err = run([]string{"--shadow-duration", "2s", "--evolution-min-reports", "2"},
		[]string{"--heartbeat-interval", "50ms", "--metrics-interval", "100ms", "--wal-rate", "50", "--checkpoint-every", "20",
			"--answer", "--evolve-after", "700ms", "--evolve-target", "memory_system", "--evolve-code", "latency_ms=1"},
		"supervisor_evolutions_total", "supervisor_agent_reported_latency_seconds", "supervisor_request_duration_seconds_bucket",
		"supervisor_checkpoint_duration_seconds_bucket", "supervisor_wal_fsync_duration_seconds_bucket")
	if err != nil {
		return nil, fmt.Errorf("first run (evolution, request, checkpoints): %w", err)
	}
	err = run([]string{"--replica", "s3://grafana-test/supervisor", "--replica-endpoint", "http://" + closed, "--replica-region", "us-east-1"},
		[]string{"--heartbeat-interval", "50ms", "--garbage", "invalid"},
		"supervisor_replica_lag_seconds", "supervisor_replica_errors_total", "supervisor_invalid_frames_total")
	if err != nil {
		return nil, fmt.Errorf("second run (--replica, an invalid frame): %w", err)
	}
	t.Logf("the binary exports %d metric names", len(out))
	return out, nil
}

// metricTypes reads the # TYPE lines of a scrape: name → type, with a
// histogram's or summary's series names (_bucket, _sum, _count) under its
// type. The bare name of a histogram is not a series and is left out.
func metricTypes(body string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		name, typ := f[2], f[3]
		switch typ {
		case "histogram":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = typ
			}
		case "summary":
			out[name], out[name+"_sum"], out[name+"_count"] = typ, typ, typ
		default:
			out[name] = typ
		}
	}
	return out
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// The test agent: the end-to-end tests' binary (../../test), which is the
// agent of internal/testagent when SUPERVISOR_TEST_AGENT=1, built once
// beside the supervisor.
var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

func testAgentBinary() (string, error) {
	agentOnce.Do(func() {
		agentBin = filepath.Join(buildDir, "testagent")
		cmd := exec.Command("go", "test", "-c", "-o", agentBin, "./test/")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "GOWORK=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			agentErr = fmt.Errorf("go test -c ./test/ (the test agent): %v\n%s", err, out.String())
		}
	})
	return agentBin, agentErr
}
