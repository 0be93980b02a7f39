"""The last minutes of the fair queue, for the status page's charts: a bounded ring buffer
sampled on a fixed interval, and the ``history`` field of ``GET /v1/status``.

**Sampling.** Every :data:`SAMPLE_INTERVAL_S` seconds a background task of the app that
listens (:func:`history_ctx`, in its ``cleanup_ctx``: started with the app, cancelled when it
stops; never on a request's path) reads the
:meth:`~rmserve.server.sharing.fair_queue.FairQueue.snapshot` of every served model's fair queue
and records one :class:`Sample`: the Unix time, the groups queued and in flight (all users, all
models) and, per user, the cumulative prompt tokens and groups served (summed over models). The
first sample is taken as the app starts. At most :data:`HISTORY_SAMPLES` samples are kept
(180 × 5 s: the last 15 minutes); the oldest goes when a new one comes.

**Rates are computed by the server.** :meth:`HistoryBuffer.history` answers a
:class:`StatusHistory` in columns: the samples' times, queue depths, and per user the rates of
each interval between two consecutive samples,
``(served[i + 1] − served[i]) / (time_s[i + 1] − time_s[i])`` (prompt tokens/s, groups/s).
A user missing from the earlier sample had been served nothing yet (0). A counter below its
previous value (not expected: an app's fair queue lives as long as the app) is read as
restarted from 0, Prometheus's rule for counter resets: the rate is then its new value over the
interval.

**Size.** At most :data:`HISTORY_SAMPLES` times and queue depths, plus two rates per interval
for each user served something in the window; under 5 KB of JSON for the times and depths and
under 7 KB per active user for a full buffer (``tests/server/test_status_history.py`` bounds
it).

**Visibility**, as for ``GET /v1/queue``: an admin (also the anonymous user of a server without
a users file) gets every user's rates, any other user only its own; the queue depths are
totals, which ``GET /v1/queue`` shows everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web
from rmserve.server.sharing.fair_queue import QueueState, queue_of

SAMPLE_INTERVAL_S = 5.0
"""Seconds between two samples of the history."""

HISTORY_SAMPLES = 180
"""Most samples kept (180 × :data:`SAMPLE_INTERVAL_S` = 15 minutes)."""

logger = logging.getLogger("rmserve.server")


class UserThroughput(msgspec.Struct, frozen=True):
    """One user's throughput over the history (an entry of :attr:`StatusHistory.users`).

    Element ``i`` of each tuple is the rate over the interval from ``time_s[i]`` to
    ``time_s[i + 1]`` of the :class:`StatusHistory`: one element fewer than ``time_s``.

    Attributes:
        user: the user's name.
        tokens_per_s: prompt tokens of the user's groups whose turn ended in the interval
            (the fair queue's ``served_tokens``), per second.
        groups_per_s: the same in groups per second.
    """

    user: str
    tokens_per_s: tuple[float, ...]
    groups_per_s: tuple[float, ...]


class StatusHistory(msgspec.Struct, frozen=True):
    """The ``history`` of ``GET /v1/status``: the last samples of the fair queue, oldest first.

    Attributes:
        interval_s: seconds between two samples (:data:`SAMPLE_INTERVAL_S`).
        capacity: most samples kept (:data:`HISTORY_SAMPLES`).
        time_s: Unix time (seconds) of each sample.
        queued_groups: groups waiting for a turn at each sample (all users, all models).
        inflight_groups: groups at the engine at each sample (all users, all models).
        users: per user served something in the window (a nonzero rate), by name, the
            rates of each interval (:class:`UserThroughput`); only the caller's own entry
            unless the caller is an admin.
    """

    interval_s: float
    capacity: int
    time_s: tuple[float, ...]
    queued_groups: tuple[int, ...]
    inflight_groups: tuple[int, ...]
    users: tuple[UserThroughput, ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of the history.

    Attributes:
        time_s: Unix time (seconds).
        queued_groups / inflight_groups: groups waiting / at the engine (all users).
        served: per user, the cumulative ``(prompt tokens, groups)`` served since the server
            started.
    """

    time_s: float
    queued_groups: int
    inflight_groups: int
    served: Mapping[str, tuple[int, int]]

    @classmethod
    def of(cls, time_s: float, snapshots: Iterable[QueueState]) -> Sample:
        """The sample at ``time_s`` of one or several fair queues (their counts summed)."""
        queued = inflight = 0
        served: dict[str, tuple[int, int]] = {}
        for snapshot in snapshots:
            queued += snapshot.queued_groups
            inflight += snapshot.inflight_groups
            for entry in snapshot.users:
                tokens, groups = served.get(entry.user, (0, 0))
                served[entry.user] = (tokens + entry.served_tokens, groups + entry.served_groups)
        return cls(time_s, queued, inflight, served)


def _increase(now: int, before: int) -> int:
    """A counter's increase between two samples (a decrease is a restart from 0)."""
    return now - before if now >= before else now


class HistoryBuffer:
    """The ring buffer of :class:`Sample` (see the module docstring).

    Args:
        capacity: most samples kept (≥ 2).
        interval_s: seconds between two samples of :func:`history_ctx` (> 0).
        clock: Unix time in seconds (a test seam: tests pass their own and call
            :func:`take_sample`).
        sleep: what :func:`history_ctx` waits with between two samples (``asyncio.sleep``; a
            test seam: one that never returns leaves the samples after the first to the test).

    Raises:
        ValueError: ``capacity`` below 2 or ``interval_s`` not positive.
    """

    def __init__(self, capacity: int = HISTORY_SAMPLES, interval_s: float = SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if not isinstance(capacity, int) or capacity < 2:
            raise ValueError(f"capacity: {capacity!r} must be an integer ≥ 2")
        if not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s: {interval_s!r} must be a number > 0")
        self.capacity = capacity
        self.interval_s = float(interval_s)
        self.clock = clock
        self.sleep = sleep
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, sample: Sample) -> None:
        """Keep ``sample`` (the oldest goes when :attr:`capacity` are kept).

        Raises:
            ValueError: ``sample.time_s`` not after the last sample's (a clock that went back).
        """
        if self._samples and not sample.time_s > self._samples[-1].time_s:
            raise ValueError(
                f"time_s: sample at {sample.time_s} is not after the last one at {self._samples[-1].time_s}"
            )
        self._samples.append(sample)

    def history(self, viewer: str | None = None) -> StatusHistory:
        """The :class:`StatusHistory` of the samples kept.

        Args:
            viewer: the only user whose rates are included; None = every user (an admin).
        """
        samples = list(self._samples)
        names = sorted({name for s in samples for name in s.served} if viewer is None
                       else {viewer} & {name for s in samples for name in s.served})
        users = []
        for name in names:
            tokens, groups = [], []
            for before, after in zip(samples, samples[1:]):
                seconds = after.time_s - before.time_s
                t0, g0 = before.served.get(name, (0, 0))
                t1, g1 = after.served.get(name, (0, 0))
                tokens.append(_increase(t1, t0) / seconds)
                groups.append(_increase(g1, g0) / seconds)
            if any(tokens) or any(groups):
                users.append(UserThroughput(name, tuple(tokens), tuple(groups)))
        return StatusHistory(
            interval_s=self.interval_s,
            capacity=self.capacity,
            time_s=tuple(s.time_s for s in samples),
            queued_groups=tuple(s.queued_groups for s in samples),
            inflight_groups=tuple(s.inflight_groups for s in samples),
            users=tuple(users),
        )


HISTORY_KEY = web.AppKey("status_history", HistoryBuffer)
"""Where the app that listens keeps its :class:`HistoryBuffer` (replace it before the app
starts to change the interval, the clock or the sleep)."""

MODEL_APPS_KEY = web.AppKey("status_history_model_apps", tuple)
"""The model apps whose fair queues a node's history samples (set by
:func:`rmserve.server.http.node.create_node_app`); absent on a server of one model, which samples
its own."""


def take_sample(front: web.Application) -> Sample:
    """Record one sample now (the buffer's clock) of every served model's fair queue.

    Returns:
        The sample recorded (no queue: zeros and no users).

    Raises:
        ValueError: the buffer's clock reads no later than its last sample.
    """
    buffer = front[HISTORY_KEY]
    apps = front.get(MODEL_APPS_KEY) or (front,)
    queues = [queue for queue in (queue_of(app) for app in apps) if queue is not None]
    sample = Sample.of(buffer.clock(), (queue.snapshot() for queue in queues))
    buffer.record(sample)
    return sample


async def history_ctx(front: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx`` of the sampling task: :func:`take_sample` as the app starts and every
    ``interval_s`` of its :class:`HistoryBuffer` after; cancelled on cleanup. A sample that
    fails is logged and the next one taken on time."""

    async def run() -> None:
        buffer = front[HISTORY_KEY]
        interval_s = buffer.interval_s
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            try:
                take_sample(front)
            except Exception:
                logger.exception("status history: sample failed")
            await buffer.sleep(interval_s - (loop.time() - started) % interval_s)

    task = asyncio.create_task(run(), name="rmserve-status-history")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def setup(front: web.Application) -> None:
    """Give the app that listens its :class:`HistoryBuffer` (under :data:`HISTORY_KEY`) and its
    sampling task (:func:`history_ctx`)."""
    front[HISTORY_KEY] = HistoryBuffer()
    front.cleanup_ctx.append(history_ctx)
