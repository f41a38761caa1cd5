"""A fake supervisor for unit tests of an agent: in-memory pipes, no binary.

    from supervisor_agent.testing import FakeSupervisor
    with FakeSupervisor(restore={"snapshot": {"n": 1}, "wal_entries": [], "last_sequence": 3}) as sup:
        agent = sup.agent()                 # an Agent connected to this fake
        agent.log("memory_add", {"content": "x"})   # acked by the fake at once
        rid = sup.request("hello")          # a process_request
        ...answer it via agent.requests()...
        assert sup.result(rid)["data"] == {...}

The fake acknowledges every wal_entry/wal_batch asking for an ack and every
checkpoint, records everything the agent sent in ``sup.received``, and keeps
the latest checkpoint and the WAL so ``sup.restore_message()`` builds what a
real supervisor would send after a crash. Set ``sup.fail_next_wal = "WAL_FULL"``
to have it refuse the next entry.
"""
import os
import threading
import uuid
from typing import Any, Dict, List, Optional

from .agent import Agent
from .errors import ProtocolError
from .framing import encode_frame, read_frame

# The largest frame the supervisor reads from an agent (a checkpoint: 100 MiB of
# data plus a 16 KiB envelope). A bigger one (up to --max-frame-size) is skipped
# unread and answered INVALID_MESSAGE naming neither its type nor a sequence.
MAX_FROM_AGENT = (100 << 20) + (16 << 10)


