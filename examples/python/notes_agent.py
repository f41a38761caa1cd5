#!/usr/bin/env python3
"""A notes agent: a small but real agent built on supervisor_agent.

Run it under the supervisor (from the repository root):

    PYTHONPATH=python go run ./cmd/supervisor run -- python3 examples/python/notes_agent.py

and talk to it over HTTP:

    curl -s -XPOST 'http://127.0.0.1:9464/v1/requests?wait=5s' \
         -d '{"message": "remember", "context": {"text": "buy milk", "tags": ["todo"]}}'
    curl -s -XPOST 'http://127.0.0.1:9464/v1/requests?wait=5s' -d '{"message": "search", "context": {"query": "milk"}}'

Each request names a tool (``message``) and passes its arguments in
``context``. Every change is logged to the supervisor's WAL and acknowledged
as durable before it is applied; the agent checkpoints every
NOTES_CHECKPOINT_EVERY changes (default 20) and on shutdown. Kill it with -9
at any moment: the supervisor restarts it with the last checkpoint plus the
WAL after it, and no acknowledged note is lost.
"""
import os
import sys
import time
from typing import Any, Callable, Dict

from supervisor_agent import Agent, NotUnderSupervisor, SupervisorError, WalFull

CHECKPOINT_EVERY = int(os.environ.get("NOTES_CHECKPOINT_EVERY", "20"))


def log(msg: str) -> None:
    print(f"notes_agent: {msg}", file=sys.stderr, flush=True)  # stdout carries frames


class Notes:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.notes: Dict[str, Dict[str, Any]] = {}
        self.next_id = 1
        self.changes = 0
        self.tools: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
            "remember": self.remember, "forget": self.forget, "search": self.search, "list": self.list,
        }

    # ----- state: what a checkpoint holds, and how a WAL entry changes it -----
    def state(self) -> Dict[str, Any]:
        return {
            "agent_state": {"id": "notes", "name": "notes_agent", "version": "1", "status": "idle"},
            "memory_blocks": list(self.notes.values()),
            "tool_registry": {"tools": sorted(self.tools)},
            "next_id": self.next_id,
        }

    def load(self, snapshot: Dict[str, Any]) -> None:
        self.notes = {b["id"]: b for b in snapshot.get("memory_blocks", [])}
        self.next_id = snapshot.get("next_id", 1)

    def apply(self, entry: Dict[str, Any]) -> None:
        op, p = entry["operation"], entry["params"]
        if op == "memory_add":
            self.notes[p["id"]] = {"id": p["id"], "text": p["text"], "tags": p.get("tags", [])}
            self.next_id = max(self.next_id, int(p["id"].lstrip("n")) + 1)
        elif op == "state_update" and p.get("forget"):
            self.notes.pop(p["forget"], None)

    def change(self, operation: str, params: Dict[str, Any]) -> None:
        """Write-ahead: durable in the supervisor's WAL first, then applied."""
        try:
            self.agent.log(operation, params)
        except WalFull:  # the restore would be too big: checkpoint, then log again
            self.agent.checkpoint(self.state())
            self.agent.log(operation, params)
        self.apply({"operation": operation, "params": params})
        self.changes += 1
        if self.changes % CHECKPOINT_EVERY == 0:
            cid = self.agent.checkpoint(self.state())
            log(f"checkpoint {cid} after {self.changes} changes")

    # ----- tools -----
    def remember(self, args: Dict[str, Any]) -> Dict[str, Any]:
        text = str(args.get("text", "")).strip()
        if not text:
            raise ValueError("remember needs a non-empty 'text'")
        nid = f"n{self.next_id}"
        self.change("memory_add", {"id": nid, "text": text, "tags": list(args.get("tags", []))})
        return {"id": nid}

    def forget(self, args: Dict[str, Any]) -> Dict[str, Any]:
        nid = str(args.get("id", ""))
        if nid not in self.notes:
            raise KeyError(f"no note {nid!r}")
        self.change("state_update", {"forget": nid})
        return {"forgotten": nid}

    def search(self, args: Dict[str, Any]) -> Dict[str, Any]:
        q = str(args.get("query", "")).lower()
        hits = [n for n in self.notes.values()
                if q in n["text"].lower() or q in [t.lower() for t in n["tags"]]]
        return {"notes": hits}

    def list(self, args: Dict[str, Any]) -> Dict[str, Any]:
        return {"notes": list(self.notes.values())}


def main() -> None:
    with Agent.connect(on_shutdown=lambda m: notes.state()) as agent:
        notes = Notes(agent)
        if agent.restore:
            notes.load(agent.restore.snapshot)
            for e in agent.restore.wal_entries:  # in order, after the snapshot
                notes.apply(e)
            log(f"restored {len(notes.notes)} notes (checkpoint {agent.restore.checkpoint_id or 'none'}, "
                f"{len(agent.restore.wal_entries)} WAL entries)")
        started = time.monotonic()
        served = 0
        for req in agent.requests():
            tool = notes.tools.get(req.message)
            if tool is None:
                req.fail("UNKNOWN_TOOL", f"unknown tool {req.message!r}; tools: {sorted(notes.tools)}")
                continue
            try:
                req.reply(tool(req.context))
            except SupervisorError as e:  # not durable: the change was not applied
                req.fail(e.code or "SUPERVISOR_ERROR", str(e))
            except (ValueError, KeyError) as e:
                req.fail("TOOL_FAILED", str(e))
            served += 1
            if served % 10 == 0:
                agent.metrics(throughput=served / (time.monotonic() - started), memory_blocks=len(notes.notes),
                              active_tools=len(notes.tools))
        log("shutting down")


if __name__ == "__main__":
    try:
        main()
    except NotUnderSupervisor as e:  # run by hand: say how to run it, no traceback
        sys.exit(f"notes_agent: {e}")
