package supervisor

import (
	"os"
	"testing"

	"github.com/agent-sidecar/supervisor/examples/refagent"
)

// TestMain lets the test binary double as the reference agent: the
// supervisor under test re-executes it with SUPERVISOR_TEST_REFAGENT=1.
func TestMain(m *testing.M) {
	if os.Getenv("SUPERVISOR_TEST_REFAGENT") == "1" {
		os.Exit(refagent.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}
