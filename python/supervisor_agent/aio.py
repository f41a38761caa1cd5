"""The asyncio client: the sync Agent's features on the event loop, no threads.

    from supervisor_agent.aio import Agent

    async def handle(req):
        answer = await req.step("llm", lambda: llm(req.message))   # never runs twice
        await req.reply({"answer": answer})

    async def main():
        async with Agent.connect() as agent:
            state = agent.restore.snapshot if agent.restore else {}
            await agent.serve(handle)          # a task per request; cancel_request cancels it

    asyncio.run(main())

The pipes are the loop's own transports (``loop.connect_read_pipe`` /
``connect_write_pipe``). Every frame is written whole, synchronously, into the
write transport before the first ``await`` of the call that sends it, and the
call then waits for the transport to drain below its high-water mark: a call
cancelled at any ``await`` never leaves half a frame behind, and a supervisor
that reads slowly slows the agent down instead of growing its memory.
"""
import asyncio
import collections
import inspect
import os
import sys
import time
import traceback
from typing import Any, AsyncIterator, Awaitable, Callable, Deque, Dict, List, Optional, Set, Tuple

import msgpack

from .agent import CHECKPOINT_FRAME_LIMIT, COMPRESS_OVER, Restore, _decompress, _int, _zstd, checkpoint_too_large
from .errors import (
    Disconnected,
    NotDurable,
    NotUnderSupervisor,
    ProtocolError,
    SupervisorError,
    from_error_message,
)
from .framing import DEFAULT_MAX_FRAME, encode_frame
from .steps import (
    DEFAULT_WAL_ENTRY_LIMIT,
    OP_DONE,
    OP_STEP,
    RequestCancelled,
    StepMismatch,
    StepResultTooLarge,
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

ACCEPTS = ["cancel_request"]
_FLUSH_AT = 64 << 10  # queued bytes that are handed to the transport without waiting for the loop's turn
_SWEEP = 0.25  # seconds between checks of log() timeouts
_DECODE = dict(raw=False, strict_map_key=False, unicode_errors="backslashreplace")

__all__ = ["Agent", "Request", "Restore", "RequestCancelled"]


class _ReadProto(asyncio.Protocol):
    """Cuts frames out of the bytes the read pipe delivers. The buffer only ever
    holds bytes that arrived: a declared length is checked against max_frame
    before anything waits for it, and nothing is allocated from it."""

    def __init__(self, agent: "Agent", max_frame: int) -> None:
        self._agent, self._max = agent, max_frame
        self._buf = bytearray()
        self._transport: Optional[asyncio.BaseTransport] = None
        self._failed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._failed:
            return
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        agent = self._agent
        try:
            while end - pos >= 4:
                n = int.from_bytes(buf[pos:pos + 4], "big")
                if n == 0:
                    raise ProtocolError("invalid frame: zero length")
                if n > self._max:
                    raise ProtocolError(f"invalid frame: length {n} exceeds the maximum of {self._max} bytes")
                if end - pos - 4 < n:
                    break
                body = bytes(buf[pos + 4:pos + 4 + n])
                pos += 4 + n
                try:
                    m = msgpack.unpackb(body, **_DECODE)
                except Exception as e:
                    raise ProtocolError(f"invalid frame payload: {e.__class__.__name__}: {e}") from None
                if not isinstance(m, dict):
                    raise ProtocolError(f"invalid frame payload: not a map but {type(m).__name__}")
                agent._dispatch(m)
        except ProtocolError as e:
            self._failed = True
            del buf[:]
            agent._lost(e)
            if self._transport is not None:
                self._transport.close()
            return
        del buf[:pos]

    def eof_received(self) -> Optional[bool]:
        if self._buf and not self._failed:
            self._failed = True
            self._agent._lost(ProtocolError(f"truncated frame: input ended with {len(self._buf)} bytes of a frame"))
        return None

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self._agent._lost(Disconnected(f"the supervisor closed the pipe{': ' + str(exc) if exc else ''}"))


class _WriteProto(asyncio.BaseProtocol):
    """Flow control of the write pipe: drain() waits while the transport is paused."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._paused = False
        self._waiters: Deque["asyncio.Future[None]"] = collections.deque()
        self.closed: Optional[BaseException] = None
        self._closed_fut: "asyncio.Future[None]" = loop.create_future()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done():
                f.set_result(None)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = Disconnected(f"cannot write to the supervisor: {exc or 'the pipe is closed'}")
        self._paused = False
        while self._waiters:
            f = self._waiters.popleft()
            if not f.done():
                f.set_exception(self.closed)
        if not self._closed_fut.done():
            self._closed_fut.set_result(None)

    async def drain(self) -> None:
        if self.closed is not None:
            raise self.closed
        if not self._paused:
            return
        f = self._loop.create_future()
        self._waiters.append(f)
        await f


class Request:
    """One process_request. ``req.task`` is its handler task once started
    (``agent.serve`` or ``req.start``): cancel_request cancels it."""

    def __init__(self, agent: "Agent", m: Dict[str, Any]) -> None:
        d = m.get("data") or {}
        self._agent = agent
        self.request_id = str(m.get("request_id", ""))
        self.message = str(d.get("message", ""))
        self.context: Dict[Any, Any] = d.get("context") or {}
        self.user_id = str(d.get("user_id", ""))
        self.raw = m
        self.attempt = _int(m.get("attempt")) or 1
        self.cancel_event = asyncio.Event()
        self.task: Optional["asyncio.Task[Any]"] = None
        self.answered = False
        self._next_step = 0

    def __repr__(self) -> str:
        return f"Request(request_id={self.request_id!r}, message={self.message!r}, attempt={self.attempt})"

    @property
    def cancelled(self) -> bool:
        """True once the supervisor sent cancel_request for this request."""
        return self.cancel_event.is_set()

    def start(self, coro: Awaitable[Any]) -> "asyncio.Task[Any]":
        """Run coro (e.g. ``handle(req)``) as this request's handler task: a
        cancel_request cancels it (CancelledError inside it). An exception
        escaping it fails the request (REQUEST_FAILED; STEP_MISMATCH,
        STEP_RESULT_TOO_LARGE) unless it was answered; a cancelled one is answered
        REQUEST_CANCELLED (kept by the supervisor beside the cancelled status)."""
        self.task = asyncio.get_running_loop().create_task(self._guard(coro))
        self._agent._tasks.add(self.task)
        self.task.add_done_callback(self._agent._tasks.discard)
        return self.task

    async def _guard(self, coro: Awaitable[Any]) -> Any:
        if self.cancelled:  # cancelled before it started: never run it
            if inspect.iscoroutine(coro):
                coro.close()
            self._answer_cancelled()
            return None
        try:
            return await coro
        except (asyncio.CancelledError, RequestCancelled):
            if self.cancelled:  # our cancellation: the request is over
                self._answer_cancelled()
                return None
            raise
        except Exception as e:
            print(f"supervisor_agent: request {self.request_id} handler failed:", file=sys.stderr)
            traceback.print_exc()
            if not self.answered:
                code = {StepMismatch: "STEP_MISMATCH", StepResultTooLarge: "STEP_RESULT_TOO_LARGE"}.get(
                    type(e), "REQUEST_FAILED")
                try:
                    await self.fail(code, f"{type(e).__name__}: {e}"[:1000])
                except SupervisorError:
                    pass
            return None

    def _answer_cancelled(self) -> None:
        """Say the handler stopped (REQUEST_CANCELLED, kept beside the cancelled status, as
        the Go client does); then request_done, so the request's steps are forgotten."""
        if self.answered:
            return
        try:
            self._agent._answer(self, {"type": "request_result", "request_id": self.request_id, "error": {
                "code": "REQUEST_CANCELLED", "message": "the request was cancelled; its handler stopped"}})
        except SupervisorError:
            self._agent._forget(self)

    async def step(self, name: str, fn: Callable[[], Any], *, timeout: Optional[float] = 30.0) -> Any:
        """Run fn (a coroutine function, or a plain one) once per request, durably.

        Its result is logged (request_step, ack: true) and step returns only once
        the supervisor has it on disk. When the request is delivered again after a
        crash, a completed step returns its logged result without calling fn.
        Raises StepMismatch (another name logged at this index), StepResultTooLarge
        (over the wal_entry limit: store big results elsewhere), RequestCancelled
        (cancelled before fn ran), or the log's errors."""
        index = self._next_step
        self._next_step += 1
        hit = self._agent._steps.get(self.request_id, index)
        if hit is not None:
            if hit[0] != name:
                raise mismatch(self.request_id, index, hit[0], name)
            return hit[1]
        if self.cancelled:
            raise RequestCancelled(f"request {self.request_id} was cancelled: step {name!r} not run",
                                   {"request_id": self.request_id, "index": index, "name": name})
        result = fn()
        if inspect.isawaitable(result):
            result = await result
        agent = self._agent
        fut = agent._log_step(self.request_id, index, name, result)
        if agent._wp._paused:  # type: ignore[union-attr]
            await agent._drain()
        await agent._wait(fut, timeout, f"{self.request_id} step {index} ({name})")
        return result

    async def reply(self, data: Dict[Any, Any]) -> None:
        """Send the request_result (then request_done when the request has steps)."""
        self._agent._answer(self, {"type": "request_result", "request_id": self.request_id, "data": data})
        await self._agent._drain()

    async def fail(self, code: str, message: str) -> None:
        self._agent._answer(self, {"type": "request_result", "request_id": self.request_id,
                                   "error": {"code": code, "message": message}})
        await self._agent._drain()


class _Opening:
    """What connect()/open() return: ``await`` it, or use it in ``async with``."""

    def __init__(self, factory: Callable[[], Awaitable["Agent"]]) -> None:
        self._factory = factory
        self._agent: Optional[Agent] = None

    def __await__(self) -> Any:
        return self._factory().__await__()

    async def __aenter__(self) -> "Agent":
        self._agent = await self._factory()
        return self._agent

    async def __aexit__(self, *exc: Any) -> None:
        if self._agent is not None:
            await self._agent.close()


Callback = Callable[[Dict[str, Any]], Any]


class Agent:
    """A connection to the supervisor on the running event loop.

    ``agent = await Agent.connect()`` or ``async with Agent.connect() as agent``."""

    def __init__(
        self,
        *,
        role: str = "primary",
        version: int = 2,
        heartbeat_interval: float = 1.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_hot_reload: Optional[Callback] = None,
        on_evolution_result: Optional[Callback] = None,
        on_shutdown: Optional[Callback] = None,
        on_cancel: Optional[Callable[[Request], Any]] = None,
        wal_entry_limit: int = DEFAULT_WAL_ENTRY_LIMIT,
    ) -> None:
        self.role = role
        self.version = 2 if (version >= 2 and _zstd is not None) else 1
        self._hb_interval = heartbeat_interval
        self._max_frame = max_frame
        self.on_hot_reload = on_hot_reload
        self.on_evolution_result = on_evolution_result
        self.on_shutdown = on_shutdown
        self.on_cancel = on_cancel
        self.wal_entry_limit = wal_entry_limit
        self.restore: Optional[Restore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._seq = 0
        self._durable = 0
        self._waiters: Deque[Tuple[int, int, "asyncio.Future[int]"]] = collections.deque()
        self._cp_waiters: Deque["asyncio.Future[str]"] = collections.deque()
        self._steps = StepTable()
        self._inflight: Dict[str, Request] = {}
        self._requests: "asyncio.Queue[Optional[Request]]" = asyncio.Queue()
        self.events: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()
        self.shutdown_requested = asyncio.Event()
        self._close_reason: Optional[BaseException] = None
        self._restore_fut: Optional["asyncio.Future[None]"] = None
        self._tasks: Set["asyncio.Task[Any]"] = set()
        self._hb_task: Optional["asyncio.Task[None]"] = None
        self._wt: Any = None
        self._wp: Optional[_WriteProto] = None
        self._rt: Any = None
        self._out: List[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._deadlines: Dict["asyncio.Future[int]", Tuple[float, float, Any]] = {}
        self._sweeper: Optional[asyncio.TimerHandle] = None

    # ---------- construction ----------
    @classmethod
    def open(cls, rfile: Any, wfile: Any, *, restore_pending: bool = False, **kw: Any) -> _Opening:
        """Connect over two pipe files (anything with fileno(): pipes, FIFOs, sockets)."""
        async def go() -> "Agent":
            a = cls(**kw)
            await a._start(rfile, wfile, restore_pending)
            return a
        return _Opening(go)

    @classmethod
    def connect(cls, **kw: Any) -> _Opening:
        """Connect by the supervisor's environment contract; raise NotUnderSupervisor without one."""
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
        kw.setdefault("role", env.get("SUPERVISOR_ROLE", "primary"))
        return cls.open(r, w, restore_pending=env.get("SUPERVISOR_RESTORE_PENDING") == "1", **kw)

    async def _start(self, rfile: Any, wfile: Any, restore_pending: bool) -> None:
        loop = self._loop = asyncio.get_running_loop()
        if restore_pending:
            self._restore_fut = loop.create_future()
        self._wt, self._wp = await loop.connect_write_pipe(lambda: _WriteProto(loop), wfile)
        self._rt, _ = await loop.connect_read_pipe(lambda: _ReadProto(self, self._max_frame), rfile)
        if self._restore_fut is not None:
            try:
                await self._restore_fut
            except BaseException:
                await self.close()
                raise
        if self._hb_interval > 0:
            self._hb_task = loop.create_task(self._heartbeat_loop())

    async def __aenter__(self) -> "Agent":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop heartbeats, flush what was written and close both pipes."""
        if self._hb_task is not None:
            self._hb_task.cancel()
        self._flush()
        self._lost(Disconnected("the agent closed the connection"))
        if self._wt is not None and not self._wt.is_closing():
            self._wt.close()  # buffered frames are written out first
        if self._wp is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._wp._closed_fut), 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
        if self._rt is not None and not self._rt.is_closing():
            self._rt.close()

    # ---------- sending ----------
    def _encode(self, msg: Dict[str, Any]) -> bytes:
        msg.setdefault("timestamp", int(time.time()))
        if self.version >= 2:
            msg.setdefault("version", self.version)
        return encode_frame(msg)

    def _write(self, frame: bytes) -> None:
        """Queue the whole frame now (no await: never half a frame). While entries are
        in flight, frames queued in one turn of the loop go to the transport in one
        write at its end (call_soon); otherwise, or once 64 KiB are queued, at once."""
        wp = self._wp
        if wp is None:
            raise Disconnected("not connected")
        if wp.closed is not None:
            raise wp.closed
        if isinstance(self._close_reason, Disconnected):
            raise Disconnected(f"the supervisor is gone: {self._close_reason}")
        self._out.append(frame)
        self._out_bytes += len(frame)
        if self._out_bytes >= _FLUSH_AT or not self._waiters:
            # nothing else in flight: no batch to wait for, write now (one loop turn less of latency)
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._out_bytes = 0
        if self._wp is not None and self._wp.closed is None and not self._wt.is_closing():
            self._wt.write(data)

    async def _drain(self) -> None:
        """Hand the queued frames to the transport; wait while it is above its high-water mark."""
        assert self._wp is not None
        self._flush()
        await self._wp.drain()

    async def _send(self, msg: Dict[str, Any]) -> None:
        self._write(self._encode(msg))
        await self._drain()

    async def send_raw(self, msg: Dict[str, Any]) -> None:
        """Send any message as is (timestamp added). For tests and extensions."""
        await self._send(msg)

    async def heartbeat(self) -> None:
        await self._send({"type": "heartbeat", "accepts": ACCEPTS})

    async def metrics(self, **values: float) -> None:
        await self._send({"type": "metrics", "data": values})

    async def report_error(self, code: str, message: str, context: Optional[Dict[Any, Any]] = None) -> None:
        err: Dict[str, Any] = {"code": code, "message": message}
        if context:
            err["context"] = context
        await self._send({"type": "error", "error": err})

    async def evolution_intent(self, target: str, new_code: str, reason: str = "",
                               expected_improvement: Optional[Dict[str, float]] = None) -> None:
        h: Dict[str, Any] = {"reason": reason, "target": target, "new_code": new_code}
        if expected_improvement:
            h["expected_improvement"] = expected_improvement
        await self._send({"type": "evolution_intent", "hypothesis": h})

    async def _heartbeat_loop(self) -> None:
        try:
            while True:
                await self.heartbeat()
                await asyncio.sleep(self._hb_interval)
        except (SupervisorError, asyncio.CancelledError):
            return

    # ---------- WAL ----------
    @property
    def last_sequence(self) -> int:
        return self._seq

    def log_nowait(self, operation: str, params: Dict[Any, Any]) -> "asyncio.Future[int]":
        """Send one entry with ack: true now; the future gives its sequence once durable.
        (No drain: for a burst of entries; ``await agent.log(...)`` is the usual call.)
        An entry over wal_entry_limit raises InvalidMessage at once and is not sent."""
        seq = self._seq + 1
        frame = self._encode({"type": "wal_entry", "ack": True,
                              "data": {"operation": operation, "params": params, "sequence": seq}})
        if len(frame) - 4 > self.wal_entry_limit:
            raise entry_too_large(operation, len(frame) - 4, self.wal_entry_limit)
        self._write(frame)
        self._seq = seq
        return self._waiter(seq, seq)

    async def log(self, operation: str, params: Dict[Any, Any], *, timeout: Optional[float] = 30.0) -> int:
        """Log one entry; return its sequence once the supervisor has it on disk (wal_ack).
        Raises WalFull, WalFailed, SequenceConflict, InvalidMessage, NotDurable (timeout, disconnect).
        Cancelling the call leaves the entry logged (its frame was written whole)."""
        fut = self.log_nowait(operation, params)
        seq = self._seq
        if self._wp._paused:  # type: ignore[union-attr]  # back-pressure: wait for the pipe
            await self._drain()
        return await self._wait(fut, timeout, seq)

    async def log_batch(self, entries: List[tuple], *, timeout: Optional[float] = 30.0) -> int:
        """entries: [(operation, params), ...] (1 to 100) logged as one unit; returns the last sequence."""
        if not 1 <= len(entries) <= 100:
            raise ValueError("a batch holds 1 to 100 entries")
        first = self._seq + 1
        data = [{"operation": op, "params": p, "sequence": first + i} for i, (op, p) in enumerate(entries)]
        frame = self._encode({"type": "wal_batch", "ack": True, "data": data})
        err = batch_too_large(data, len(frame) - 4, self.wal_entry_limit)
        if err is not None:
            raise err
        self._write(frame)
        last = self._seq = first + len(entries) - 1
        fut = self._waiter(first, last)
        await self._drain()
        return await self._wait(fut, timeout, last)

    def _waiter(self, first: int, last: int) -> "asyncio.Future[int]":
        assert self._loop is not None
        fut: "asyncio.Future[int]" = self._loop.create_future()
        if self._close_reason is not None:
            fut.set_exception(NotDurable(f"connection ended before entry {last} was durable: {self._close_reason}"))
        else:
            self._waiters.append((first, last, fut))
        return fut

    async def _wait(self, fut: "asyncio.Future[int]", timeout: Optional[float], what: Any) -> int:
        if timeout is None or fut.done():
            return await fut
        # one sweeper for every waiter instead of a timer per call (a timer costs more than the log)
        self._deadlines[fut] = (time.monotonic() + timeout, timeout, what)
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(_SWEEP, self._sweep)  # type: ignore[union-attr]
        try:
            return await fut
        finally:
            self._deadlines.pop(fut, None)

    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        for fut, (deadline, timeout, what) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[fut]
                _expire(fut, timeout, what)
        if self._deadlines and self._close_reason is None:
            self._sweeper = self._loop.call_later(_SWEEP, self._sweep)  # type: ignore[union-attr]

    def _on_ack(self, s: int) -> None:
        if s > self._durable:
            self._durable = s
        w = self._waiters
        while w and w[0][1] <= s:
            _, last, fut = w.popleft()
            if not fut.done():
                fut.set_result(last)

    def _on_wal_error(self, first: Optional[int], last: Optional[int], exc: SupervisorError) -> None:
        if first is None or last is None:  # unknown range: fail every entry still in flight
            first, last = self._durable + 1, max(self._seq, self._durable + 1)
        keep: Deque[Tuple[int, int, "asyncio.Future[int]"]] = collections.deque()
        for (f, l, fut) in self._waiters:
            if f <= last and first <= l:
                if not fut.done():
                    fut.set_exception(exc)
            else:
                keep.append((f, l, fut))
        self._waiters = keep

    # ---------- steps ----------
    def _log_step(self, request_id: str, index: int, name: str, result: Any) -> "asyncio.Future[int]":
        check_result_encodable(name, result)
        seq = self._seq + 1
        frame = self._encode({"type": "wal_entry", "ack": True, "data": {
            "operation": OP_STEP, "params": step_params(request_id, index, name, result), "sequence": seq}})
        if len(frame) - 4 > self.wal_entry_limit:
            raise too_large(name, len(frame) - 4, self.wal_entry_limit)
        self._write(frame)
        self._seq = seq
        self._steps.put(request_id, index, name, result)
        return self._waiter(seq, seq)

    def _forget(self, req: Request) -> None:
        """The request is over without an answer (cancelled): drop its steps."""
        self._inflight.pop(req.request_id, None)
        self._drop_steps(req.request_id)

    def _drop_steps(self, request_id: str) -> None:
        if request_id in self._steps:
            try:
                self._write(self._encode({"type": "wal_entry", "data": {
                    "operation": OP_DONE, "params": {"request_id": request_id}, "sequence": self._seq + 1}}))
            except SupervisorError:
                return
            self._seq += 1
            self._steps.drop(request_id)

    def _answer(self, req: Request, msg: Dict[str, Any]) -> None:
        # The answer first, then request_done (docs/protocol.md: never the other
        # way round, or a restart could redeliver a request whose steps are gone).
        self._write(self._encode(msg))
        req.answered = True
        self._inflight.pop(req.request_id, None)
        if req.request_id in self._steps:
            self._write(self._encode({"type": "wal_entry", "data": {
                "operation": OP_DONE, "params": {"request_id": req.request_id}, "sequence": self._seq + 1}}))
            self._seq += 1
            self._steps.drop(req.request_id)

    @property
    def step_table(self) -> Dict[str, List[Dict[str, Any]]]:
        """The completed steps of requests not yet answered, as checkpoints hold them."""
        return self._steps.export()

    # ---------- checkpoints ----------
    async def checkpoint(self, state: Dict[Any, Any], *, timeout: Optional[float] = 120.0) -> str:
        """Store the whole state; return the checkpoint id once acknowledged. The step
        table of unanswered requests is added under __supervisor_steps__ (state is not changed)."""
        assert self._loop is not None
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
        fut: "asyncio.Future[str]" = self._loop.create_future()
        self._write(frame)
        self._cp_waiters.append(fut)
        await self._drain()
        if timeout is None:
            return await fut
        h = self._loop.call_later(timeout, _expire_cp, fut, timeout)
        try:
            return await fut
        finally:
            h.cancel()

    def _finish_checkpoint(self, cid: Any, exc: Optional[BaseException]) -> None:
        if self._cp_waiters:
            fut = self._cp_waiters.popleft()
            if not fut.done():
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(str(cid))

    # ---------- requests ----------
    async def requests(self) -> AsyncIterator[Request]:
        """Yield process_request messages until shutdown or disconnect. The loop body
        runs in your task: start a handler task per request with ``req.start(handle(req))``
        so that cancel_request can cancel it (or use ``serve``)."""
        while True:
            r = await self._requests.get()
            if r is None:
                self._requests.put_nowait(None)
                return
            yield r

    async def serve(self, handler: Callable[[Request], Awaitable[Any]], *, concurrency: int = 0) -> None:
        """Run handler(req) in a task of its own per request until shutdown or disconnect,
        at most ``concurrency`` at once (0: no limit); then wait for the running ones."""
        sem = asyncio.Semaphore(concurrency) if concurrency > 0 else None
        running: Set["asyncio.Task[Any]"] = set()
        async for req in self.requests():
            if sem is not None:
                await sem.acquire()
            t = req.start(handler(req))
            running.add(t)
            t.add_done_callback(running.discard)
            if sem is not None:
                t.add_done_callback(lambda _t: sem.release())  # type: ignore[union-attr]
        if isinstance(self._close_reason, Disconnected):
            for t in running:  # nobody to answer to any more
                t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    # ---------- receiving ----------
    def _apply_restore(self, m: Dict[str, Any]) -> None:
        snap = m.get("snapshot") or {}
        if m.get("compressed"):
            snap = _decompress(snap)
        entries = list(m.get("wal_entries") or [])
        last = m.get("last_sequence")
        if last is None:
            last = max([e.get("sequence", 0) for e in entries] + [0])
        self._steps.load(snap, entries)
        self._seq = max(self._seq, int(last))
        self._durable = max(self._durable, int(last))
        snap, entries = user_view(snap, entries)
        self.restore = Restore(str(m.get("checkpoint_id", "")), snap, entries, int(last), bool(m.get("compressed")))

    def _dispatch(self, m: Dict[str, Any]) -> None:
        t = m.get("type")
        rf = self._restore_fut
        if rf is not None and not rf.done():
            if t != "restore":
                rf.set_exception(SupervisorError(f"expected a restore first, got {t!r}"))
                return
            try:
                self._apply_restore(m)
            except SupervisorError as e:
                rf.set_exception(e)
                return
            rf.set_result(None)
            return
        try:
            self._dispatch_one(t, m)
        except SupervisorError as e:
            print(f"supervisor_agent: {t} message not handled: {e}", file=sys.stderr)
        except Exception:  # a callback's bug must not kill the reader
            print(f"supervisor_agent: handling a {t} message failed:", file=sys.stderr)
            traceback.print_exc()

    def _dispatch_one(self, t: Any, m: Dict[str, Any]) -> None:
        if t == "wal_ack":
            s = _int(m.get("sequence"))
            if s is not None:
                self._on_ack(s)
        elif t == "process_request":
            req = Request(self, m)
            self._inflight[req.request_id] = req
            self._requests.put_nowait(req)
        elif t == "cancel_request":
            req = self._inflight.get(str(m.get("request_id", "")))
            if req is not None and not req.cancelled:  # an id we do not know is ignored
                req.cancel_event.set()
                if req.task is not None and not req.task.done():
                    req.task.cancel()
                if self.on_cancel is not None:
                    self._call(self.on_cancel, req)
            elif req is None:  # not in flight but maybe restored with steps: cancelled is final
                self._drop_steps(str(m.get("request_id", "")))
            self.events.put_nowait(m)
        elif t == "checkpoint_ack":
            self._finish_checkpoint(m.get("checkpoint_id", ""), None)
        elif t == "error":
            exc = from_error_message(m.get("error") or {})
            d = exc.details
            if exc.code == "CHECKPOINT_FAILED" or (exc.code == "INVALID_MESSAGE" and d.get("type") == "checkpoint"):
                self._finish_checkpoint(None, exc)
            elif exc.code in ("WAL_FULL", "WAL_FAILED", "SEQUENCE_CONFLICT") or (
                exc.code == "INVALID_MESSAGE" and d.get("type") in ("wal_entry", "wal_batch")
            ):
                first = _int(d.get("first_sequence"))
                last = _int(d.get("last_sequence", first))
                if exc.code == "SEQUENCE_CONFLICT" and first is not None:
                    last = first + (_int(d.get("entries", 1)) or 1) - 1
                self._on_wal_error(first, last, exc)
            else:
                self.events.put_nowait(m)
        elif t == "restore":
            self._apply_restore(m)
            self.events.put_nowait(m)
        elif t == "hot_reload":
            self.events.put_nowait(m)
            if self.on_hot_reload:
                self._call(self.on_hot_reload, m)
        elif t == "evolution_result":
            self.events.put_nowait(m)
            if self.on_evolution_result:
                self._call(self.on_evolution_result, m)
        elif t == "shutdown":
            self.events.put_nowait(m)
            if m.get("create_checkpoint") and self.on_shutdown is not None:
                self._spawn(self._final_checkpoint(m))
                return
            self._end_requests()
        else:
            self.events.put_nowait(m)

    def _call(self, cb: Callable[..., Any], arg: Any) -> None:
        r = cb(arg)
        if inspect.isawaitable(r):
            self._spawn(r)

    def _spawn(self, aw: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await aw
            except Exception:
                traceback.print_exc()
        assert self._loop is not None
        t = self._loop.create_task(run())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _final_checkpoint(self, m: Dict[str, Any]) -> None:
        try:
            state = self.on_shutdown(m)  # type: ignore[misc]
            if inspect.isawaitable(state):
                state = await state
            if state is not None:
                await self.checkpoint(state)
        except SupervisorError as e:
            print(f"supervisor_agent: final checkpoint failed: {e}", file=sys.stderr)
        finally:
            self._end_requests()

    def _end_requests(self) -> None:
        self.shutdown_requested.set()
        self._requests.put_nowait(None)

    def _lost(self, reason: BaseException) -> None:
        """The connection is over: fail every waiter, end requests()."""
        if self._close_reason is not None:
            return
        self._close_reason = reason
        rf = self._restore_fut
        if rf is not None and not rf.done():
            rf.set_exception(Disconnected(f"the supervisor closed the pipe before the restore: {reason}")
                             if isinstance(reason, Disconnected) else reason)
        waiters, self._waiters = self._waiters, collections.deque()
        for (_, last, fut) in waiters:
            if not fut.done():
                fut.set_exception(NotDurable(f"connection ended before entry {last} was durable: {reason}"))
        cps, self._cp_waiters = self._cp_waiters, collections.deque()
        for fut in cps:
            if not fut.done():
                fut.set_exception(NotDurable(f"connection ended before the checkpoint was acknowledged: {reason}"))
        self._end_requests()


def _expire(fut: "asyncio.Future[int]", timeout: float, what: Any) -> None:
    if not fut.done():
        fut.set_exception(NotDurable(f"no wal_ack for entry {what} within {timeout}s"))


def _expire_cp(fut: "asyncio.Future[str]", timeout: float) -> None:
    if not fut.done():
        fut.set_exception(NotDurable(f"no checkpoint_ack within {timeout}s"))
