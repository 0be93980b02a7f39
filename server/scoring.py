"""Scoring a decoded request: admission → render → engine (or result cache) → group results.

:func:`score_request` is the whole path after the HTTP layer has decoded and checked a
``POST /v1/score`` body: admit its groups against ``max_inflight_groups``, render and
tokenize every group in one render-thread call (in the caller's fair turn of the render
threads, :mod:`rmserve.server.render_pool`), score all groups concurrently (each group's
sequences in one ``engine.score_group`` call so they share the prompt's prefix-cache blocks;
groups seen before come from the :class:`~rmserve.server.result_cache.ResultCache`), check
the engine's answers and build one :class:`~rmserve.schema.GroupResult` per group. Cancelling
the caller (client disconnect) cancels every pending ``score_group`` call, and the engine
aborts those requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import uuid
from collections.abc import Sequence

from aiohttp import web
from rmserve.server import limits, render_pool
from rmserve.server.fair_queue import ENGINE_PRIORITY, Caller, FairQueue, queue_of
from rmserve.server.leases import leases_of
from rmserve.server.protocol import ExtraValue, RewardEngine, SequenceScore
from rmserve.server.render import RenderedGroup, Renderer
from rmserve.server.result_cache import ResultCache, group_key
from rmserve.server.users import ANONYMOUS, User
from rmserve.server.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    METRICS_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
)

from rmserve.errors import EngineError, InvalidRequest, Overloaded, RMServeError
from rmserve.schema import GroupResult, ModelInfo, RequestGroup, ResponseError, ScoreRequest, ScoreResponse


def check_scores(scores: Sequence[SequenceScore], expected: int, gi: int, group_id: str) -> None:
    """Check the engine's answer for ``groups[gi]``: one score per sequence sent.

    Non-finite rewards are not an engine failure: :func:`group_result` answers them per
    response (null reward, ``non_finite_reward`` error).

    Raises:
        EngineError: not ``expected`` scores.
    """
    if len(scores) != expected:
        raise EngineError(
            f"the engine returned {len(scores)} scores for groups[{gi}] (id {group_id!r}) with {expected} sequences sent"
        )


def group_extras(
    scores: Sequence[SequenceScore], gi: int, group_id: str
) -> dict[str, tuple[ExtraValue, ...]] | None:
    """The group's per-response extras: name → one value per response (response order).

    Returns:
        None when no sequence carries extras (the reply then omits the field).

    Raises:
        EngineError: the sequences of the group carry different extra names (naming the
            first response that differs from response 0).
    """
    if not any(score.extras for score in scores):
        return None
    names = list(scores[0].extras)
    for ri, score in enumerate(scores):
        if set(score.extras) != set(names):
            raise EngineError(
                f"the engine returned extras {sorted(score.extras)} for groups[{gi}] (id {group_id!r}) "
                f"response {ri} but {sorted(names)} for response 0; every response needs the same names"
            )
    return {name: tuple(score.extras[name] for score in scores) for name in names}


def group_result(group: RequestGroup, rendered: RenderedGroup, scores: Sequence[SequenceScore], gi: int) -> GroupResult:
    """The reply's record for ``groups[gi]``.

    ``scores`` answer the sequences :attr:`RenderedGroup.scorable` sent to the engine, in that
    order. A response that was not sent (over-length), whose score carries an engine
    ``error`` (e.g. ``no_answer_tokens``) or whose reward is NaN/±inf gets a null reward and a
    :class:`~rmserve.schema.ResponseError` in ``errors``; the group's other
    responses keep their rewards. ``errors`` is absent when every response was scored.

    Raises:
        EngineError: a score count other than the sequences sent, or extras whose names
            differ between responses (:func:`group_extras`).
    """
    scorable = rendered.scorable
    check_scores(scores, len(scorable), gi, group.id)
    n = len(group.responses)
    rewards: list[float | None] = [None] * n
    cached = [0] * n
    errors: list[ResponseError | None] = list(rendered.errors) if rendered.errors is not None else [None] * n
    for j, score in zip(scorable, scores, strict=True):
        cached[j] = int(score.num_cached_tokens)
        reward = float(score.reward)
        if score.error is not None:
            errors[j] = score.error
        elif math.isfinite(reward):
            rewards[j] = reward
        else:
            errors[j] = ResponseError("non_finite_reward", f"the model gave a non-finite reward ({reward}) for it")
    extras = group_extras(scores, gi, group.id) if scorable else None
    if extras is not None and len(scorable) < n:  # spread to response order: None where not sent
        sent = dict(zip(scorable, range(len(scorable))))
        extras = {name: tuple(values[sent[j]] if j in sent else None for j in range(n)) for name, values in extras.items()}
    return GroupResult(
        id=group.id,
        rewards=tuple(rewards),
        num_tokens=rendered.num_tokens,
        num_cached_tokens=tuple(cached),
        truncated_tokens=rendered.truncated_tokens,
        extras=extras,
        errors=tuple(errors) if any(e is not None for e in errors) else None,
    )


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report from a failed task group: an rmserve error if there is one."""
    leaves: list[BaseException] = []

    def walk(eg: BaseExceptionGroup) -> None:
        for exc in eg.exceptions:
            if isinstance(exc, BaseExceptionGroup):
                walk(exc)
            else:
                leaves.append(exc)

    walk(group)
    for exc in leaves:
        if isinstance(exc, RMServeError):
            return exc
    return leaves[0]


