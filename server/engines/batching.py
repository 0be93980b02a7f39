"""Batch planning for engines that pad: which sequences share a forward pass (no torch needed).

:func:`length_sorted_batches` cuts a known set of sequences (one DPO group) into batches;
:func:`length_matched_batch` picks the next batch of a queue, and :class:`CrossGroupBatcher`
runs the queue of every group in flight through it (the transformers reward engine)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def length_sorted_batches(lengths: Sequence[int], *, max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Pack sequence indices into right-padded batches, longest first.

    Indices are sorted by length, longest first (ties in input order), and cut greedily:
    a batch grows while ``rows × its longest length ≤ max_batch_tokens`` (the padded size
    of the batch, which bounds activation memory) and ``rows ≤ max_batch_size``. A single
    sequence longer than ``max_batch_tokens`` gets a batch of its own. Sorting keeps
    similar lengths together, so little of each batch is padding.

    Args:
        lengths: length of each sequence in tokens (≥ 1).
        max_batch_tokens: padded-token budget of one batch (≥ 1).
        max_batch_size: most sequences in one batch (≥ 1).

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.

    Raises:
        ValueError: a budget below 1.
    """
    if max_batch_tokens < 1 or max_batch_size < 1:
        raise ValueError(f"max_batch_tokens ({max_batch_tokens}) and max_batch_size ({max_batch_size}) must be ≥ 1")
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    batches: list[list[int]] = []
    current: list[int] = []
    for j in order:
        width = lengths[current[0]] if current else lengths[j]
        if current and (len(current) + 1 > max_batch_size or (len(current) + 1) * width > max_batch_tokens):
            batches.append(current)
            current = []
        current.append(j)
    if current:
        batches.append(current)
    return batches


MAX_PADDING_FRACTION = 0.25
"""The most padding a cross-group batch may hold, as a share of its padded tokens
(:func:`length_matched_batch`): a sequence joins a batch only while the padding stays at or under
it, so a batch of mismatched lengths is never formed just to fill it."""


def length_matched_batch(
    lengths: Sequence[int],
    *,
    max_batch_size: int,
    max_batch_tokens: int = sys.maxsize,
    max_padding: float = MAX_PADDING_FRACTION,
) -> list[int]:
    """The next batch of a queue of sequences waiting for a padded forward pass: the oldest
    sequence and those of the nearest lengths.

    ``lengths[0]`` is the oldest waiting sequence (the anchor: it is always in the batch, so no
    sequence waits forever behind newer ones of better-fitting lengths). The batch grows one
    sequence at a time, taking among the next shorter and the next longer sequence (by length)
    the one that adds the least padding, while the batch holds at most ``max_batch_size``
    sequences, its padded size (rows × longest length) stays within ``max_batch_tokens``, and
    its padding stays within ``max_padding`` of the padded size. With many groups in flight a
    batch is nearly free of padding; with few, it is small rather than mostly padding.

    Args:
        lengths: tokens of each waiting sequence (≥ 1), oldest first.
        max_batch_size: most sequences in the batch (≥ 1).
        max_batch_tokens: padded-token budget of the batch (≥ 1); the anchor alone may exceed it.
        max_padding: largest padding share of the padded size, in [0, 1).

    Returns:
        Indices into ``lengths``, longest first (ties: oldest first); ``[0]`` at least.

    Raises:
        ValueError: an empty queue, a budget below 1, or ``max_padding`` outside [0, 1).
    """
    if not lengths:
        raise ValueError("length_matched_batch needs at least one waiting sequence")
    if max_batch_tokens < 1 or max_batch_size < 1:
        raise ValueError(f"max_batch_tokens ({max_batch_tokens}) and max_batch_size ({max_batch_size}) must be ≥ 1")
    if not 0 <= max_padding < 1:
        raise ValueError(f"max_padding ({max_padding}) must be in [0, 1)")
    order = sorted(range(len(lengths)), key=lambda j: (lengths[j], j))
    at = order.index(0)
    lo, hi = at - 1, at + 1  # next shorter / next longer in ``order``
    rows, width, real = [0], lengths[0], lengths[0]
    while len(rows) < max_batch_size:
        options = []
        if lo >= 0:
            options.append((width, real + lengths[order[lo]], "lo"))
        if hi < len(order):
            options.append((lengths[order[hi]], real + lengths[order[hi]], "hi"))
        fitting = [
            (padded - new_real, side)
            for new_width, new_real, side in options
            if (padded := (len(rows) + 1) * new_width) <= max_batch_tokens and padded - new_real <= max_padding * padded
        ]
        if not fitting:
            break
        _, side = min(fitting)
        if side == "lo":
            j, lo = order[lo], lo - 1
        else:
            j, hi = order[hi], hi + 1
        rows.append(j)
        width, real = max(width, lengths[j]), real + lengths[j]
    return sorted(rows, key=lambda j: (-lengths[j], j))


