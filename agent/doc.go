// Package agent is the client side of the supervisor protocol, for people
// writing an agent in Go. The agent is a child process of the supervisor and
// talks to it over two pipes in length-prefixed MessagePack frames (see
// docs/protocol.md); this package does the framing, encoding and validation,
// and leaves the agent's state and logic to the author.
//
// # Obligations
//
// An agent that wants the supervisor to keep it alive and its state safe:
//
//   - sends a heartbeat about every second ([Conn.Heartbeats]);
//   - logs every change to its state in the write-ahead log before making it
//     ([Conn.SendWAL], [Conn.SendWALBatch]), with sequences that start at 1
//     and only increase, continuing after a restore from the highest sequence
//     restored;
//   - on restore, replaces its state by the snapshot (when a checkpoint id is
//     given) and applies the WAL entries in order, skipping any at or below
//     its last applied sequence;
//   - sends checkpoints of its whole state now and then, and a final one on
//     shutdown when asked to ([Conn.SendCheckpoint], [Conn.AwaitCheckpointAck]);
//   - exits when the supervisor closes its pipe ([ErrSupervisorGone]) or says
//     shutdown ([ErrShutdown]).
//
// When SUPERVISOR_RESTORE_PENDING=1 ([Config.RestorePending]) a restore is
// the first frame the agent will read; it should not change its state before
// that restore has been applied.
//
// # Use
//
// An agent with its own loop receives from [Conn.Messages] beside its timers
// (examples/demo is a complete one):
//
//	conn, err := agent.Connect(agent.Options{})
//	if err != nil { ... }
//	defer conn.Close()
//	go conn.Heartbeats(ctx, time.Second)
//	for {
//		select {
//		case <-tick.C:
//			// log (conn.Log, conn.SendWAL), then change the state
//		case m, ok := <-conn.Messages():
//			if !ok {
//				return conn.Err() // ErrSupervisorGone: exit 0
//			}
//			switch m := m.(type) {
//			case *schema.Restore:
//				// replace the state by the snapshot, replay the WAL entries
//			case *schema.Shutdown:
//				// send a final checkpoint if asked, read the channel until
//				// its checkpoint_ack (or a short timeout), exit 0
//			}
//		}
//	}
//
// An agent that prefers callbacks hands them to [Conn.Run] instead:
//
//	err = conn.Run(ctx, agent.Handlers{
//		Restore:        a.restore,
//		ProcessRequest: a.handle,
//		Shutdown: func(m *schema.Shutdown) {
//			if m.CreateCheckpoint {
//				if conn.SendCheckpoint(a.state) == nil {
//					ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
//					conn.AwaitCheckpointAck(ctx)
//					cancel()
//				}
//			}
//		},
//	})
//	if errors.Is(err, agent.ErrShutdown) || errors.Is(err, agent.ErrSupervisorGone) {
//		return 0
//	}
//
// # Durable requests
//
// A request the supervisor accepted is delivered until it is answered, again
// after a restart of the agent ([Request].Attempt > 1). [Handlers].Handle
// receives it as a [*Request] with a context that a cancel_request cancels
// (heartbeats opt in to it). A step ([Step], [Request.Step]) is a unit of its
// work whose result is logged before the handler goes on and replayed,
// without running it again, on a redelivery:
//
//	Handle: func(ctx context.Context, req *agent.Request) (any, error) {
//		answer, err := agent.Step(ctx, req, "llm", func(ctx context.Context) (string, error) {
//			return callTheModel(ctx, req.Data.Message)
//		})
//		if err != nil {
//			return nil, err
//		}
//		return map[string]any{"answer": answer}, nil
//	},
//
// The Conn keeps the step table of unanswered requests in every checkpoint
// sent with [Conn.SendCheckpoint] and rebuilds it from the restore, which
// the agent's code receives without it.
//
// [Connect] picks the pipes from SUPERVISOR_TRANSPORT: stdin and stdout for
// "stdio" (then stdout is not free for logs: log to stderr, which the
// supervisor captures), fds 3 and 4 for "fd". [NewConn] takes any reader and
// writer, for tests and custom transports.
//
// Sends are safe for concurrent use; every frame is written in one piece.
// Messages are received either from the Messages channel or by Receive, Run
// and AwaitCheckpointAck, one goroutine at a time.
package agent
