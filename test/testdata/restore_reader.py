"""A Python agent that only times its restore (BenchmarkRestartLongTail with
RESTART_AGENT=python): it imports the Python client package (the start-up a
real Python agent pays), heartbeats, and reads each frame through one 1 MiB
buffer. When the last byte of a restore has been read it writes, to
$HOSTILE_OUT, the line the hostile agent's bigstate mode writes:
'restored "?" sha - entries -1 bytes N at NANOS'. It exits at end of input.
"""

import os
import struct
import sys
import threading
import time

import msgpack
import supervisor_agent  # noqa: F401  (the import cost is the point)

out = os.environ["HOSTILE_OUT"]
rfd, wfd = 0, 1
wlock = threading.Lock()


def send(msg):
    b = msgpack.packb(msg)
    with wlock:
        os.write(wfd, struct.pack(">I", len(b)) + b)


def heartbeat():
    while True:
        send({"type": "heartbeat", "timestamp": int(time.time())})
        time.sleep(0.2)


threading.Thread(target=heartbeat, daemon=True).start()
buf = bytearray(1 << 20)
view = memoryview(buf)
inp = os.fdopen(rfd, "rb", buffering=0)


def read_exact(n):
    got = 0
    while got < n:
        k = inp.readinto(view[: min(n - got, len(buf))])
        if not k:
            sys.exit(0)
        got += k


while True:
    h = inp.read(4)
    if not h or len(h) < 4:
        sys.exit(0)
    (size,) = struct.unpack(">I", h)
    read_exact(size)
    if size > 1 << 20:
        with open(out, "a") as f:
            f.write('restored "?" sha - entries -1 bytes %d at %d\n' % (size, time.time_ns()))
