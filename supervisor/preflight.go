package supervisor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
)

// preflight checks everything `supervisor run` can check before it touches
// the data directory, so that a start that is bound to fail (a port in use,
// a missing agent binary, a data directory path that is a file) leaves
// nothing behind — no new directory, no pre-allocated WAL segment. It
// returns the HTTP listener, already bound (nil when --http-addr is empty);
// Run serves on it instead of listening a second time. Errors wrap ErrConfig.
func (s *Supervisor) preflight() (net.Listener, error) {
	if err := s.cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath(s.cfg.Command[0]); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			err = ee.Err
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the message
		}
		return nil, fmt.Errorf("%w: cannot run the agent command %q: %v (give its path, or put it on $PATH)", ErrConfig, s.cfg.Command[0], err)
	}
	if fi, err := os.Stat(s.cfg.DataDir); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("%w: --data-dir %s is not a directory", ErrConfig, s.cfg.DataDir)
	}
	if s.cfg.HTTPAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot listen on --http-addr %s: %v (is another supervisor using it? pick another address, or --http-addr \"\" to disable HTTP)",
			ErrConfig, s.cfg.HTTPAddr, unwrapOpError(err))
	}
	s.lc.stat.HTTPAddr = ln.Addr().String()
	// Requests can arrive before the loop spawns the first agent: say so,
	// rather than report an empty state.
	s.setState(StateStarting)
	return ln, nil
}

// unwrapOpError drops net.OpError's "listen tcp 127.0.0.1:9464:" prefix,
// which would repeat the address the message already names.
func unwrapOpError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}
