#!/usr/bin/env python3
"""A scripted agent for the restore-invariant tests, written from
docs/protocol.md with python3-msgpack only.

Its state is the set of WAL sequences it has applied. A checkpoint holds
that set; a restore gives it back (snapshot ∪ WAL entries), so a test can
compare what was restored with what the agent sent and was not refused.

Environment:
  AGENT_REPORT   JSON-lines file it appends what happened to (start with the
                 restore it got, sent entries, acks, errors).
  AGENT_PLAN     JSON list of plans, one per incarnation (the last repeats);
                 a plan is a list of steps:
                   {"log": N, "size": S, "from": K, "rate": R, "tag": T}  N
                       entries of about S bytes, numbered from K (default:
                       above the restore's last_sequence), R per second (0 =
                       flat out); T makes their contents differ from earlier
                       entries with the same sequences
                   {"entry": SEQ, "size": S}   one entry with that sequence
                   {"checkpoint": true, "pad": B}  checkpoint (B bytes of padding),
                       wait for its ack or error
                   {"sleep": SECONDS}
                   {"wait_file": PATH}         until PATH exists
                   {"crash": CODE}             exit at once
                   {"stay": true}              heartbeat until shutdown (reports "staying")
  AGENT_VERSION  protocol version to put in every message (default 1).
  AGENT_NO_FINAL_CHECKPOINT  "1": do not checkpoint on shutdown.
  AGENT_HB       heartbeat interval in seconds (default 0.2).
"""
import json
import os
import struct
import sys
import threading
import time

import msgpack

inp = sys.stdin.buffer
out = sys.stdout.buffer
if os.environ.get("SUPERVISOR_TRANSPORT") == "fd":
    inp, out = os.fdopen(3, "rb"), os.fdopen(4, "wb")

REPORT = os.environ["AGENT_REPORT"]
VERSION = int(os.environ.get("AGENT_VERSION", "1"))
HB = float(os.environ.get("AGENT_HB", "0.2"))
wlock = threading.Lock()
rlock = threading.Lock()


def report(**ev):
    ev["pid"] = os.getpid()
    ev["t"] = time.time()
    with rlock, open(REPORT, "a") as f:
        f.write(json.dumps(ev) + "\n")


def send(msg):
    msg.setdefault("timestamp", int(time.time()))
    if VERSION != 1:
        msg["version"] = VERSION
    b = msgpack.packb(msg, use_bin_type=True)
    with wlock:
        out.write(struct.pack(">I", len(b)) + b)
        out.flush()


def read_exact(n):
    b = b""
    while len(b) < n:
        c = inp.read(n - len(b))
        if not c:
            return None
        b += c
    return b


def read_frame():
    h = read_exact(4)
    if h is None:
        return None
    (n,) = struct.unpack(">I", h)
    b = read_exact(n)
    if b is None:
        return None
    return msgpack.unpackb(b, raw=False, strict_map_key=False)


def decompress(body):
    import zstandard  # only a v2 agent receives compressed restores

    return zstandard.ZstdDecompressor().decompress(body, max_output_size=256 << 20)


incarnation = 0
try:
    with open(REPORT) as f:
        incarnation = sum(1 for line in f if '"event": "start"' in line)
except FileNotFoundError:
    pass
plans = json.loads(os.environ.get("AGENT_PLAN", "[[{\"stay\": true}]]"))
plan = plans[min(incarnation, len(plans) - 1)]

applied = set()
last_sequence = 0
restore_info = None
if os.environ.get("AGENT_REPORT_LAUNCH") == "1":
    # Before anything is read: with --spawn-during-recovery the process
    # may run while the supervisor is still recovering.
    report(event="launch", restore_pending=os.environ.get("SUPERVISOR_RESTORE_PENDING"))
