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
