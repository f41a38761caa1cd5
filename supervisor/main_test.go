package supervisor

import (
	"os"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/testagent"
)

// TestMain lets the test binary double as the test agent: the supervisor
// under test re-executes it with testagent.EnvRunAgent=1.
func TestMain(m *testing.M) {
	testagent.MainIfAgent()
	os.Exit(m.Run())
}
