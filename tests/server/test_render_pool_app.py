"""The render pool inside the app (fake engine and renderer, one render thread): a user's
request is decoded and rendered ahead of another user's backlog with fair share on, after
it with fair share off.

Setup of both tests: alice's request a0 holds the only render thread (its render waits on a
gate); alice's a1..a4 then wait to be decoded, and bob's b0 after them. When the gate opens:

- fair share on: the queue alternates between alice and bob; b0's decode and then its
  render each pass alice's waiting jobs after at most two of them, while a1's render is
  queued behind alice's own decodes of a2..a4: renders a0, b0, a1, a2, a3, a4;
- fair share off: the thread pool takes jobs in arrival order: the decodes of a1..a4 and
  b0, then the renders in the order the decodes finished: a0, a1, a2, a3, a4, b0.

Every group has two 1,200-character answers (longer than the fake model's 64 tokens: they
are answered per response and never reach the engine; the render work is the same).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from testkit.app_client import wait_until
from testkit.auth_stub import user_header_middleware
from testkit.fakes import FakeEngine, FakeRenderer
from rmserve.server.http.app import EXECUTOR_KEY, STATE_KEY, ServerConfig, create_app
from rmserve.server.sharing.render_order import pool_of
from rmserve.server.sharing.users import User

USERS = {"alice": User("alice"), "bob": User("bob")}


user_from_test_header = user_header_middleware(USERS)


class OrderRenderer(FakeRenderer):
    """Records the first group id of each request it renders; the first render waits on ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.first_gate = threading.Event()
        self.order: list[str] = []

    def render_request(self, request, **options):
        self.order.append(request.groups[0].id)
        if len(self.order) == 1:
            assert self.first_gate.wait(30), "the test never opened the gate"
        return super().render_request(request, **options)


def body(gid: str) -> dict:
    return {"groups": [{"id": gid, "prompt": "hi", "responses": ["y" * 1200, "z" * 1200]}]}


async def render_order(aiohttp_client, fair_share: bool) -> list[str]:
    renderer = OrderRenderer()
    app = create_app(ServerConfig(port=0, render_threads=1, fair_share=fair_share), FakeEngine(), renderer)
    app.middlewares.append(user_from_test_header)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    pool = pool_of(app)
    assert (pool is not None) == fair_share

    def waiting() -> int:
        if pool is not None:
            return pool.snapshot().queued_groups
        return app[EXECUTOR_KEY]._work_queue.qsize()  # jobs the plain thread pool holds back

    def post(gid: str, user: str) -> asyncio.Task:
        return asyncio.create_task(client.post("/v1/score", json=body(gid), headers={"X-Test-User": user}))

    tasks = [post("a0", "alice")]
    await wait_until(lambda: renderer.order == ["a0"])
    for i in range(1, 5):
        tasks.append(post(f"a{i}", "alice"))
        await wait_until(lambda i=i: waiting() == i)
    tasks.append(post("b0", "bob"))
    await wait_until(lambda: waiting() == 5)
    renderer.first_gate.set()
    responses = await asyncio.gather(*tasks)
    assert [r.status for r in responses] == [200] * 6
    for r in responses:
        r.release()
    return renderer.order


@pytest.mark.parametrize(("fair_share", "expected"), [
    (True, ["a0", "b0", "a1", "a2", "a3", "a4"]),
    (False, ["a0", "a1", "a2", "a3", "a4", "b0"]),
])
async def test_render_threads_serve_a_second_user_ahead_of_a_backlog_only_with_fair_share(
    aiohttp_client, fair_share, expected
):
    assert await render_order(aiohttp_client, fair_share) == expected
