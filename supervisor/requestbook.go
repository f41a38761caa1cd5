package supervisor

import (
	"fmt"
	"log/slog"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// openRequests opens the request journal (DATA_DIR/requests/journal) and
// hands the book to the API. Damage is reported loudly and never stops the
// start: the intact records are kept.
func (s *Supervisor) openRequests() error {
	b, rp, err := requests.OpenBook(s.cfg.DataDir, requests.Config{
		Retention: s.cfg.RequestRetention, Timeout: s.cfg.RequestTimeout, MaxBytes: s.cfg.RequestJournalBytes,
		MaxAttempts: s.cfg.RequestMaxAttempts, Encode: func(m schema.Message) ([]byte, error) { return s.codec.Encode(m) },
		Log: s.log, Metrics: s.rmet, Audit: s.rec.Audit,
	})
	if err != nil {
		return plantedLink(fmt.Errorf("open the request journal: %w", err))
	}
	s.book = b
	s.api.Requests().SetBook(b)
	pending := 0
	for _, v := range b.List() {
		if v.Status == requests.StatusPending {
			pending++
		}
	}
	s.log.Info("request journal opened", "records", len(rp.Records), "bytes", rp.Size, "pending", pending,
		"torn_bytes_truncated", rp.TruncatedBytes)
	if rp.Corruption != nil {
		s.rec.Record(observe.Occurrence{Level: slog.LevelError,
			Msg:    "REQUEST JOURNAL DAMAGED: a corrupt record was skipped; the intact records before and after it are kept and served. Requests whose records were lost are unknown (404). The damaged file is kept for inspection.",
			Fields: map[string]any{"error": rp.Corruption.Error(), "skipped_bytes": rp.SkippedBytes, "set_aside": rp.SetAside}})
	}
	return nil
}
