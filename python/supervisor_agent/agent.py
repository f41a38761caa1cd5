"""The Agent: one connection to the supervisor over two pipes."""
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

import msgpack

from .errors import (
    Disconnected,
    InvalidMessage,
    NotDurable,
    NotUnderSupervisor,
    SupervisorError,
    from_error_message,
)
from .framing import DEFAULT_MAX_FRAME, encode_frame, read_frame
from .steps import (
    DEFAULT_WAL_ENTRY_LIMIT,
    OP_DONE,
    OP_STEP,
    RequestCancelled,
    StepTable,
    batch_too_large,
    check_result_encodable,
    entry_too_large,
    mismatch,
    step_params,
    too_large,
    user_view,
    with_table,
)

ACCEPTS = ["cancel_request"]  # sent in every heartbeat: this client turns cancel_request into req.cancelled

COMPRESS_OVER = 1 << 20
MAX_DECOMPRESSED = 100 << 20
# The largest frame the supervisor reads from an agent: a checkpoint, 100 MiB of
# data plus a 16 KiB envelope (SPEC §2; no flag changes it). A bigger frame is
# skipped unread and answered INVALID_MESSAGE without a type: no reply a client
# could tie to its checkpoint, so the next checkpoint_ack would be taken for it.
CHECKPOINT_FRAME_LIMIT = (100 << 20) + (16 << 10)


def checkpoint_too_large(size: int, compressed: bool) -> InvalidMessage:
    return InvalidMessage(
        f"INVALID_MESSAGE: checkpoint of {size} bytes{' (compressed)' if compressed else ''} is over the "
        f"supervisor's largest frame of {CHECKPOINT_FRAME_LIMIT} bytes (100 MiB of data): nothing was sent"
        + ("" if compressed else "; install zstandard to send it compressed (v2)") + ".",
        {"type": "checkpoint", "field": "data", "rule": "too_large", "size": size, "limit": CHECKPOINT_FRAME_LIMIT},
    )

try:  # optional: v2 compression
    import zstandard as _zstd
except ImportError:  # pragma: no cover
    _zstd = None


@dataclass
class Restore:
    checkpoint_id: str
    snapshot: Dict[Any, Any]
    wal_entries: List[Dict[str, Any]]
    last_sequence: int
    compressed: bool = False  # the snapshot arrived zstd-compressed (v2)


@dataclass
class Request:
    request_id: str
    message: str
    context: Dict[Any, Any]
    user_id: str
    raw: Dict[str, Any]
    _agent: "Agent" = field(repr=False)
    attempt: int = 1  # 1 on first delivery, higher when delivered again after a restart
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    _next_step: int = field(default=0, repr=False)
    _step_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the supervisor sent cancel_request for this request (DELETE /v1/requests/ID)."""
        return self.cancel_event.is_set()

    def step(self, name: str, fn: Callable[[], Any], *, timeout: Optional[float] = 30.0) -> Any:
        """Run fn once per request, durably: its result is logged (request_step, ack: true)
        before step returns; on a redelivery a completed step returns its logged result
        without calling fn. Raises StepMismatch, StepResultTooLarge, RequestCancelled,
        or the log's errors (WalFull, NotDurable, ...)."""
        with self._step_lock:
            index = self._next_step
            self._next_step += 1
        hit = self._agent._steps_get(self.request_id, index)
        if hit is not None:
            if hit[0] != name:
                raise mismatch(self.request_id, index, hit[0], name)
            return hit[1]
        if self.cancelled:
            self._agent._forget(self)  # cancelled is final: it is never delivered again
            raise RequestCancelled(f"request {self.request_id} was cancelled: step {name!r} not run",
                                   {"request_id": self.request_id, "index": index, "name": name})
        result = fn()
        pending = self._agent._log_step(self.request_id, index, name, result, self.cancel_event)
        if pending is None:  # cancelled while fn ran: the request is over, its steps gone
            self._agent._forget(self)
            raise RequestCancelled(f"request {self.request_id} was cancelled while step {name!r} ran: not logged",
                                   {"request_id": self.request_id, "index": index, "name": name})
        pending.wait(timeout)
        return result

    def reply(self, data: Dict[Any, Any]) -> None:
        self._agent._answer(self, {"type": "request_result", "request_id": self.request_id, "data": data})

    def fail(self, code: str, message: str) -> None:
        self._agent._answer(self, {"type": "request_result", "request_id": self.request_id,
                                   "error": {"code": code, "message": message}})


