// Package testagent is the agent the supervisor's tests run: a real
// stateful agent built on package agent, with faults to inject and an events
// log for tests to check. It is for tests only: no production binary
// imports it. A test binary doubles as the agent (as os/exec's tests do):
// its TestMain calls [MainIfAgent], and the supervisor under test runs the
// test binary with [EnvRunAgent]=1 in its environment. [Main] is the
// program; [Run] is the agent on a connection, for tests that play the
// supervisor in process. Authors looking for an example agent want
// examples/demo instead.
//
// # State
//
// The agent keeps the seed's checkpoint state — agent_state, memory_blocks
// (with a deterministic 8-dimension embedding), tool_registry,
// conversation_history, metrics — plus last_seq (the highest applied WAL
// sequence), chain (a running SHA-256 over every applied entry, see
// [ChainNext]) and modules (module → code loaded by hot_reload). [State] is
// also the `data` of its checkpoints, encoded canonically (sorted keys,
// compact integers), so state_digest — the SHA-256 of that encoding — and
// chain prove a restore exact.
//
// Every change is sent to the WAL before it is applied, numbered after
// last_seq, and applied from the bytes that were logged, the same path a
// restore replays: memory_add (self-driven notes and requests), tool_register
// (a request "/tool NAME [PARAM...]"), state_update (a request "/status S",
// an evolution, a hot reload: {status, module, code}).
//
// On restore it replaces its state by the snapshot (when checkpoint_id is
// not empty), applies the WAL entries above its last_seq and continues
// numbering after the highest. With SUPERVISOR_RESTORE_PENDING=1 it makes no
// change — no self-driven entry, no checkpoint, no request — before that
// restore. On shutdown with create_checkpoint it sends a checkpoint, waits up
// to 2s for its ack and exits 0. Module code is a tiny config language
// ([ParseBehaviour]) that sets the simulated latency, error rate and memory
// it reports in metrics; requests take the simulated latency, in line.
//
// # Flags
//
// Each flag can also be given as an environment variable REFAGENT_NAME
// (--wal-rate: REFAGENT_WAL_RATE), used when the flag is absent; the
// supervisor passes its environment to the agent. docs/agent.md has the
// table; `-h` prints them. Faults (--crash-after,
// --crash-on-restore, --hang-after, --stop-reading-after, --ignore-sigterm,
// --garbage, --fork-grandchild, --stderr-flood) make it misbehave on
// purpose, and --events PATH records what it did as JSON lines for tests to
// check. --behaviour CODE sets its starting module code (a slow agent:
// latency_ms=50) and --answer makes it answer every request.
//
// Exit codes: 0 shutdown or supervisor gone, 1 broken connection, 2 usage,
// 3 --crash-on-restore, 4 restore failed, --crash-code for --crash-after.
package testagent
