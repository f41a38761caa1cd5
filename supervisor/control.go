package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
)

// The control socket DATA_DIR/supervisor.sock speaks one JSON request line and
// one JSON response line per connection. It is mode 0600 inside a 0700
// directory, and every peer's uid is checked with SO_PEERCRED.

const socketName = "supervisor.sock"

// Control operations.
const (
	OpStatus  = "status"
	OpRestore = "restore"
)

// ErrNotRunning: no supervisor answers on the data directory's socket.
var ErrNotRunning = errors.New("no supervisor is running on this data directory")

// ErrBusy: the supervisor is delivering another operator restore (restarting
// the agent for it); the request was not applied. Retry in a moment.
var ErrBusy = errors.New("busy: another restore is being delivered to the agent; retry in a moment")

// ControlRequest is a request on the control socket.
type ControlRequest struct {
	Op           string `json:"op"`
	CheckpointID string `json:"checkpoint_id,omitempty"`
	NoWAL        bool   `json:"no_wal,omitempty"`
}

// ControlResponse is the answer.
type ControlResponse struct {
	OK      bool         `json:"ok"`
	Busy    bool         `json:"busy,omitempty"` // not applied: retry (ErrBusy)
	Error   string       `json:"error,omitempty"`
	Message string       `json:"message,omitempty"`
	Status  *Status      `json:"status,omitempty"`
	Restore *RestoreInfo `json:"restore,omitempty"`
}

// RestoreInfo describes a restore the supervisor sent or recorded.
type RestoreInfo struct {
	CheckpointID string `json:"checkpoint_id"`
	Watermark    uint64 `json:"watermark"`
	WALEntries   int    `json:"wal_entries"`
	LastSequence uint64 `json:"last_sequence"`
	Sent         bool   `json:"sent"` // false: recorded for the agent's next start
	NoWAL        bool   `json:"no_wal"`
}

// Status is what `supervisor status` shows.
type Status struct {
	Running            bool      `json:"running"` // a supervisor holds the data directory
	SupervisorPID      int       `json:"supervisor_pid,omitempty"`
	State              string    `json:"state"`
	PID                int       `json:"agent_pid,omitempty"`
	Incarnation        int       `json:"incarnation,omitempty"`
	AgentStartedAt     time.Time `json:"agent_started_at,omitempty"`
	UptimeSeconds      float64   `json:"agent_uptime_seconds,omitempty"`
	LastHeartbeat      time.Time `json:"last_heartbeat,omitempty"`
	Restarts           int       `json:"restarts"`
	LastRestartReason  string    `json:"last_restart_reason,omitempty"`
	NewestCheckpoint   string    `json:"newest_checkpoint,omitempty"`
	LastWALSequence    uint64    `json:"last_wal_sequence"`
	DurableWALSequence uint64    `json:"durable_wal_sequence"`

	// What an operator asks first (issue #17).
	Version  string `json:"version,omitempty"`   // the running supervisor's build (Build)
	Revision string `json:"revision,omitempty"`  // its VCS revision
	HTTPAddr string `json:"http_addr,omitempty"` // the address actually bound ("" = HTTP off)
	// PendingRestore is a restore point waiting for the agent's next start
	// (recorded by `supervisor restore`), nil when there is none.
	PendingRestore *PendingRestore `json:"pending_restore,omitempty"`
	// Diagnosis explains the last framing error, when it has a known cause
	// (the agent wrote text to its protocol stream).
	Diagnosis string `json:"diagnosis,omitempty"`
	// Replica is the replica's state (--replica), nil when off.
	Replica *replica.Status `json:"replica,omitempty"`
}

// PendingRestore is a restore point not yet delivered.
type PendingRestore struct {
	CheckpointID string `json:"checkpoint_id"`
	NoWAL        bool   `json:"no_wal"`
}

type controlCall struct {
	req   ControlRequest
	reply chan ControlResponse
	// meta: for OpRestore, the checkpoint's header, read on the connection's
	// goroutine (the owner does not wait on the store).
	meta checkpoint.Meta
}

func (s *Supervisor) listenControl() (net.Listener, error) {
	path := filepath.Join(s.cfg.DataDir, socketName)
	// We hold the data directory's lock, so a socket file here is stale.
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on control socket %s: %w", path, err)
	}
	// The directory is ours and closed to others (checkDataDir), so the
	// socket we just bound cannot have been swapped for a symlink; check
	// anyway before changing its mode.
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		ln.Close()
		return nil, fmt.Errorf("control socket %s was replaced while being created; remove it and start again", path)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict control socket %s to its owner: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	return ln, nil
}

