// Command supervisor runs an AI agent as a child process and keeps it alive
// and its state safe: it restarts the agent when it dies or hangs, stores its
// write-ahead log and checkpoints, and restores its state on every restart.
//
// Usage:
//
//	supervisor run [flags] [-- AGENT_COMMAND [ARGS...]]
//	supervisor checkpoints list|show ID [--data-dir DIR] [--json]
//	supervisor restore --checkpoint ID [--data-dir DIR] [--no-wal]
//	supervisor status [--data-dir DIR] [--json]
//	supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]
//	supervisor audit [--data-dir DIR] [--since D] [--json]
//	supervisor evolutions list|show ID [--data-dir DIR] [--json]
//	supervisor replica restore --replica URL --data-dir DIR [--to-sequence N | --to-time T]
//	supervisor replica list --replica URL [--json]
//	supervisor version [--json]
//
// Flags and arguments may come in any order. Every flag of run may also be
// set as SUPERVISOR_<FLAG> in the environment (--heartbeat-timeout:
// SUPERVISOR_HEARTBEAT_TIMEOUT); a flag on the command line wins. Without an
// agent command, run supervises the built-in demo agent (demo-agent).
// Every command has --help;
// docs/cli.md documents every flag.
//
// Exit codes: 0 clean stop; 1 the agent failed (crash loop, or --restart
// never) or a command failed; 2 usage or configuration error, which a
// process manager should not retry; 3 the agent's state cannot be restored
// completely and the agent was not started (an operator must act; not to be
// retried either).
//
// Each command is a type with Run(ctx, args) error and its own flag set, so
// tests call it directly; main only traps signals, dispatches, reports the
// error once and maps it to an exit code (exitCode).
package main
