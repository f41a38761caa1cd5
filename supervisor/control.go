package supervisor

import (
	"fmt"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
)

// controlCall is a control request on its way to the owner loop (api.Owner
// Control).
type controlCall struct {
	req   ControlRequest
	reply chan ControlResponse
	// meta: for OpRestore, the checkpoint's header, read on the connection's
	// goroutine (the owner does not wait on the store).
	meta checkpoint.Meta
}

// handleControl runs on the owner goroutine. A zero response means the
// answer is sent on reply later.
func (s *Supervisor) handleControl(call controlCall) ControlResponse {
	req, reply := call.req, call.reply
	switch req.Op {
	case OpStatus: // the API answers it from the published view; the loop still can (tests)
		st := s.Status()
		return ControlResponse{OK: true, Status: &st}
	case OpRestore:
		meta := call.meta
		// Recorded: written to DATA_DIR/checkpoints/restore-point.json
		// (recordPoint) before it is acted on, and cleared once it has been
		// (assembleStart), so a supervisor that stops or crashes first
		// applies it at its next start.
		point := &durable.Point{CheckpointID: meta.ID, NoWAL: req.NoWAL, Recorded: true}
		in := s.lc.cur
		if s.lc.pendingReply != nil {
			// Another restore is being delivered (the agent is being
			// restarted for it): recording this one now would silently
			// replace, or be replaced by, the one under way.
			return ControlResponse{Busy: true, Error: ErrBusy.Error()}
		}
		// An agent that exited on its own and is being drained is not
		// running either: stopping it for the restore would relabel its
		// exit (a crash) as the operator's, restart it at once, and
		// override --restart and the crash-loop count.
		if in == nil || in.stopping || in.draining || s.lc.shutting {
			msg := "the agent is not running; the restore will be sent when it next starts"
			if in != nil && in.draining && !in.stopping {
				msg = "the agent has just exited on its own; the restore will be sent when it next starts (if --restart starts it again)"
			}
			ok := ControlResponse{OK: true, Message: msg,
				Restore: &RestoreInfo{CheckpointID: meta.ID, Watermark: meta.Watermark, NoWAL: req.NoWAL}}
			if !s.recordPoint(point, reply, ok) {
				return ControlResponse{Error: "the supervisor is stopping and could not record the restore point; run `supervisor restore` once it has exited"}
			}
			s.lc.pendingPoint = point
			s.publish()
			return ControlResponse{} // answered once the point is on disk
		}
		// The restore is delivered by restarting the agent: frames it sent
		// before it would have read an in-place restore belong to the old
		// history, and nothing in the protocol tells them apart from the new
		// one. Stopping it, draining its output and starting it with the
		// restore as its first frame leaves no such window.
		if !s.recordPoint(point, nil, ControlResponse{}) {
			return ControlResponse{Error: "the supervisor is stopping; the restore was not delivered"}
		}
		s.lc.pendingPoint = point
		s.lc.pendingReply = reply
		s.publish()
		in.Log().Info("operator restore requested: restarting the agent to deliver it", "checkpoint_id", meta.ID, "no_wal", req.NoWAL)
		s.stopInstance(in, reasonOperatorRestore)
		return ControlResponse{} // answered when the restore has been sent
	default:
		return ControlResponse{Error: fmt.Sprintf("unknown operation %q (want %s or %s)", clip.String(req.Op, 64), OpStatus, OpRestore)}
	}
}

// recordPoint writes an operator's restore point to the data directory on
// the store worker, and then, when reply is set, answers it with ok (with a
// warning when the write failed). The owner sets the point pending at once:
// the worker runs jobs in order, so a start's restore, assembled after this
// job, finds the point on disk and clears it once acted on. False: the
// worker has stopped (the supervisor is exiting).
func (s *Supervisor) recordPoint(point *durable.Point, reply chan ControlResponse, ok ControlResponse) bool {
	return s.work.Post(func() {
		err := s.st.Checkpoints().SetRestorePoint(point.CheckpointID, point.NoWAL)
		if err != nil {
			s.log.Error("cannot record the operator's restore point in DATA_DIR/checkpoints/restore-point.json; it is held in memory only, and lost if the supervisor exits before the agent starts",
				"checkpoint_id", point.CheckpointID, "err", err)
			ok.Message += fmt.Sprintf("; WARNING: it could not be recorded on disk (%v), so it is lost if the supervisor exits before then", err)
		}
		if reply != nil {
			reply <- ok
		}
	})
}
