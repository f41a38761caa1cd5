package supervisor

import (
	"errors"
	"fmt"

	"github.com/agent-sidecar/supervisor/wire"
)

// diagnoseFraming explains a framing error whose cause is known — by far
// the commonest: the agent printed text to the stream that carries frames,
// and "star" became a length prefix of 1937006962 bytes. It remembers the
// explanation (for `supervisor status` and the give-up message) and returns
// it, or "" when the cause is unknown. The agent's text in it is at most 64
// bytes, quoted.
func (s *Supervisor) diagnoseFraming(err error) string {
	var te *wire.TextError
	if !errors.As(err, &te) {
		return ""
	}
	d := fmt.Sprintf("the agent wrote text to its protocol stream (stdout); log to stderr, or use --stdio=false (it wrote %q)", te.Text)
	if !s.cfg.Stdio {
		d = fmt.Sprintf("the agent wrote text to its protocol stream (fd 4); write only frames there and log to stdout or stderr (it wrote %q)", te.Text)
	}
	s.lc.stat.Diagnosis = d
	s.publish()
	return d
}

// failureHint is added to the message that ends Run after a failed agent
// (crash loop, or --restart never): the known cause of the last run's end,
// or "".
func (s *Supervisor) failureHint(reason string) string {
	if reason != "framing_error" {
		return ""
	}
	d := s.lc.stat.Diagnosis
	if d == "" {
		return ""
	}
	return " Cause: " + d + "."
}
