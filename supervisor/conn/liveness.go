package conn

// Liveness: the heartbeat's age, less the time the agent waited on our
// storage, and the end of an instance (Finish).

import (
	"io"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
)

// sinkBegin and sinkEnd bracket a call into our storage that may block on
// our disk (a WAL append, the checkpoint queue, a staging write): the time
// between them is recorded as not the agent's (see HeartbeatAge). Reader
// goroutine only; no allocation on the frame path.
func (in *Instance) sinkBegin() time.Time {
	start := time.Now()
	in.sinkSince.Store(start.UnixNano())
	return start
}

func (in *Instance) sinkEnd(start time.Time) {
	end := time.Now()
	in.sinkSince.Store(0)
	in.blockedNano.Add(int64(end.Sub(start)))
	in.lastFrameAt.Store(end.UnixNano())
}

// sinkWriter is a writer onto our storage (a streamed checkpoint's staging
// file) whose every Write is time in a sink. The reader's time between
// writes, waiting for the agent's next bytes, is not: it is the agent's.
type sinkWriter struct {
	in *Instance
	w  io.Writer
}

func (s *sinkWriter) Write(p []byte) (int, error) {
	start := s.in.sinkBegin()
	defer s.in.sinkEnd(start)
	return s.w.Write(p)
}

// heartbeatAge returns the time since the last heartbeat, or since the start
// when none has arrived yet, and whether one has — less the time the reader
// spent blocked on our own storage meanwhile (a slow disk is not a hung
// agent).
func (in *Instance) HeartbeatAge(now time.Time) (time.Duration, bool) {
	since, seen := in.started, false
	if last := in.lastHeartbeat.Load(); last != 0 {
		since, seen = time.Unix(0, last), true
	}
	age := now.Sub(since) - time.Duration(in.blockedNano.Load())
	if s := in.sinkSince.Load(); s != 0 {
		age -= now.Sub(time.Unix(0, s))
	}
	return max(age, 0), seen
}

// finish reaps the process and waits for its goroutines. The frame reader
// reads what the agent wrote before it died to the end, and stores it,
// however long our own storage takes: the agent's WAL entries must not be
// lost. Only when the reader has waited drainTimeout for bytes that do not
// come (the pipe is held open by a descendant that escaped the process
// group) is the pipe closed.
func (in *Instance) Finish(drainTimeout time.Duration) agentproc.ExitStatus {
	in.abandonMu.Do(func() { close(in.abandoned) })
	st := in.proc.Reap()
	exited := time.Now().UnixNano()
	tick := time.NewTicker(min(drainTimeout/4, 100*time.Millisecond))
	defer tick.Stop()
wait:
	for {
		select {
		case <-in.readerEnd:
			break wait
		case now := <-tick.C:
			if in.sinkSince.Load() != 0 {
				continue // busy storing what the agent wrote: ours to wait for
			}
			idleSince := max(exited, in.lastFrameAt.Load())
			if now.Sub(time.Unix(0, idleSince)) >= drainTimeout {
				in.log.Warn("agent output still open after the agent exited, with nothing more arriving (a descendant escaped its process group?); closing it",
					"waited", drainTimeout)
				break wait
			}
		}
	}
	in.proc.CloseReaders()
	<-in.readerEnd
	in.stopAcks()
	in.logsEnd.Wait()
	in.closeOutbound()
	<-in.writerEnd
	return st
}
