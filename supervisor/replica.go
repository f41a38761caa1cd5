package supervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/agent-sidecar/supervisor/replica"
)

// Replication to object storage (SPEC §11, docs/replication.md): with
// --replica, an empty data directory is restored from the replica before
// anything else is opened, and once the stores are open a replica.Replicator
// uploads checkpoints, durable WAL entries and the small files on its own
// goroutine. It holds nothing the agent, the frame reader, the owner loop
// or the WAL wait on, except stores.trunc (read) during a bounded WAL read.

// AuditReplicaRestore: an empty data directory was restored from the
// replica at start.
const AuditReplicaRestore = "replica_restored"

// replicaFlush bounds the last upload at shutdown.
const replicaFlush = 5 * time.Second

// replicaState is the supervisor's side of the replica.
type replicaState struct {
	client   *replica.Client
	r        *replica.Replicator
	restored *replica.Result // what an empty data directory was restored from
}

// validateReplica checks --replica and its companions.
func (c *Config) validateReplica() error {
	if c.Replica == "" {
		if c.ReplicaEndpoint != "" || c.ReplicaRegion != "" {
			return errors.New("--replica-endpoint and --replica-region need --replica s3://BUCKET/PREFIX")
		}
		return nil
	}
	if _, err := replica.ParseURL(c.Replica, c.ReplicaEndpoint, c.ReplicaRegion); err != nil {
		return fmt.Errorf("--replica: %w", err)
	}
	if c.ReplicaSyncInterval <= 0 {
		return fmt.Errorf("--replica-sync-interval must be a positive duration, got %s", c.ReplicaSyncInterval)
	}
	return nil
}

// replicaStartError maps a replica error at start: the operator must fix a
// location, credentials or bucket (ErrConfig), a replica that cannot be
// restored completely is ErrUnrestorable, the rest (the server is down) is
// worth a retry.
func replicaStartError(err error) error {
	switch {
	case errors.Is(err, replica.ErrAuth), errors.Is(err, replica.ErrBucket), errors.Is(err, replica.ErrBadURL):
		return fmt.Errorf("%w: %w", ErrConfig, err)
	case errors.Is(err, replica.ErrCorrupt), errors.Is(err, replica.ErrNoTarget):
		return fmt.Errorf("%w: %w", ErrUnrestorable, err)
	}
	return err
}

// restoreFromReplica restores an empty data directory from the replica
// (nothing there: a fresh start). It runs with the data directory locked
// and before anything else is created in it. A replica that cannot be read
// stops the start: starting empty would write a new, empty history that a
// later restore could prefer.
func (s *Supervisor) restoreFromReplica() error {
	if s.cfg.Replica == "" {
		return nil
	}
	loc, err := replica.ParseURL(s.cfg.Replica, s.cfg.ReplicaEndpoint, s.cfg.ReplicaRegion)
	if err != nil {
		return fmt.Errorf("%w: --replica: %w", ErrConfig, err)
	}
	c, err := replica.Open(loc)
	if err != nil {
		return replicaStartError(err)
	}
	s.rep = &replicaState{client: c}
	empty, err := replica.IsEmptyDataDir(s.cfg.DataDir)
	if err != nil || !empty {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), replica.RestoreTimeout)
	defer cancel()
	start := time.Now()
	s.log.Info("data directory is empty: restoring it from the replica", "replica", loc.String())
	res, err := c.Restore(ctx, s.cfg.DataDir, replica.Target{}, s.log)
	if errors.Is(err, replica.ErrEmpty) {
		s.log.Info("the replica holds nothing yet: a fresh start", "replica", loc.String(), "detail", err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore the data directory from the replica %s: %w", loc, replicaStartError(err))
	}
	s.rep.restored = &res
	s.log.Info("data directory restored from the replica", "generation", res.Generation, "checkpoint_id", res.CheckpointID,
		"watermark", res.Watermark, "wal_entries", res.Entries, "last_sequence", res.LastSequence,
		"bytes", res.Bytes, "seconds", time.Since(start).Seconds(), "skipped_generations", len(res.SkippedGenerations),
		"requests_journal_bytes", res.RequestsJournalBytes, "requests_journal_only", res.RequestsJournalOnly)
	return nil
}

// replicaRewound tells the replicator that an operator rolled history back
// (the stores' OnRewind; store worker). Nothing when not replicating.
func (s *Supervisor) replicaRewound() {
	if s.rep != nil && s.rep.r != nil {
		s.rep.r.Rewound()
	}
}

// startReplica starts replicating once the stores are open.
func (s *Supervisor) startReplica() {
	if s.rep == nil {
		return
	}
	if res := s.rep.restored; res != nil {
		s.rec.Audit(AuditReplicaRestore, map[string]any{"replica": s.rep.client.Location().String(), "generation": res.Generation,
			"checkpoint_id": res.CheckpointID, "watermark": res.Watermark, "wal_entries": res.Entries, "last_sequence": res.LastSequence,
			"skipped_generations": res.SkippedGenerations, "requests_journal_bytes": res.RequestsJournalBytes,
			"requests_journal_error": res.RequestsJournalError, "requests_journal_incomplete": res.RequestsJournalIncomplete,
			"requests_journal_only": res.RequestsJournalOnly})
	}
	st := s.st
	local := replica.Local{DataDir: s.cfg.DataDir, WAL: st.WAL(), Checkpoints: st.Checkpoints(), HoldTruncation: st.HoldTruncation}
	if s.book != nil {
		local.Journal = s.book.Journal() // pending requests follow the agent
	}
	r := replica.New(s.rep.client, local,
		replica.Options{SyncInterval: s.cfg.ReplicaSyncInterval, Logger: s.log, Registerer: s.met.Reg, Version: Build().Version})
	s.rep.r = r
	r.Start()
	s.log.Info("replicating the data directory", "replica", s.rep.client.Location().String(), "sync_interval", s.cfg.ReplicaSyncInterval,
		"state_file", filepath.Join(s.cfg.DataDir, "replica.json"))
}

// stopReplica stops the replicator after a last upload bounded by
// replicaFlush.
func (s *Supervisor) stopReplica() {
	if s.rep != nil && s.rep.r != nil {
		s.rep.r.Close(replicaFlush)
	}
}

func (s *Supervisor) replicaStatus() *replica.Status {
	if s.rep == nil || s.rep.r == nil {
		return nil
	}
	st := s.rep.r.Status()
	return &st
}
