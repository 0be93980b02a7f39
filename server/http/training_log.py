"""Sampled records of the training samples scored through the trainer routes
(``rmserve serve --training-log FILE``): so a run can show which reward model scored it.

Every input a request to ``POST /get_reward``, ``/classify`` or ``/pooling`` had scored may
become one JSON line appended to the file:

``{"time": 1767225600.5, "route": "/get_reward", "user": "trainer", "model": "rm", "fingerprint":
"…", "index": 0, "reward": 4.55, "num_tokens": 9, "input": "text", "sha256": "…"}``

- ``time``: Unix time the reply was made; ``route``, ``user`` (``anonymous`` without a users
  file), ``model`` (the served name) and ``fingerprint`` of the model that scored it;
- ``index``: the input's position in its request (``query[i]``, ``input[i]``);
- ``reward``: the raw reward (the ``/v1/score`` value, whatever activation a ``/classify``
  reply applied); ``num_tokens``: the tokens the reward model scored;
- ``input``: ``text`` or ``token_ids``; ``sha256``: the SHA-256 of the input as sent (a text's
  UTF-8 bytes; token ids as the JSON list ``[1,2,3]``, no spaces); ``text``: the input itself
  (the text or the id list), only with ``--training-log-text``.

Only scored inputs are recorded (an input answered with an error, and every query of a
``/get_reward`` request that failed, are not). **Sampling** is by the hash, so it is the same
on every run and every server: an input is recorded when the first 8 bytes of its SHA-256, read
as a big-endian integer, are below ``rate × 2⁶⁴`` (rate 1: all; 0: none).

**Writing** never holds up a reply: a route hands the request's scored inputs to
:meth:`TrainingLog.record`, which only puts them on a queue (at most :data:`MAX_PENDING`
requests); one writer thread hashes, samples, encodes and appends them (one ``write`` and
``flush`` per request). A write that fails (disk full, file removed and unwritable) is logged
once, at error level, and its lines are counted in :attr:`TrainingLog.failed_lines`; the
scores are answered as usual and later requests are written again once the file can be
written. A request arriving while :data:`MAX_PENDING` requests wait (the disk far behind) is not
recorded: logged once, counted in :attr:`TrainingLog.dropped_requests`. On shutdown the
pending lines are written, and a log that lost lines says how many.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

logger = logging.getLogger("rmserve.server")

MAX_PENDING = 10_000
"""Requests whose inputs may wait for the writer thread at once (beyond: not recorded)."""

CLOSE_WAIT_S = 30.0
"""How long a shutdown waits for the writer to write what is pending."""

_FULL = 1 << 64


@dataclass(frozen=True, slots=True)
class ScoredInput:
    """One input a trainer route had scored.

    Attributes:
        index: its position in the request (``query[i]`` / ``input[i]``).
        value: the input as sent: a text or a list of token ids.
        reward: the raw reward.
        num_tokens: tokens the reward model scored.
    """

    index: int
    value: str | Sequence[int]
    reward: float
    num_tokens: int


@dataclass(frozen=True, slots=True)
class _Batch:
    time: float
    route: str
    user: str
    model: str
    fingerprint: str
    inputs: tuple[ScoredInput, ...]


def input_digest(value: str | Sequence[int]) -> tuple[str, str]:
    """``(input kind, SHA-256 hex)`` of an input as sent: a text's UTF-8 bytes, token ids as
    the JSON list ``[1,2,3]`` (no spaces). Kind: ``text`` or ``token_ids``."""
    if isinstance(value, str):
        return "text", hashlib.sha256(value.encode("utf-8")).hexdigest()
    return "token_ids", hashlib.sha256(orjson.dumps(list(value))).hexdigest()


def sampled(sha256_hex: str, rate: float) -> bool:
    """Whether an input of this SHA-256 is recorded at ``rate`` (module docstring)."""
    return int(sha256_hex[:16], 16) < rate * _FULL


class TrainingLog:
    """The sampled JSON-lines record of a server's trainer routes (module docstring).

    Args:
        path: the file lines are appended to (created when missing).
        rate: fraction in [0, 1] of the inputs recorded.
        with_text: also record each input itself (``text``).
        clock: Unix time now, seconds (tests pass their own).
        max_pending: requests that may wait for the writer at once (≥ 1).

    Attributes:
        written_lines, failed_lines, dropped_requests: counters (see the module docstring).

    The writer thread and the file are started on the first :meth:`record`.

    Raises:
        ValueError: ``rate`` not in [0, 1], ``max_pending`` below 1.
    """

    def __init__(self, path: str | Path, rate: float, *, with_text: bool = False,
                 clock: Callable[[], float] = time.time, max_pending: int = MAX_PENDING) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"rate: {rate!r} must be a fraction in [0, 1]")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending: {max_pending!r} must be an integer ≥ 1")
        self.max_pending = max_pending
        self.path = Path(path)
        self.rate = float(rate)
        self.with_text = with_text
        self.clock = clock
        self.written_lines = 0
        self.failed_lines = 0
        self.dropped_requests = 0
        self._queue: queue.Queue[_Batch | None] = queue.Queue(max_pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._told_failure = False
        self._told_drop = False
        self._closed = False

    # --- the event loop's side ---------------------------------------------------------

    def record(self, *, route: str, user: str, model: str, fingerprint: str, inputs: Sequence[ScoredInput]) -> None:
        """Hand a request's scored inputs to the writer; returns at once (never raises for
        the file: a full queue or a closed log only counts the request as dropped)."""
        if not inputs or self.rate == 0:
            return
        batch = _Batch(time=self.clock(), route=route, user=user, model=model, fingerprint=fingerprint,
                       inputs=tuple(inputs))
        if self._closed:
            self._drop("the server is stopping")
            return
        self._start()
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._drop(f"{self.max_pending:,} requests are waiting for the writer (the disk is behind)")

    async def drain(self) -> None:
        """Wait (off the event loop) until every request recorded so far is written or failed."""
        if self._thread is not None:
            await asyncio.to_thread(self._queue.join)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Write what is pending (up to ``timeout_s``), stop the writer; logs lost lines.
        Blocking: call it off the event loop (:func:`install` does)."""
        self._closed = True
        if self._thread is not None:
            deadline = time.monotonic() + timeout_s
            try:
                self._queue.put(None, timeout=timeout_s)
            except queue.Full:
                pass
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                logger.error("training log %s: the writer did not finish within %.0f s; pending lines are lost",
                             self.path, timeout_s)
        if self.failed_lines or self.dropped_requests:
            logger.warning("training log %s: %d lines written, %d not written (write errors), %d requests not "
                           "recorded (writer behind)", self.path, self.written_lines, self.failed_lines,
                           self.dropped_requests)

    def _drop(self, why: str) -> None:
        self.dropped_requests += 1
        if not self._told_drop:
            self._told_drop = True
            logger.warning("training log %s: a request's samples were not recorded: %s (said once; counted)",
                           self.path, why)

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="rmserve-training-log", daemon=True)
                    thread.start()
                    self._thread = thread

    # --- the writer thread -------------------------------------------------------------

    def lines(self, batch: _Batch) -> list[bytes]:
        """The JSON lines (each ending in a newline) of a batch's sampled inputs."""
        out = []
        for item in batch.inputs:
            kind, digest = input_digest(item.value)
            if not sampled(digest, self.rate):
                continue
            line = {
                "time": batch.time, "route": batch.route, "user": batch.user, "model": batch.model,
                "fingerprint": batch.fingerprint, "index": item.index, "reward": item.reward,
                "num_tokens": item.num_tokens, "input": kind, "sha256": digest,
            }
            if self.with_text:
                line["text"] = item.value if isinstance(item.value, str) else list(item.value)
            out.append(orjson.dumps(line) + b"\n")
        return out

    def _run(self) -> None:
        handle = None
        try:
            while True:
                batch = self._queue.get()
                try:
                    if batch is None:
                        return
                    lines = self.lines(batch)
                    if not lines:
                        continue
                    try:
                        if handle is None:
                            handle = open(self.path, "ab")  # noqa: SIM115 - kept open across batches
                        handle.write(b"".join(lines))
                        handle.flush()
                        self.written_lines += len(lines)
                    except (OSError, ValueError) as exc:
                        self.failed_lines += len(lines)
                        if handle is not None:
                            try:
                                handle.close()
                            except OSError:
                                pass
                        handle = None  # the next batch opens the file again
                        if not self._told_failure:
                            self._told_failure = True
                            logger.error("training log %s: cannot write (%s); the scores are answered as usual, "
                                         "these lines are lost (said once; counted)", self.path, exc)
                finally:
                    self._queue.task_done()
        finally:
            if handle is not None:
                try:
                    handle.close()
                except OSError:
                    pass


TRAINING_LOG_KEY = web.AppKey("training_log", TrainingLog)
"""Where the front door keeps its :class:`TrainingLog` (absent without ``--training-log``)."""


def install(front: web.Application, config) -> None:
    """Give the front door its :class:`TrainingLog` when ``config.training_log`` is set, closed
    (pending lines written, in a thread) on cleanup. A model app behind a node gets one too but
    never records: the routes record on the app that listens (its file is not opened then)."""
    if config.training_log is None:
        return
    log = TrainingLog(config.training_log, config.training_log_rate, with_text=config.training_log_text)
    front[TRAINING_LOG_KEY] = log

    async def close(_app: web.Application) -> None:
        await asyncio.to_thread(log.close)

    front.on_cleanup.append(close)


def training_log_of(front: web.Application) -> TrainingLog | None:
    """The front door's :class:`TrainingLog`, None without ``--training-log``."""
    return front.get(TRAINING_LOG_KEY)
