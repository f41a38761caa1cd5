"""End-to-end: the real supervisor binary (built once per session) runs tests/agents/e2e_agent.py."""
import hashlib
import importlib.util
import os
import signal

import pytest

from conftest import AGENT, wait_until
from supervisor_agent.agent import _zstd

_spec = importlib.util.spec_from_file_location("e2e_agent", AGENT)
e2e_agent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e_agent)
RICH = e2e_agent.RICH


def test_restore_after_kill9_is_exact(run_supervisor):
    sup = run_supervisor("exact")
    first = sup.wait_event("start")
    assert first["restore"] is None
    sup.wait_event("ready")
    logged = [e["seq"] for e in sup.events() if e["event"] == "logged"]
    assert logged == [1, 2, 3]
    os.kill(first["pid"], signal.SIGKILL)
    second = sup.wait_event("start", count=2)
    r = second["restore"]
    assert second["pid"] != first["pid"]
    assert r["snapshot"] == {"rich": RICH}
    assert r["wal_entries"] == [{"operation": "state_update", "params": {"i": i, "rich": RICH}, "sequence": i + 1}
                                for i in range(3)]
    assert r["last_sequence"] == 3
    # bytes stay bytes, big ints stay ints, floats bit-exact
    assert type(r["snapshot"]["rich"]["bin"]) is bytes
    assert r["snapshot"]["rich"]["float"].hex() == (0.1 + 0.2).hex()
    assert r["snapshot"]["rich"]["big"] == 2**64 - 1


def test_log_blocks_until_durable_and_raises_wal_full(run_supervisor):
    sup = run_supervisor("walfull", flags=["--max-frame-size", str(1 << 20)])
    ev = sup.wait_event("refused")
    assert ev["error"] == "WalFull", ev
    assert "WAL_FULL" in ev["message"]
    # about 1 MiB of restore holds about a hundred 9 KB entries; every accepted one was acked
    assert 50 < ev["n"] < 120, ev
    after = sup.wait_event("after_checkpoint")
    assert after["checkpoint_id"]
    assert after["seq"] > ev["n"]


@pytest.mark.parametrize("size,compressed", [(200 << 10, False), (3 << 20, True)])
def test_checkpoint_round_trip(run_supervisor, size, compressed):
    if compressed and _zstd is None:
        pytest.skip("zstandard not installed")
    sup = run_supervisor("checkpoint", env={"AGENT_SIZE": str(size)})
    first = sup.wait_event("start")
    cp = sup.wait_event("checkpointed")
    assert cp["checkpoint_id"]
    os.kill(first["pid"], signal.SIGKILL)
    r = sup.wait_event("start", count=2)["restore"]
    assert r["checkpoint_id"] == cp["checkpoint_id"]
    blob = bytes((i * 7919) % 251 for i in range(size // 2)) * 2
    assert r["snapshot"] == {"blob": hashlib.sha256(blob).hexdigest(), "size": size}
    # a v2 agent that sent a compressed checkpoint gets a compressed restore of a large snapshot
    assert r["compressed"] is compressed


def test_shutdown_stores_final_checkpoint(run_supervisor):
    sup = run_supervisor("shutdown")
    sup.wait_event("ready")
    assert sup.stop() == 0
    assert any(e["event"] == "exit" for e in sup.events())
    # the agent exited by itself, cleanly (no interpreter abort from the reader thread)
    assert "Fatal Python error" not in sup.log_text()
    stopped = [l for l in sup.log_text().splitlines() if 'msg="agent stopped"' in l]
    assert stopped and "killed by signal" not in stopped[-1], stopped
    assert len(sup.checkpoints()) >= 1
    sup2 = run_supervisor("serve")
    r = sup2.wait_event("start", count=2)["restore"]
    assert r["snapshot"] == {"final": True, "n": 42, "reason": "supervisor is stopping"}


@pytest.mark.parametrize("transport", [[], ["--stdio=false"]], ids=["stdio", "fd"])
def test_requests_answered_over_http(run_supervisor, transport):
    sup = run_supervisor("serve", flags=transport)
    assert sup.wait_event("start")["transport"] == ("fd" if transport else "stdio")
    sup.wait_event("ready")
    sup.wait_ready()
    status, body = sup.post_request("hello", user_id="u1", context={"k": 1})
    assert status == 200
    assert body["data"] == {"echo": "hello", "user": "u1", "ctx": {"k": 1}}
    status, body = sup.post_request("fail")
    assert status == 200
    assert body["error"] == {"code": "TOOL_FAILED", "message": "asked to fail"}


def test_sequence_conflict_surfaced(run_supervisor):
    sup = run_supervisor("conflict")
    ev = sup.wait_event("conflict")
    assert ev["error"] == "SequenceConflict", ev
    assert ev["details"]["sequence"] == 1
    assert sup.wait_event("next")["seq"] == 3


def test_heartbeats_keep_busy_agent_alive(run_supervisor):
    sup = run_supervisor("busy", flags=["--heartbeat-timeout", "1s"], env={"AGENT_BUSY": "3.5", "AGENT_HB": "0.2"})
    sup.wait_event("survived", timeout=30)
    assert sum(1 for e in sup.events() if e["event"] == "start") == 1
    assert "hung" not in sup.log_text().lower()


NOTES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "examples", "python", "notes_agent.py")


def test_notes_agent_survives_kill9(run_supervisor):
    sup = run_supervisor("notes", agent=NOTES, env={"NOTES_CHECKPOINT_EVERY": "3"})
    sup.wait_ready()
    ids = [sup.post_request("remember", context={"text": f"note {i} ✓", "tags": ["t"]})[1]["data"]["id"]
           for i in range(5)]
    assert ids == ["n1", "n2", "n3", "n4", "n5"]
    assert sup.post_request("forget", context={"id": "n2"})[1]["data"] == {"forgotten": "n2"}
    pid = sup.agent_pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: sup.agent_pid() not in (None, pid), 20, "a new agent")
    sup.wait_ready()
    notes = sup.post_request("search", context={"query": "✓"})[1]["data"]["notes"]
    assert [n["id"] for n in notes] == ["n1", "n3", "n4", "n5"]
    # numbering continued above the restore: no SEQUENCE_CONFLICT, next id follows
    assert sup.post_request("remember", context={"text": "after"})[1]["data"] == {"id": "n6"}
    assert sup.post_request("nope")[1]["error"]["code"] == "UNKNOWN_TOOL"
    assert "SEQUENCE_CONFLICT" not in sup.log_text()
