"""``RewardClient.score_stream`` closed by its caller while a finished request is not handled yet."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from rmserve.client.client import RewardClient
from rmserve.client.config import Concurrency
from testkit.servers import make_groups

from rmserve import errors
from rmserve.schema import ScoreRecord


async def test_a_failure_left_unhandled_when_the_caller_stops_is_collected():
    # Two requests finish in the same wait: group 0's answered, group 1's failed. The caller
    # stops after the first record; the second request's error must be collected by the
    # stream, not left for the event loop to report as "Task exception was never retrieved".
    groups = make_groups(2)
    client = RewardClient("http://127.0.0.1:9", concurrency=Concurrency(max_groups_in_flight=2, groups_per_request=1))

    async def score_records(batch, **_):
        (group,) = batch
        if group.id == groups[1].id:
            raise errors.EngineError("the engine failed (scripted)")
        return [ScoreRecord(benchmark=group.benchmark, domain=group.domain, id=group.id,
                            num_chosen=group.num_chosen, rewards=(1.0,) * len(group.responses))]

    client._score_records = score_records
    reported: list[str] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    try:
        received = []
        stream = client.score_stream(groups)
        async with contextlib.aclosing(stream):
            async for record in stream:
                received.append(record.id)
                break
        del stream
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert received == [groups[0].id]
    assert reported == []
