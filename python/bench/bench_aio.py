#!/usr/bin/env python3
"""Benchmarks of supervisor_agent.aio beside the sync client, through the real binary.

    cd python && /usr/bin/python3 bench/bench_aio.py [--supervisor PATH] [--rounds 3]

Builds the supervisor (go build) unless --supervisor is given. Runs this same file as
the agent under it (BENCH_ROLE=agent), alternating the sync and the asyncio client
(BENCH_CLIENT) for --rounds rounds in the same run, and prints:
  - one log() in flight: p50/p99 latency of a durable log (sync vs asyncio), and their ratio
  - asyncio: 64 tasks each awaiting log() in a loop: durable entries per second
  - asyncio: a step (trivial function, result logged durably) p50
  - cancellation: DELETE /v1/requests/ID -> the handler task sees CancelledError, p50/p99
    (only when the supervisor implements DELETE and cancel_request; otherwise says so)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def sync_agent(res):
    from supervisor_agent import Agent
    with Agent.connect() as agent:
        for _ in range(200):
            agent.log("memory_add", {"content": "warm"})
        lat = []
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            agent.log("memory_add", {"content": "x" * 100})
            lat.append(time.perf_counter() - t0)
        res["log_1_latencies"] = lat
        # the sync client's best pipelining, 64 entries in flight (log_nowait, sliding window):
        # what this machine's supervisor and disk allow, beside the asyncio figure
        import collections
        q, n = collections.deque(), 0
        t0 = time.perf_counter()
        end = t0 + SECONDS
        while time.perf_counter() < end:
            q.append(agent.log_nowait("memory_add", {"content": "x" * 100}))
            if len(q) >= 64:
                q.popleft().wait()
                n += 1
        res["log_64_per_s"] = n / (time.perf_counter() - t0)
        for p in q:
            p.wait()


async def aio_agent(res):
    import asyncio
    from supervisor_agent.aio import Agent
    cancels = os.environ.get("BENCH_CANCELS", "")
    async with Agent.connect() as agent:
        for _ in range(200):
            await agent.log("memory_add", {"content": "warm"})
        lat = []
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await agent.log("memory_add", {"content": "x" * 100})
            lat.append(time.perf_counter() - t0)
        res["log_1_latencies"] = lat

        n = [0]
        stop = time.perf_counter() + SECONDS

        async def worker():
            while time.perf_counter() < stop:
                await agent.log("memory_add", {"content": "x" * 100})
                n[0] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(64)])
        res["log_64_per_s"] = n[0] / (time.perf_counter() - t0)

        # step overhead, beside a plain log (same request, same run)
        from supervisor_agent.aio import Request
        req = Request(agent, {"request_id": "bench-step", "data": {"message": "m"}})
        steps = []
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await req.step("s", lambda: 1)
            steps.append(time.perf_counter() - t0)
        res["step_latencies"] = steps
        agent._steps.drop("bench-step")

        # cancellation: the bench's main process DELETEs requests; each handler waits, and
        # writes the time it saw CancelledError (time.time_ns, comparable across processes)
        out = open(cancels, "a", buffering=1) if cancels else None

        async def handle(r):
            out.write(json.dumps({"request_id": r.request_id, "event": "started"}) + "\n")
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                out.write(json.dumps({"request_id": r.request_id, "event": "cancelled", "t": time.time_ns()}) + "\n")
                raise
            await r.reply({})
        write_result(res)
        if out is not None:
            await agent.serve(handle)


def write_result(res):
    """Atomically: the bench's main process polls for the file."""
    tmp = os.environ["BENCH_OUT"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, os.environ["BENCH_OUT"])


def agent_main():
    res = {}
    if os.environ["BENCH_CLIENT"] == "sync":
        sync_agent(res)
        write_result(res)
    else:
        import asyncio
        asyncio.run(aio_agent(res))


