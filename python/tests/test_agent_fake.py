import threading

import pytest

from supervisor_agent import NotUnderSupervisor, WalFull, Agent
from supervisor_agent.testing import FakeSupervisor


def test_log_numbering_continues_above_restore():
    with FakeSupervisor(restore={"snapshot": {"a": 1}, "wal_entries": [
            {"operation": "memory_add", "params": {"x": 1}, "sequence": 41}], "last_sequence": 41}) as sup:
        agent = sup.agent()
        assert agent.restore.snapshot == {"a": 1}
        assert [e["sequence"] for e in agent.restore.wal_entries] == [41]
        assert agent.log("memory_add", {"content": "hi"}) == 42
        assert sup.wal[42]["params"] == {"content": "hi"}


def test_wal_full_raised_and_next_log_works():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.fail_next_wal = "WAL_FULL"
        with pytest.raises(WalFull):
            agent.log("memory_add", {"n": 1})
        assert agent.log("memory_add", {"n": 2}) == 2


def test_requests_and_shutdown_checkpoint():
    with FakeSupervisor() as sup:
        state = {"n": 0}
        agent = sup.agent(on_shutdown=lambda m: dict(state))
        rid = sup.request("ping")
        rid2 = sup.request("boom")
        it = agent.requests()
        r = next(it)
        state["n"] += 1
        r.reply({"answer": "pong"})
        next(it).fail("TOOL_FAILED", "no")
        assert sup.result(rid)["data"] == {"answer": "pong"}
        assert sup.result(rid2)["error"] == {"code": "TOOL_FAILED", "message": "no"}
        sup.shutdown()
        assert list(it) == []  # the iterator ends after the final checkpoint
        assert sup.checkpoint == {"n": 1}


def test_concurrent_logs_are_whole_frames():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        def work(k):
            for i in range(50):
                agent.log("memory_add", {"k": k, "i": i, "pad": "x" * 3000})
        ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert sorted(sup.wal) == list(range(1, 401))


def test_heartbeats_sent_in_background():
    with FakeSupervisor() as sup:
        sup.agent(heartbeat_interval=0.01)
        sup.wait_for(lambda s: sum(1 for m in s.received if m["type"] == "heartbeat") >= 3)


def test_refuses_without_supervisor(monkeypatch):
    monkeypatch.delenv("SUPERVISOR_PROTOCOL_VERSION", raising=False)
    with pytest.raises(NotUnderSupervisor, match="started by the supervisor"):
        Agent.connect()


def test_log_blocks_until_wal_ack():
    from supervisor_agent import NotDurable
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.hold_acks = True
        with pytest.raises(NotDurable):
            agent.log("memory_add", {"n": 1}, timeout=0.3)
        p = agent.log_nowait("memory_add", {"n": 2})
        done = threading.Event()
        threading.Thread(target=lambda: (p.wait(), done.set()), daemon=True).start()
        sup.wait_for(lambda s: 2 in s.wal)
        assert not done.is_set()  # logged but not acknowledged: still waiting
        sup.release_acks()
        assert done.wait(5)


def test_batch_and_cumulative_ack():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        pend = [agent.log_nowait("memory_add", {"i": i}) for i in range(20)]
        assert agent.log_batch([("memory_add", {"b": i}) for i in range(5)]) == 25
        assert [p.wait() for p in pend] == list(range(1, 21))


def test_checkpoint_compressed_over_1mib():
    from supervisor_agent.agent import _zstd
    if _zstd is None:
        pytest.skip("zstandard not installed")
    with FakeSupervisor() as sup:
        agent = sup.agent()
        state = {"blob": b"ab" * (1 << 20)}
        assert agent.checkpoint(state)
        cp = [m for m in sup.received if m["type"] == "checkpoint"][-1]
        assert cp["compressed"] is True and cp["compression"] == "zstd" and cp["version"] == 2
        assert isinstance(cp["data"], bytes) and len(cp["data"]) < 100000
        assert sup.checkpoint == state
        agent.checkpoint({"small": 1})
        cp = [m for m in sup.received if m["type"] == "checkpoint"][-1]
        assert "compressed" not in cp and cp["data"] == {"small": 1}


def test_restore_compressed_snapshot_decoded():
    import msgpack
    from supervisor_agent.agent import _zstd
    if _zstd is None:
        pytest.skip("zstandard not installed")
    snap = {"x": 1.25, "b": b"\x00"}
    body = _zstd.ZstdCompressor().compress(msgpack.packb(snap, use_bin_type=True))
    # a compressed restore frame, as a v2 supervisor sends it
    import os
    from supervisor_agent import Agent, encode_frame
    r, w = os.pipe()
    os.write(w, encode_frame({"type": "restore", "timestamp": 0, "version": 2, "compressed": True,
                              "compression": "zstd", "checkpoint_id": "c", "snapshot": body,
                              "wal_entries": [], "last_sequence": 9}))
    os.close(w)
    sink = open(os.devnull, "wb")
    agent = Agent(os.fdopen(r, "rb"), sink, restore_pending=True, heartbeat_interval=0)
    assert agent.restore.snapshot == snap and agent.restore.compressed
    assert agent.restore.last_sequence == 9 and agent.last_sequence == 9