if os.environ.get("SUPERVISOR_RESTORE_PENDING") == "1":
    m = read_frame()
    assert m is not None and m["type"] == "restore", m
    snap = m["snapshot"]
    if m.get("compressed"):
        snap = msgpack.unpackb(decompress(snap), raw=False, strict_map_key=False)
    seqs = list(snap.get("seqs", []))
    entries = [e["sequence"] for e in m["wal_entries"]]
    applied.update(seqs)
    applied.update(entries)
    last_sequence = m.get("last_sequence", max(entries + seqs + [0]))
    restore_info = {
        "checkpoint_id": m["checkpoint_id"],
        "snapshot_seqs": seqs,
        "entries": entries,
        "last_sequence": last_sequence,
        "compressed": bool(m.get("compressed")),
        "snapshot_keys": sorted(snap.keys()),
    }
report(event="start", incarnation=incarnation, restore=restore_info)

acks = {}
cp_max = {}  # the highest sequence the checkpoint in flight holds
ack_cv = threading.Condition()
stopping = threading.Event()


def reader():
    while True:
        m = read_frame()
        if m is None:
            os._exit(0)
        t = m.get("type")
        if t == "checkpoint_ack":
            report(event="ack", checkpoint_id=m["checkpoint_id"], covers=cp_max.get("v", 0))
            with ack_cv:
                acks["last"] = ("ack", m["checkpoint_id"])
                ack_cv.notify_all()
        elif t == "error":
            e = m["error"]
            report(event="error", code=e["code"], message=e["message"][:300], details=e.get("details") or {})
            if e["code"] == "CHECKPOINT_FAILED":
                with ack_cv:
                    acks["last"] = ("error", e["code"])
                    ack_cv.notify_all()
        elif t == "shutdown":
            stopping.set()
            if m.get("create_checkpoint") and os.environ.get("AGENT_NO_FINAL_CHECKPOINT") != "1":
                checkpoint(0, wait=False)
            time.sleep(0.2)
            os._exit(0)


def heartbeats():
    while True:
        send({"type": "heartbeat"})
        time.sleep(HB)


def entry(seq, size, tag=""):
    params = {"seq": seq, "pad": "x" * size}
    if tag:
        params["tag"] = tag
    return {"operation": "memory_add", "params": params, "sequence": seq}


def checkpoint(pad, wait=True):
    data = {"seqs": sorted(applied)}
    if pad:
        data["pad"] = "p" * pad
    with ack_cv:
        acks.pop("last", None)
        cp_max["v"] = max(applied, default=0)
    send({"type": "checkpoint", "data": data})
    report(event="checkpoint_sent", applied=len(applied), max=max(applied, default=0))
    if wait:
        with ack_cv:
            ack_cv.wait_for(lambda: "last" in acks, timeout=60)


threading.Thread(target=reader, daemon=True).start()
threading.Thread(target=heartbeats, daemon=True).start()

nxt = last_sequence + 1
for step in plan:
    if "log" in step:
        n, size = step["log"], step.get("size", 100)
        if "from" in step:
            nxt = step["from"]
        rate = step.get("rate", 0)
        sent = []
        for i in range(n):
            send({"type": "wal_entry", "data": entry(nxt, size, step.get("tag", ""))})
            applied.add(nxt)
            sent.append(nxt)
            nxt += 1
            if rate:
                time.sleep(1.0 / rate)
            if len(sent) == 50 and i < n - 1:
                report(event="sent", seqs=sent)  # in chunks: a kill mid-step leaves a record
                sent = []
        report(event="sent", seqs=sent)
    elif "entry" in step:
        seq = step["entry"]
        send({"type": "wal_entry", "data": entry(seq, step.get("size", 100))})
        report(event="sent", seqs=[seq], explicit=True)
    elif "checkpoint" in step:
        checkpoint(step.get("pad", 0))
    elif "sleep" in step:
        time.sleep(step["sleep"])
    elif "wait_file" in step:
        while not os.path.exists(step["wait_file"]):
            time.sleep(0.05)
    elif "crash" in step:
        report(event="crash", code=step["crash"])
        os._exit(step["crash"])
    elif "stay" in step:
        report(event="staying")
        while True:
            time.sleep(1)
report(event="plan_done")
while True:
    time.sleep(1)
