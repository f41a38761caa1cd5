package supervisor

import (
	"context"
	"path/filepath"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/supervisor/api"
)

// The API's types, under the names the CLI and clients have always used.
type (
	Status          = api.Status
	ControlRequest  = api.ControlRequest
	ControlResponse = api.ControlResponse
	RestoreInfo     = api.RestoreInfo
	PendingRestore  = api.PendingRestore
)

// Control operations (api.OpStatus, api.OpRestore).
const (
	OpStatus  = api.OpStatus
	OpRestore = api.OpRestore
	// OpCancelRequest: `supervisor requests cancel ID`.
	OpCancelRequest = api.OpCancelRequest
)

// Control socket errors (api.ErrNotRunning, api.ErrBusy).
var (
	ErrNotRunning = api.ErrNotRunning
	ErrBusy       = api.ErrBusy
)

// Call sends one request to the supervisor running on dataDir (api.Call).
func Call(dataDir string, req ControlRequest, timeout time.Duration) (ControlResponse, error) {
	return api.Call(dataDir, req, timeout)
}

// apiOwner is the supervisor as the API sees it (api.Owner): published
// snapshots to read, and one channel to the owner loop for control calls.
// It never touches owner state.
type apiOwner struct{ s *Supervisor }

var _ api.Owner = apiOwner{}

func (o apiOwner) Status() api.Status { return o.s.Status() }

func (o apiOwner) Health(now time.Time) (givenUp, stalled bool, age, limit time.Duration) {
	stalled, age = o.s.loopStalled(now)
	return o.s.current().failed, stalled, age, o.s.stallLimit()
}

func (o apiOwner) Readiness() (bool, string, api.Status) { return o.s.readiness() }

func (o apiOwner) Target() (primary api.Agent, mirror api.Mirror, trial string) {
	v := o.s.current()
	if v.cur != nil {
		primary = v.cur
	}
	if t := v.trial; t != nil {
		mirror, trial = t, t.id
	}
	return primary, mirror, trial
}

func (o apiOwner) CheckpointMeta(id string) (checkpoint.Meta, error) {
	return o.s.st.Checkpoints().Stat(id)
}

func (o apiOwner) CheckpointList() ([]checkpoint.Meta, error) {
	if o.s.st == nil {
		return nil, nil
	}
	return o.s.st.Checkpoints().List()
}

// Details: the published view's restarts and trial, and what never changes.
func (o apiOwner) Details() api.Details {
	v := o.s.current()
	d := api.Details{RecentRestarts: v.restarts, HeartbeatTimeout: o.s.cfg.HeartbeatTimeout,
		WALDir: filepath.Join(o.s.cfg.DataDir, "wal"), Recorder: o.s.rec}
	if t := v.trial; t != nil {
		// Fields set before the trial was published, never changed after.
		// The target and reason are the agent's text (an evolution_intent
		// may be 1 MiB): clipped, as in the log and the audit log, since
		// every GET /v1/status and every refresh of the page carries them.
		d.Trial = &api.EvolutionTrial{ID: t.id, Target: clip.String(t.intent.Target, 256), Reason: clip.String(t.intent.Reason, 1024),
			Started: t.started.UTC(), BackupCheckpointID: t.backup.ID}
	}
	return d
}

func (o apiOwner) Control(ctx context.Context, req api.ControlRequest, meta checkpoint.Meta) api.ControlResponse {
	call := controlCall{req: req, reply: make(chan api.ControlResponse, 1), meta: meta}
	select {
	case o.s.inbox.control <- call:
	case <-ctx.Done():
		return api.ControlResponse{Error: "supervisor is stopping"}
	}
	select {
	case r := <-call.reply:
		return r
	case <-ctx.Done():
		return api.ControlResponse{Error: "supervisor is stopping"}
	}
}
