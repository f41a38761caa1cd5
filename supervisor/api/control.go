package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/internal/clip"
	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"golang.org/x/sys/unix"
)

// The control socket DATA_DIR/supervisor.sock speaks one JSON request line and
// one JSON response line per connection. It is mode 0600 inside a 0700
// directory, and every peer's uid is checked with SO_PEERCRED.

// SocketName is the control socket's file in the data directory.
const SocketName = "supervisor.sock"

// Control operations.
const (
	OpStatus  = "status"
	OpRestore = "restore"
	// OpCancelRequest cancels a request (`supervisor requests cancel ID`),
	// as DELETE /v1/requests/ID does.
	OpCancelRequest = "cancel_request"
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
	RequestID    string `json:"request_id,omitempty"`
}

// ControlResponse is the answer.
type ControlResponse struct {
	OK      bool         `json:"ok"`
	Busy    bool         `json:"busy,omitempty"` // not applied: retry (ErrBusy)
	Error   string       `json:"error,omitempty"`
	Message string       `json:"message,omitempty"`
	Status  *Status      `json:"status,omitempty"`
	Restore *RestoreInfo `json:"restore,omitempty"`
	// Code is the HTTP status the same operation would have had
	// (OpCancelRequest: 200, 404, 409).
	Code    int             `json:"code,omitempty"`
	Request json.RawMessage `json:"request,omitempty"`
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

	// The status page's details (status.go; docs/operations.md lists
	// them): absent when not known, e.g. with no supervisor running.
	GeneratedAt             time.Time            `json:"generated_at,omitzero"`
	HeartbeatAgeSeconds     float64              `json:"heartbeat_age_seconds,omitempty"`
	HeartbeatTimeoutSeconds float64              `json:"heartbeat_timeout_seconds,omitempty"`
	RecentRestarts          []RestartRecord      `json:"recent_restarts,omitempty"`
	WAL                     *WALStatus           `json:"wal,omitempty"`
	Checkpoints             *CheckpointStatus    `json:"checkpoints,omitempty"`
	Requests                *RequestCounts       `json:"requests,omitempty"`
	Evolution               *EvolutionStatus     `json:"evolution,omitempty"`
	Audit                   observe.AuditRecords `json:"audit,omitzero"`
	History                 *History             `json:"history,omitempty"`
}

// PendingRestore is a restore point not yet delivered.
type PendingRestore struct {
	CheckpointID string `json:"checkpoint_id"`
	NoWAL        bool   `json:"no_wal"`
}

// ListenControl binds the control socket of dataDir (the caller holds the
// data directory's lock, so a socket file there is stale).
func ListenControl(dataDir string) (net.Listener, error) {
	path := filepath.Join(dataDir, SocketName)
	// We hold the data directory's lock, so a socket file here is stale (a
	// crash, even a power cut, leaves one behind).
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove the stale control socket %s: %w (remove it by hand)", path, err)
	}
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

// ServeControl answers control connections on ln until ctx is done or the
// listener closes; every connection goroutine has exited when it returns.
func (s *Server) ServeControl(ctx context.Context, ln net.Listener) {
	s.startSampler() // the status's history, with or without HTTP
	defer s.stopSampler()
	var conns sync.WaitGroup
	defer conns.Wait()
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
		conns.Add(1)
		go func() { defer conns.Done(); s.serveControlConn(ctx, conn.(*net.UnixConn)) }()
	}
}

func (s *Server) serveControlConn(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	respond := func(r ControlResponse) { _ = json.NewEncoder(conn).Encode(r) }
	if err := checkPeer(conn); err != nil {
		s.opts.Log.Warn("control socket: refused a peer", "err", err)
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
	if req.Op == OpStatus {
		// Read from published snapshots, never through the owner loop:
		// the same object as GET /v1/status.
		st := s.FullStatus(time.Now())
		respond(ControlResponse{OK: true, Status: &st})
		return
	}
	if req.Op == OpCancelRequest {
		// The request book answers, not the owner loop.
		code, body := s.cancelRequest(req.RequestID)
		b, _ := json.Marshal(body)
		resp := ControlResponse{OK: code == 200, Code: code, Request: b}
		if code != 200 {
			if m, ok := body.(map[string]any); ok {
				resp.Error, _ = m["error"].(string)
			}
		} else {
			resp.Message = "request " + req.RequestID + " cancelled"
		}
		respond(resp)
		return
	}
	var meta checkpoint.Meta
	if req.Op == OpRestore {
		id, err := checkpoint.ParseID(req.CheckpointID)
		if err != nil {
			respond(ControlResponse{Error: fmt.Sprintf("checkpoint id %q: %v", clip.String(req.CheckpointID, 64), err)})
			return
		}
		// Read here, on the connection's goroutine: the owner does not wait
		// on the store.
		if meta, err = s.owner.CheckpointMeta(id); err != nil {
			respond(ControlResponse{Error: fmt.Sprintf("cannot restore: %v", err)})
			return
		}
	}
	respond(s.owner.Control(ctx, req, meta))
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

// Call sends one request to the supervisor running on dataDir. It returns an
// error wrapping ErrNotRunning when nobody listens there.
func Call(dataDir string, req ControlRequest, timeout time.Duration) (ControlResponse, error) {
	path := filepath.Join(dataDir, SocketName)
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
