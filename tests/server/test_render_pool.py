"""The render pool: the order in which jobs of several users reach the render threads.

A :class:`ManualExecutor` stands in for the thread pool: it records each job handed to it
and runs one only when the test says so, so the order of hand-overs is exact (no threads,
no timing). Orders below are worked out by hand from deficit round robin (quantum 100 unless
said otherwise; every job costs 100).
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from aiohttp import web
from rmserve.server.sharing import render_order
from rmserve.server.config import ServerConfig
from rmserve.server.sharing.fair_queue import Caller
from rmserve.server.sharing.render_order import RenderPool, pool_of, request_chars
from rmserve.server.swaps.state import CONFIG_KEY, EXECUTOR_KEY
from rmserve.server.sharing.users import User

from rmserve.schema import Message, RequestGroup, ScoreRequest

A = Caller(User("A"))
B = Caller(User("B"))
B2 = Caller(User("B", weight=2.0))


class ManualExecutor(concurrent.futures.Executor):
    """Records submitted jobs; :meth:`finish` runs the oldest unfinished one in this thread.

    Args:
        start: mark each job running when submitted (as a thread that picked it up at once:
            it can no longer be cancelled).
    """

    def __init__(self, start: bool = False) -> None:
        self.start = start
        self.jobs: list[tuple[object, concurrent.futures.Future]] = []
        self.labels: list[str] = []
        self.done = 0

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.start:
            future.set_running_or_notify_cancel()
        self.jobs.append((fn, future))
        self.labels.append(getattr(fn, "label", "?"))
        return future

    def finish(self) -> None:
        fn, future = self.jobs[self.done]
        self.done += 1
        if not future.cancelled():
            try:
                future.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - handed to the waiter
                future.set_exception(exc)


def job(label: str, result: object = None, error: Exception | None = None):
    def fn():
        if error is not None:
            raise error
        return label if result is None else result

    fn.label = label
    return fn


class Jobs:
    """Tasks running jobs through a pool (or the app-level :func:`render_order.run`)."""

    def __init__(self, executor: ManualExecutor, runner) -> None:
        self.executor = executor
        self.runner = runner
        self.tasks: dict[str, asyncio.Task] = {}

    async def add(self, caller: Caller, label: str, cost: int = 100) -> None:
        self.tasks[label] = asyncio.create_task(self.runner(caller, cost, job(label)))
        for _ in range(3):
            await asyncio.sleep(0)  # enqueued (or handed over) in this order

    async def drain(self) -> list[str]:
        """Finish the jobs one at a time, oldest hand-over first, until every task is done;
        returns the labels in the order they were handed over. (No job is added meanwhile,
        so each hand-over is decided by the queue alone, whatever the loop's timing.)"""
        async with asyncio.timeout(10):  # a deadlock guard, not a timing assert
            while not all(t.done() for t in self.tasks.values()):
                if self.executor.done < len(self.executor.jobs):
                    self.executor.finish()
                await asyncio.sleep(0)
        results = await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        assert [r for r in results if not isinstance(r, str)] == []
        return self.executor.labels


def pool_jobs(threads: int, quantum: int = 100, *, boost: float = 1.0, start: bool = False) -> tuple[RenderPool, Jobs]:
    executor = ManualExecutor(start=start)
    pool = RenderPool(executor, threads, quantum_chars=quantum, interactive_boost=boost)
    return pool, Jobs(executor, pool.run)


async def test_a_late_user_is_served_within_threads_plus_one_hand_overs():
    # 2 threads. a1, a2 go straight to the threads (A alone: +100 each, A leaves the ring).
    # a3..a20 wait; b1 joins the ring [A, B]. a1 ends: A +100 → a3. a2 ends: A has 0 → B +100 → b1.
    # b1 is the 2nd hand-over after it arrived (≤ threads + 1 = 3); first come first served it would be the 19th.
    pool, jobs = pool_jobs(threads=2)
    for i in range(1, 21):
        await jobs.add(A, f"a{i}")
    await jobs.add(B, "b1")
    assert jobs.executor.labels == ["a1", "a2"]
    assert (pool.snapshot().queued_groups, pool.snapshot().inflight_groups) == (19, 2)
    assert await jobs.drain() == ["a1", "a2", "a3", "b1", *[f"a{i}" for i in range(4, 21)]]


async def test_weights_share_the_threads():
    # 1 thread; B has weight 2. a1 runs at once. Ring [A, B] once b1..b4 wait.
    # a1 ends: A +100 → a2. Next: A 0 → B +200 → b1, then b2 (B 0). Next: B 0 → A +100 → a3.
    # Next: A 0 → B +200 → b3, then b4 (B empty). Last: a4.
    pool, jobs = pool_jobs(threads=1)
    for i in range(1, 5):
        await jobs.add(A, f"a{i}")
    for i in range(1, 5):
        await jobs.add(B2, f"b{i}")
    assert await jobs.drain() == ["a1", "a2", "b1", "b2", "a3", "b3", "b4", "a4"]


async def test_costs_are_characters():
    # 1 thread, quantum 100. A: a2 costs 300; B: b1..b3 cost 100 each; a1 (cost 100) runs first.
    # a1 ends: ring [A, B]: A +100 < 300, B +100 → b1. B 0 → A 200 < 300, B 100 → b2.
    # B 0 → A 300 → a2. A empty → B +100 → b3.
    pool, jobs = pool_jobs(threads=1)
    await jobs.add(A, "a1")
    await jobs.add(A, "a2", cost=300)
    for i in range(1, 4):
        await jobs.add(B, f"b{i}")
    assert await jobs.drain() == ["a1", "b1", "b2", "a2", "b3"]


async def test_interactive_jobs_of_a_user_go_before_its_batch_jobs():
    pool, jobs = pool_jobs(threads=1)
    await jobs.add(A, "a1")
    await jobs.add(A, "a2")
    await jobs.add(Caller(User("A"), "interactive"), "a3")
    await jobs.add(A, "a4")
    assert await jobs.drain() == ["a1", "a3", "a2", "a4"]


async def test_interactive_boost_gives_an_interactive_user_more_than_its_weight():
    # boost 2: B's interactive jobs are credited 200 per visit. a1 runs; ring [A, B].
    # a1 ends: A +100 → a2. A 0 → B +200 → b1, b2. B 0 → A +100 → a3. A 0 → B +200 → b3. A: a4.
    bi = Caller(User("B"), "interactive")
    pool, jobs = pool_jobs(threads=1, boost=2.0)
    for i in range(1, 5):
        await jobs.add(A, f"a{i}")
    for i in range(1, 4):
        await jobs.add(bi, f"b{i}")
    assert await jobs.drain() == ["a1", "a2", "b1", "b2", "a3", "b3", "a4"]


async def test_a_cancelled_waiting_job_leaves_the_queue_and_never_runs():
    pool, jobs = pool_jobs(threads=1)
    for label in ("a1", "a2", "a3"):
        await jobs.add(A, label)
    await jobs.add(B, "b1")
    waiting = jobs.tasks.pop("a2")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    state = pool.snapshot()
    assert (state.queued_groups, state.inflight_groups) == (2, 1)  # a3 and b1 wait, a1 runs
    assert [(u.user, u.queued_groups) for u in state.users] == [("A", 1), ("B", 1)]
    # a1 ends: ring [A, B] (A re-entered with a2): A +100 → a3; then B → b1. a2 is never handed over.
    assert await jobs.drain() == ["a1", "a3", "b1"]


async def test_a_job_already_in_a_thread_keeps_its_slot_until_it_ends():
    pool, jobs = pool_jobs(threads=1, start=True)  # a thread picks each job up at once
    await jobs.add(A, "a1")
    await jobs.add(B, "b1")
    running = jobs.tasks.pop("a1")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    for _ in range(5):
        await asyncio.sleep(0)
    assert jobs.executor.labels == ["a1"]  # the thread is still busy with a1: b1 waits
    assert (pool.snapshot().inflight_groups, pool.snapshot().queued_groups) == (1, 1)
    assert await jobs.drain() == ["a1", "b1"]
    assert jobs.tasks["b1"].result() == "b1"


async def test_a_failing_job_raises_to_its_caller_and_frees_its_slot():
    pool, jobs = pool_jobs(threads=1)
    jobs.tasks["a1"] = asyncio.create_task(pool.run(A, 10, job("a1", error=ValueError("bad template"))))
    await jobs.add(B, "b1")
    jobs.executor.finish()
    with pytest.raises(ValueError, match="bad template"):
        await jobs.tasks.pop("a1")
    assert await jobs.drain() == ["a1", "b1"]
    assert (pool.snapshot().inflight_groups, pool.snapshot().queued_groups) == (0, 0)


async def test_negative_cost_is_refused():
    pool, _ = pool_jobs(threads=1)
    with pytest.raises(ValueError, match="cost_tokens: -1 must be an integer ≥ 0"):
        await pool.run(A, -1, job("x"))


def _app(executor: ManualExecutor, **config) -> web.Application:
    app = web.Application()
    app[CONFIG_KEY] = ServerConfig(port=0, render_threads=1, **config)
    app[EXECUTOR_KEY] = executor  # type: ignore[assignment]  # the stand-in for the thread pool
    render_order.install(app, executor)
    return app


async def test_app_without_fair_share_runs_jobs_in_arrival_order():
    executor = ManualExecutor()
    app = _app(executor, fair_share=False)
    assert pool_of(app) is None
    jobs = Jobs(executor, lambda caller, cost, fn: render_order.run(app, caller, cost, fn))
    for i in range(1, 5):
        await jobs.add(A, f"a{i}")
    await jobs.add(B, "b1")
    assert executor.labels == ["a1", "a2", "a3", "a4", "b1"]  # all handed to the pool at once
    assert await jobs.drain() == ["a1", "a2", "a3", "a4", "b1"]


async def test_app_with_fair_share_orders_jobs_per_user():
    executor = ManualExecutor()
    app = _app(executor, fair_share=True)
    pool = pool_of(app)
    assert pool is not None and pool.queue.concurrency == 1
    pool.queue.quantum_tokens = 100
    jobs = Jobs(executor, lambda caller, cost, fn: render_order.run(app, caller, cost, fn))
    for i in range(1, 5):
        await jobs.add(A, f"a{i}")
    await jobs.add(B, "b1")
    assert executor.labels == ["a1"]
    # a1 ends: A +100 → a2; then A 0 → B → b1; then a3, a4.
    assert await jobs.drain() == ["a1", "a2", "b1", "a3", "a4"]


def test_request_chars_counts_the_prompt_once_per_response():
    request = ScoreRequest(groups=(
        RequestGroup(id="g0", responses=("xy", "xyz1"),
                     messages=(Message("system", "abc"), Message("user", "hello"))),  # prompt 8: 2×8 + 2 + 4
        RequestGroup(id="g1", responses=("a",), prompt="hi"),  # 2 + 1
    ))
    assert request_chars(request) == 22 + 3
