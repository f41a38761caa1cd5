#!/usr/bin/python3
"""Interop peer for the Go schema package, written against python3-msgpack.

    interop.py agent        write every agent message type as frames on stdout,
                            each preceded by a frame holding the case name
    interop.py supervisor   read supervisor frames on stdin, decode each with
                            msgpack and print one JSON object per line

Compressed cases need python3-zstandard; without it they are left out and
"zstd unavailable" is written to stderr.
"""
import base64
import json
import struct
import sys

import msgpack

try:
    import zstandard
except ImportError:  # the Go test decides whether that is acceptable
    zstandard = None

TS = 1705392000


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def pack(obj, single_float=False):
    return msgpack.packb(obj, use_bin_type=True, use_single_float=single_float)


def agent_cases():
    """(name, payload) for every agent message type, with the encodings
    python-msgpack produces for various values: fixint, uint8..uint64,
    negative ints, float32 and float64, str8/16/32, map16, array16."""
    params = {"content": "User asked about weather", "metadata": {"source": "conversation"}, "importance": 0.7}
    yield "heartbeat", pack({"type": "heartbeat", "timestamp": TS})
    yield "heartbeat_fixint_ts", pack({"type": "heartbeat", "timestamp": 5})
    yield "heartbeat_uint8_ts", pack({"type": "heartbeat", "timestamp": 200})
    yield "heartbeat_uint16_ts", pack({"type": "heartbeat", "timestamp": 60000})
    yield "heartbeat_uint64_ts", pack({"type": "heartbeat", "timestamp": 2**40})
    yield "heartbeat_negative_ts", pack({"type": "heartbeat", "timestamp": -100})
    yield "heartbeat_accepts", pack({"type": "heartbeat", "timestamp": TS, "accepts": ["cancel_request"]})
    yield "heartbeat_v2_metadata", pack({"type": "heartbeat", "timestamp": TS, "version": 2, "metadata": {"k": "v"}})
    yield "checkpoint", pack({"type": "checkpoint", "timestamp": TS, "data": {
        "agent_state": {"id": "a1", "name": "agent", "version": "1.0", "status": "thinking"},
        "memory_blocks": [{"id": "m1", "text": "t", "embedding": [0.1, 0.2], "importance": 0.5, "access_count": 10, "created": TS}],
        "tool_registry": {"tools": [{"name": "calc", "params": ["expression"], "doc": "d", "unsafe": False}]},
        "conversation_history": [{"role": "user", "content": "hi", "timestamp": TS}],
        "metrics": {"total_requests": 1000, "avg_latency": 10.5, "error_count": 5},
        "blob": b"\x00\x01binary",
        "long_text": "x" * 70000,  # str32
    }})
    yield "wal_entry_uint16_seq", pack({"type": "wal_entry", "timestamp": TS, "data": {"operation": "memory_add", "params": params, "sequence": 12345}})
    yield "wal_entry_uint32_seq", pack({"type": "wal_entry", "timestamp": TS, "data": {"operation": "tool_register", "params": {"name": "calculator"}, "sequence": 70000}})
    yield "wal_entry_uint64_seq", pack({"type": "wal_entry", "timestamp": TS, "data": {"operation": "state_update", "params": {"status": "thinking"}, "sequence": 2**63 - 1}})
    yield "wal_entry_fixint_seq", pack({"type": "wal_entry", "timestamp": TS, "data": {"operation": "memory_add", "params": {}, "sequence": 1}})
    yield "wal_batch_20", pack({"type": "wal_batch", "timestamp": TS, "data": [
        {"operation": "memory_add", "params": {"i": i}, "sequence": 100 + i} for i in range(20)]})  # array16
    yield "evolution_intent", pack({"type": "evolution_intent", "timestamp": TS, "hypothesis": {
        "reason": "Optimize memory search with SIMD", "target": "memory_system", "new_code": "(def (memory-search ...) ...)",
        "expected_improvement": {"latency": -0.20, "memory": 0, "accuracy": 0.1}}})
    yield "metrics_float64", pack({"type": "metrics", "timestamp": TS, "data": {
        "avg_latency": 10.5, "p50_latency": 8.0, "p95_latency": 25.0, "p99_latency": 50.0, "error_rate": 0.01,
        "memory_usage": 80000000, "throughput": 1000, "active_tools": 5, "memory_blocks": 1000}})
    yield "metrics_float32", pack({"type": "metrics", "timestamp": TS, "data": {"avg_latency": 10.5, "error_rate": 0.25}}, single_float=True)
    yield "metrics_map16", pack({"type": "metrics", "timestamp": TS, "data": {"g%02d" % i: i for i in range(20)}})
    yield "error", pack({"type": "error", "timestamp": TS, "error": {"code": "TOOL_FAILED", "message": "boom", "stack_trace": "line 1", "context": {"tool": "calc"}}})
    if zstandard is not None:
        data = {"agent_state": {"status": "idle"}, "blob": "state " * 10000}
        z = zstandard.ZstdCompressor().compress(pack(data))
        yield "checkpoint_zstd_bin", pack({"type": "checkpoint", "timestamp": TS, "version": 2, "compressed": True, "compression": "zstd", "data": z})
        yield "checkpoint_zstd_base64", pack({"type": "checkpoint", "timestamp": TS, "version": 2, "compressed": True, "compression": "zstd",
                                              "data": base64.b64encode(z).decode()})
        stream = zstandard.ZstdCompressor().compressobj()
        zs = stream.compress(pack(data)) + stream.flush()  # no content size in the header
        yield "checkpoint_zstd_stream", pack({"type": "checkpoint", "timestamp": TS, "version": 2, "compressed": True, "compression": "zstd", "data": zs})
    else:
        sys.stderr.write("zstd unavailable\n")


def agent():
    out = sys.stdout.buffer
    for name, payload in agent_cases():
        out.write(frame(pack(name)))
        out.write(frame(payload))
    out.flush()


def plain(v):
    """JSON-friendly: bytes become {"bin": base64}."""
    if isinstance(v, bytes):
        return {"bin": base64.b64encode(v).decode()}
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def supervisor():
    inp = sys.stdin.buffer
    while True:
        hdr = inp.read(4)
        if not hdr:
            return
        if len(hdr) != 4:
            sys.exit("truncated header")
        (n,) = struct.unpack(">I", hdr)
        payload = inp.read(n)
        if len(payload) != n:
            sys.exit("truncated payload")
        # strict_map_key: every map key must be a str or bytes; raw=False: str is UTF-8.
        msg = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        if msg.get("compressed"):
            if zstandard is None:
                sys.exit("compressed frame but zstandard unavailable")
            body = zstandard.ZstdDecompressor().decompress(msg["snapshot"])
            msg["snapshot"] = msgpack.unpackb(body, raw=False)
        print(json.dumps(plain(msg), sort_keys=True), flush=True)


if __name__ == "__main__":
    {"agent": agent, "supervisor": supervisor}[sys.argv[1]]()
