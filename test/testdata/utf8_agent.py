#!/usr/bin/env python3
"""An agent that sends messages whose strings (keys and values) are not
UTF-8, and reads every frame the supervisor sends with a strict decoder
(msgpack raw=False), as the Python client does. It reports to $AGENT_REPORT,
one line per fact:

  frame TYPE JSON        a frame that decoded (JSON: its error body, if any)
  undecodable REPR       a frame a strict decoder refused
  sent N                 after the N hostile messages went out

It never crashes on a frame: the test counts what it saw.
"""
import json
import os
import struct
import sys
import threading
import time

import msgpack

inp, out = sys.stdin.buffer, sys.stdout.buffer
REPORT = os.environ["AGENT_REPORT"]
lock = threading.Lock()


def report(line):
    with lock, open(REPORT, "a") as f:
        f.write(line + "\n")


def X(b):
    """A str whose bytes are b, UTF-8 or not (surrogateescape)."""
    return b.decode("utf-8", "surrogateescape")


def send_raw(payload):
    with lock:
        out.write(struct.pack(">I", len(payload)) + payload)
        out.flush()


packer_lock = threading.Lock()


def pack(msg):
    msg.setdefault("timestamp", int(time.time()))
    with packer_lock:
        return msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape").pack(msg)


def read_exact(n):
    b = b""
    while len(b) < n:
        c = inp.read(n - len(b))
        if not c:
            return None
        b += c
    return b


def reader():
    while True:
        h = read_exact(4)
        if h is None:
            os._exit(0)
        (n,) = struct.unpack(">I", h)
        b = read_exact(n)
        if b is None:
            os._exit(0)
        try:
            m = msgpack.unpackb(b, raw=False)
        except Exception as e:  # what a strict client would die of
            report("undecodable " + repr(e) + " " + repr(b[:200]))
            continue
        err = m.get("error") if m.get("type") == "error" else None
        report("frame %s %s" % (m.get("type"), json.dumps(err)))


def heartbeats():
    while True:
        send_raw(pack({"type": "heartbeat"}))
        time.sleep(0.2)


threading.Thread(target=reader, daemon=True).start()
threading.Thread(target=heartbeats, daemon=True).start()

# A map with the same (non-UTF-8) key twice: built by hand, since a dict
# cannot hold it twice.
dup = msgpack.packb({"type": "metrics", "timestamp": int(time.time())}, use_bin_type=True)
dup = bytes([0x83]) + dup[1:] + msgpack.packb("data") + bytes([0x82]) + (
    msgpack.packb(X(b"k\xff"), unicode_errors="surrogateescape") + msgpack.packb(1)) * 2

hostile = [
    # a metrics key that is not UTF-8, with a value of the wrong type:
    # the reply names the field by its key path
    pack({"type": "metrics", "data": {X(b"lat\xff\xfency"): "slow"}}),
    dup,
    # values that are not UTF-8 where the reply quotes them
    pack({"type": X(b"heart\xc3beat")}),
    pack({"type": "wal_entry", "data": {"sequence": 1, "operation": X(b"op\xff"), "params": {}}}),
    pack({"type": "checkpoint", "data": {"agent_state": {"status": X(b"\xed\xa0\x80idle")}}}),
    pack({"type": "wal_entry", "data": {"sequence": 0, X(b"\xfe"): X(b"\xff")}}),
]
time.sleep(0.5)
for p in hostile:
    send_raw(p)
report("sent %d" % len(hostile))
while True:
    time.sleep(1)