def http(addr, method, path, body=None):
    req = urllib.request.Request(f"http://{addr}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


WAL_SYNC = "batch"


def run_round(binary, tmp, client, k, cancels_n=0):
    out = os.path.join(tmp, f"result-{client}-{k}.json")
    cancels = os.path.join(tmp, f"cancels-{k}.jsonl") if cancels_n else ""
    log = os.path.join(tmp, f"supervisor-{client}-{k}.log")
    env = dict(os.environ, BENCH_ROLE="agent", BENCH_OUT=out, BENCH_CLIENT=client, BENCH_CANCELS=cancels,
               PYTHONPATH=os.path.join(HERE, ".."))
    p = subprocess.Popen([binary, "run", "--data-dir", os.path.join(tmp, f"data-{client}-{k}"),
                          "--http-addr", "127.0.0.1:0" if cancels_n else "", "--restart", "never",
                          "--wal-sync", WAL_SYNC, "--wal-operations", "request_step,request_done", "--",
                          sys.executable, os.path.abspath(__file__)], env=env, stderr=open(log, "wb"))
    try:
        deadline = time.time() + 300
        while not os.path.exists(out) and p.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not os.path.exists(out):
            sys.exit(f"benchmark agent produced no result; see {log}")
        res = json.load(open(out))
        if cancels_n:
            res["cancel"] = measure_cancels(log, cancels, cancels_n)
        return res
    finally:
        p.terminate()
        p.wait(30)


def cancel_events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def measure_cancels(log, cancels, n):
    addr = None
    deadline = time.time() + 30
    while addr is None and time.time() < deadline:
        m = re.findall(r'HTTP listener up.*?addr=(\S+)', open(log, errors="replace").read())
        addr = m[-1] if m else None
        time.sleep(0.05)
    lat = []
    for i in range(n):
        st, body = http(addr, "POST", "/v1/requests", {"message": f"cancel me {i}"})
        if st != 202:
            return {"error": f"POST answered {st}: {body[:200]!r}"}
        rid = json.loads(body)["request_id"]
        deadline = time.time() + 10
        while not any(e["request_id"] == rid for e in cancel_events(cancels)):
            if time.time() > deadline:
                return {"error": "a request never reached the agent"}
            time.sleep(0.001)
        t0 = time.time_ns()
        st, body = http(addr, "DELETE", f"/v1/requests/{rid}")
        if st not in (200, 202, 204):
            return {"error": f"DELETE /v1/requests/ID answered {st}: {body[:100]!r} (no cancellation in this supervisor)"}
        deadline = time.time() + 10
        while True:
            seen = [e for e in cancel_events(cancels) if e["request_id"] == rid and e["event"] == "cancelled"]
            if seen:
                lat.append((seen[0]["t"] - t0) / 1e9)
                break
            if time.time() > deadline:
                return {"error": "DELETE answered but the handler task was never cancelled (no cancel_request sent)"}
            time.sleep(0.001)
    return {"latencies": lat}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--supervisor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wal-sync", default="batch", help="the supervisor's --wal-sync (none: the clients' CPU ceiling)")
    ap.add_argument("--cancels", type=int, default=200, help="requests to cancel (0: skip)")
    args = ap.parse_args()
    global WAL_SYNC
    WAL_SYNC = args.wal_sync
    tmp = tempfile.mkdtemp(prefix="aio-bench-")
    binary = args.supervisor
    if not binary:
        binary = os.path.join(tmp, "supervisor")
        subprocess.run(["go", "build", "-o", binary, "./cmd/supervisor"], cwd=os.path.join(HERE, "..", ".."), check=True)
    sync_p50, aio_p50, sync_p99, aio_p99, tput, step_p50, sync_tput = [], [], [], [], [], [], []
    for k in range(args.rounds):
        s = run_round(binary, tmp, "sync", k)
        a = run_round(binary, tmp, "aio", k)
        sync_p50.append(pct(s["log_1_latencies"], 0.5))
        sync_p99.append(pct(s["log_1_latencies"], 0.99))
        aio_p50.append(pct(a["log_1_latencies"], 0.5))
        aio_p99.append(pct(a["log_1_latencies"], 0.99))
        tput.append(a["log_64_per_s"])
        sync_tput.append(s["log_64_per_s"])
        step_p50.append(pct(a["step_latencies"], 0.5))
    cancel = run_round(binary, tmp, "aio", "cancel", args.cancels)["cancel"] if args.cancels else {"error": "skipped"}
    med = statistics.median
    print(f"supervisor_agent.aio benchmark (python {sys.version.split()[0]}, --wal-sync {WAL_SYNC}, "
          f"{args.rounds} rounds alternating sync/asyncio, medians; data in {tmp})")
    print(f"  log() durable, 1 in flight, sync     : p50 {med(sync_p50)*1e3:7.3f} ms  p99 {med(sync_p99)*1e3:7.3f} ms")
    print(f"  log() durable, 1 in flight, asyncio  : p50 {med(aio_p50)*1e3:7.3f} ms  p99 {med(aio_p99)*1e3:7.3f} ms")
    ratios = [a / s for a, s in zip(aio_p50, sync_p50)]
    print(f"  asyncio / sync p50 latency           : {med(ratios):7.2f}x  (rounds: {', '.join('%.2f' % r for r in ratios)})")
    print(f"  await log() x64 tasks, asyncio       : {med(tput):9.0f} entries/s  (rounds: {', '.join('%.0f' % t for t in tput)})")
    print(f"  sync log_nowait, 64 in flight        : {med(sync_tput):9.0f} entries/s  (rounds: {', '.join('%.0f' % t for t in sync_tput)})")
    print(f"  await req.step() trivial, asyncio    : p50 {med(step_p50)*1e3:7.3f} ms")
    if "latencies" in cancel:
        c = cancel["latencies"]
        print(f"  DELETE -> CancelledError in handler  : p50 {pct(c, 0.5)*1e3:7.3f} ms  p99 {pct(c, 0.99)*1e3:7.3f} ms  (n={len(c)})")
    else:
        print(f"  DELETE -> CancelledError in handler  : not measured: {cancel['error']}")


if __name__ == "__main__":
    if os.environ.get("BENCH_ROLE") == "agent":
        agent_main()
    else:
        main()
