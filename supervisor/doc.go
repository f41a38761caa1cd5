// Package supervisor runs one agent process and keeps it alive and its state
// safe: it spawns the agent in its own process group, exchanges frames with it,
// notices death at once and hangs within the heartbeat timeout, restarts it
// with back-off up to a crash-loop limit, appends its WAL entries, stores its
// checkpoints, sends it a restore (newest checkpoint + WAL after it) on every
// start and on an operator's command, and exposes metrics, health and an
// audit log.
//
// One goroutine — the loop in Run (loop.go) — owns the agent's lifecycle
// state (starting, running, stopping, backing off, given up; the lifecycle
// struct) and never waits on I/O: storage work runs on the store worker
// (durable.Worker, storejobs.go) and answers it on the inbox. The parts it
// is built from are packages of their own, which do not import this one:
//
//   - agentproc: spawning agents, their process groups, pidfds, the reaper
//     and escaped descendants;
//   - conn: one agent instance's frames, heartbeats, acks and log lines,
//     handing valid messages to a Sink and lifecycle events to the owner;
//   - durable: the WAL, the checkpoint store, restore assembly, retention
//     and rollbacks — the restore invariant — and their worker;
//   - api: the HTTP API, the request table and the control socket, which
//     read the view the owner publishes (view.go) and send it control calls;
//   - observe: metrics, the audit log and the Recorder.
//
// None of them changes lifecycle state. See docs/architecture.md.
package supervisor
