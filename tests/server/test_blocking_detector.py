"""The blocking-call detector of the server tests (``no_blocking_calls`` in ``tests/conftest.py``).

It is on for every fast test in this folder; this test shows that it catches a blocking call
made on the event loop under a server frame, so a quiet server test suite means something.
"""

from __future__ import annotations

import time

from testkit.fakes import FakeEngine, FakeRenderer
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app


class SleepingStartEngine(FakeEngine):
    """A fake engine whose start sleeps on the event loop (what the detector exists to catch)."""

    async def start(self) -> None:
        time.sleep(0.001)
        await super().start()


async def test_a_blocking_call_on_the_loop_is_caught(aiohttp_client):
    app = create_app(ServerConfig(port=0), SleepingStartEngine(), FakeRenderer())
    client = await aiohttp_client(app)
    state = app[STATE_KEY]
    await state.settled.wait()
    # The server's start-up awaits engine.start(); the detector raises inside it, and the
    # server records that as a failed start.
    assert state.status == "failed"
    assert f"{type(state.error).__name__}: {state.error}" == "BlockingError: Blocking call to time.sleep"
    async with client.get("/health") as resp:
        assert resp.status == 503
