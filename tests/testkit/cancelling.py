"""Cancelling a scoring task on a real engine and checking the engine aborted its requests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest


async def cancel_in_flight(engine: Any, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` once ``engine`` has a request unfinished (waiting up to 30 s), then check
    the task ends in ``CancelledError`` and, within 10 s, ``engine.num_unfinished_requests()``
    is back to 0 (every engine request of the task aborted).

    Raises:
        AssertionError: the task finished before it could be cancelled, or requests are left.
    """
    deadline = time.monotonic() + 30
    while engine.num_unfinished_requests() == 0 and not task.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    assert not task.done(), "the group finished before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert engine.num_unfinished_requests() == 0
