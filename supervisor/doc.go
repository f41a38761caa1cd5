// Package supervisor runs one agent process and keeps it alive and its state
// safe: it spawns the agent in its own process group, exchanges frames with it,
// notices death at once and hangs within the heartbeat timeout, restarts it
// with back-off up to a crash-loop limit, appends its WAL entries, stores its
// checkpoints, sends it a restore (newest checkpoint + WAL after it) on every
// start and on an operator's command, and exposes metrics, health and an
// audit log.
//
// One goroutine — the loop in Run — owns the agent's lifecycle state
// (starting, running, stopping, backing off, given up) and never waits on
// I/O: storage work runs on the store worker (storework.go) and answers it
// with an event. Frame readers, the process watcher, the control socket and
// the HTTP server send it events or read the view it publishes (view.go);
// none of them changes lifecycle state. See docs/architecture.md.
package supervisor
