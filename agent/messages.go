package agent

import (
	"context"
	"errors"

	"github.com/agent-sidecar/supervisor/schema"
)

// Messages returns the channel on which the supervisor's messages arrive, in
// order, for an agent that runs its own select loop:
//
//	for {
//		select {
//		case m, ok := <-conn.Messages():
//			if !ok {
//				return conn.Err() // ErrSupervisorGone, a broken stream, ErrClosed
//			}
//			switch m := m.(type) { ... }
//		case <-tick.C:
//			...
//		}
//	}
//
// The channel is closed when receiving ends for good; [Conn.Err] then says
// why. A message that fails validation is logged, reported to the
// supervisor as INVALID_MESSAGE and skipped, as [Conn.Run] does. A shutdown
// is delivered like any other message and the channel stays open after it,
// so the agent can read the checkpoint_ack of its final checkpoint there.
//
// Every call returns the same channel. The first starts a goroutine, owned by
// the Conn, that hands messages from the Conn's reader to the channel; it
// ends when the input ends or [Conn.Close] is called. From then on the
// channel is the only way to receive: [Conn.Receive], [Conn.Run] and
// [Conn.AwaitCheckpointAck] return [ErrMessagesInUse]. Messages that
// AwaitCheckpointAck set aside earlier come first.
func (c *Conn) Messages() <-chan schema.Message {
	c.startPump.Do(func() {
		c.pumping.Store(true)
		go c.pump()
	})
	return c.msgs
}

// Err returns why receiving from the channel of [Conn.Messages] ended: nil
// while it goes on (or was never asked for), and once the channel is closed
// ErrSupervisorGone, an error wrapping the wire error, or ErrClosed.
func (c *Conn) Err() error {
	select {
	case <-c.msgsDone:
		return c.msgsErr
	default:
		return nil
	}
}

// pump moves messages from the reader's queue to c.msgs until the input
// ends or the Conn is closed. It holds rmu for its whole life: it is the
// one receiver.
func (c *Conn) pump() {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	defer close(c.msgs)
	defer close(c.msgsDone)
	for {
		var m schema.Message
		if len(c.pending) > 0 {
			m = c.pending[0]
			c.pending[0] = nil
			c.pending = c.pending[1:]
		} else {
			var err error
			m, err = c.receive(context.Background())
			if errors.Is(err, schema.ErrInvalidMessage) {
				c.skipInvalid(err)
				continue
			}
			if err != nil {
				c.msgsErr = err
				return
			}
		}
		select {
		case c.msgs <- m:
		case <-c.closed:
			c.msgsErr = ErrClosed
			return
		}
	}
}

// skipInvalid logs a message from the supervisor that failed validation and
// reports it back as INVALID_MESSAGE.
func (c *Conn) skipInvalid(err error) {
	c.log.Warn("skipping an invalid message from the supervisor", "err", err)
	if serr := c.SendError(schema.CodeInvalidMessage, err.Error()); serr != nil {
		c.log.Warn("could not report the invalid message to the supervisor", "err", serr)
	}
}