class FakeSupervisor:
    def __init__(self, restore: Optional[Dict[str, Any]] = None) -> None:
        self._restore = restore
        a_r, s_w = os.pipe()  # supervisor -> agent
        s_r, a_w = os.pipe()  # agent -> supervisor
        self._agent_r, self._agent_w = os.fdopen(a_r, "rb"), os.fdopen(a_w, "wb")
        self._r, self._w = os.fdopen(s_r, "rb"), os.fdopen(s_w, "wb")
        self._wlock = threading.Lock()
        self._cv = threading.Condition()
        self.received: List[Dict[str, Any]] = []
        self.wal: Dict[int, Dict[str, Any]] = {}
        self.checkpoint: Optional[Dict[str, Any]] = None
        self.checkpoint_seq = 0
        self.results: Dict[str, Dict[str, Any]] = {}
        self.fail_next_wal: Optional[str] = None
        self.hold_acks = False  # True: log entries but answer no wal_ack until release_acks()
        self._agent: Optional[Agent] = None
        if restore is not None:
            m = {"type": "restore", "checkpoint_id": restore.get("checkpoint_id", ""),
                 "snapshot": restore.get("snapshot", {}), "wal_entries": restore.get("wal_entries", []),
                 "last_sequence": restore.get("last_sequence", 0)}
            self.send(m)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def agent(self, **kw: Any) -> Agent:
        kw.setdefault("heartbeat_interval", 0.05)
        self._agent = Agent(self._agent_r, self._agent_w, restore_pending=self._restore is not None, **kw)
        return self._agent

    def send(self, msg: Dict[str, Any]) -> None:
        msg.setdefault("timestamp", 0)
        with self._wlock:
            self._w.write(encode_frame(msg))
            self._w.flush()

    def send_raw(self, payload: bytes) -> None:
        """Send one frame whose MessagePack payload was built by hand: what a
        dict cannot express (a str that is not UTF-8, a key twice)."""
        import struct
        with self._wlock:
            self._w.write(struct.pack(">I", len(payload)) + payload)
            self._w.flush()

    def async_agent(self, **kw: Any) -> Any:
        """An asyncio Agent (supervisor_agent.aio) connected to this fake: ``agent = await sup.async_agent()``."""
        from . import aio
        kw.setdefault("heartbeat_interval", 0.05)
        return aio.Agent.open(self._agent_r, self._agent_w, restore_pending=self._restore is not None, **kw)

    def request(self, message: str, context: Optional[Dict[str, Any]] = None, user_id: str = "",
                *, request_id: Optional[str] = None, attempt: Optional[int] = None) -> str:
        """Send a process_request; pass request_id and attempt to redeliver one."""
        rid = request_id or str(uuid.uuid4())
        m: Dict[str, Any] = {"type": "process_request", "request_id": rid,
                             "data": {"message": message, "context": context or {}, "user_id": user_id}}
        if attempt is not None:
            m["attempt"] = attempt
        self.send(m)
        return rid

    def cancel(self, request_id: str) -> None:
        """Send cancel_request, as the supervisor does after DELETE /v1/requests/ID."""
        self.send({"type": "cancel_request", "request_id": request_id})

    def shutdown(self, create_checkpoint: bool = True, reason: str = "test") -> None:
        self.send({"type": "shutdown", "reason": reason, "create_checkpoint": create_checkpoint})

    def result(self, request_id: str, timeout: float = 5.0) -> Dict[str, Any]:
        with self._cv:
            if not self._cv.wait_for(lambda: request_id in self.results, timeout):
                raise TimeoutError(f"no request_result for {request_id}")
            return self.results[request_id]

    def wait_for(self, pred: Any, timeout: float = 5.0) -> Any:
        with self._cv:
            if not self._cv.wait_for(lambda: pred(self), timeout):
                raise TimeoutError("condition not met")

    def release_acks(self) -> None:
        """Stop holding acks and acknowledge everything logged so far."""
        with self._cv:
            self.hold_acks = False
            top = max(self.wal, default=0)
        if top:
            self.send({"type": "wal_ack", "sequence": top})

    def restore_message(self) -> Dict[str, Any]:
        entries = [self.wal[s] for s in sorted(self.wal) if s > self.checkpoint_seq]
        return {"snapshot": self.checkpoint or {}, "wal_entries": entries,
                "last_sequence": max(self.wal, default=0), "checkpoint_id": "fake" if self.checkpoint else ""}

    def close(self) -> None:
        for f in (self._w,):
            try:
                f.close()
            except OSError:
                pass
        if self._agent is not None:
            self._agent.close()

    def __enter__(self) -> "FakeSupervisor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self) -> Optional[Dict[str, Any]]:
        """The next frame the agent sent; one over MAX_FROM_AGENT is skipped and
        answered as the supervisor answers it (rule too_large, no type)."""
        import struct
        while True:
            h = self._r.read(4)
            if not h:
                return None
            if len(h) < 4:
                raise ProtocolError("truncated frame")
            (n,) = struct.unpack(">I", h)
            if n <= MAX_FROM_AGENT:
                import io
                return read_frame(io.BytesIO(h + self._r.read(n)))
            left = n
            while left:
                c = self._r.read(min(left, 1 << 20))
                if not c:
                    return None
                left -= len(c)
            with self._cv:
                self.received.append({"type": None, "skipped": n})
            self.send({"type": "error", "error": {
                "code": "INVALID_MESSAGE", "details": {"rule": "too_large"},
                "message": f"invalid message: payload of {n} bytes is above the largest accepted frame "
                           f"({MAX_FROM_AGENT} bytes) (too_large)"}})

    def _loop(self) -> None:
        while True:
            try:
                m = self._read()
            except Exception:
                return
            if m is None:
                return
            t = m.get("type")
            reply: Optional[Dict[str, Any]] = None
            with self._cv:
                self.received.append(m)
                if t in ("wal_entry", "wal_batch"):
                    entries = [m["data"]] if t == "wal_entry" else list(m["data"])
                    seqs = [e["sequence"] for e in entries]
                    if self.fail_next_wal:
                        code, self.fail_next_wal = self.fail_next_wal, None
                        reply = {"type": "error", "error": {"code": code, "message": "fake refusal",
                                 "details": {"first_sequence": seqs[0], "last_sequence": seqs[-1]}}}
                    else:
                        for e in entries:
                            self.wal[e["sequence"]] = e
                        if m.get("ack") and not self.hold_acks:
                            reply = {"type": "wal_ack", "sequence": max(self.wal)}
                elif t == "checkpoint":
                    data = m["data"]
                    if m.get("compressed"):
                        from .agent import _decompress
                        data = _decompress(data)
                    self.checkpoint, self.checkpoint_seq = data, max(self.wal, default=0)
                    reply = {"type": "checkpoint_ack", "checkpoint_id": str(uuid.uuid4()), "size": 0}
                elif t == "request_result":
                    self.results[m["request_id"]] = m
                self._cv.notify_all()
            if reply is not None:
                try:
                    self.send(reply)
                except OSError:
                    return