class _Waiter:
    __slots__ = ("event", "result", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class Pending:
    """A WAL entry (or batch) sent with ack: true; wait() returns once it is durable."""

    def __init__(self, agent: "Agent", first: int, last: int, gen: Optional[int] = None) -> None:
        self._agent, self.first_sequence, self.sequence, self._gen = agent, first, last, gen

    def wait(self, timeout: Optional[float] = 30.0) -> int:
        """Block until durable; raise WalFull, SequenceConflict, ... or NotDurable on timeout."""
        return self._agent._wait_durable(self.first_sequence, self.sequence, timeout, self._gen)


def _decompress(body: bytes) -> Any:
    if _zstd is None:
        raise SupervisorError("a compressed message arrived but zstandard is not installed")
    raw = _zstd.ZstdDecompressor().decompress(body, max_output_size=MAX_DECOMPRESSED)
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, unicode_errors="backslashreplace")


def _int(v: Any) -> Optional[int]:
    """v as an int, or None when it is not a whole number (a reply never kills the reader)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


class Agent:
    """A connection to the supervisor. Use Agent.connect() in a real agent."""

    def __init__(
        self,
        rfile: BinaryIO,
        wfile: BinaryIO,
        *,
        restore_pending: bool = False,
        role: str = "primary",
        version: int = 2,
        heartbeat_interval: float = 1.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_hot_reload: Optional[Callable[[Dict[str, Any]], None]] = None,
        on_evolution_result: Optional[Callable[[Dict[str, Any]], None]] = None,
        on_shutdown: Optional[Callable[[Dict[str, Any]], Optional[Dict[Any, Any]]]] = None,
        on_cancel: Optional[Callable[[Request], None]] = None,
        wal_entry_limit: int = DEFAULT_WAL_ENTRY_LIMIT,
    ) -> None:
        self._r, self._w = rfile, wfile
        self._steps = StepTable()  # guarded by _seq_lock: entries change it in wire order
        self._inflight: Dict[str, Request] = {}
        self._inflight_lock = threading.Lock()
        self.on_cancel = on_cancel
        self.wal_entry_limit = wal_entry_limit
        self.role = role
        self.version = 2 if (version >= 2 and _zstd is not None) else 1
        self._max_frame = max_frame
        self._wlock = threading.Lock()
        self._lock = threading.Lock()  # guards sequence numbering and waiters
        self._cond = threading.Condition(self._lock)
        self._durable = 0  # highest acked sequence
        self._wal_gen = 0  # wal_acks and WAL errors received so far
        self._wal_errors: List[tuple] = []  # (first, last, exc)
        self._cp_waiters: List[_Waiter] = []
        self._cp_lock = threading.Lock()
        self._seq = 0
        self._seq_lock = threading.Lock()  # numbering + sending, so sequences reach the wire in order
        self._closed = threading.Event()
        self._close_reason: Optional[BaseException] = None
        self.requests_q: "queue.Queue[Optional[Request]]" = queue.Queue()
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.on_hot_reload = on_hot_reload
        self.on_evolution_result = on_evolution_result
        self.on_shutdown = on_shutdown
        self.shutdown_requested = threading.Event()
        self.restore: Optional[Restore] = None
        self._restore_event = threading.Event()
        if restore_pending:
            m = read_frame(self._r, max_frame)
            if m is None:
                raise Disconnected("the supervisor closed the pipe before the restore")
            if m.get("type") != "restore":
                raise SupervisorError(f"expected a restore first, got {m.get('type')!r}")
            self._apply_restore(m)
        # Callbacks and agent.events run on a thread of their own, in the order the
        # messages came: a callback may log() or checkpoint() and wait for an ack that
        # only the reader reads.
        self._jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._callbacks = threading.Thread(target=self._callback_loop, name="supervisor-callbacks", daemon=True)
        self._callbacks.start()
        self._reader = threading.Thread(target=self._read_loop, name="supervisor-reader", daemon=True)
        self._reader.start()
        self._hb_interval = heartbeat_interval
        self._hb = threading.Thread(target=self._heartbeat_loop, name="supervisor-heartbeat", daemon=True)
        if heartbeat_interval > 0:
            self._hb.start()

    # ---------- construction ----------
    @classmethod
    def connect(cls, **kw: Any) -> "Agent":
        """Connect using the supervisor's environment contract; refuse without one."""
        env = os.environ
        hint = "Run it as: supervisor run -- python3 " + (sys.argv[0] if sys.argv and sys.argv[0] else "agent.py")
        if "SUPERVISOR_PROTOCOL_VERSION" not in env:
            raise NotUnderSupervisor(
                "This program is an agent meant to be started by the supervisor "
                "(SUPERVISOR_PROTOCOL_VERSION is not set). " + hint
            )
        transport = env.get("SUPERVISOR_TRANSPORT", "stdio")
        if transport == "fd":
            r, w = os.fdopen(3, "rb", buffering=0), os.fdopen(4, "wb", buffering=0)
        elif transport == "stdio":
            if sys.stdin.isatty():
                raise NotUnderSupervisor("stdin is a terminal: this agent must be started by the supervisor. " + hint)
            # unbuffered: a daemon reader blocked in a BufferedReader makes the
            # interpreter abort at exit ("could not acquire lock for <stdin>")
            r = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
            w = open(sys.stdout.fileno(), "wb", buffering=0, closefd=False)
            sys.stdout = sys.stderr  # a stray print() must not corrupt the frame stream
        else:
            raise NotUnderSupervisor(f"unknown SUPERVISOR_TRANSPORT {transport!r}")
        try:
            peer_version = int(env["SUPERVISOR_PROTOCOL_VERSION"])
        except ValueError:
            peer_version = 1
        kw.setdefault("version", peer_version)
        return cls(
            r, w, restore_pending=env.get("SUPERVISOR_RESTORE_PENDING") == "1",
            role=env.get("SUPERVISOR_ROLE", "primary"), **kw,
        )

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._w.close()
        except Exception:
            pass

    # ---------- sending ----------
    def _encode(self, msg: Dict[str, Any]) -> bytes:
        msg.setdefault("timestamp", int(time.time()))
        if self.version >= 2:
            msg.setdefault("version", self.version)
        return encode_frame(msg)

    def _send(self, msg: Dict[str, Any]) -> None:
        self._write(self._encode(msg))

    def _write(self, frame: bytes) -> None:
        with self._wlock:
            if self._close_reason is not None and isinstance(self._close_reason, Disconnected):
                raise Disconnected("the supervisor is gone")
            try:
                view = memoryview(frame)
                while view:  # a raw file may write less than asked
                    n = self._w.write(view)
                    view = view[n if n is not None else len(view):]
                self._w.flush()
            except (BrokenPipeError, ValueError, OSError) as e:
                raise Disconnected(f"cannot write to the supervisor: {e}") from None

    def send_raw(self, msg: Dict[str, Any]) -> None:
        """Send any message as is (timestamp added). For tests and extensions."""
        self._send(msg)

    def heartbeat(self) -> None:
        self._send({"type": "heartbeat", "accepts": ACCEPTS})

    def metrics(self, **values: float) -> None:
        self._send({"type": "metrics", "data": values})

    def report_error(self, code: str, message: str, context: Optional[Dict[Any, Any]] = None) -> None:
        err: Dict[str, Any] = {"code": code, "message": message}
        if context:
            err["context"] = context
        self._send({"type": "error", "error": err})

    def evolution_intent(self, target: str, new_code: str, reason: str = "",
                         expected_improvement: Optional[Dict[str, float]] = None) -> None:
        h: Dict[str, Any] = {"reason": reason, "target": target, "new_code": new_code}
        if expected_improvement:
            h["expected_improvement"] = expected_improvement
        self._send({"type": "evolution_intent", "hypothesis": h})

    # ---------- WAL ----------
    @property
    def last_sequence(self) -> int:
        return self._seq

    def log_nowait(self, operation: str, params: Dict[Any, Any], *, sequence: Optional[int] = None) -> Pending:
        """Send one entry with ack: true; return at once. Pending.wait() blocks until durable.
        An entry over wal_entry_limit raises InvalidMessage at once and is not sent."""
        gen = None
        with self._seq_lock:
            seq = self._seq + 1 if sequence is None else sequence
            frame = self._encode({"type": "wal_entry", "ack": True,
                                  "data": {"operation": operation, "params": params, "sequence": seq}})
            if len(frame) - 4 > self.wal_entry_limit:
                raise entry_too_large(operation, len(frame) - 4, self.wal_entry_limit)
            if seq <= self._seq:  # an explicit old sequence: only an answer after this send counts
                with self._cond:
                    gen = self._wal_gen
            self._seq = max(self._seq, seq)
            self._write(frame)
        return Pending(self, seq, seq, gen)

    def log(self, operation: str, params: Dict[Any, Any], *, timeout: Optional[float] = 30.0) -> int:
        """Log one entry and return its sequence once it is durable (raises WalFull, ...)."""
        return self.log_nowait(operation, params).wait(timeout)

    def log_batch_nowait(self, entries: List[tuple]) -> Pending:
        """entries: [(operation, params), ...] (1 to 100), logged as one unit."""
        if not 1 <= len(entries) <= 100:
            raise ValueError("a batch holds 1 to 100 entries")
        with self._seq_lock:
            first = self._seq + 1
            data = [{"operation": op, "params": p, "sequence": first + i} for i, (op, p) in enumerate(entries)]
            frame = self._encode({"type": "wal_batch", "ack": True, "data": data})
            err = batch_too_large(data, len(frame) - 4, self.wal_entry_limit)
            if err is not None:
                raise err
            self._seq = first + len(entries) - 1
            self._write(frame)
            last = self._seq
        return Pending(self, first, last)

    def log_batch(self, entries: List[tuple], *, timeout: Optional[float] = 30.0) -> int:
        return self.log_batch_nowait(entries).wait(timeout)

    def _wait_durable(self, first: int, last: int, timeout: Optional[float], gen: Optional[int] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                for (f, l, exc) in self._wal_errors:
                    if f <= last and first <= l:
                        raise exc
                if self._durable >= last and (gen is None or self._wal_gen > gen):
                    return last
                if self._close_reason is not None:
                    raise NotDurable(f"connection ended before entry {last} was durable: {self._close_reason}")
                rem = None if deadline is None else deadline - time.monotonic()
                if rem is not None and rem <= 0:
                    raise NotDurable(f"no wal_ack for entry {last} within {timeout}s")
                self._cond.wait(rem)

    # ---------- steps ----------
    def _steps_get(self, request_id: str, index: int) -> Optional[tuple]:
        with self._seq_lock:
            return self._steps.get(request_id, index)

    def _log_step(self, request_id: str, index: int, name: str, result: Any,
                  cancelled: Optional[threading.Event] = None) -> Optional[Pending]:
        """Log a step's result; None, logging nothing, once cancelled is set (looked at
        under the lock the cancel's request_done takes: a step is either logged before
        it or not at all)."""
        check_result_encodable(name, result)
        with self._seq_lock:
            if cancelled is not None and cancelled.is_set():
                return None
            seq = self._seq + 1
            frame = self._encode({"type": "wal_entry", "ack": True, "data": {
                "operation": OP_STEP, "params": step_params(request_id, index, name, result), "sequence": seq}})
            if len(frame) - 4 > self.wal_entry_limit:
                raise too_large(name, len(frame) - 4, self.wal_entry_limit)
            self._seq = seq
            self._steps.put(request_id, index, name, result)  # before the send: a checkpoint after it holds it
            self._write(frame)
        return Pending(self, seq, seq)

    def _drop_steps(self, request_id: str) -> None:
        with self._seq_lock:
            if self._steps.drop(request_id):
                self._seq += 1
                try:
                    self._send({"type": "wal_entry", "data": {
                        "operation": OP_DONE, "params": {"request_id": request_id}, "sequence": self._seq}})
                except SupervisorError:
                    pass

    def _forget(self, req: Request) -> None:
        """The request is over without an answer (cancelled): drop its steps (request_done)."""
        self._drop_steps(req.request_id)
        with self._inflight_lock:
            self._inflight.pop(req.request_id, None)

    def _answer(self, req: Request, msg: Dict[str, Any]) -> None:
        """The request_result, then request_done (when the request has steps): never the
        other way round, or a restart could redeliver a request whose steps are gone
        (docs/protocol.md)."""
        with self._inflight_lock:
            self._inflight.pop(req.request_id, None)
        with self._seq_lock:
            self._send(msg)
            if self._steps.drop(req.request_id):
                self._seq += 1
                self._send({"type": "wal_entry", "data": {
                    "operation": OP_DONE, "params": {"request_id": req.request_id}, "sequence": self._seq}})

    @property
    def step_table(self) -> Dict[str, List[Dict[str, Any]]]:
        """The completed steps of requests not yet answered, as checkpoints hold them."""
        with self._seq_lock:
            return self._steps.export()

    # ---------- checkpoints ----------
    def checkpoint(self, state: Dict[Any, Any], *, timeout: Optional[float] = 120.0) -> str:
        """Store the whole state; return the checkpoint id once acknowledged."""
        w = _Waiter()
        with self._cp_lock:  # waiters queue in the order their checkpoints reach the wire
            # under _seq_lock: the step table written is exactly the one of the entries sent before
            with self._seq_lock:
                data = with_table(state, self._steps)
                body = msgpack.packb(data, use_bin_type=True)
                msg: Dict[str, Any] = {"type": "checkpoint"}
                if self.version >= 2 and _zstd is not None and len(body) > COMPRESS_OVER:
                    msg.update(compressed=True, compression="zstd",
                               data=_zstd.ZstdCompressor(level=3, write_content_size=True).compress(body))
                else:
                    msg["data"] = data
                frame = self._encode(msg)
                if len(frame) - 4 > CHECKPOINT_FRAME_LIMIT:
                    raise checkpoint_too_large(len(frame) - 4, bool(msg.get("compressed")))
                with self._cond:
                    self._cp_waiters.append(w)
                try:
                    self._write(frame)
                except BaseException:
                    with self._cond:
                        self._cp_waiters.remove(w)
                    raise
        if not w.event.wait(timeout):
            raise NotDurable(f"no checkpoint_ack within {timeout}s")
        if w.error is not None:
            raise w.error
        return str(w.result)

    # ---------- receiving ----------
    def _apply_restore(self, m: Dict[str, Any]) -> None:
        snap = m.get("snapshot") or {}
        if m.get("compressed"):
            snap = _decompress(snap)
        entries = list(m.get("wal_entries") or [])
        last = m.get("last_sequence")
        if last is None:
            last = max([e.get("sequence", 0) for e in entries] + [0])
        with self._seq_lock:
            self._steps.load(snap, entries)
            self._seq = max(self._seq, int(last))
        snap, entries = user_view(snap, entries)
        self.restore = Restore(str(m.get("checkpoint_id", "")), snap, entries, int(last), bool(m.get("compressed")))
        with self._cond:
            self._durable = max(self._durable, int(last))
        self._restore_event.set()

    def _read_loop(self) -> None:
        reason: BaseException = Disconnected("the supervisor closed the pipe")
        try:
            while True:
                m = read_frame(self._r, self._max_frame)
                if m is None:
                    break
                self._dispatch(m)
        except SupervisorError as e:
            reason = e
        except Exception as e:  # pragma: no cover
            reason = SupervisorError(f"reader failed: {e!r}")
        with self._cond:
            self._close_reason = reason
            cps, self._cp_waiters = self._cp_waiters, []
            self._cond.notify_all()
        for w in cps:
            w.error = NotDurable(f"connection ended before the checkpoint was acknowledged: {reason}")
            w.event.set()
        self.shutdown_requested.set()
        self.requests_q.put(None)
        self._closed.set()
        self._jobs.put(None)  # the callbacks already queued run, then the thread ends

    def _callback_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _later(self, job: Callable[[], None]) -> None:
        """Run job on the callback thread, after everything queued before it."""
        self._jobs.put(job)

    def _event(self, m: Dict[str, Any]) -> None:
        """Put m on agent.events, in order with the callbacks."""
        self._jobs.put(lambda: self.events.put(m))

    def _dispatch(self, m: Dict[str, Any]) -> None:
        t = m.get("type")
        if t == "wal_ack":
            with self._cond:
                self._durable = max(self._durable, int(m.get("sequence", 0)))
                self._wal_gen += 1
                self._cond.notify_all()
        elif t == "checkpoint_ack":
            self._finish_checkpoint(m.get("checkpoint_id", ""), None)
        elif t == "error":
            err = m.get("error") or {}
            exc = from_error_message(err)
            d = exc.details
            if exc.code == "CHECKPOINT_FAILED" or (exc.code == "INVALID_MESSAGE" and d.get("type") == "checkpoint"):
                self._finish_checkpoint(None, exc)
            elif exc.code in ("WAL_FULL", "WAL_FAILED", "SEQUENCE_CONFLICT") or (
                exc.code == "INVALID_MESSAGE" and d.get("type") in ("wal_entry", "wal_batch")
            ):
                first = _int(d.get("first_sequence"))
                last = _int(d.get("last_sequence", first))
                if exc.code == "SEQUENCE_CONFLICT" and first is not None:
                    # last_sequence is the log's; the whole frame was refused
                    last = first + (_int(d.get("entries", 1)) or 1) - 1
                with self._cond:
                    if first is None or last is None:  # unknown range: fail every entry still in flight
                        first, last = self._durable + 1, max(self._seq, self._durable + 1)
                    self._wal_errors.append((first, last, exc))
                    self._wal_gen += 1
                    del self._wal_errors[:-256]
                    self._cond.notify_all()
            else:
                self._event(m)
        elif t == "process_request":
            d = m.get("data") or {}
            req = Request(str(m.get("request_id", "")), str(d.get("message", "")),
                          d.get("context") or {}, str(d.get("user_id", "")), m, self,
                          attempt=_int(m.get("attempt")) or 1)
            with self._inflight_lock:
                self._inflight[req.request_id] = req
            self.requests_q.put(req)
        elif t == "cancel_request":
            with self._inflight_lock:
                req = self._inflight.get(str(m.get("request_id", "")))
            if req is not None:  # an id we do not know (answered already) is ignored
                req.cancel_event.set()
                # Cancelled is final (never delivered again): its steps are forgotten now
                # (request_done), whether or not the handler answers or steps again.
                self._forget(req)
                if self.on_cancel is not None:
                    on_cancel = self.on_cancel
                    self._later(lambda: self._call(t, on_cancel, req))
            else:  # not in flight but maybe restored with steps: cancelled is final, forget them
                self._drop_steps(str(m.get("request_id", "")))
            self._event(m)
        elif t == "restore":
            self._apply_restore(m)
            self._event(m)
        elif t == "hot_reload":
            if self.on_hot_reload:
                cb = self.on_hot_reload
                self._later(lambda: self._call(t, cb, m))
            self._event(m)
        elif t == "evolution_result":
            if self.on_evolution_result:
                cb = self.on_evolution_result
                self._later(lambda: self._call(t, cb, m))
            self._event(m)
        elif t == "shutdown":
            self._event(m)
            self._later(lambda: self._shutdown(m))
        else:
            self._event(m)

    def _shutdown(self, m: Dict[str, Any]) -> None:
        """A shutdown message, on the callback thread: on_shutdown's state is sent as the
        final checkpoint (its ack read by the reader meanwhile), then requests() ends."""
        if m.get("create_checkpoint") and self.on_shutdown is not None:
            state = self._call("shutdown", self.on_shutdown, m, "no final checkpoint")
            if state is not None:
                self._final_checkpoint(state)
                return
        self.shutdown_requested.set()
        self.requests_q.put(None)

    def _call(self, t: Any, cb: Callable[[Any], Any], arg: Any, consequence: str = "") -> Any:
        """cb(arg) on the callback thread. What it raises is printed to stderr and the
        agent goes on, as in the asyncio client: a callback's bug must not stop the
        heartbeats and end requests() as if the supervisor had gone."""
        try:
            return cb(arg)
        except Exception:
            print(f"supervisor_agent: handling a {t} message failed"
                  f"{' (' + consequence + ')' if consequence else ''}:", file=sys.stderr)
            traceback.print_exc()
            return None

    def _final_checkpoint(self, state: Dict[Any, Any]) -> None:
        try:
            self.checkpoint(state)
        except SupervisorError as e:
            print(f"supervisor_agent: final checkpoint failed: {e}", file=sys.stderr)
        except Exception:  # a state msgpack cannot encode: requests() must still end
            print("supervisor_agent: final checkpoint failed:", file=sys.stderr)
            traceback.print_exc()
        finally:
            self.shutdown_requested.set()
            self.requests_q.put(None)

    def _finish_checkpoint(self, cid: Any, exc: Optional[BaseException]) -> None:
        with self._cond:
            w = self._cp_waiters.pop(0) if self._cp_waiters else None
        if w is not None:
            w.result, w.error = cid, exc
            w.event.set()

    def requests(self) -> Iterator[Request]:
        """Yield process_request messages until shutdown or disconnect."""
        while True:
            r = self.requests_q.get()
            if r is None:
                self.requests_q.put(None)
                return
            yield r

    def _heartbeat_loop(self) -> None:
        try:
            self.heartbeat()  # at once: the supervisor counts the agent up from its first heartbeat
        except SupervisorError:
            return
        while not self._closed.wait(self._hb_interval):
            try:
                self.heartbeat()
            except SupervisorError:
                return
