package supervisor

// Run's start and stop: the data directory opened and locked, the parts
// started in order, and stopped in the reverse order in one place.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/evolution"
	"github.com/agent-sidecar/supervisor/internal/atomicfile"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/durable"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
)

// Run supervises the agent until ctx is cancelled (a graceful stop: returns
// nil) or the agent crash-loops (returns an error wrapping ErrCrashLoop), or
// fails with --restart never (ErrAgentFailed). A start that fails its
// preflight (ErrConfig) has created nothing.
//
// Its parts start in this order and stop in the reverse one, here: the
// data directory (open), the reaper, the store worker, the HTTP API and the
// probe listener, the control socket, then the owner loop.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	// Nothing is created before everything that can fail fast has been
	// checked (preflight.go): a failed start leaves no data directory behind.
	httpLn, err := s.preflight()
	if err != nil {
		return err
	}
	// The reaper's half that must come first: orphaned descendants of an
	// agent (one may start during open, early.go) are re-parented to us.
	if err := agentproc.BecomeSubreaper(); err != nil {
		s.log.Warn("cannot become a child subreaper; orphaned agent descendants will be reaped by init instead", "err", err)
	}
	probeLn, err := s.listenProbes()
	if err == nil {
		err = s.open()
	}
	if err != nil {
		for _, ln := range []net.Listener{httpLn, probeLn} {
			if ln != nil {
				ln.Close()
			}
		}
		// An agent started during recovery (early.go) is killed unsent:
		// its spawn's answer finds no loop.
		close(s.inbox.loopDone)
		s.spawns.Wait()
		return err
	}

	// 1. The reaper: orphaned descendants of the agent are ours to reap.
	reaperCtx, stopReaper := context.WithCancel(context.Background())
	reaper := goRun(func() { agentproc.Shared().RunReaper(reaperCtx, s.log) })
	// 2. The store worker: checkpoint saves and the owner's storage jobs.
	worker := goRun(func() { s.work.Run(s.storeCheckpoint) })
	// 3. The HTTP API, when --http-addr is set.
	var httpDone <-chan struct{}
	if httpLn != nil {
		httpDone = goRun(func() {
			if err := s.api.Serve(httpLn); err != nil {
				s.log.Error("HTTP server stopped", "err", err)
			}
		})
	}
	// 3b. The probe listener, when --probe-addr is set.
	var probeDone <-chan struct{}
	if probeLn != nil {
		probeDone = goRun(func() {
			if err := s.api.ServeProbes(probeLn); err != nil {
				s.log.Error("probe listener stopped", "err", err)
			}
		})
	}
	// 4. The control socket.
	controlCtx, stopControl := context.WithCancel(context.Background())
	var controlDone <-chan struct{}
	cl, runErr := api.ListenControl(s.cfg.DataDir)
	if runErr == nil {
		controlDone = goRun(func() { s.api.ServeControl(controlCtx, cl) })
		// 5. The owner loop, until ctx is cancelled or it gives up.
		s.rec.Audit(observe.AuditStart, map[string]any{"pid": os.Getpid(), "command": s.cfg.Command, "data_dir": s.cfg.DataDir})
		runErr = s.loop(ctx)
		fields := map[string]any{"restarts": s.lc.restarts}
		if runErr != nil {
			fields["error"] = runErr.Error()
		}
		s.rec.Audit(observe.AuditStop, fields)
	}
	// No loop takes an answer from here on (nor took any, when the control
	// socket could not be made: an agent started during recovery is killed).
	close(s.inbox.loopDone)

	// Stop, in the reverse order. 4: the control socket (calls waiting for
	// the loop are answered "stopping").
	stopControl()
	if controlDone != nil {
		cl.Close()
		<-controlDone
	}
	// 3: the HTTP API and the probe listener, with a bounded wait for
	// requests under way.
	if httpDone != nil || probeDone != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.api.Shutdown(sctx)
		cancel()
		for _, done := range []<-chan struct{}{httpDone, probeDone} {
			if done != nil {
				<-done
			}
		}
	}
	// 2: the store worker, once no spawn goroutine can post to it (an
	// unwanted spawn's trial is released on it); it finishes its queue, then
	// the answers the loop will never take are settled.
	s.spawns.Wait()
	s.work.Stop()
	<-worker
	s.settleStored()
	// 1: the reaper.
	stopReaper()
	<-reaper
	// The data directory: the replica's last upload, the WAL, the audit log,
	// the lock.
	if cerr := s.close(); cerr != nil && runErr == nil {
		runErr = cerr
	}
	return runErr
}

// listenProbes binds --probe-addr (nil when it is empty), before anything
// is created, like --http-addr in preflight.
func (s *Supervisor) listenProbes() (net.Listener, error) {
	if s.cfg.ProbeAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", s.cfg.ProbeAddr)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot listen on --probe-addr %s: %v (is another process using it? pick another address, or leave --probe-addr out)",
			ErrConfig, s.cfg.ProbeAddr, unwrapOpError(err))
	}
	return ln, nil
}

// goRun runs f on a goroutine of its own; the channel is closed when f has
// returned.
func goRun(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	return done
}

