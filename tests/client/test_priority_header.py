"""The client's priority hint: sent as ``X-RMServe-Priority`` on every request, read by the
server, and handed to the engine as its request priority (interactive 0, batch 1)."""

from __future__ import annotations

import pytest
from aiohttp import web
from rmserve.client.client import PRIORITY_HEADER, RewardClient
from rmserve.client.config import Retry, Timeouts
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from testkit.fakes import FakeRenderer, PriorityEngine


def _client(http, priority):
    return RewardClient(
        str(http.make_url("")), session=http.session, priority=priority,
        timeouts=Timeouts(connect_s=5, sock_read_s=30, total_s=30, probe_s=5), retry=Retry(max_attempts=1),
    )


def test_the_header_name_is_the_one_the_server_reads():
    from rmserve.server.sharing.fair_queue import PRIORITY_HEADER as SERVER_HEADER

    assert PRIORITY_HEADER == SERVER_HEADER == "X-RMServe-Priority"


def test_an_unknown_priority_is_refused():
    with pytest.raises(ValueError, match="priority: 'urgent' is not one of interactive, batch"):
        RewardClient("http://127.0.0.1:9", priority="urgent")


@pytest.mark.parametrize(("priority", "header"), [("interactive", "interactive"), ("batch", "batch"), (None, None)])
async def test_every_request_carries_the_header(aiohttp_client, priority, header):
    seen = []

    async def health(request: web.Request) -> web.Response:
        seen.append(request.headers.get(PRIORITY_HEADER))
        return web.json_response({"status": "ready", "version": "1"})

    app = web.Application()
    app.router.add_get("/health", health)
    http = await aiohttp_client(app)
    async with _client(http, priority) as client:
        await client.health()
        await client.health()
    assert seen == [header, header]


@pytest.mark.parametrize(("fair_share", "priority", "expected"), [
    (True, "interactive", 0), (True, "batch", 1), (True, None, 1), (False, "interactive", 0), (False, None, 1),
])
async def test_the_engine_gets_the_priority_of_the_header(aiohttp_client, make_groups, fair_share, priority, expected):
    engine = PriorityEngine()
    app = create_app(ServerConfig(port=0, fair_share=fair_share), engine, FakeRenderer())
    http = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    async with _client(http, priority) as client:
        reply = await client.score(make_groups(3))
    assert len(reply.results) == 3
    assert engine.priorities == [expected] * 3
