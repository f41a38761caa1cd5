#!/usr/bin/env python3
"""An asyncio agent that answers each request with three LLM calls, each a durable step.

    PYTHONPATH=python go run ./cmd/supervisor run -- python3 examples/python/llm_agent.py

Each call is `await req.step(name, fn)`: its result is logged in the supervisor's
write-ahead log (fsynced) before the step returns. Kill the agent with SIGKILL in
the middle of a request: the supervisor restarts it and delivers the request again
(`req.attempt` 2), and the steps that had completed return their logged results
without calling the LLM again — only the step that was running when the agent died
runs again. `DELETE /v1/requests/ID` cancels the request's handler task: the step
running gets `asyncio.CancelledError`, the steps after it never run.

The LLM here is a fake that works offline: it sleeps (LLM_DELAY seconds, default
2) and appends one JSON line per call to LLM_CALLS_FILE (default
/tmp/llm_agent_calls.jsonl) — a file outside the supervisor's data directory, so
you can count the calls across restarts. The walkthrough is in
examples/python/README.md.
"""
import asyncio
import json
import os
import time

from supervisor_agent.aio import Agent

CALLS = os.environ.get("LLM_CALLS_FILE", "/tmp/llm_agent_calls.jsonl")
DELAY = float(os.environ.get("LLM_DELAY", "2"))

state = {"answered": 0}


def record(**event):
    """One line per event in the calls file (what the walkthrough and the tests count)."""
    event["t"] = time.time()
    event["pid"] = os.getpid()
    with open(CALLS, "a") as f:
        f.write(json.dumps(event) + "\n")


async def llm(prompt, request_id, step):
    """The fake LLM. A real one, with the OpenAI SDK (pip install openai):

        from openai import AsyncOpenAI
        client = AsyncOpenAI()
        r = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": prompt}],
            # a step that was running at a crash runs again: let the API drop the repeat
            extra_headers={"Idempotency-Key": f"{request_id}/{step}"},
        )
        return r.choices[0].message.content
    """
    record(event="llm_call", request_id=request_id, step=step)
    await asyncio.sleep(DELAY)
    record(event="llm_done", request_id=request_id, step=step)
    return f"<{step} for {prompt[:60]!r}>"


async def handle(req):
    rid = req.request_id
    record(event="delivered", request_id=rid, attempt=req.attempt)
    try:
        plan = await req.step("plan", lambda: llm(f"Plan an answer to: {req.message}", rid, "plan"))
        draft = await req.step("draft", lambda: llm(f"Answer {req.message!r} following {plan}", rid, "draft"))
        final = await req.step("review", lambda: llm(f"Review and fix: {draft}", rid, "review"))
    except asyncio.CancelledError:
        record(event="cancelled", request_id=rid)  # DELETE /v1/requests/ID: stop here
        raise
    state["answered"] += 1
    await req.reply({"answer": final, "attempt": req.attempt})
    record(event="answered", request_id=rid, attempt=req.attempt)


async def main():
    # on_shutdown: the state to checkpoint when the supervisor stops us
    async with Agent.connect(on_shutdown=lambda msg: dict(state)) as agent:
        if agent.restore and agent.restore.checkpoint_id:
            state.update(agent.restore.snapshot)
        record(event="start", restored_steps=sum(len(s) for s in agent.step_table.values()))
        await agent.serve(handle)  # a task per request, until shutdown


if __name__ == "__main__":
    asyncio.run(main())
