"""Durable steps of requests (docs/protocol.md, "Steps: effects that never run twice").

The table of completed steps is shared by the sync and the asyncio clients: it is
rebuilt from a restore (the snapshot's ``__supervisor_steps__`` key, then the
``request_step``/``request_done`` entries of the WAL tail), grows when a step's
result is sent, shrinks when a request is answered, and is written into every
checkpoint so that a step survives the checkpoint that follows it.
"""
from typing import Any, Dict, List, Optional, Tuple

import msgpack

from .errors import InvalidMessage, SupervisorError

STEPS_KEY = "__supervisor_steps__"
OP_STEP = "request_step"
OP_DONE = "request_done"
STEP_OPERATIONS = (OP_STEP, OP_DONE)
DEFAULT_WAL_ENTRY_LIMIT = 10 << 10  # the supervisor's wal_entry limit (a flag may raise it)


class StepMismatch(SupervisorError):
    """A redelivered request called its steps in another order: the logged step
    at this index has another name. The handler is not deterministic in its
    steps; fail the request."""


class StepResultTooLarge(SupervisorError):
    """A step's result does not fit in one wal_entry (10 KiB by default)."""


class RequestCancelled(SupervisorError):
    """The request was cancelled (cancel_request) before this step ran."""


def too_large(name: str, size: int, limit: int) -> StepResultTooLarge:
    return StepResultTooLarge(
        f"step {name!r}: its request_step entry would be {size} bytes, over the supervisor's wal_entry "
        f"limit of {limit} bytes (10 KiB by default). Store big results elsewhere (a file, an object "
        f"store) and make the step's result their key; nothing was logged.",
        {"size": size, "limit": limit, "name": name},
    )


def entry_too_large(operation: str, size: int, limit: int) -> InvalidMessage:
    """The error for a wal_entry the client does not send: the supervisor would refuse it
    (INVALID_MESSAGE, too_large), and its refusal, which names no sequence, would fail
    every entry still in flight with it."""
    return InvalidMessage(
        f"INVALID_MESSAGE: wal_entry ({operation!r}) of {size} bytes is over the supervisor's wal_entry "
        f"limit of {limit} bytes (10 KiB by default): nothing was sent. Log a key to data stored elsewhere.",
        {"type": "wal_entry", "field": "", "rule": "too_large", "size": size, "limit": limit},
    )


def batch_too_large(data: List[Dict[str, Any]], payload_size: int, limit: int) -> Optional[InvalidMessage]:
    """The error for a wal_batch holding an entry over the wal_entry limit (None when it fits).
    The supervisor checks every entry of a batch against that limit and its refusal names no
    sequence, so the client would fail every entry in flight with the batch."""
    if payload_size <= limit:  # no entry can be bigger than the whole payload
        return None
    for e in data:
        n = len(msgpack.packb(e, use_bin_type=True))
        if n > limit:
            return entry_too_large(str(e.get("operation")), n, limit)
    return None


def mismatch(request_id: str, index: int, logged: str, called: str) -> StepMismatch:
    return StepMismatch(
        f"request {request_id}: step {index} was logged as {logged!r} but this delivery calls it {called!r}: "
        f"the handler must call its steps in the same order on every delivery",
        {"request_id": request_id, "index": index, "logged": logged, "called": called},
    )


class StepTable:
    """(request_id, index) -> (name, result) for requests not yet answered."""

    def __init__(self) -> None:
        self._t: Dict[str, Dict[int, Tuple[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._t)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._t

    def get(self, request_id: str, index: int) -> Optional[Tuple[str, Any]]:
        steps = self._t.get(request_id)
        return None if steps is None else steps.get(index)

    def put(self, request_id: str, index: int, name: str, result: Any) -> None:
        self._t.setdefault(request_id, {})[index] = (name, result)

    def drop(self, request_id: str) -> bool:
        return self._t.pop(request_id, None) is not None

    def requests(self) -> List[str]:
        return list(self._t)

    def export(self) -> Dict[str, List[Dict[str, Any]]]:
        """The table as a checkpoint holds it under __supervisor_steps__."""
        return {rid: [{"index": i, "name": n, "result": r} for i, (n, r) in sorted(steps.items())]
                for rid, steps in self._t.items()}

    def load(self, snapshot: Any, wal_entries: List[Dict[str, Any]]) -> None:
        """Rebuild from a restore: the snapshot's table, then the WAL tail in order."""
        self._t = {}
        saved = snapshot.get(STEPS_KEY) if isinstance(snapshot, dict) else None
        if isinstance(saved, dict):
            for rid, steps in saved.items():
                for s in steps if isinstance(steps, list) else []:
                    if isinstance(s, dict) and isinstance(s.get("index"), int):
                        self.put(str(rid), s["index"], str(s.get("name", "")), s.get("result"))
        for e in wal_entries:
            self.apply(e)

    def apply(self, entry: Dict[str, Any]) -> bool:
        """Apply one WAL entry; True when it was a step entry."""
        op = entry.get("operation") if isinstance(entry, dict) else None
        if op not in STEP_OPERATIONS:
            return False
        p = entry.get("params") or {}
        rid = str(p.get("request_id", ""))
        if op == OP_STEP and isinstance(p.get("index"), int):
            self.put(rid, p["index"], str(p.get("name", "")), p.get("result"))
        elif op == OP_DONE:
            self.drop(rid)
        return True


def user_view(snapshot: Any, wal_entries: List[Dict[str, Any]]) -> Tuple[Any, List[Dict[str, Any]]]:
    """The restore as the agent's code sees it: without the step table and the step entries."""
    if isinstance(snapshot, dict) and STEPS_KEY in snapshot:
        snapshot = {k: v for k, v in snapshot.items() if k != STEPS_KEY}
    return snapshot, [e for e in wal_entries if not (isinstance(e, dict) and e.get("operation") in STEP_OPERATIONS)]


def with_table(state: Dict[Any, Any], table: StepTable) -> Dict[Any, Any]:
    """The checkpoint data: the agent's state plus the table (a copy; state is not changed)."""
    if len(table) == 0:
        if STEPS_KEY in state:
            return {k: v for k, v in state.items() if k != STEPS_KEY}
        return state
    out = dict(state)
    out[STEPS_KEY] = table.export()
    return out


def step_params(request_id: str, index: int, name: str, result: Any) -> Dict[str, Any]:
    return {"request_id": request_id, "index": index, "name": name, "result": result}


def check_result_encodable(name: str, result: Any) -> None:
    try:
        msgpack.packb(result, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise SupervisorError(f"step {name!r}: its result cannot be encoded as MessagePack: {e}") from None
