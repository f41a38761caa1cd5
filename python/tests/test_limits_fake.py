"""What the supervisor refuses without naming the message: the clients must not lose
track of which answer belongs to which call (FakeSupervisor mirrors the real replies)."""
import asyncio

import pytest

from supervisor_agent import InvalidMessage, NotDurable
from supervisor_agent.testing import MAX_FROM_AGENT, FakeSupervisor

# a plain (version 1) checkpoint just over the supervisor's largest accepted frame:
# the real supervisor skips it unread and answers INVALID_MESSAGE {rule: too_large}
# with no type (checked against the binary: "payload of 104923184 bytes is above
# the largest accepted frame (104873984 bytes)").
BIG = {"blob": b"x" * (MAX_FROM_AGENT + (32 << 10))}


def test_sync_oversized_checkpoint_does_not_steal_the_next_ack():
    with FakeSupervisor() as sup:
        agent = sup.agent(version=1)
        with pytest.raises((InvalidMessage, NotDurable)):
            agent.checkpoint(BIG, timeout=3)
        # the next checkpoint is stored and acknowledged: it must say so
        assert agent.checkpoint({"small": 1}, timeout=3)
        assert sup.checkpoint == {"small": 1}


def test_aio_oversized_checkpoint_does_not_steal_the_next_ack():
    async def main():
        with FakeSupervisor() as sup:
            async with sup.async_agent(version=1) as agent:
                with pytest.raises((InvalidMessage, NotDurable)):
                    await agent.checkpoint(BIG, timeout=3)
                assert await agent.checkpoint({"small": 1}, timeout=3)
                assert sup.checkpoint == {"small": 1}
    asyncio.run(asyncio.wait_for(main(), 30))


# what the supervisor answers a wal_batch holding an entry over the wal_entry limit
# (schema/decode.go: rule too_large, field data[i], type wal_batch, no sequence)
BATCH_REFUSAL = {"type": "error", "error": {
    "code": "INVALID_MESSAGE", "details": {"type": "wal_batch", "field": "data[0]", "rule": "too_large"},
    "message": "invalid message: wal_batch.data[0]: entry of 20085 bytes is over the 10240-byte wal_entry limit (too_large)"}}
BIG_ENTRY = [("memory_add", {"big": "x" * 20000})]


def test_sync_oversized_batch_entry_does_not_fail_the_entry_in_flight_beside_it():
    with FakeSupervisor() as sup:
        agent = sup.agent()
        sup.hold_acks = True
        p1 = agent.log_nowait("memory_add", {"n": 1})
        sup.wait_for(lambda s: 1 in s.wal)
        try:
            pb = agent.log_batch_nowait(BIG_ENTRY)
        except InvalidMessage:
            pb = None
        if pb is not None:  # sent: refused as the supervisor refuses it, naming no sequence
            sup.send(dict(BATCH_REFUSAL))
            with pytest.raises(InvalidMessage):
                pb.wait(5)
        sup.release_acks()
        assert p1.wait(5) == 1  # entry 1 is durable: it must not raise the batch's error


def test_aio_oversized_batch_entry_does_not_fail_the_entry_in_flight_beside_it():
    async def main():
        with FakeSupervisor() as sup:
            async with sup.async_agent(heartbeat_interval=0) as agent:
                sup.hold_acks = True
                t1 = asyncio.ensure_future(agent.log("memory_add", {"n": 1}, timeout=5))
                await asyncio.sleep(0.1)
                tb = asyncio.ensure_future(agent.log_batch(BIG_ENTRY, timeout=5))
                await asyncio.sleep(0.1)
                if any(m["type"] == "wal_batch" for m in sup.received):
                    # sent: refused as the supervisor refuses it, naming no sequence
                    sup.send(dict(BATCH_REFUSAL))
                with pytest.raises(InvalidMessage):
                    await tb
                sup.release_acks()
                assert await t1 == 1
    asyncio.run(asyncio.wait_for(main(), 30))
