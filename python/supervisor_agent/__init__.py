"""Python client for agents run under the supervisor sidecar."""
from .agent import Agent, Pending, Request, Restore
from .errors import (
    CheckpointFailed,
    Disconnected,
    InvalidMessage,
    NotDurable,
    NotUnderSupervisor,
    ProtocolError,
    SequenceConflict,
    SupervisorError,
    WalFailed,
    WalFull,
)
from .framing import encode_frame, read_frame
from .steps import RequestCancelled, StepMismatch, StepResultTooLarge

__all__ = [
    "Agent", "Pending", "Request", "Restore", "SupervisorError", "NotUnderSupervisor", "ProtocolError",
    "Disconnected", "WalFull", "WalFailed", "SequenceConflict", "InvalidMessage", "CheckpointFailed",
    "NotDurable", "encode_frame", "read_frame", "StepMismatch", "StepResultTooLarge", "RequestCancelled",
]
