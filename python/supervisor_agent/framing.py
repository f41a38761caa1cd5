"""Length-prefixed MessagePack framing (4-byte big-endian length)."""
import struct
from typing import Any, BinaryIO, Dict, Optional

import msgpack

from .errors import ProtocolError

DEFAULT_MAX_FRAME = 128 << 20
_CHUNK = 1 << 20


def read_exact(f: BinaryIO, n: int) -> bytes:
    """Read n bytes, growing the buffer chunk by chunk (never allocating n up front)."""
    parts = []
    got = 0
    while got < n:
        c = f.read(min(n - got, _CHUNK))
        if not c:
            raise ProtocolError(f"truncated frame: input ended after {got} of {n} bytes")
        parts.append(c)
        got += len(c)
    return b"".join(parts)


def read_frame(f: BinaryIO, max_frame: int = DEFAULT_MAX_FRAME) -> Optional[Dict[str, Any]]:
    """One frame as a dict; None on a clean end of input between frames."""
    h = f.read(4)
    while h and len(h) < 4:
        c = f.read(4 - len(h))
        if not c:
            break
        h += c
    if not h:
        return None
    if len(h) < 4:
        raise ProtocolError(f"truncated frame: input ended inside the length prefix ({len(h)} of 4 bytes)")
    (n,) = struct.unpack(">I", h)
    if n == 0:
        raise ProtocolError("invalid frame: zero length")
    if n > max_frame:
        raise ProtocolError(f"invalid frame: length {n} exceeds the maximum of {max_frame} bytes")
    body = read_exact(f, n)
    try:
        # A str that is not UTF-8 (the supervisor never sends one, but an older
        # one quoted the agent's own bytes in error replies) becomes text with
        # \xNN escapes instead of killing the reader.
        m = msgpack.unpackb(body, raw=False, strict_map_key=False, unicode_errors="backslashreplace")
    except Exception as e:  # ExtraData, FormatError, StackError, ValueError...
        raise ProtocolError(f"invalid frame payload: {e.__class__.__name__}: {e}") from None
    if not isinstance(m, dict):
        raise ProtocolError(f"invalid frame payload: not a map but {type(m).__name__}")
    return m


def encode_frame(msg: Dict[str, Any]) -> bytes:
    b = msgpack.packb(msg, use_bin_type=True)
    return struct.pack(">I", len(b)) + b
