import io
import struct

import msgpack
import pytest

from supervisor_agent import ProtocolError, read_frame, encode_frame


class CountingReader(io.BytesIO):
    """Records the largest read size asked for (a declared length must not be allocated up front)."""

    def __init__(self, b):
        super().__init__(b)
        self.max_ask = 0

    def read(self, n=-1):
        self.max_ask = max(self.max_ask, n)
        return super().read(n)


def frame(obj):
    return encode_frame(obj)


def test_round_trip():
    m = {"type": "wal_ack", "timestamp": 1, "sequence": 7}
    assert read_frame(io.BytesIO(frame(m))) == m


def test_clean_end_between_frames_is_none():
    f = io.BytesIO(frame({"type": "x"}))
    assert read_frame(f) == {"type": "x"}
    assert read_frame(f) is None


def test_truncated_prefix():
    with pytest.raises(ProtocolError, match="inside the length prefix"):
        read_frame(io.BytesIO(b"\x00\x00"))


def test_truncated_body():
    b = frame({"type": "wal_ack", "sequence": 1})
    with pytest.raises(ProtocolError, match="truncated frame"):
        read_frame(io.BytesIO(b[:-3]))


def test_zero_length():
    with pytest.raises(ProtocolError, match="zero length"):
        read_frame(io.BytesIO(b"\x00\x00\x00\x00"))


def test_oversized_length_refused_before_reading():
    f = CountingReader(struct.pack(">I", 0xFFFFFFFF) + b"\x81")
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        read_frame(f)
    assert f.max_ask <= 4


def test_large_declared_length_not_allocated_up_front():
    # within the cap but the stream ends early: reads are chunked, error is clear
    f = CountingReader(struct.pack(">I", 100 << 20) + b"\x80" * 10)
    with pytest.raises(ProtocolError, match="truncated frame: input ended after 10 of"):
        read_frame(f)
    assert f.max_ask <= 1 << 20


def test_custom_cap():
    with pytest.raises(ProtocolError, match="maximum of 16"):
        read_frame(io.BytesIO(frame({"k": "x" * 40})), max_frame=16)


@pytest.mark.parametrize("body", [b"\xc1", b"\x81\xa1k", b"\x80\x80", b"\x92\x01\x02", b"\xa3abc"])
def test_garbage_payload(body):
    with pytest.raises(ProtocolError, match="invalid frame payload"):
        read_frame(io.BytesIO(struct.pack(">I", len(body)) + body))


def test_deep_nesting_is_protocol_error():
    body = b"\x91" * 100000 + b"\x80"
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(struct.pack(">I", len(body)) + body))


def test_bin_and_non_string_keys_survive():
    m = {"type": "restore", "snapshot": {1: b"\x00\xff", "f": 1.5}}
    assert read_frame(io.BytesIO(frame(m))) == m