async def score_groups(
    engine: RewardEngine, rendered: list[RenderedGroup], request_id: str, cache: ResultCache, fingerprint: str,
    queue: FairQueue | None = None, caller: Caller = Caller(),
) -> tuple[list[list[SequenceScore]], list[bool]]:
    """Score all groups concurrently; the first engine failure cancels the other groups.

    Only a group's :attr:`~RenderedGroup.scorable` sequences go to the engine (a group with
    none makes no engine call), with their ``answer_starts`` when the renderer set
    :attr:`~RenderedGroup.answer_start` (DPO). Groups found in ``cache`` (same fingerprint, same token ids
    sent) are answered from it. With a ``queue``, each group's engine call waits for its
    turn of the :class:`~rmserve.server.fair_queue.FairQueue` (cost: its tokens sent).

    Returns:
        (scores per group, one per scorable sequence; whether each group came from the cache
        — a group with nothing to send counts as cached: no engine work).
    """
    sent = [[group.token_ids[j] for j in group.scorable] for group in rendered]
    starts = [
        None if group.answer_start is None else [group.answer_start[j] for j in group.scorable] for group in rendered
    ]
    keys = [group_key(fingerprint, ids) if st is None else group_key(fingerprint, [*ids, st]) for ids, st in zip(sent, starts)]
    cached: list[list[SequenceScore] | None] = [[] if not ids else cache.get(key) for ids, key in zip(sent, keys)]

    async def call(gi: int, ids: list) -> list[SequenceScore]:
        turn = queue.turn(caller.user, sum(map(len, ids)), caller.priority) if queue is not None else contextlib.nullcontext()
        priority = ENGINE_PRIORITY[caller.priority]
        async with turn:
            if starts[gi] is None:
                return await engine.score_group(ids, f"{request_id}-{gi}", priority=priority)
            return await engine.score_group(ids, f"{request_id}-{gi}", answer_starts=starts[gi], priority=priority)

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = {
                gi: tg.create_task(call(gi, ids))
                for gi, ids in enumerate(sent)
                if cached[gi] is None
            }
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    scores = []
    for gi, key in enumerate(keys):
        hit = cached[gi]
        if hit is not None:
            scores.append(hit)
            continue
        result = tasks[gi].result()
        cache.put(key, result)
        scores.append(result)
    return scores, [c is not None for c in cached]


