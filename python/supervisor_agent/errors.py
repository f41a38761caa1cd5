"""Exceptions raised by supervisor_agent. All derive from SupervisorError."""
from typing import Any, Dict, Optional


class SupervisorError(Exception):
    """Base of every error this package raises."""

    code: str = ""

    def __init__(self, message: str, details: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.message = message
        self.details: Dict[str, Any] = details or {}


class NotUnderSupervisor(SupervisorError):
    """The process was not started by the supervisor (no env contract)."""


class ProtocolError(SupervisorError):
    """The supervisor's byte stream is broken (bad length, truncated frame, garbage)."""


class Disconnected(SupervisorError):
    """The supervisor closed the pipe; the agent should exit."""


class WalFull(SupervisorError):
    """WAL_FULL: the entry was not logged. Checkpoint, then log again; do not act."""

    code = "WAL_FULL"


class WalFailed(SupervisorError):
    """WAL_FAILED: the entry could not be logged; do not act."""

    code = "WAL_FAILED"


class SequenceConflict(SupervisorError):
    """SEQUENCE_CONFLICT: a reused sequence with different contents, or a bad gap."""

    code = "SEQUENCE_CONFLICT"


class InvalidMessage(SupervisorError):
    """INVALID_MESSAGE: the supervisor rejected a message as malformed."""

    code = "INVALID_MESSAGE"


class CheckpointFailed(SupervisorError):
    """CHECKPOINT_FAILED: the checkpoint was not stored; the previous one is intact."""

    code = "CHECKPOINT_FAILED"


class NotDurable(SupervisorError):
    """No durability answer came (timeout, or the connection ended first)."""


_BY_CODE = {c.code: c for c in (WalFull, WalFailed, SequenceConflict, InvalidMessage, CheckpointFailed)}


def from_error_message(err: Any) -> SupervisorError:
    """The exception for an error reply's body; any shape of body gives one."""
    if not isinstance(err, dict):
        err = {"message": str(err)}
    code = str(err.get("code", ""))
    cls = _BY_CODE.get(code, SupervisorError)
    details = err.get("details")
    e = cls(f"{code}: {err.get('message', '')}", details if isinstance(details, dict) else {})
    e.code = code
    return e
