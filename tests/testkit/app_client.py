"""Starting the real app on a fake engine for the in-process server tests (aiohttp's test client)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from testkit.fakes import FakeRenderer

from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app


async def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Yield to the loop until ``predicate()`` holds (a deadlock guard, not a timing assert)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)


async def fake_app_client(
    aiohttp_client: Callable[..., Any],
    config: ServerConfig,
    engine: Any,
    *,
    renderer: Any = None,
    middlewares: Iterable[Any] = (),
    wait_ready: bool = True,
) -> Any:
    """An aiohttp test client of ``create_app(config, engine, renderer or FakeRenderer())``
    with ``middlewares`` appended; once the model has settled (loaded or failed) unless
    ``wait_ready`` is False. aiohttp's TestServer always runs with handler_cancellation=True,
    as the real server does."""
    app = create_app(config, engine, renderer or FakeRenderer())
    app.middlewares.extend(middlewares)
    client = await aiohttp_client(app)
    if wait_ready:
        await app[STATE_KEY].settled.wait()
    return client


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A Prometheus text page as ``{(sample name, sorted label pairs): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
