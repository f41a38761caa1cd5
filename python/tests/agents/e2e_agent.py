"""Agent driven by the e2e tests. AGENT_MODE picks the scenario; everything it
sees is appended to AGENT_REPORT as one Python literal per line (repr keeps
bin, floats, unicode and big ints exact)."""
import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from supervisor_agent import Agent, RequestCancelled, SupervisorError  # noqa: E402

REPORT = os.environ.get("AGENT_REPORT", "")
MODE = os.environ.get("AGENT_MODE", "serve")

RICH = {
    "float": 0.1 + 0.2, "neg": -1.5e-300, "inf_like": 1.7976931348623157e308,
    "bin": bytes(range(256)), "unicode": "héllo ✓ 日本 🚀", "big": 2**64 - 1, "small": -(2**63),
    "nested": [{"k": [1, 2.5, None, True]}, {7: "int key"}],
}


def report(**ev):
    ev["pid"] = os.getpid()
    with open(REPORT, "a") as f:
        f.write(repr(ev) + "\n")


def incarnation():
    try:
        with open(REPORT) as f:
            return sum(1 for line in f if "'event': 'start'" in line)
    except FileNotFoundError:
        return 0


def record_call(**ev):
    """A side effect outside the data dir: one JSON line per LLM call (AGENT_CALLS)."""
    import json
    ev["t"], ev["pid"] = time.time(), os.getpid()
    with open(os.environ["AGENT_CALLS"], "a") as f:
        f.write(json.dumps(ev) + "\n")


def llm_steps(req):
    """Three durable steps, each a fake LLM call that waits LLM_DELAY seconds (or until cancelled)."""
    def call(step):
        def fn():
            record_call(event="llm_call", request_id=req.request_id, step=step)
            req.cancel_event.wait(float(os.environ.get("LLM_DELAY", "1")))
            record_call(event="llm_done", request_id=req.request_id, step=step)
            return "<%s>" % step
        return fn
    try:
        out = [req.step(s, call(s)) for s in ("plan", "draft", "review")]
    except RequestCancelled:
        record_call(event="cancelled", request_id=req.request_id)
        return
    req.reply({"answer": out, "attempt": req.attempt})
    record_call(event="answered", request_id=req.request_id, attempt=req.attempt)


def serve(agent):
    for req in agent.requests():
        if req.message == "llm":
            llm_steps(req)
        elif req.message == "fail":
            req.fail("TOOL_FAILED", "asked to fail")
        else:
            req.reply({"echo": req.message, "user": req.user_id, "ctx": req.context})


def main():
    inc = incarnation()
    state = {"final": False}
    agent = Agent.connect(heartbeat_interval=float(os.environ.get("AGENT_HB", "1.0")), on_shutdown=lambda m: dict(state, final=True, reason=m.get("reason")))
    r = agent.restore
    snap = None if r is None else r.snapshot
    if MODE == "checkpoint" and snap and "blob" in snap:  # too big to report: a digest
        snap = dict(snap, blob=hashlib.sha256(snap["blob"]).hexdigest())
    report(event="start", inc=inc, transport=os.environ.get("SUPERVISOR_TRANSPORT"), restore=None if r is None else {
        "checkpoint_id": r.checkpoint_id, "snapshot": snap, "wal_entries": r.wal_entries,
        "last_sequence": r.last_sequence, "compressed": r.compressed})
    if MODE == "exact" and inc == 0:
        agent.checkpoint({"rich": RICH})
        for i in range(3):
            seq = agent.log("state_update", {"i": i, "rich": RICH})
            report(event="logged", seq=seq)
    elif MODE == "walfull":
        n = 0
        try:
            while n < 10000:
                agent.log("memory_add", {"pad": "x" * 9000, "n": n})
                n += 1
        except SupervisorError as e:
            report(event="refused", n=n, error=type(e).__name__, message=str(e))
        cid = agent.checkpoint({"n": n})
        seq = agent.log("memory_add", {"after": True})
        report(event="after_checkpoint", checkpoint_id=cid, seq=seq)
    elif MODE == "checkpoint" and inc == 0:
        size = int(os.environ["AGENT_SIZE"])
        blob = bytes((i * 7919) % 251 for i in range(size // 2)) * 2  # compressible, not trivial
        cid = agent.checkpoint({"blob": blob, "size": size})
        report(event="checkpointed", checkpoint_id=cid)
    elif MODE == "conflict":
        agent.log("memory_add", {"a": 1})
        agent.log("memory_add", {"a": 2})
        try:
            agent.log_nowait("memory_add", {"a": "different"}, sequence=1).wait(10)
            report(event="conflict", error=None)
        except SupervisorError as e:
            report(event="conflict", error=type(e).__name__, details=e.details)
        report(event="next", seq=agent.log("memory_add", {"a": 3}))
    elif MODE == "busy":
        secs = float(os.environ.get("AGENT_BUSY", "3"))
        end = time.monotonic() + secs
        x = 0
        while time.monotonic() < end:  # CPU-bound main thread
            x += 1
        report(event="survived", seq=agent.log("memory_add", {"x": x % 1000}))
    elif MODE == "shutdown":
        state["n"] = 42
    report(event="ready")
    serve(agent)
    report(event="exit")


if __name__ == "__main__":
    main()
