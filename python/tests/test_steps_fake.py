"""Steps, attempt and cancellation against the in-memory FakeSupervisor (sync and asyncio clients)."""
import asyncio
import threading

import pytest

from supervisor_agent import RequestCancelled, StepMismatch, StepResultTooLarge
from supervisor_agent.steps import STEPS_KEY
from supervisor_agent.testing import FakeSupervisor

RID = "0b9f0000-0000-4000-8000-000000000001"


def _restore_with_steps():
    # a checkpoint that holds step 0 of RID, and a WAL tail with its step 1 and another request done
    return {"checkpoint_id": "c1", "last_sequence": 12,
            "snapshot": {"notes": ["a"], STEPS_KEY: {RID: [{"index": 0, "name": "plan", "result": {"p": 1}}],
                                                     "gone": [{"index": 0, "name": "x", "result": 1}]}},
            "wal_entries": [
                {"operation": "request_step", "params": {"request_id": RID, "index": 1, "name": "llm", "result": "hi"},
                 "sequence": 11},
                {"operation": "request_done", "params": {"request_id": "gone"}, "sequence": 12}]}


def test_sync_steps_replayed_from_restore_and_table_in_checkpoint():
    with FakeSupervisor(restore=_restore_with_steps()) as sup:
        agent = sup.agent()
        # the agent's code sees neither the table nor the step entries
        assert agent.restore.snapshot == {"notes": ["a"]}
        assert agent.restore.wal_entries == []
        assert agent.step_table == {RID: [{"index": 0, "name": "plan", "result": {"p": 1}},
                                          {"index": 1, "name": "llm", "result": "hi"}]}
        sup.request("q", request_id=RID, attempt=2)
        req = next(agent.requests())
        assert req.attempt == 2
        calls = []
        assert req.step("plan", lambda: calls.append("plan")) == {"p": 1}
        assert req.step("llm", lambda: calls.append("llm")) == "hi"
        assert req.step("tool", lambda: calls.append("tool") or [1, 2]) == [1, 2]
        assert calls == ["tool"]  # only the step not logged before ran
        logged = sup.wal[13]
        assert logged["operation"] == "request_step"
        assert logged["params"] == {"request_id": RID, "index": 2, "name": "tool", "result": [1, 2]}
        agent.checkpoint({"notes": ["a"]})
        assert sup.checkpoint[STEPS_KEY][RID][2] == {"index": 2, "name": "tool", "result": [1, 2]}
        req.reply({"ok": True})
        res = sup.result(RID)
        assert res["data"] == {"ok": True}
        # request_done was logged after the answer (never before: docs/protocol.md),
        # and the table is empty again
        sup.wait_for(lambda s: any(m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"
                                   for m in s.received))
        done = [m for m in sup.received if m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"]
        assert done and sup.received.index(done[0]) > sup.received.index(res)
        assert agent.step_table == {}
        agent.checkpoint({"notes": ["a"]})
        assert sup.checkpoint == {"notes": ["a"]}


def test_sync_step_waits_for_ack_mismatch_and_too_large():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.request("q", request_id=RID)
        req = next(agent.requests())
        sup.hold_acks = True
        got = []
        t = threading.Thread(target=lambda: got.append(req.step("a", lambda: 7)))
        t.start()
        sup.wait_for(lambda s: 1 in s.wal)
        assert got == []  # logged, not acknowledged: step has not returned
        sup.release_acks()
        t.join(5)
        assert got == [7]
        with pytest.raises(StepResultTooLarge, match="10240 bytes.*Store big results elsewhere"):
            req.step("big", lambda: "x" * 20000)
        assert sorted(sup.wal) == [1]  # nothing logged for it
    with FakeSupervisor(restore=_restore_with_steps()) as sup:
        agent = sup.agent()
        sup.request("q", request_id=RID, attempt=2)
        req = next(agent.requests())
        with pytest.raises(StepMismatch, match="'plan'.*'other'"):
            req.step("other", lambda: 1)


def test_sync_heartbeat_opts_in_and_cancel_sets_flag():
    with FakeSupervisor() as sup:
        agent = sup.agent(heartbeat_interval=0.01)
        sup.wait_for(lambda s: any(m["type"] == "heartbeat" for m in s.received))
        hb = next(m for m in sup.received if m["type"] == "heartbeat")
        assert hb["accepts"] == ["cancel_request"]
        sup.request("q", request_id=RID)
        req = next(agent.requests())
        assert req.step("first", lambda: 1) == 1
        sup.cancel(RID)
        assert req.cancel_event.wait(5) and req.cancelled
        ran = []
        with pytest.raises(RequestCancelled):
            req.step("second", lambda: ran.append(1))
        assert ran == []
        # cancelled is final: its steps are forgotten (request_done), not kept in checkpoints
        assert agent.step_table == {}
        sup.wait_for(lambda s: any(m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"
                                   for m in s.received))


def test_sync_cancelled_handler_that_returns_leaves_no_steps():
    # The handler sees req.cancelled and returns without a step or an answer: the
    # request is over (never delivered again), so its steps must not stay in every
    # checkpoint. A step whose fn ran while the cancel came is not logged either.
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.request("q", request_id=RID)
        req = next(agent.requests())
        assert req.step("first", lambda: 1) == 1
        sup.cancel(RID)
        assert req.cancel_event.wait(5)
        sup.wait_for(lambda s: any(m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"
                                   for m in s.received))
        assert agent.step_table == {}
        agent.checkpoint({"k": 1})
        assert sup.checkpoint == {"k": 1}

    with FakeSupervisor() as sup:
        agent = sup.agent()
        rid2 = RID[:-1] + "2"
        sup.request("q", request_id=rid2)
        req = next(agent.requests())

        def slow():
            sup.cancel(rid2)
            assert req.cancel_event.wait(5)
            return "paid for, but the request is gone"
        with pytest.raises(RequestCancelled):
            req.step("llm", slow)
        assert agent.step_table == {}
        assert not any(m["type"] == "wal_entry" and m["data"]["operation"] == "request_step"
                       and m["data"]["params"].get("request_id") == rid2 for m in sup.received)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_aio_log_checkpoint_requests_and_restore():
    async def main():
        with FakeSupervisor(restore=_restore_with_steps()) as sup:
            async with sup.async_agent(on_shutdown=lambda m: {"final": True}) as agent:
                assert agent.restore.snapshot == {"notes": ["a"]} and agent.restore.last_sequence == 12
                assert await agent.log("memory_add", {"c": 1}) == 13
                futs = [agent.log("memory_add", {"i": i}) for i in range(64)]
                assert await asyncio.gather(*futs) == list(range(14, 78))
                assert await agent.log_batch([("memory_add", {"b": 1}), ("memory_add", {"b": 2})]) == 79
                cid = await agent.checkpoint({"s": 1})
                assert cid and sup.checkpoint[STEPS_KEY][RID][1]["name"] == "llm"
                sup.fail_next_wal = "WAL_FULL"
                from supervisor_agent import WalFull
                with pytest.raises(WalFull):
                    await agent.log("memory_add", {"n": 1})
                assert await agent.log("memory_add", {"n": 2}) == 81
                sup.request("ping", context={"k": 1}, user_id="u")
                sup.request("boom")
                it = agent.requests().__aiter__()
                r1 = await it.__anext__()
                assert (r1.message, r1.context, r1.user_id, r1.attempt) == ("ping", {"k": 1}, "u", 1)
                await r1.reply({"pong": 1})
                r2 = await it.__anext__()
                await r2.fail("TOOL_FAILED", "no")
                await asyncio.get_running_loop().run_in_executor(None, sup.result, r2.request_id)
                assert sup.results[r1.request_id]["data"] == {"pong": 1}
                assert sup.results[r2.request_id]["error"] == {"code": "TOOL_FAILED", "message": "no"}
                sup.shutdown()
                async for _ in it:
                    pass  # ends after the final checkpoint
                assert sup.checkpoint == {"final": True, STEPS_KEY: agent.step_table}
                hbs = [m for m in sup.received if m["type"] == "heartbeat"]
                assert hbs and hbs[0]["accepts"] == ["cancel_request"]
    run(main())


def test_aio_steps_replay_cancel_and_errors():
    async def main():
        with FakeSupervisor(restore=_restore_with_steps()) as sup:
            async with sup.async_agent() as agent:
                calls = []
                started = asyncio.Event()

                async def handle(req):
                    a = await req.step("plan", lambda: calls.append("plan"))
                    b = await req.step("llm", lambda: calls.append("llm"))
                    async def slow():
                        calls.append("slow")
                        started.set()
                        await asyncio.sleep(30)
                    if req.message == "cancel me":
                        await req.step("slow", slow)
                        calls.append("after-slow")
                    c = await req.step("tool", lambda: asyncio.sleep(0, result=[a, b]))
                    await req.reply({"c": c})

                serving = asyncio.ensure_future(agent.serve(handle))
                sup.request("q", request_id=RID, attempt=2)
                res = await asyncio.get_running_loop().run_in_executor(None, sup.result, RID)
                assert res["data"] == {"c": [{"p": 1}, "hi"]}
                assert calls == []  # plan and llm were logged before: not run again; tool is an awaitable
                assert agent.step_table == {}
                # cancellation: the handler task gets CancelledError in the middle of a step
                sup.request("cancel me", request_id="r2")
                await started.wait()
                sup.cancel("r2")
                for _ in range(200):
                    if "r2" not in agent._inflight:
                        break
                    await asyncio.sleep(0.01)
                assert calls == ["plan", "llm", "slow"]
                # the handler stopped: REQUEST_CANCELLED (then request_done: its steps are dropped)
                res = await asyncio.get_running_loop().run_in_executor(None, sup.result, "r2")
                assert res["error"]["code"] == "REQUEST_CANCELLED"
                assert agent.step_table == {}
                await asyncio.get_running_loop().run_in_executor(None, sup.wait_for, lambda s: any(
                    m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"
                    and m["data"]["params"] == {"request_id": "r2"} for m in s.received))
                ops = [m["data"]["params"] for m in sup.received
                       if m["type"] == "wal_entry" and m["data"]["operation"] == "request_done"]
                assert {"request_id": "r2"} in ops
                # a step's result too large fails the request (STEP_RESULT_TOO_LARGE)
                async def big(req):
                    await req.step("big", lambda: b"x" * 11000)
                serving.cancel()
                sup.request("big", request_id="r3")
                async for req in agent.requests():
                    with pytest.raises(StepResultTooLarge):
                        await req.step("big", lambda: b"x" * 11000)
                    req.start(big(req))
                    break
                res = await asyncio.get_running_loop().run_in_executor(None, sup.result, "r3")
                assert res["error"]["code"] == "STEP_RESULT_TOO_LARGE" and "10240" in res["error"]["message"]
    run(main())


def test_aio_cancelled_log_leaves_whole_frames_and_back_pressure():
    """Cancel log() calls at every await while the fake holds acks and reads slowly:
    every frame reaches the fake whole, and later logs are acknowledged."""
    async def main():
        with FakeSupervisor() as sup:
            async with sup.async_agent(heartbeat_interval=0) as agent:
                sup.hold_acks = True
                pad = "y" * 8000
                tasks = [asyncio.ensure_future(agent.log("memory_add", {"i": i, "pad": pad})) for i in range(200)]
                await asyncio.sleep(0)
                for t in tasks[::2]:
                    t.cancel()
                await asyncio.sleep(0.2)
                sup.release_acks()
                done = await asyncio.gather(*tasks, return_exceptions=True)
                assert all(isinstance(d, asyncio.CancelledError) for d in done[::2])
                assert done[1::2] == list(range(2, 201, 2))
                assert await agent.log("memory_add", {"after": 1}) == 201
                await asyncio.get_running_loop().run_in_executor(None, sup.wait_for, lambda s: 201 in s.wal)
                assert sorted(sup.wal) == list(range(1, 202))  # every frame whole, in order
    run(main())


def test_aio_callbacks_events_and_cancel_before_start():
    async def main():
        with FakeSupervisor() as sup:
            seen = []

            async def on_evo(m):
                seen.append(("evo", m["decision"]))
            async with sup.async_agent(on_hot_reload=lambda m: seen.append(("hot", m["module"])),
                                       on_evolution_result=on_evo,
                                       on_cancel=lambda r: seen.append(("cancel", r.request_id))) as agent:
                sup.send({"type": "hot_reload", "code": "x=1", "module": "m", "backup_checkpoint_id": ""})
                sup.send({"type": "evolution_result", "success": True, "decision": "promoted", "metrics": {}, "reason": "r"})
                kinds = [(await agent.events.get())["type"] for _ in range(2)]
                assert kinds == ["hot_reload", "evolution_result"]
                await asyncio.sleep(0.05)
                assert seen == [("hot", "m"), ("evo", "promoted")]
                # cancelled before its handler task started: the handler never runs
                sup.request("q", request_id="early")
                sup.cancel("early")
                ran = []
                async def handle(req):
                    ran.append(req.request_id)
                it = agent.requests().__aiter__()
                req = await it.__anext__()
                assert (await agent.events.get())["type"] == "cancel_request"
                assert req.cancelled and seen[-1] == ("cancel", "early")
                await req.start(handle(req))
                assert ran == []
                sup.cancel("unknown-id")  # ignored
                assert (await agent.events.get())["request_id"] == "unknown-id"
    run(main())


def test_cancel_of_a_restored_request_not_in_flight_forgets_its_steps():
    with FakeSupervisor(restore=_restore_with_steps()) as sup:
        agent = sup.agent()
        assert RID in agent.step_table
        sup.cancel(RID)
        sup.wait_for(lambda s: 13 in s.wal)
        assert sup.wal[13] == {"operation": "request_done", "params": {"request_id": RID}, "sequence": 13}
        assert agent.step_table == {}

    async def main():
        with FakeSupervisor(restore=_restore_with_steps()) as sup:
            async with sup.async_agent() as agent:
                sup.cancel(RID)
                await agent.events.get()
                assert agent.step_table == {}
                await asyncio.get_running_loop().run_in_executor(None, sup.wait_for, lambda s: 13 in s.wal)
                assert sup.wal[13]["operation"] == "request_done"
    run(main())


def test_aio_hostile_frame_ends_connection_and_refuses_without_supervisor(monkeypatch):
    import os
    import struct
    from supervisor_agent import NotDurable, NotUnderSupervisor
    from supervisor_agent.aio import Agent

    async def main():
        r, w = os.pipe()
        sr, sw = os.pipe()
        agent = await Agent.open(os.fdopen(r, "rb", buffering=0), os.fdopen(sw, "wb", buffering=0),
                                 heartbeat_interval=0)
        fut = agent.log_nowait("memory_add", {"n": 1})
        os.write(w, struct.pack(">I", 0xFFFFFFF0))  # 4 GiB declared: refused before waiting for it
        with pytest.raises(NotDurable, match="exceeds the maximum"):
            await fut
        assert [r async for r in agent.requests()] == []
        await agent.close()
        os.close(w)
        os.close(sr)
    run(main())
    monkeypatch.delenv("SUPERVISOR_PROTOCOL_VERSION", raising=False)
    with pytest.raises(NotUnderSupervisor, match="started by the supervisor"):
        Agent.connect()


def test_aio_back_pressure_bounds_memory():
    """Nobody reads the supervisor's end: sends wait in drain once the transport
    is over its high-water mark, instead of buffering without end."""
    import os
    from supervisor_agent.aio import Agent

    async def main():
        r, w = os.pipe()
        sr, sw = os.pipe()
        agent = await Agent.open(os.fdopen(r, "rb", buffering=0), os.fdopen(sw, "wb", buffering=0),
                                 heartbeat_interval=0)
        sent = [0]

        async def flood():
            while sent[0] < 2000:
                await agent.metrics(pad=1.0, **{f"k{i}": float(i) for i in range(300)})  # ~5 KB each
                sent[0] += 1
        t = asyncio.ensure_future(flood())
        await asyncio.sleep(0.3)
        assert not t.done() and sent[0] < 200, sent  # blocked: the pipe (64 KiB) and the transport are full
        assert agent._wt.get_write_buffer_size() < 256 << 10
        loop = asyncio.get_running_loop()
        drained = [0]

        def reader():
            while True:
                b = os.read(sr, 1 << 16)
                if not b:
                    return
                drained[0] += len(b)
        rt = loop.run_in_executor(None, reader)
        await asyncio.wait_for(t, 20)
        assert sent[0] == 2000
        await agent.close()
        os.close(w)
        await rt
        assert drained[0] > 2000 * 4000
    run(main())


def test_aio_compression_both_ways():
    import msgpack
    from supervisor_agent.agent import _zstd
    if _zstd is None:
        pytest.fail("zstandard is not installed")

    async def main():
        with FakeSupervisor() as sup:
            async with sup.async_agent() as agent:
                state = {"blob": b"ab" * (1 << 20)}
                assert await agent.checkpoint(state)
                cp = [m for m in sup.received if m["type"] == "checkpoint"][-1]
                assert cp["compressed"] is True and cp["version"] == 2 and len(cp["data"]) < 100000
                assert sup.checkpoint == state
        import os
        from supervisor_agent import encode_frame
        from supervisor_agent.aio import Agent
        snap = {"x": 1.25, STEPS_KEY: {"r": [{"index": 0, "name": "s", "result": 5}]}}
        body = _zstd.ZstdCompressor().compress(msgpack.packb(snap, use_bin_type=True))
        r, w = os.pipe()
        os.write(w, encode_frame({"type": "restore", "timestamp": 0, "version": 2, "compressed": True,
                                  "compression": "zstd", "checkpoint_id": "c", "snapshot": body,
                                  "wal_entries": [], "last_sequence": 9}))
        sink = open(os.devnull, "wb")
        agent = await Agent.open(os.fdopen(r, "rb", buffering=0), sink, restore_pending=True, heartbeat_interval=0)
        assert agent.restore.snapshot == {"x": 1.25} and agent.restore.compressed
        assert agent.step_table == {"r": [{"index": 0, "name": "s", "result": 5}]}
        assert agent.last_sequence == 9
        await agent.close()
        os.close(w)
    run(main())


def test_aio_oversized_log_raises_at_once_and_leaves_the_entry_in_flight_alone():
    from supervisor_agent import InvalidMessage

    async def main():
        with FakeSupervisor() as sup:
            async with sup.async_agent() as agent:
                sup.hold_acks = True
                small = agent.log_nowait("memory_add", {"n": 1})
                with pytest.raises(InvalidMessage) as ei:
                    agent.log_nowait("memory_add", {"blob": "x" * (10 << 10)})
                assert ei.value.details["limit"] == 10 << 10
                with pytest.raises(InvalidMessage):
                    await agent.log("memory_add", {"blob": "x" * (10 << 10)})
                await asyncio.get_running_loop().run_in_executor(None, sup.release_acks)
                assert await small == 1
                assert await agent.log("memory_add", {"n": 2}) == 2
                assert sorted(sup.wal) == [1, 2]
    run(main())
