"""End-to-end: the real supervisor binary runs tests/agents/aio_agent.py (supervisor_agent.aio)."""
import hashlib
import os
import signal

import pytest

from conftest import AIO_AGENT, STEP_FLAGS
from supervisor_agent.agent import _zstd

RICH = {
    "float": 0.1 + 0.2, "bin": bytes(range(256)), "unicode": "héllo ✓ 日本 🚀", "big": 2**64 - 1,
    "small": -(2**63), "nested": [{"k": [1, 2.5, None, True]}, {7: "int key"}],
}


@pytest.fixture
def run_aio(run_supervisor):
    def start(mode, flags=(), env=None):
        return run_supervisor(mode, flags=list(flags), env=env, agent=AIO_AGENT)
    return start


def test_aio_restore_after_kill9_is_exact_and_numbering_continues(run_aio):
    sup = run_aio("exact")
    first = sup.wait_event("start")
    assert first["restore"] is None
    sup.wait_event("ready")
    assert [e["seq"] for e in sup.events() if e["event"] == "logged"] == [1, 2, 3]
    assert sup.wait_event("logged_many")["seqs"] == list(range(4, 68))  # 64 in flight, each durable
    os.kill(first["pid"], signal.SIGKILL)
    second = sup.wait_event("start", count=2)
    r = second["restore"]
    assert r["snapshot"] == {"rich": RICH}
    assert r["wal_entries"][:3] == [{"operation": "state_update", "params": {"i": i, "rich": RICH}, "sequence": i + 1}
                                    for i in range(3)]
    assert [e["sequence"] for e in r["wal_entries"]] == list(range(1, 68))
    assert r["last_sequence"] == 67
    assert type(r["snapshot"]["rich"]["bin"]) is bytes and r["snapshot"]["rich"]["big"] == 2**64 - 1
    assert sup.wait_event("next")["seq"] == 68  # above last_sequence: no SEQUENCE_CONFLICT
    assert "SEQUENCE_CONFLICT" not in sup.log_text()


def test_aio_log_raises_wal_full_then_checkpoint_frees_it(run_aio):
    sup = run_aio("walfull", flags=["--max-frame-size", str(1 << 20)])
    ev = sup.wait_event("refused")
    assert ev["error"] == "WalFull" and "WAL_FULL" in ev["message"], ev
    assert 50 < ev["n"] < 120, ev
    after = sup.wait_event("after_checkpoint")
    assert after["checkpoint_id"] and after["seq"] > ev["n"]


@pytest.mark.parametrize("size,compressed", [(200 << 10, False), (3 << 20, True)])
def test_aio_checkpoint_round_trip(run_aio, size, compressed):
    if compressed and _zstd is None:
        pytest.fail("zstandard is not installed: .ci/run installs python3-zstandard")
    sup = run_aio("checkpoint", env={"AGENT_SIZE": str(size)})
    first = sup.wait_event("start")
    cp = sup.wait_event("checkpointed")
    os.kill(first["pid"], signal.SIGKILL)
    r = sup.wait_event("start", count=2)["restore"]
    assert r["checkpoint_id"] == cp["checkpoint_id"]
    blob = bytes((i * 7919) % 251 for i in range(size // 2)) * 2
    assert r["snapshot"] == {"blob": hashlib.sha256(blob).hexdigest(), "size": size}
    assert r["compressed"] is compressed  # a v2 agent gets a compressed restore of a large snapshot


def test_aio_shutdown_stores_final_checkpoint_from_async_callback(run_aio, run_supervisor):
    sup = run_aio("shutdown")
    sup.wait_event("ready")
    assert sup.stop() == 0
    assert any(e["event"] == "exit" for e in sup.events())
    stopped = [l for l in sup.log_text().splitlines() if 'msg="agent stopped"' in l]
    assert stopped and "killed by signal" not in stopped[-1], stopped
    sup2 = run_supervisor("serve", agent=AIO_AGENT)
    r = sup2.wait_event("start", count=2)["restore"]
    assert r["snapshot"] == {"final": True, "n": 42, "reason": "supervisor is stopping"}


@pytest.mark.parametrize("transport", [[], ["--stdio=false"]], ids=["stdio", "fd"])
def test_aio_requests_answered_over_http(run_aio, transport):
    sup = run_aio("serve", flags=transport)
    assert sup.wait_event("start")["transport"] == ("fd" if transport else "stdio")
    sup.wait_ready()
    status, body = sup.post_request("hello", user_id="u1", context={"k": 1})
    assert status == 200
    assert body["data"] == {"echo": "hello", "user": "u1", "ctx": {"k": 1}, "attempt": 1}
    status, body = sup.post_request("fail")
    assert status == 200 and body["error"] == {"code": "TOOL_FAILED", "message": "asked to fail"}


def test_aio_heartbeats_run_on_the_loop_and_opt_in_is_accepted(run_aio):
    sup = run_aio("busy", flags=["--heartbeat-timeout", "1s"], env={"AGENT_BUSY": "3.5", "AGENT_HB": "0.2"})
    sup.wait_event("survived", timeout=30)
    assert sum(1 for e in sup.events() if e["event"] == "start") == 1
    log = sup.log_text()
    assert "hung" not in log.lower()
    # every heartbeat carried accepts: ["cancel_request"]; the supervisor took them all
    assert "INVALID_MESSAGE" not in log and "invalid" not in log.lower(), log[-2000:]


def test_aio_steps_survive_agent_kill_in_the_restore(run_aio):
    """Steps logged for an unanswered request are in the next restore's step table
    (from the WAL tail), and the agent's own view of the restore has no step entries."""
    sup = run_aio("serve", flags=STEP_FLAGS)
    sup.wait_ready()
    status, body = sup.submit("steps-then-hang")
    assert status == 202, body
    rid = body["request_id"]
    ev = sup.wait_event("steps_logged")
    assert ev["table"] == {rid: [{"index": 0, "name": "one", "result": "first"},
                                 {"index": 1, "name": "two", "result": "second"}]}
    os.kill(ev["pid"], signal.SIGKILL)
    second = sup.wait_event("start", count=2)
    assert second["table"] == ev["table"]
    assert second["restore"]["wal_entries"] == []
    assert second["restore"]["last_sequence"] == 2


def test_aio_step_table_kept_across_checkpoint(run_aio):
    """A checkpoint taken after steps holds the table under __supervisor_steps__; the
    restore built on it gives the table back and the agent's snapshot without the key."""
    sup = run_aio("checkpoint_steps", flags=STEP_FLAGS)
    sup.wait_ready()
    rid = sup.submit("anything")[1]["request_id"]
    ev = sup.wait_event("checkpointed")
    want = {rid: [{"index": 0, "name": "one", "result": "first"}, {"index": 1, "name": "two", "result": "second"}]}
    assert ev["table"] == want
    os.kill(ev["pid"], signal.SIGKILL)
    second = sup.wait_event("start", count=2)
    assert second["restore"]["checkpoint_id"] == ev["checkpoint_id"]
    assert second["restore"]["snapshot"] == {"user": "state"}
    assert second["restore"]["wal_entries"] == []
    assert second["table"] == want
