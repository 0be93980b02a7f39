"""Per-user fair order of the render threads' work: decoding bodies, rendering chat templates.

Before a group reaches the engine's :class:`~rmserve.server.sharing.fair_queue.FairQueue`, its request
body is decoded and its conversations rendered and tokenized on the app's render threads
(``EXECUTOR_KEY``, ``ServerConfig.render_threads`` threads). A plain thread pool runs that work
first come, first served, so one user with hundreds of requests in flight would make every
other user's first decode wait behind all of them. With ``ServerConfig.fair_share`` on, the
app's :class:`RenderPool` orders that work per user instead:

- every job (one body to decode, one request to render or, for a generative judge, to plan)
  waits in its user's queue of a :class:`~rmserve.server.sharing.fair_queue.FairQueue` whose
  concurrency is the number of render threads: at most that many jobs are in the thread pool
  at once, so a job handed to the pool starts at once and nothing piles up in the pool's own
  first-come queue;
- when a thread frees, the next job is chosen by the same weighted deficit round robin as the
  engine queue, with the job's *characters* as its cost (:func:`request_chars`: the text the
  tokenizer reads; a body to decode costs its bytes) and :data:`DEFAULT_QUANTUM_CHARS` per
  round for a user of weight 1; within a user, ``interactive`` jobs go before ``batch`` ones,
  and the engine queue's ``interactive_boost`` applies the same way across users;
- so a user who sends a first job while another has a backlog waits for the jobs already in
  the threads and about one job per other user with waiting work (for jobs of at least the
  quantum's size; smaller ones are counted by their characters), not for the backlog;
- a caller that goes away (client disconnect: its task is cancelled) while its job waits
  takes the job out of the queue; a job already in a thread runs to its end (a thread cannot
  be stopped) and keeps its slot until then.

With fair share off the app has no render pool and :func:`run` hands the job straight to the
thread pool, in arrival order, as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web
from rmserve.server.sharing.fair_queue import Caller, FairQueue, QueueState
from rmserve.server.swaps.state import CONFIG_KEY, EXECUTOR_KEY

from rmserve.schema import ScoreRequest

T = TypeVar("T")

DEFAULT_QUANTUM_CHARS = 1024
"""Characters a weight-1 user is credited per round of the render pool's queue. Below the
size of a typical job (a group of a few responses is thousands of characters), so users
alternate job by job; the queue skips rounds that serve nobody, so small values cost nothing."""

RENDER_POOL_KEY = web.AppKey("render_pool", object)
"""Where the app keeps its :class:`RenderPool` (typed ``object``: read it with :func:`pool_of`)."""


def request_chars(request: ScoreRequest) -> int:
    """A request's render cost: the characters of every conversation the renderer reads.

    Each response is rendered after its group's prompt, so a group of ``n`` responses costs
    ``n × prompt characters + Σ response characters`` (prompt = every message's ``content``,
    or ``prompt``). Returns a count ≥ 0.
    """
    total = 0
    for group in request.groups:
        if group.messages is not None:
            prompt = sum(len(m.content) for m in group.messages)
        else:
            prompt = len(group.prompt or "")
        total += prompt * len(group.responses) + sum(len(r) for r in group.responses)
    return total


class RenderPool:
    """Jobs for a thread pool, handed to it per user by weighted deficit round robin.

    Args:
        executor: the thread pool that runs the jobs (only :meth:`submit` is used).
        threads: most jobs handed to ``executor`` at once (≥ 1): its number of threads.
        quantum_chars: characters a weight-1 user is credited per round (≥ 1).
        interactive_boost: factor (≥ 1) on the credit of a user whose next job is
            ``interactive`` (as :class:`~rmserve.server.sharing.fair_queue.FairQueue`).

    Raises:
        ValueError: ``threads`` or ``quantum_chars`` below 1, ``interactive_boost`` below 1.
    """

    def __init__(self, executor: concurrent.futures.Executor, threads: int, *,
                 quantum_chars: int = DEFAULT_QUANTUM_CHARS, interactive_boost: float = 1.0) -> None:
        self.executor = executor
        self.queue = FairQueue(threads, quantum_chars, interactive_boost=interactive_boost)
        """The order of the jobs (its ``concurrency`` is the most jobs in the threads)."""

    async def run(self, caller: Caller, cost: int, fn: Callable[[], T]) -> T:
        """Wait for ``caller``'s turn, run ``fn()`` in a thread and return what it returns.

        Args:
            caller: whose job it is (user and priority hint).
            cost: the job's characters (≥ 0), e.g. :func:`request_chars` or a body's bytes.
            fn: the job; called once, in a thread of ``executor``.

        Raises:
            ValueError: ``cost`` negative.
            asyncio.CancelledError: the caller was cancelled (a waiting job leaves the queue;
                a running one finishes in its thread, holding its slot until then).
            Whatever ``fn`` raises; RuntimeError when ``executor`` is shut down.
        """
        ticket = await self.queue.wait_turn(caller.user, cost, caller.priority)
        loop = asyncio.get_running_loop()
        try:
            future = self.executor.submit(fn)
        except BaseException:
            self.queue.end_turn(ticket)
            raise

        def done(_: concurrent.futures.Future) -> None:  # in the worker thread (or here, if already done)
            try:
                loop.call_soon_threadsafe(self.queue.end_turn, ticket)
            except RuntimeError:  # the loop is closed: the app is gone, nothing waits any more
                pass

        future.add_done_callback(done)
        return await asyncio.wrap_future(future, loop=loop)

    def snapshot(self) -> QueueState:
        """Per-user jobs waiting for and holding render threads now (costs in characters)."""
        return self.queue.snapshot()


def install(app: web.Application, executor: concurrent.futures.Executor) -> None:
    """Put a :class:`RenderPool` over ``executor`` on the app when ``ServerConfig.fair_share``
    is on (``render_threads`` slots, the fair queue's ``interactive_boost``); nothing otherwise."""
    config = app[CONFIG_KEY]
    if config.fair_share:
        app[RENDER_POOL_KEY] = RenderPool(executor, config.render_threads,
                                          interactive_boost=config.fair_share_interactive_boost)


def pool_of(app: web.Application) -> RenderPool | None:
    """The app's :class:`RenderPool`, or None (fair share off, or the app not started)."""
    pool = app.get(RENDER_POOL_KEY)
    return pool if isinstance(pool, RenderPool) else None


async def run(app: web.Application, caller: Caller, cost: int, fn: Callable[[], T]) -> T:
    """Run the job ``fn()`` on the app's render threads and return its result: through the
    app's :class:`RenderPool` when it has one (``caller``'s fair turn, ``cost`` characters),
    else straight on the thread pool (``EXECUTOR_KEY``) in arrival order.

    Raises:
        Whatever ``fn`` raises; see :meth:`RenderPool.run`.
    """
    pool = pool_of(app)
    if pool is None:
        return await asyncio.get_running_loop().run_in_executor(app[EXECUTOR_KEY], fn)
    return await pool.run(caller, cost, fn)
