"""Scoring a decoded request: admission → render → engine (or result cache) → group results.

:func:`score_request` is the whole path after the HTTP layer has decoded and checked a
``POST /v1/score`` body: admit its groups against ``max_inflight_groups``, render and
tokenize every group in one render-thread call, score all groups concurrently (each group's
sequences in one ``engine.score_group`` call so they share the prompt's prefix-cache blocks;
groups seen before come from the :class:`~rmserve.server.result_cache.ResultCache`), check
the engine's answers and build one :class:`~rmserve.schema.GroupResult` per group. Cancelling
the caller (client disconnect) cancels every pending ``score_group`` call, and the engine
aborts those requests.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence

from aiohttp import web
from rmserve.server.protocol import ExtraValue, RewardEngine, SequenceScore
from rmserve.server.render import RenderedGroup, Renderer
from rmserve.server.result_cache import ResultCache, group_key
from rmserve.server.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    EXECUTOR_KEY,
    METRICS_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
)

from rmserve.errors import EngineError, InvalidRequest, Overloaded, RMServeError
from rmserve.schema import GroupResult, ModelInfo, RequestGroup, ScoreRequest, ScoreResponse


def check_scores(scores: Sequence[SequenceScore], expected: int, gi: int, group_id: str) -> None:
    """Check the engine's answer for ``groups[gi]``: one finite reward per response.

    Raises:
        EngineError: not ``expected`` scores, or a NaN/infinite reward (naming the response).
    """
    if len(scores) != expected:
        raise EngineError(
            f"the engine returned {len(scores)} scores for groups[{gi}] (id {group_id!r}) with {expected} responses"
        )
    for ri, score in enumerate(scores):
        if not math.isfinite(score.reward):
            raise EngineError(
                f"the engine returned a non-finite reward ({score.reward}) for groups[{gi}] "
                f"(id {group_id!r}) response {ri}"
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
    """The reply's record for ``groups[gi]`` after :func:`check_scores` and :func:`group_extras`."""
    check_scores(scores, len(group.responses), gi, group.id)
    return GroupResult(
        id=group.id,
        rewards=tuple(float(s.reward) for s in scores),
        num_tokens=rendered.num_tokens,
        num_cached_tokens=tuple(int(s.num_cached_tokens) for s in scores),
        truncated_tokens=rendered.truncated_tokens,
        extras=group_extras(scores, gi, group.id),
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
    engine: RewardEngine, rendered: list[RenderedGroup], request_id: str, cache: ResultCache, fingerprint: str
) -> tuple[list[list[SequenceScore]], list[bool]]:
    """Score all groups concurrently; the first failure cancels the other groups.

    Groups found in ``cache`` (same fingerprint, same token ids) are answered from it.

    Returns:
        (scores per group, whether each group came from the cache).
    """
    keys = [group_key(fingerprint, group.token_ids) for group in rendered]
    cached = [cache.get(key) for key in keys]
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = {
                gi: tg.create_task(engine.score_group(group.token_ids, f"{request_id}-{gi}"))
                for gi, group in enumerate(rendered)
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


def _admit(state, num_groups: int, limit: int) -> None:
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
    app: web.Application, request: ScoreRequest, info: ModelInfo, renderer: Renderer
) -> ScoreResponse:
    """Score every group of a decoded, checked request with the model ``info`` describes.

    Raises:
        InvalidRequest / Overloaded: admission (see ``max_inflight_groups``).
        InvalidRequest / SequenceTooLong: from rendering.
        EngineNotReady / EngineError: from the engine, or an answer that fails
            :func:`check_scores` / :func:`group_extras`.
    """
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    executor = app[EXECUTOR_KEY]
    num_groups = len(request.groups)
    _admit(state, num_groups, app[CONFIG_KEY].max_inflight_groups)
    state.admit_groups(num_groups)
    metrics.inflight_groups.inc(num_groups)
    try:
        loop = asyncio.get_running_loop()
        rendered: list[RenderedGroup] = await loop.run_in_executor(executor, renderer.render_request, request)
        scores, from_cache = await score_groups(
            app[ENGINE_KEY], rendered, uuid.uuid4().hex, app[RESULT_CACHE_KEY], info.fingerprint
        )
    finally:
        state.release_groups(num_groups)
        metrics.inflight_groups.dec(num_groups)

    results = [
        group_result(group, group_rendered, group_scores, gi)
        for gi, (group, group_rendered, group_scores) in enumerate(zip(request.groups, rendered, scores))
    ]
    for result, hit in zip(results, from_cache, strict=True):
        if hit:
            metrics.result_cache_hits.inc()
        else:
            metrics.observe_group(result.num_tokens, result.num_cached_tokens)
    return ScoreResponse(model=info.name, fingerprint=info.fingerprint, results=tuple(results))