def test_hostile_frame_ends_connection_with_clear_error():
    import os
    import struct
    from supervisor_agent import NotDurable
    r, w = os.pipe()
    sink = open(os.devnull, "wb")
    agent = Agent(os.fdopen(r, "rb"), sink, heartbeat_interval=0)
    p = agent.log_nowait("memory_add", {"n": 1})
    os.write(w, struct.pack(">I", 0xFFFFFFF0))  # 4 GiB declared: refused before allocating
    with pytest.raises(NotDurable, match="exceeds the maximum"):
        p.wait(5)
    assert list(agent.requests()) == []
    os.close(w)


def test_heartbeat_thread_stops_with_agent():
    with FakeSupervisor() as sup:
        agent = sup.agent(heartbeat_interval=0.01)
        sup.wait_for(lambda s: any(m["type"] == "heartbeat" for m in s.received))
        agent.close()
        agent._hb.join(5)
        assert not agent._hb.is_alive()


def test_concurrent_checkpoints_each_get_their_ack():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        ids = []
        lock = threading.Lock()
        def work(k):
            cid = agent.checkpoint({"k": k, "pad": "y" * 5000})
            with lock:
                ids.append(cid)
        ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert len(set(ids)) == 8


def _error_frame(code: bytes, message: bytes, details: bytes = b"\x80") -> bytes:
    """An error reply built byte by byte: code and message strs may be any bytes."""
    def s(b):
        return bytes([0xd9, len(b)]) + b
    return (b"\x83" + s(b"type") + s(b"error") + s(b"timestamp") + b"\x00" + s(b"error") +
            b"\x83" + s(b"code") + s(code) + s(b"message") + s(message) + s(b"details") + details)


def test_error_replies_never_kill_the_reader():
    """Whatever an error reply holds — strs that are not UTF-8, odd shapes —
    the client reads on: the next entry is still acknowledged."""
    import msgpack
    from supervisor_agent import InvalidMessage, WalFailed
    from supervisor_agent.errors import from_error_message
    with FakeSupervisor() as sup:
        agent = sup.agent()
        assert agent.log("memory_add", {"n": 1}) == 1
        sup.send_raw(_error_frame(b"INVALID_MESSAGE", b"invalid metrics message: data.lat\xff\xfe: bad",
                                  b"\x81" + bytes([0xd9, 5]) + b"field" + bytes([0xd9, 6]) + b"data.\xff"))
        sup.send_raw(_error_frame(b"CODE_\xc3", b"\xed\xa0\x80"))
        for odd in ({"type": "error", "timestamp": 0, "error": "just a string"},
                    {"type": "error", "timestamp": 0, "error": {"code": "INVALID_MESSAGE", "details": ["x"]}},
                    {"type": "error", "timestamp": 0, "error": {"code": "WAL_FAILED", "message": "m",
                                                                "details": {"first_sequence": "x", "last_sequence": None}}},
                    {"type": "error", "timestamp": 0, "error": {"code": "SEQUENCE_CONFLICT",
                                                                "details": {"first_sequence": 7, "entries": "many"}}}):
            sup.send_raw(msgpack.packb(odd, use_bin_type=True))
        got = []
        while len(got) < 2:
            m = agent.events.get(timeout=5)
            if m.get("type") == "error":
                got.append(m)
        assert got[0]["error"]["message"] == "invalid metrics message: data.lat\\xff\\xfe: bad"
        assert got[0]["error"]["details"] == {"field": "data.\\xff"}
        assert got[1]["error"]["code"] == "CODE_\\xc3"
        assert not agent._closed.is_set(), agent._close_reason
        # the reader is alive: the WAL_FAILED whose range is not a number
        # fails the entry in flight, and the next one is acknowledged
        with pytest.raises(WalFailed):
            agent.log("memory_add", {"n": 2})
        assert agent.log("memory_add", {"n": 3}) == 3
        assert isinstance(from_error_message({"code": "INVALID_MESSAGE", "details": "not a map"}), InvalidMessage)


