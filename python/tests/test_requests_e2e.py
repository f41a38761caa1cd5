"""Durable requests through the real binary: redelivery after kill -9 skips completed
steps; DELETE /v1/requests/ID stops a request's remaining steps. For the asyncio
example agent (examples/python/llm_agent.py) and the sync client (e2e_agent.py).

These need the supervisor's side of docs/protocol.md "Extensions: durable requests,
steps and cancellation": redelivery with `attempt` after a restart, and
`cancel_request` to an agent whose heartbeats opted in."""
import json
import os
import signal

import pytest

from conftest import AGENT, STEP_FLAGS, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLM_AGENT = os.path.join(REPO, "examples", "python", "llm_agent.py")


def calls(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_call(path, timeout=30, **match):
    def find():
        for e in calls(path):
            if all(e.get(k) == v for k, v in match.items()):
                return e
        return None
    try:
        return wait_until(find, timeout, f"a call record {match}")
    except AssertionError:
        raise AssertionError(f"no call record {match}; records: {calls(path)}")


def count(path, rid, event, step=None):
    return sum(1 for e in calls(path) if e.get("request_id") == rid and e["event"] == event
               and (step is None or e.get("step") == step))


@pytest.fixture(params=["aio_example", "sync"])
def llm_sup(request, run_supervisor, tmp_path):
    """A supervisor running an agent that answers "llm" with steps plan, draft, review."""
    path = str(tmp_path / "calls.jsonl")
    env = {"LLM_CALLS_FILE": path, "AGENT_CALLS": path, "LLM_DELAY": "1"}
    agent = LLM_AGENT if request.param == "aio_example" else AGENT
    sup = run_supervisor("serve", flags=STEP_FLAGS, env=env, agent=agent)
    sup.wait_ready()
    return sup, path


def test_kill9_mid_request_does_not_repeat_completed_steps(llm_sup):
    sup, path = llm_sup
    status, body = sup.submit("llm")
    assert status == 202, body
    rid = body["request_id"]
    running = wait_call(path, event="llm_call", request_id=rid, step="review")
    os.kill(running["pid"], signal.SIGKILL)  # plan and draft are logged; review is running
    ans = sup.wait_answer(rid, timeout=60)
    assert ans["status"] == "answered", ans
    assert ans["data"]["attempt"] == 2, ans
    # the completed steps were not called again; the one in flight at the kill was
    assert count(path, rid, "llm_call", "plan") == 1
    assert count(path, rid, "llm_call", "draft") == 1
    assert count(path, rid, "llm_call", "review") == 2
    assert count(path, rid, "answered") == 1


def test_cancel_stops_the_remaining_steps(llm_sup):
    sup, path = llm_sup
    status, body = sup.submit("llm")
    assert status == 202, body
    rid = body["request_id"]
    wait_call(path, event="llm_call", request_id=rid, step="draft")
    status, body = sup.cancel_request(rid)
    assert status in (200, 202, 204), (status, body)
    wait_call(path, event="cancelled", request_id=rid)
    # the handler ended at the cancel: the step after it never ran, no answer was sent
    assert count(path, rid, "llm_call", "review") == 0
    assert count(path, rid, "answered") == 0
    st, body = sup.request_status(rid)
    assert st == 200 and body["status"] == "cancelled", body
    # the agent is still up and serves the next request
    status, body = sup.post_request("hello", wait="30s")
    assert status == 200 and "data" in body, body
