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