def test_hot_reload_callback_exception_does_not_kill_the_sync_agent(capsys):
    """A bug in a callback (run on the reader thread) is printed; the reader goes
    on: acks, requests and heartbeats keep flowing."""
    with FakeSupervisor() as sup:
        def on_hot_reload(m):
            raise KeyError("new_code")
        agent = sup.agent(on_hot_reload=on_hot_reload)
        assert agent.log("memory_add", {"n": 1}) == 1
        sup.send({"type": "hot_reload", "new_code": "x", "version": 2})
        rid = sup.request("still there?")  # read after the hot_reload: no sleep needed
        it = agent.requests()
        req = next(it, None)
        assert req is not None, f"requests() ended after a callback raised; close reason: {agent._close_reason!r}"
        req.reply({"ok": True})
        assert sup.result(rid)["data"] == {"ok": True}
        assert agent.log("memory_add", {"n": 2}) == 2
        assert agent.events.get(timeout=5)["type"] == "hot_reload"  # still handed on
        err = capsys.readouterr().err
        assert "handling a hot_reload message failed" in err and "KeyError: 'new_code'" in err, err


def test_cancel_and_evolution_callback_exceptions_do_not_kill_the_sync_agent():
    with FakeSupervisor() as sup:
        def boom(_):
            raise RuntimeError("callback bug")
        agent = sup.agent(on_cancel=boom, on_evolution_result=boom)
        rid = sup.request("to cancel")
        it = agent.requests()
        req = next(it)
        sup.cancel(rid)
        sup.send({"type": "evolution_result", "success": True, "decision": "promoted", "metrics": {}, "reason": ""})
        rid2 = sup.request("next")
        req2 = next(it, None)
        assert req2 is not None, f"requests() ended after a callback raised; close reason: {agent._close_reason!r}"
        assert req.cancelled
        req2.reply({"ok": 2})
        assert sup.result(rid2)["data"] == {"ok": 2}


def test_raising_on_shutdown_ends_requests_without_a_checkpoint_and_keeps_the_connection(capsys):
    """A raising on_shutdown has no state to store: it is printed, requests()
    ends as at any shutdown, and the connection stays up (no reader failure)."""
    with FakeSupervisor() as sup:
        def on_shutdown(m):
            raise ValueError("no state")
        agent = sup.agent(on_shutdown=on_shutdown)
        it = agent.requests()
        sup.shutdown()
        assert list(it) == []
        assert agent.shutdown_requested.is_set()
        assert agent._close_reason is None, agent._close_reason
        assert agent.log("memory_add", {"n": 1}) == 1  # acks still arrive
        assert sup.checkpoint is None
        err = capsys.readouterr().err
        assert "handling a shutdown message failed (no final checkpoint)" in err and "ValueError: no state" in err, err


def test_unencodable_final_state_still_ends_requests(capsys):
    with FakeSupervisor() as sup:
        agent = sup.agent(on_shutdown=lambda m: {"x": object()})
        sup.shutdown()
        assert agent.shutdown_requested.wait(5), "requests() never ends: the final checkpoint's thread died"
        assert list(agent.requests()) == []
        assert "final checkpoint failed" in capsys.readouterr().err


def test_oversized_log_raises_at_once_and_leaves_the_entry_in_flight_alone():
    """An entry over the wal_entry limit is refused by the client, unsent: the
    supervisor's refusal names no sequence and would fail every entry in flight."""
    from supervisor_agent import InvalidMessage
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.hold_acks = True
        small = agent.log_nowait("memory_add", {"n": 1})
        with pytest.raises(InvalidMessage) as ei:
            agent.log_nowait("memory_add", {"blob": "x" * (10 << 10)})
        assert ei.value.code == "INVALID_MESSAGE" and ei.value.details["limit"] == 10 << 10
        assert ei.value.details["size"] > 10 << 10
        sup.release_acks()
        assert small.wait(5) == 1
        assert agent.log("memory_add", {"n": 2}) == 2  # no sequence spent on the refused entry
        assert sorted(sup.wal) == [1, 2]
        agent.wal_entry_limit = 64 << 10  # the limit is the caller's to raise
        assert agent.log("memory_add", {"blob": "x" * (10 << 10)}) == 3


def test_sync_callback_can_log_durably():
    # on_hot_reload/on_evolution_result/on_cancel run on the reader thread; a callback
    # that records the reload durably (agent.log) waits for a wal_ack only that thread reads.
    import time
    got = []
    with FakeSupervisor() as sup:
        def on_reload(m):
            try:
                got.append(agent.log("state_update", {"code": m["code"]}, timeout=3))
            except Exception as e:  # what the reader thread would print and swallow
                got.append(e)
        agent = sup.agent(on_hot_reload=on_reload)
        sup.send({"type": "hot_reload", "code": "new", "module": "memory", "backup_checkpoint_id": ""})
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == [1]
