package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
)

// Handlers receive the supervisor's messages in [Conn.Run]. Each runs on
// Run's goroutine, one at a time, in the order the messages arrived; a
// handler that blocks stops the reading of further messages. A nil handler
// means the message is ignored (logged at debug level), except Shutdown: Run
// returns [ErrShutdown] whether or not it is set.
type Handlers struct {
	// Restore replaces the agent's state by msg.Snapshot (when
	// msg.CheckpointID != "") and then applies msg.WALEntries in order,
	// skipping entries at or below the agent's last applied sequence. An
	// error ends Run (after telling the supervisor with RESTORE_FAILED): an
	// agent that cannot restore must not carry on with the wrong state.
	Restore func(*schema.Restore) error
	// CheckpointAck reports a stored checkpoint.
	CheckpointAck func(*schema.CheckpointAck)
	// HotReload loads new code into the running agent. An error is reported
	// to the supervisor as HOT_RELOAD_FAILED and Run carries on with the old
	// code.
	HotReload func(*schema.HotReload) error
	// EvolutionResult reports the supervisor's decision on an evolution.
	EvolutionResult func(*schema.EvolutionResult)
	// Handle answers a user request, with durable steps and cancellation:
	// ctx is cancelled when the supervisor sends cancel_request for the
	// request (context.Cause is ErrRequestCancelled), when the connection
	// ends, or when Run's ctx ends; req.Step runs a step whose result is
	// logged and never computed twice (req.Attempt > 1 on a redelivery after
	// a restart). The return value becomes the request_result, as for
	// Request (see [Request.Answer] for the error codes). When set, Request
	// and ProcessRequest are not called.
	Handle func(ctx context.Context, req *Request) (any, error)
	// ProcessRequest is a user request. Log what it changes in the WAL
	// before changing it. It is not called when Request or Handle is set.
	ProcessRequest func(*schema.ProcessRequest)
	// Request answers a user request: its return value becomes the
	// request_result the HTTP caller receives (data must encode to a map; an
	// error is sent as {code, message}, with the code of a *RequestError or
	// REQUEST_FAILED). Use Conn.Log inside it before any side effect.
	Request func(*schema.ProcessRequest) (any, error)
	// Shutdown asks the agent to stop. If msg.CreateCheckpoint, send a final
	// checkpoint and wait for its ack (SendCheckpoint, AwaitCheckpointAck)
	// before returning. After it returns, Run returns ErrShutdown.
	Shutdown func(*schema.Shutdown)
	// CancelRequest reports a cancel_request (the request's context is
	// already cancelled when it is called; most agents need not set it).
	CancelRequest func(*schema.CancelRequest)
	// Error is an error the supervisor reports: WAL_FULL, WAL_FAILED,
	// CHECKPOINT_FAILED, INVALID_MESSAGE (a message the agent sent was
	// rejected; details say which field and why).
	Error func(*schema.Error)
}

// Run reads messages and dispatches them to h until something ends it:
//   - shutdown: ErrShutdown (after h.Shutdown returns);
//   - the supervisor closed the pipe: ErrSupervisorGone;
//   - a broken stream (a torn or oversized frame): an error wrapping the
//     wire error;
//   - a failed Restore handler: its error;
//   - ctx ends: ctx.Err();
//   - Close: ErrClosed.
//
// A message from the supervisor that fails validation is logged, answered
// with an INVALID_MESSAGE error, and skipped. Run may be called again after
// it returned ctx.Err(). It returns [ErrMessagesInUse] once [Conn.Messages]
// has been called: an agent receives either by callbacks or from the channel.
func (c *Conn) Run(ctx context.Context, h Handlers) error {
	for {
		m, err := c.Receive(ctx)
		if errors.Is(err, schema.ErrInvalidMessage) {
			c.skipInvalid(err)
			continue
		}
		if err != nil {
			return err
		}
		if err := c.dispatch(ctx, m, h); err != nil {
			return err
		}
	}
}

func (c *Conn) dispatch(ctx context.Context, m schema.Message, h Handlers) error {
	switch m := m.(type) {
	case *schema.Restore:
		if h.Restore == nil {
			break
		}
		if err := h.Restore(m); err != nil {
			err = fmt.Errorf("agent: restore from checkpoint %q with %d WAL entries: %w", m.CheckpointID, len(m.WALEntries), err)
			if serr := c.SendError(CodeRestoreFailed, err.Error()); serr != nil {
				c.log.Warn("could not report the failed restore to the supervisor", "err", serr)
			}
			return err
		}
		return nil
	case *schema.CheckpointAck:
		if h.CheckpointAck != nil {
			h.CheckpointAck(m)
			return nil
		}
	case *schema.HotReload:
		if h.HotReload == nil {
			break
		}
		if err := h.HotReload(m); err != nil {
			c.log.Warn("hot reload failed; keeping the old code", "module", m.Module, "err", err)
			if serr := c.SendError(CodeHotReloadFailed, fmt.Sprintf("hot reload of module %q: %v", m.Module, err)); serr != nil {
				c.log.Warn("could not report the failed hot reload to the supervisor", "err", serr)
			}
		}
		return nil
	case *schema.EvolutionResult:
		if h.EvolutionResult != nil {
			h.EvolutionResult(m)
			return nil
		}
	case *schema.ProcessRequest:
		if h.Handle != nil {
			req, rctx := c.StartRequest(ctx, m)
			data, err := h.Handle(rctx, req)
			if serr := req.Answer(data, err); serr != nil {
				c.log.Warn("could not send the request result", "request_id", m.RequestID, "err", serr)
			}
			return nil
		}
		if h.Request != nil {
			c.answer(m, h.Request) // durable.go
			return nil
		}
		if h.ProcessRequest != nil {
			h.ProcessRequest(m)
			return nil
		}
	case *schema.Shutdown:
		if h.Shutdown != nil {
			h.Shutdown(m)
		}
		if m.Reason != "" {
			return fmt.Errorf("%w: %s", ErrShutdown, m.Reason)
		}
		return ErrShutdown
	case *schema.CancelRequest:
		if h.CancelRequest != nil {
			h.CancelRequest(m)
			return nil
		}
	case *schema.Error:
		if h.Error != nil {
			h.Error(m)
			return nil
		}
		c.log.Warn("the supervisor reported an error", "code", m.Error.Code, "message", m.Error.Message)
		return nil
	}
	c.log.Debug("no handler; message ignored", "type", m.MessageType())
	return nil
}

// Heartbeats sends a heartbeat at once and then every interval (default 1s)
// until ctx ends. It blocks; run it on its own goroutine. It also returns
// when the transport is gone for good (closed, broken pipe); other send
// errors are logged and the next tick tries again.
func (c *Conn) Heartbeats(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for ctx.Err() == nil {
		if err := c.SendHeartbeat(); err != nil {
			if isPermanent(err) {
				c.log.Info("heartbeats stopped: the connection to the supervisor is gone", "err", err)
				return
			}
			c.log.Warn("heartbeat not sent", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

func isPermanent(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, os.ErrClosed) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrClosedPipe)
}