@dataclass(eq=False, slots=True)
class _Waiting:
    """One sequence waiting for a forward pass: the model it must run on, its ids, the group's
    request id (for error messages) and the future its result goes to."""

    model: Any
    token_ids: Sequence[int]
    request_id: str
    future: asyncio.Future[Any]


class CrossGroupBatcher(Generic[T]):
    """Forward passes of an engine that pads (the transformers engine), batched across the groups
    in flight: every sequence of every group waiting is a candidate for the next batch, which
    :func:`length_matched_batch` picks (the oldest sequence and those of the nearest lengths). A
    group's sequences therefore need not share a batch: a batch of one group's responses, whose
    lengths differ several-fold on RM-Bench, would be mostly padding.

    One batch runs at a time, in a worker thread (the event loop stays free); the sequences that
    arrive meanwhile wait for the next pick. Only sequences submitted for the same model object
    share a batch.

    Args:
        run: ``run(model, sequences)`` → one result per sequence, in order; blocking (it runs in a
            worker thread). It may raise: a failed batch of several sequences is run again one
            sequence at a time, so a sequence that cannot be scored fails alone (its group), not
            the other groups it shared the batch with.
        max_batch_size: most sequences per forward pass (≥ 1).
        max_batch_tokens: padded-token budget of a forward pass.
        max_padding: largest padding share of a batch (:func:`length_matched_batch`).
        error: turns a ``run`` failure into the exception its sequence's caller gets, given the
            request id and the exception.
    """

    def __init__(
        self,
        run: Callable[[Any, list[Sequence[int]]], list[T]],
        *,
        max_batch_size: int,
        max_batch_tokens: int = sys.maxsize,
        max_padding: float = MAX_PADDING_FRACTION,
        error: Callable[[str, Exception], Exception],
    ) -> None:
        self._run = run
        self._limits = {"max_batch_size": max_batch_size, "max_batch_tokens": max_batch_tokens,
                        "max_padding": max_padding}
        self._error = error
        self._waiting: list[_Waiting] = []
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.batches = 0
        """Forward passes run (batches, retries one sequence at a time included)."""

    def submit(self, model: Any, sequences: Sequence[Sequence[int]], request_id: str) -> list[asyncio.Future[T]]:
        """Queue a group's sequences for ``model``; one future per sequence, in order. Cancelling
        a future leaves its sequence out of the batches not yet run."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in sequences]
        self._waiting.extend(_Waiting(model, ids, request_id, f) for ids, f in zip(sequences, futures, strict=True))
        if self._waiting:
            self._idle.clear()
            if self._worker is None:
                self._worker = loop.create_task(self._work(), name="cross-group-batcher")
        return futures

    async def idle(self) -> None:
        """Return once nothing is waiting or running (a checkpoint swap waits for this)."""
        await self._idle.wait()

    def _next_batch(self) -> list[_Waiting]:
        """Take the next batch out of the waiting list (cancelled sequences dropped)."""
        self._waiting = [w for w in self._waiting if not w.future.done()]
        if not self._waiting:
            return []
        model = self._waiting[0].model
        same = [w for w in self._waiting if w.model is model]
        picked = [same[j] for j in length_matched_batch([len(w.token_ids) for w in same], **self._limits)]
        taken = {id(w) for w in picked}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        return picked

    async def _work(self) -> None:
        batch: list[_Waiting] = []
        try:
            while batch := self._next_batch():
                await self._run_batch(batch)
        finally:
            self._worker = None
            for w in [*batch, *self._waiting]:  # left only when the worker itself was cancelled
                if not w.future.done():
                    w.future.set_exception(self._error(w.request_id, RuntimeError("the engine stopped")))
            self._waiting.clear()
            self._idle.set()

    async def _run_batch(self, batch: list[_Waiting]) -> None:
        try:
            self.batches += 1
            results = await asyncio.to_thread(self._run, batch[0].model, [w.token_ids for w in batch])
        except Exception as exc:  # noqa: BLE001 - reported to the callers, never the end of the worker
            if len(batch) > 1:
                for w in batch:  # one at a time: only a sequence that cannot be scored fails
                    if not w.future.done():
                        await self._run_batch([w])
                return
            results = None
            failure = exc
        for k, w in enumerate(batch):
            if w.future.done():
                continue
            if results is None:
                w.future.set_exception(self._error(w.request_id, failure))
            elif len(results) != len(batch):
                w.future.set_exception(self._error(
                    w.request_id, ValueError(f"{len(results)} results for a batch of {len(batch)} sequences")))
            else:
                w.future.set_result(results[k])
