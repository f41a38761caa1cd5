"""The asyncio twin of e2e_agent.py, driven by test_aio_e2e.py: AGENT_MODE picks the
scenario; every event is appended to AGENT_REPORT as one Python literal per line."""
import asyncio
import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from supervisor_agent import SupervisorError  # noqa: E402
from supervisor_agent.aio import Agent  # noqa: E402

REPORT = os.environ.get("AGENT_REPORT", "")
MODE = os.environ.get("AGENT_MODE", "serve")
RICH = {
    "float": 0.1 + 0.2, "bin": bytes(range(256)), "unicode": "héllo ✓ 日本 🚀", "big": 2**64 - 1,
    "small": -(2**63), "nested": [{"k": [1, 2.5, None, True]}, {7: "int key"}],
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


async def handle(req):
    if req.message == "fail":
        await req.fail("TOOL_FAILED", "asked to fail")
    elif req.message == "steps":
        a = await req.step("one", lambda: asyncio.sleep(0, result={"n": 1}))
        b = await req.step("two", lambda: [a, "two"])
        await req.reply({"steps": b, "attempt": req.attempt})
    elif req.message == "steps-then-hang":
        await req.step("one", lambda: "first")
        await req.step("two", lambda: "second")
        report(event="steps_logged", request_id=req.request_id, table=req._agent.step_table)
        await asyncio.sleep(3600)
    else:
        await req.reply({"echo": req.message, "user": req.user_id, "ctx": req.context, "attempt": req.attempt})


async def main():
    inc = incarnation()
    state = {"final": False}

    async def on_shutdown(m):
        await asyncio.sleep(0)
        return dict(state, final=True, reason=m.get("reason"))

    async with Agent.connect(heartbeat_interval=float(os.environ.get("AGENT_HB", "1.0")),
                             on_shutdown=on_shutdown) as agent:
        r = agent.restore
        snap = None if r is None else r.snapshot
        if MODE == "checkpoint" and snap and "blob" in snap:
            snap = dict(snap, blob=hashlib.sha256(snap["blob"]).hexdigest())
        report(event="start", inc=inc, transport=os.environ.get("SUPERVISOR_TRANSPORT"),
               table=agent.step_table, restore=None if r is None else {
                   "checkpoint_id": r.checkpoint_id, "snapshot": snap, "wal_entries": r.wal_entries,
                   "last_sequence": r.last_sequence, "compressed": r.compressed})
        if MODE == "exact" and inc == 0:
            await agent.checkpoint({"rich": RICH})
            for i in range(3):
                report(event="logged", seq=await agent.log("state_update", {"i": i, "rich": RICH}))
            # 64 in flight at once: numbered in order, every one durable
            seqs = await asyncio.gather(*[agent.log("state_update", {"j": j}) for j in range(64)])
            report(event="logged_many", seqs=seqs)
        elif MODE == "exact":
            report(event="next", seq=await agent.log("state_update", {"after": True}))
        elif MODE == "walfull":
            n = 0
            try:
                while n < 10000:
                    await agent.log("memory_add", {"pad": "x" * 9000, "n": n})
                    n += 1
            except SupervisorError as e:
                report(event="refused", n=n, error=type(e).__name__, message=str(e))
            cid = await agent.checkpoint({"n": n})
            report(event="after_checkpoint", checkpoint_id=cid, seq=await agent.log("memory_add", {"after": True}))
        elif MODE == "checkpoint" and inc == 0:
            size = int(os.environ["AGENT_SIZE"])
            blob = bytes((i * 7919) % 251 for i in range(size // 2)) * 2
            report(event="checkpointed", checkpoint_id=await agent.checkpoint({"blob": blob, "size": size}))
        elif MODE == "busy":
            # the loop stays free (awaits) while the work runs in a thread: heartbeats keep going
            secs = float(os.environ.get("AGENT_BUSY", "3"))
            await asyncio.get_running_loop().run_in_executor(None, time.sleep, secs)
            report(event="survived", seq=await agent.log("memory_add", {"x": 1}))
        elif MODE == "checkpoint_steps":
            # a request whose steps are logged and then checkpointed, never answered
            pass
        elif MODE == "shutdown":
            state["n"] = 42
        report(event="ready")
        if MODE == "checkpoint_steps":
            async def handle_cp(req):
                await req.step("one", lambda: "first")
                await req.step("two", lambda: "second")
                report(event="checkpointed", checkpoint_id=await agent.checkpoint({"user": "state"}),
                       table=agent.step_table)
                await asyncio.sleep(3600)
            await agent.serve(handle_cp)
        else:
            await agent.serve(handle)
        report(event="exit")


if __name__ == "__main__":
    asyncio.run(main())
