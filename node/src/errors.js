// Errors raised by supervisor-agent. All derive from SupervisorError.

/** Base of every error this package raises. `code` is the supervisor's error code, when there is one. */
export class SupervisorError extends Error {
  constructor(message, details = {}, code = "") {
    super(message);
    this.name = new.target.name;
    this.details = details;
    this.code = code;
  }
}

/** The process was not started by the supervisor (no environment contract). */
export class NotUnderSupervisor extends SupervisorError {}
/** The supervisor's byte stream is broken (bad length, truncated frame, not MessagePack). */
export class ProtocolError extends SupervisorError {}
/** The supervisor closed the pipe: the agent should exit. */
export class Disconnected extends SupervisorError {}
/** WAL_FULL: the entry was not logged. Checkpoint, then log again; do not act. */
export class WalFull extends SupervisorError {}
/** WAL_FAILED: the entry could not be logged; do not act. */
export class WalFailed extends SupervisorError {}
/** SEQUENCE_CONFLICT: a reused sequence with different contents. */
export class SequenceConflict extends SupervisorError {}
/** INVALID_MESSAGE: the supervisor refused a message as malformed. */
export class InvalidMessage extends SupervisorError {}
/** CHECKPOINT_FAILED: the checkpoint was not stored; the previous one is intact. */
export class CheckpointFailed extends SupervisorError {}
/** No durability answer came (timeout, or the connection ended first). */
export class NotDurable extends SupervisorError {}
/** A step's name differs from the one logged at its index: the handler is not deterministic in its steps. */
export class StepMismatch extends SupervisorError {}
/** A step's result does not fit in one WAL entry. */
export class StepResultTooLarge extends SupervisorError {}

const BY_CODE = {
  WAL_FULL: WalFull,
  WAL_FAILED: WalFailed,
  SEQUENCE_CONFLICT: SequenceConflict,
  INVALID_MESSAGE: InvalidMessage,
  CHECKPOINT_FAILED: CheckpointFailed,
};

/** The error for the body of an `error` message; any shape of body gives one. */
export function fromErrorMessage(err) {
  if (err === null || typeof err !== "object" || Array.isArray(err)) err = { message: String(err) };
  const code = typeof err.code === "string" ? err.code : String(err.code ?? "");
  const Cls = BY_CODE[code] ?? SupervisorError;
  const details = err.details && typeof err.details === "object" && !Array.isArray(err.details) ? err.details : {};
  return new Cls(`${code}: ${err.message ?? ""}`, details, code);
}
