#!/usr/bin/env python3
"""Benchmarks of supervisor_agent through the real supervisor binary.

    cd python && /usr/bin/python3 bench/bench.py [--supervisor PATH]

Builds the supervisor (go build) unless --supervisor is given, runs this same
file as the agent under it (BENCH_ROLE=agent), and prints:
  - log() durable calls per second, 1 thread and 8 threads (each call waits for its wal_ack)
  - log() of a 1 KiB entry, one in flight: p50 and p99 round trip (compare with the
    Go client's BenchmarkWALAck/single ack-p50-µs in the same window)
  - checkpoint() of a 10 MiB state: seconds until acknowledged
  - per-message cost of Agent.send (SDK) beside msgpack.packb + os.write to a pipe
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def agent_main():
    import msgpack
    from supervisor_agent import Agent
    from supervisor_agent.framing import encode_frame

    out = os.environ["BENCH_OUT"]
    res = {}
    with Agent.connect() as agent:
        # warm up
        for _ in range(50):
            agent.log("memory_add", {"content": "warm"})
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 3:
            agent.log("memory_add", {"content": "x" * 100, "n": n})
            n += 1
        res["log_1_thread_per_s"] = n / (time.perf_counter() - t0)

        # The round trip issue 31 compares with the Go client's
        # (test BenchmarkWALAck/single: 1 KiB entries, one in flight): p50, p99.
        lat = []
        for i in range(3000):
            t0 = time.perf_counter()
            agent.log("memory_add", {"content": "x" * 1000, "i": i})
            lat.append(time.perf_counter() - t0)
        lat.sort()
        res["log_1k_p50_us"] = lat[len(lat) // 2] * 1e6
        res["log_1k_p99_us"] = lat[int(len(lat) * 0.99)] * 1e6

        counts = [0] * 8
        stop = time.perf_counter() + 3

        def work(k):
            while time.perf_counter() < stop:
                agent.log("memory_add", {"content": "x" * 100, "k": k})
                counts[k] += 1
        t0 = time.perf_counter()
        ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        res["log_8_threads_per_s"] = sum(counts) / (time.perf_counter() - t0)

        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 3:
            pend = [agent.log_nowait("memory_add", {"content": "x" * 100}) for _ in range(64)]
            pend[-1].wait()
            n += 64
        res["log_nowait_64_in_flight_per_s"] = n / (time.perf_counter() - t0)

        state = {"blocks": [{"id": i, "text": os.urandom(512).hex()} for i in range(10 * 1024)]}  # ~10.5 MiB
        res["checkpoint_state_bytes"] = len(msgpack.packb(state, use_bin_type=True))
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            agent.checkpoint(state)
            times.append(time.perf_counter() - t0)
        res["checkpoint_10MiB_seconds"] = sorted(times)

        # per-message overhead: SDK send vs raw packb + write, both into a pipe drained by a thread
        r, w = os.pipe()
        threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(r, 1 << 16), b"")], daemon=True).start()
        wf = open(w, "wb", buffering=0)
        msg = {"type": "wal_entry", "data": {"operation": "memory_add", "params": {"content": "x" * 100}, "sequence": 1}}
        N = 50000
        t0 = time.perf_counter()
        for _ in range(N):
            b = msgpack.packb(dict(msg, timestamp=int(time.time())), use_bin_type=True)
            os.write(w, len(b).to_bytes(4, "big") + b)
        res["raw_packb_write_us"] = (time.perf_counter() - t0) / N * 1e6
        from supervisor_agent import Agent as A
        sdk = A.__new__(A)  # only the sending half: same code path as Agent.send_raw
        sdk._w, sdk._wlock, sdk.version, sdk._close_reason = wf, threading.Lock(), 2, None
        t0 = time.perf_counter()
        for _ in range(N):
            sdk._send(dict(msg))
        res["sdk_send_us"] = (time.perf_counter() - t0) / N * 1e6
        t0 = time.perf_counter()
        for _ in range(N):
            encode_frame(dict(msg, timestamp=1))
        res["encode_frame_only_us"] = (time.perf_counter() - t0) / N * 1e6
    with open(out, "w") as f:
        json.dump(res, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--supervisor")
    ap.add_argument("--wal-sync", default="batch")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sdk-bench-")
    binary = args.supervisor
    if not binary:
        binary = os.path.join(tmp, "supervisor")
        subprocess.run(["go", "build", "-o", binary, "./cmd/supervisor"], cwd=os.path.join(HERE, "..", ".."), check=True)
    out = os.path.join(tmp, "result.json")
    env = dict(os.environ, BENCH_ROLE="agent", BENCH_OUT=out, PYTHONPATH=os.path.join(HERE, ".."))
    p = subprocess.Popen([binary, "run", "--data-dir", os.path.join(tmp, "data"), "--http-addr", "",
                          "--wal-sync", args.wal_sync, "--restart", "never", "--",
                          sys.executable, os.path.abspath(__file__)], env=env,
                         stderr=open(os.path.join(tmp, "supervisor.log"), "wb"))
    deadline = time.time() + 300
    while not os.path.exists(out) and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    p.terminate()
    p.wait(30)
    if not os.path.exists(out):
        sys.exit(f"benchmark agent produced no result; see {tmp}/supervisor.log")
    res = json.load(open(out))
    print(f"supervisor_agent benchmark (python {sys.version.split()[0]}, --wal-sync {args.wal_sync}, data dir {tmp})")
    print(f"  log() durable, 1 thread        : {res['log_1_thread_per_s']:9.0f} calls/s")
    print(f"  log() 1 KiB, one in flight     : p50 {res['log_1k_p50_us']:.0f} us, p99 {res['log_1k_p99_us']:.0f} us")
    print(f"  log() durable, 8 threads       : {res['log_8_threads_per_s']:9.0f} calls/s")
    print(f"  log_nowait x64 then wait last  : {res['log_nowait_64_in_flight_per_s']:9.0f} entries/s")
    ct = res["checkpoint_10MiB_seconds"]
    print(f"  checkpoint() {res['checkpoint_state_bytes'] / 2**20:.1f} MiB state   : "
          f"best {ct[0]*1000:.0f} ms, median {ct[1]*1000:.0f} ms, worst {ct[2]*1000:.0f} ms (until checkpoint_ack)")
    print(f"  raw msgpack.packb + os.write   : {res['raw_packb_write_us']:9.2f} us/message")
    print(f"  SDK send (frame + lock + write): {res['sdk_send_us']:9.2f} us/message")
    print(f"  SDK encode_frame only          : {res['encode_frame_only_us']:9.2f} us/message")


if __name__ == "__main__":
    if os.environ.get("BENCH_ROLE") == "agent":
        agent_main()
    else:
        main()
