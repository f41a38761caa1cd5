package testagent

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// The test agent, faults and all, is not part of the supervisor binary.
func TestNotInTheProductionBinary(t *testing.T) {
	self := reflect.TypeFor[Config]().PkgPath()
	out, err := exec.Command("go", "list", "-deps", "github.com/agent-sidecar/supervisor/cmd/supervisor").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == self {
			t.Fatalf("cmd/supervisor depends on %s", self)
		}
	}
	if !strings.Contains(string(out), "github.com/agent-sidecar/supervisor/examples/demo") {
		t.Fatalf("go list -deps lacks the embedded demo agent; the check above would prove nothing:\n%s", out)
	}
}
