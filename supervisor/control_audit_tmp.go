package supervisor

import "fmt"

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