// open creates the data directory, takes its lock and opens the stores.
func (s *Supervisor) open() error {
	dir := s.cfg.DataDir
	// Created durably: each directory made here is fsynced in its parent.
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: create data directory %s: %w", ErrConfig, dir, err)
	}
	if err := checkDataDir(dir); err != nil {
		return err
	}
	lock, err := lockDataDir(dir)
	if err != nil {
		return plantedLink(err)
	}
	s.lock = lock
	if s.cfg.SpawnDuringRecovery {
		s.spawnEarly() // the agent starts up while the rest of open runs
	}
	if err := s.restoreFromReplica(); err != nil { // an empty data dir with --replica
		return err
	}
	audit, err := observe.OpenAudit(filepath.Join(dir, "audit.jsonl"), s.bmet.AuditDropped.Inc, func(err error) {
		s.log.Error("cannot write the audit log; the records of this batch are lost (check the disk under --data-dir)", "err", err)
	})
	if err != nil {
		return plantedLink(err)
	}
	s.rec.AttachAudit(audit)
	policy, err := s.cfg.walSyncPolicy()
	if err != nil {
		return err
	}
	opening := time.Now()
	st, err := durable.Open(durable.Options{Dir: dir, Codec: s.codec, Log: s.log,
		CheckpointRetain: s.cfg.CheckpointRetain, CheckpointLevel: s.cfg.CheckpointLevel, MaxFrameSize: s.cfg.MaxFrameSize,
		WALSegmentSize: s.cfg.WALSegmentSize, WALSync: policy, WALSyncInterval: s.cfg.WALSyncInterval, OnSync: s.met.WALSynced,
		OnRewind: s.replicaRewound, OnWALFailure: s.onWALFailure})
	if err != nil {
		return err
	}
	s.st = st
	w := st.WAL()
	rec := w.Recovery()
	s.log.Info("WAL opened", "segments", rec.Segments, "entries", rec.Entries,
		"last_sequence", w.LastSequence(), "floor", w.Floor(), "torn_bytes_truncated", rec.TruncatedBytes,
		"open_seconds", time.Since(opening).Seconds())
	for _, ce := range rec.Covered {
		s.rec.Record(observe.Occurrence{Level: slog.LevelWarn, Msg: "damaged WAL segments below the newest checkpoint's watermark set aside; that checkpoint covers them",
			Kind: observe.AuditWALError, Fields: map[string]any{"error": ce.Error(), "covered_by_checkpoint": true, "moved_aside": ce.Moved}})
	}
	if rec.Corruption != nil {
		s.rec.Record(observe.Occurrence{Level: slog.LevelError, Msg: "WAL CORRUPTION: replay stopped at a corrupt record; the good prefix is kept and entries after it are NOT served. Inspect with `supervisor wal dump` and restore the data directory from a backup if those entries matter.",
			Kind: observe.AuditWALError, Fields: map[string]any{"error": rec.Corruption.Error(), "last_good_sequence": w.LastSequence()}})
	}
	if err := s.openRequests(); err != nil {
		return err
	}
	ledger, err := evolution.OpenLedger(filepath.Join(dir, "evolution.json"))
	if err != nil {
		return fmt.Errorf("open the evolution ledger: %w", err)
	}
	s.ledger = ledger
	s.releaseDeadTrials()
	// The recorded point stays on disk until the first start has acted on
	// it (assembleStart): a crash before that, or during a --no-wal
	// rollback, applies it at the next start.
	if id, noWAL, ok, err := st.Checkpoints().PeekRestorePoint(); err != nil {
		s.log.Error("cannot read the recorded restore point; ignoring it", "err", err)
		if errors.Is(err, checkpoint.ErrCorrupt) {
			_, _, _, _ = st.Checkpoints().TakeRestorePoint() // damaged: cleared, so it cannot block every start
		}
	} else if ok {
		s.lc.pendingPoint = &durable.Point{CheckpointID: id, NoWAL: noWAL, Recorded: true}
		s.log.Info("restore point recorded by an operator will be used", "checkpoint_id", id, "no_wal", noWAL)
	}
	s.startReplica()
	return nil
}

func (s *Supervisor) close() error {
	var errs []error
	s.stopReplica() // a last bounded upload of what is durable
	if s.book != nil {
		if err := s.book.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the request journal: %w", err))
		}
	}
	if s.st != nil {
		if err := s.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close WAL: %w", err))
		}
	}
	if a := s.rec.AuditLog(); a != nil {
		_ = a.Close()
	}
	if s.lock != nil {
		_ = os.Remove(filepath.Join(s.cfg.DataDir, api.SocketName))
		_ = s.lock.Close()
	}
	return errors.Join(errs...)
}

// lockDataDir takes an exclusive flock on DATA_DIR/LOCK and writes our pid.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w%s", path, err, observe.SymlinkHint(err))
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("%w: %s is locked by pid %s; stop that supervisor or use another --data-dir",
			ErrDataDirLocked, dir, strings.TrimSpace(string(b)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// DataDirInUse reports whether a supervisor holds the lock of dir.
func DataDirInUse(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "LOCK"))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// ForceStop skips the graceful wait of a stop already under way (a second
// SIGTERM/SIGINT): the agent's group is killed at once. The WAL is still
// synced before Run returns.
func (s *Supervisor) ForceStop() {
	select {
	case s.inbox.force <- struct{}{}:
	default:
	}
}

// ReopenAudit reopens DATA_DIR/audit.jsonl, for log rotation (SIGHUP): the
// old file is closed, and records go to a file at the same path, created if
// it was moved away. Safe from any goroutine; before Run has opened the data
// directory it does nothing.
func (s *Supervisor) ReopenAudit() error {
	a := s.rec.AuditLog()
	if a == nil {
		return nil
	}
	if err := a.Reopen(); err != nil {
		s.log.Error("cannot reopen the audit log; records go to the old file until the next SIGHUP", "err", err)
		return fmt.Errorf("reopen audit log: %w", err)
	}
	s.log.Info("audit log reopened", "path", a.Path())
	return nil
}
