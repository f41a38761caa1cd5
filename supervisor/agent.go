package supervisor

import "github.com/agent-sidecar/supervisor/supervisor/conn"

// Roles of an agent instance (conn.RolePrimary, conn.RoleShadow).
const (
	RolePrimary = conn.RolePrimary
	RoleShadow  = conn.RoleShadow
)

// agent is the owner's record of one running instance: its connection, and
// what the owner alone decides about it. Only the owner loop reads or writes
// these fields; a store job or an HTTP handler sees the *conn.Instance only.
type agent struct {
	*conn.Instance
	stopReason string // why we stopped it, if we did
	stopping   bool
	draining   bool // exited; being drained and reaped (drainInstance)
	finished   bool // a shadow: drained and reaped (its trial may end)
}