// serveControl accepts connections until ctx is done or the listener closes.
func (s *Supervisor) serveControl(ctx context.Context, ln net.Listener) {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			// Out of descriptors for a moment: keep serving once some free.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return
		}
		go s.serveControlConn(ctx, conn.(*net.UnixConn))
	}
}

func (s *Supervisor) serveControlConn(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	respond := func(r ControlResponse) { _ = json.NewEncoder(conn).Encode(r) }
	if err := checkPeer(conn); err != nil {
		s.log.Warn("control socket: refused a peer", "err", err)
		respond(ControlResponse{Error: err.Error()})
		return
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 64<<10)).ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		respond(ControlResponse{Error: "read request: " + err.Error()})
		return
	}
	var req ControlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		respond(ControlResponse{Error: "request is not valid JSON: " + err.Error()})
		return
	}
	call := controlCall{req: req, reply: make(chan ControlResponse, 1)}
	if req.Op == OpRestore {
		id, err := checkpoint.ParseID(req.CheckpointID)
		if err != nil {
			respond(ControlResponse{Error: fmt.Sprintf("checkpoint id %q: %v", clip(req.CheckpointID, 64), err)})
			return
		}
		if call.meta, err = s.st.Checkpoints().Stat(id); err != nil {
			respond(ControlResponse{Error: fmt.Sprintf("cannot restore: %v", err)})
			return
		}
	}
	select {
	case s.control <- call:
	case <-ctx.Done():
		respond(ControlResponse{Error: "supervisor is stopping"})
		return
	}
	select {
	case r := <-call.reply:
		respond(r)
	case <-ctx.Done():
		respond(ControlResponse{Error: "supervisor is stopping"})
	}
}

// checkPeer admits only our own user (and root).
func checkPeer(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("read peer credentials: %w", cerr)
	}
	if uid := os.Getuid(); int(cred.Uid) != uid && cred.Uid != 0 {
		return fmt.Errorf("peer uid %d is not the supervisor's uid %d", cred.Uid, uid)
	}
	return nil
}

// handleControl runs on the owner goroutine. A zero response means the
// answer is sent on reply later.
func (s *Supervisor) handleControl(call controlCall) ControlResponse {
	req, reply := call.req, call.reply
	switch req.Op {
	case OpStatus:
		st := s.Status()
		return ControlResponse{OK: true, Status: &st}
	case OpRestore:
		meta := call.meta
		point := &durable.Point{CheckpointID: meta.ID, NoWAL: req.NoWAL}
		in := s.cur
		if s.pendingReply != nil {
			// Another restore is being delivered (the agent is being
			// restarted for it): recording this one now would silently
			// replace, or be replaced by, the one under way.
			return ControlResponse{Busy: true, Error: ErrBusy.Error()}
		}
		if in == nil || in.stopping || s.shutting {
			s.pendingPoint = point
			s.publish()
			return ControlResponse{OK: true, Message: "the agent is not running; the restore will be sent when it next starts",
				Restore: &RestoreInfo{CheckpointID: meta.ID, Watermark: meta.Watermark, NoWAL: req.NoWAL}}
		}
		// The restore is delivered by restarting the agent: frames it sent
		// before it would have read an in-place restore belong to the old
		// history, and nothing in the protocol tells them apart from the new
		// one. Stopping it, draining its output and starting it with the
		// restore as its first frame leaves no such window.
		s.pendingPoint = point
		s.pendingReply = reply
		s.publish()
		in.Log().Info("operator restore requested: restarting the agent to deliver it", "checkpoint_id", meta.ID, "no_wal", req.NoWAL)
		s.stopInstance(in, reasonOperatorRestore)
		return ControlResponse{} // answered when the restore has been sent
	default:
		return ControlResponse{Error: fmt.Sprintf("unknown operation %q (want %s or %s)", req.Op, OpStatus, OpRestore)}
	}
}

// Call sends one request to the supervisor running on dataDir. It returns an
// error wrapping ErrNotRunning when nobody listens there.
func Call(dataDir string, req ControlRequest, timeout time.Duration) (ControlResponse, error) {
	path := filepath.Join(dataDir, socketName)
	conn, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return ControlResponse{}, fmt.Errorf("%w (%s)", ErrNotRunning, path)
		}
		return ControlResponse{}, fmt.Errorf("connect to control socket %s: %w", path, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	b, _ := json.Marshal(req)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return ControlResponse{}, fmt.Errorf("send control request: %w", err)
	}
	var resp ControlResponse
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return ControlResponse{}, fmt.Errorf("read control response: %w", err)
	}
	if resp.Busy {
		return resp, ErrBusy
	}
	if !resp.OK && resp.Error != "" {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}
