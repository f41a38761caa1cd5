package supervisor

import (
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision, when set at link time, override what the Go
// toolchain recorded in the binary (release builds without a .git, such as
// the Docker image):
//
//	go build -ldflags "-X github.com/agent-sidecar/supervisor/supervisor.version=v1.2.0 \
//	  -X github.com/agent-sidecar/supervisor/supervisor.revision=$(git rev-parse HEAD)" ./cmd/supervisor
var version, revision string

// BuildInfo is what `supervisor version`, `supervisor status` and the
// supervisor_build_info metric report.
type BuildInfo struct {
	// Version is the module version: a tag such as v1.2.0 for `go install
	// ...@v1.2.0`, a pseudo-version, or "(devel)" for a build from a work tree.
	Version string `json:"version"`
	// Revision is the VCS commit the binary was built from, with "-dirty"
	// when the work tree had changes; "unknown" when not recorded.
	Revision  string `json:"revision"`
	Time      string `json:"vcs_time,omitempty"` // commit time, RFC 3339
	GoVersion string `json:"go_version"`
}

// Build returns the binary's build information: the link-time overrides
// when set, else what runtime/debug.ReadBuildInfo recorded.
func Build() BuildInfo { return buildOnce() }

var buildOnce = sync.OnceValue(readBuild)

func readBuild() BuildInfo {
	b := BuildInfo{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		dirty := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && b.Revision != "unknown" {
			b.Revision += "-dirty"
		}
	}
	if v := strings.TrimSpace(version); v != "" {
		b.Version = v
	}
	if r := strings.TrimSpace(revision); r != "" {
		b.Revision = r
	}
	return b
}

// newBuildInfoGauge is supervisor_build_info{version,revision,goversion} 1,
// the usual way to put a version on a dashboard or join it to alerts.
func newBuildInfoGauge(b BuildInfo) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "supervisor_build_info",
		Help: "Always 1; the labels say which build of the supervisor is running.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	return g
}