def admit(state, num_groups: int, limit: int) -> None:
    """Check ``num_groups`` against ``max_inflight_groups`` (``limit``; 0 = no limit).

    Raises:
        InvalidRequest (field ``groups``): the request alone holds more than ``limit`` groups.
        Overloaded: the groups in flight plus these would exceed ``limit``.
    """
    if not limit:
        return
    if num_groups > limit:
        raise InvalidRequest(
            f"groups holds {num_groups} groups; the server admits at most {limit} at once "
            "(max_inflight_groups); split the request",
            field="groups",
            value=num_groups,
            limit=limit,
        )
    if state.inflight_groups + num_groups > limit:
        raise Overloaded(
            f"{state.inflight_groups} groups in flight; admitting {num_groups} more would exceed "
            f"max_inflight_groups={limit}; retry later",
            limit=limit,
        )


async def score_request(
    app: web.Application, request: ScoreRequest, info: ModelInfo, renderer: Renderer, caller: Caller = Caller()
) -> ScoreResponse:
    """Score every group of a decoded, checked request with the model ``info`` describes.

    ``caller`` (user and priority hint) takes each group's turn of the app's fair queue, when
    the app has one (:mod:`rmserve.server.fair_queue`), and the request's turn of the render
    threads (:func:`rmserve.server.render_pool.run`, cost :func:`~rmserve.server.render_pool.request_chars`).

    The request's ``fingerprint``, when set, is checked first
    (:meth:`~rmserve.server.leases.LeaseBook.check_fingerprint`); its groups count as the
    caller's pinned work until the request is answered.

    Raises:
        Conflict (409, field ``fingerprint``): the request is pinned to another fingerprint.
        InvalidRequest / Overloaded: admission (see ``max_inflight_groups``), and ``user``'s
            own limits (:mod:`rmserve.server.limits`: groups in flight, then prompt tokens
            per minute once rendered; nothing reaches the engine when refused).
        InvalidRequest: from rendering (a conversation the chat template rejects). A sequence
            over max_model_len is not an error of the request: it is answered per response.
        EngineNotReady / EngineError: from the engine, or an answer that fails
            :func:`check_scores` / :func:`group_extras`.
    """
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    num_groups = len(request.groups)
    book = leases_of(app)
    book.check_fingerprint(request.fingerprint, info)
    admit(state, num_groups, app[CONFIG_KEY].max_inflight_groups)
    admission = limits.admit(app, caller.user, num_groups)
    state.admit_groups(num_groups)
    metrics.inflight_groups.inc(num_groups)
    try:
        with book.pinned(caller.user.name, request.fingerprint, num_groups):
            rendered: list[RenderedGroup] = await render_pool.run(
                app, caller, render_pool.request_chars(request),
                functools.partial(renderer.render_request, request, too_long="mark"),
            )
            await admission.charge_tokens(limits.rendered_tokens(rendered))
            scores, from_cache = await score_groups(
                app[ENGINE_KEY], rendered, uuid.uuid4().hex, app[RESULT_CACHE_KEY], info.fingerprint, queue_of(app),
                caller,
            )
    finally:
        admission.release()
        state.release_groups(num_groups)
        metrics.inflight_groups.dec(num_groups)

    results = [
        group_result(group, group_rendered, group_scores, gi)
        for gi, (group, group_rendered, group_scores) in enumerate(zip(request.groups, rendered, scores))
    ]
    for result, group_rendered, hit in zip(results, rendered, from_cache, strict=True):
        scorable = group_rendered.scorable
        if not scorable:
            continue
        if hit:
            metrics.result_cache_hits.inc()
        else:
            metrics.observe_group(
                tuple(result.num_tokens[j] for j in scorable), tuple(result.num_cached_tokens[j] for j in scorable)
            )
    return ScoreResponse(model=info.name, fingerprint=info.fingerprint, results=tuple(results))
