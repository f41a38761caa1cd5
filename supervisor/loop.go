package supervisor

// The owner loop: the only goroutine that changes lifecycle state.

import (
	"context"
	"syscall"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor/agentproc"
	"github.com/agent-sidecar/supervisor/supervisor/conn"
)

// loop is the owner: the only goroutine that changes lifecycle state.
func (s *Supervisor) loop(ctx context.Context) error {
	s.lc.startTimer = time.NewTimer(0) // first start now
	s.lc.hbTimer = time.NewTimer(time.Hour)
	s.lc.hbTimer.Stop()
	var shutdownTimer <-chan time.Time
	forced := false // ForceStop came before the stop it skips the wait of
	done := ctx.Done()
	trialTick := time.NewTicker(250 * time.Millisecond)
	defer trialTick.Stop()
	// The loop's own heartbeat: /healthz fails when it stops beating
	// for the stall limit; a dozen beats within it are enough.
	beat := time.NewTicker(s.beatEvery())
	defer beat.Stop()
	defer s.abortTrial("the supervisor stopped during the trial")
	defer s.answerPending("the supervisor stopped before the restore was sent")
	defer s.dropEarly()

	for {
		s.loopBeat.Store(time.Now().UnixNano())
		select {
		case <-beat.C:

		case <-done:
			done = nil
			s.lc.shutting = true
			s.lc.startTimer.Stop()
			s.stopTrial("the supervisor is stopping")
			if s.lc.cur == nil {
				s.setState(StateStopped)
				return nil
			}
			s.log.Info("stopping: asking the agent to shut down", "timeout", s.cfg.ShutdownTimeout)
			s.setState(StateStopping)
			s.lc.cur.stopping = true
			s.lc.cur.stopReason = "shutdown"
			s.lc.cur.SendMsg(&schema.Shutdown{Reason: "supervisor is stopping", CreateCheckpoint: true})
			shutdownTimer = time.After(s.cfg.ShutdownTimeout)
			if forced {
				s.log.Warn("second stop signal: killing the agent's process group without waiting")
				_ = s.lc.cur.Proc().SignalGroup(syscall.SIGKILL)
			}

		case <-s.inbox.force:
			if !s.lc.shutting {
				// The first signal's stop (ctx) and this one were ready
				// together, and this one was taken first: it applies
				// once the stop begins.
				forced = true
				continue
			}
			if s.lc.cur != nil {
				s.log.Warn("second stop signal: killing the agent's process group without waiting")
				_ = s.lc.cur.Proc().SignalGroup(syscall.SIGKILL)
			}

		case <-shutdownTimer:
			shutdownTimer = nil
			if s.lc.cur != nil {
				s.log.Warn("agent did not exit within --shutdown-timeout; killing its process group", "timeout", s.cfg.ShutdownTimeout)
				_ = s.lc.cur.Proc().SignalGroup(syscall.SIGKILL)
			}

		case <-s.lc.startTimer.C:
			if !s.lc.shutting {
				s.prepareStart()
			}

		case fe := <-s.inbox.walFailed:
			s.walFailed(fe)

		case r := <-s.inbox.stored:
			if stop, err := s.storeDone(r); stop {
				return err
			}

		case r := <-s.inbox.spawned:
			if stop, err := s.spawnDone(r); stop {
				return err
			}

		case <-s.lc.hbTimer.C:
			s.checkHeartbeat()

		case <-s.trialVerdict():
			// A look of the owner's own decides: it first counts the
			// answers missing by now, and those the candidate still owes.
			s.checkTrial()

		case <-s.trialTicks(trialTick.C):
			s.checkTrial()

		case ev := <-s.inbox.events:
			if ev.Inst.Role() == RoleShadow {
				s.shadowEvent(ev)
				continue
			}
			if s.lc.cur == nil || ev.Inst != s.lc.cur.Instance {
				continue // an event from an instance already finished
			}
			cur := s.lc.cur
			switch ev.Kind {
			case conn.FirstHeartbeat:
				if s.lc.state == StateStarting {
					s.setState(StateRunning)
					s.met.AgentUp.WithLabelValues(RolePrimary).Set(1)
					s.log.Info("agent is up", "pid", ev.Inst.Proc().ID(), "start_seconds", time.Since(ev.Inst.Started()).Seconds())
				}
				s.armHeartbeat()
			case conn.StreamEnded:
				s.streamEnded(cur, ev)
			case conn.EvolutionIntent:
				s.evolutionIntent(cur, ev.Msg.(*schema.EvolutionIntent))
			case conn.Exited:
				s.lc.hbTimer.Stop()
				s.drainInstance(cur)
			case conn.Finished:
				stop, err := s.instanceExited(cur, ev.Status)
				if stop {
					return err
				}
			}

		case call := <-s.inbox.control:
			if resp := s.handleControl(call); resp.OK || resp.Error != "" {
				call.reply <- resp
			}
		}
	}
}

func (s *Supervisor) setState(st State) {
	s.lc.state = st
	s.lc.stat.State = string(st)
	s.publish()
}

// storeDone takes a store worker's answer to an owner job. stop=true ends
// Run with err.
func (s *Supervisor) storeDone(r storeResult) (stop bool, err error) {
	switch {
	case r.fallback != nil:
		return s.fallbackAnswered(r.fallback)
	case r.trial != nil:
		s.trialPrepared(r.trial)
	case r.promotion != nil:
		s.promotionRecorded(r.promotion)
	case r.start != nil:
		if err := s.startPrepared(r.start); err != nil {
			return s.startFailed(err)
		}
		return s.takeEarly()
	}
	return false, nil
}

// spawnDone takes a spawned process (spawn.go) and makes it the primary or a
// trial's shadow (owner only).
func (s *Supervisor) spawnDone(r spawnResult) (stop bool, err error) {
	if r.trial != nil {
		s.shadowSpawned(r)
		return false, nil
	}
	if r.early {
		return s.earlySpawned(r)
	}
	p := r.start
	if p != s.lc.preparing || s.lc.shutting {
		if r.proc != nil {
			go agentproc.Discard(r.proc)
		}
		return false, nil
	}
	s.lc.preparing = nil
	if s.lc.pendingPoint != p.point {
		// An operator recorded another restore point while the agent was
		// being started. It has not been sent a frame: it is stopped, and
		// the start begins again from that point.
		if r.proc != nil {
			go agentproc.Discard(r.proc)
		}
		s.prepareStart()
		return false, nil
	}
	if r.err == nil && s.st.WAL().Failure() != nil {
		// The WAL failed while the agent was being spawned: its restore may
		// hold entries the log no longer has. Not sent a frame yet: it is
		// stopped, and the start waits for the log to be reopened.
		go agentproc.Discard(r.proc)
		return s.startFailed(errWALStopped)
	}
	s.lc.pendingPoint = nil
	if err := s.startSpawned(p, r.proc, r.err); err != nil {
		return s.startFailed(err)
	}
	s.armHeartbeat()
	return false, nil
}
