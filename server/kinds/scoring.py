"""The one scoring path: fingerprint → admission → pin → render → charge → fair queue → engine
(or result cache) → group results → metrics.

:func:`score_request` is the whole path after the HTTP layer has decoded and checked a
``POST /v1/score`` body (or a vLLM-compatible ``/classify`` / ``/pooling`` body, one group per
input: :mod:`rmserve.server.kinds.raw_input`), the same for every kind of reward model; what differs between kinds is
asked of the served model's :class:`~rmserve.server.kinds.base.RewardKind` (its hooks):

1. the request's ``fingerprint``, when set, is checked
   (:meth:`~rmserve.server.sharing.leases.LeaseBook.check_fingerprint`), then the kind's own
   request rules (:meth:`~rmserve.server.kinds.base.RewardKind.check_request`);
2. admission (:func:`rmserve.server.sharing.admission.admit`: ``max_inflight_groups`` and
   the user's own limits, :mod:`rmserve.server.sharing.limits`), held until the engine has answered;
3. the groups count as the caller's pinned work (:meth:`LeaseBook.pinned`) until the engine
   has answered — taken before rendering, for every kind;
4. every group is rendered or planned in one render-thread call, in the caller's fair turn of
   the render threads (:mod:`rmserve.server.sharing.render_order`;
   :meth:`~rmserve.server.kinds.base.RewardKind.prepare`), each with its cost in tokens;
5. the user's tokens-per-minute budget is charged the groups' costs;
6. all groups are scored concurrently (:func:`score_groups`), each in one engine call
   (:meth:`~rmserve.server.kinds.base.RewardKind.call`) in the caller's turn of the fair queue
   (cost: the same group cost); groups seen before come from the
   :class:`~rmserve.server.kinds.result_cache.ResultCache`;
7. one :class:`~rmserve.schema.GroupResult` per group
   (:meth:`~rmserve.server.kinds.base.RewardKind.result`), and ``/metrics`` counts each group
   the engine scored (:meth:`~rmserve.server.kinds.base.RewardKind.observation`) or the cache
   answered.

Cancelling the caller (client disconnect) cancels every pending engine call, and the engine
aborts those requests; the first engine failure cancels the other groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid

import msgspec
from aiohttp import web
from rmserve.server.sharing import admission
from rmserve.server.sharing import render_order
from rmserve.server.sharing.fair_queue import ENGINE_PRIORITY, Caller, FairQueue, queue_of
from rmserve.server.sharing.leases import leases_of
from rmserve.server.engines.protocol import first_error
from rmserve.server.kinds.base import PreparedGroup, RewardKind
from rmserve.server.kinds.result_cache import ResultCache
from rmserve.server.render.chat import Renderer
from rmserve.server.swaps.state import ENGINE_KEY, KIND_KEY, METRICS_KEY, RESULT_CACHE_KEY

from rmserve.schema import ModelInfo, ResponseError, ScoreRequest, ScoreResponse



async def score_groups(
    kind: RewardKind, engine, prepared: list[PreparedGroup], request_id: str, cache: ResultCache,
    queue: FairQueue | None = None, caller: Caller = Caller(),
) -> tuple[list[object], list[bool]]:
    """Score all groups concurrently; the first engine failure cancels the other groups.

    A group with no ``key`` makes no engine call (its outputs are None); groups found in
    ``cache`` are answered from it. With a ``queue``, each group's engine call waits for
    ``caller``'s turn of the :class:`~rmserve.server.sharing.fair_queue.FairQueue` (cost: the
    group's :attr:`~rmserve.server.kinds.base.PreparedGroup.cost`). An answer that is a
    :class:`~rmserve.schema.ResponseError` (the kind refused the group at the engine) is not cached.

    Returns:
        (the kind's outputs per group; whether each group came from the cache — a group with
        nothing to send counts as cached: no engine work).
    """
    cached: list[object | None] = [None if group.key is None else cache.get(group.key) for group in prepared]
    priority = ENGINE_PRIORITY[caller.priority]

    async def call(gi: int, group: PreparedGroup) -> object:
        turn = queue.turn(caller.user, group.cost, caller.priority) if queue is not None else contextlib.nullcontext()
        async with turn:
            return await kind.call(engine, group, f"{request_id}-{gi}", gi, priority)

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = {
                gi: tg.create_task(call(gi, group))
                for gi, group in enumerate(prepared)
                if group.key is not None and cached[gi] is None
            }
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    outputs: list[object] = []
    for gi, group in enumerate(prepared):
        if gi not in tasks:
            outputs.append(cached[gi])
            continue
        result = tasks[gi].result()
        if not isinstance(result, ResponseError):
            cache.put(group.key, result)
        outputs.append(result)
    return outputs, [gi not in tasks for gi in range(len(prepared))]



async def score_request(
    app: web.Application, request: ScoreRequest, info: ModelInfo, renderer: Renderer | None,
    caller: Caller = Caller(), kind: RewardKind | None = None,
) -> ScoreResponse:
    """Score every group of a decoded, checked request with the model ``info`` describes
    (see the module docstring for the steps).

    ``caller`` (user and priority hint) takes each group's turn of the app's fair queue, when
    the app has one (:mod:`rmserve.server.sharing.fair_queue`), and the request's turn of the
    render threads (:func:`rmserve.server.sharing.render_order.run`, cost
    :func:`~rmserve.server.sharing.render_order.request_chars`). ``kind`` None: the app's kind
    (``KIND_KEY``).

    Raises:
        Conflict (409, field ``fingerprint``): the request is pinned to another fingerprint.
        InvalidRequest: the kind's request rules (a judge: ``truncation`` asked, a group it
            cannot rebuild or whose benchmark its protocol does not apply to).
        OverLimit / Overloaded: admission (see ``max_inflight_groups``), and ``user``'s
            own limits (:mod:`rmserve.server.sharing.limits`: groups in flight, then prompt tokens
            per minute once rendered; nothing reaches the engine when refused).
        InvalidRequest: from rendering (a conversation the chat template rejects). A sequence
            over max_model_len is not an error of the request: it is answered per response.
        EngineNotReady / EngineError: from the engine, or an answer the kind refuses to record.
    """
    kind = kind if kind is not None else app[KIND_KEY]
    metrics = app[METRICS_KEY]
    num_groups = len(request.groups)
    book = leases_of(app)
    book.check_fingerprint(request.fingerprint, info)
    checked = kind.check_request(request)
    with admission.admit(app, caller.user, num_groups) as held:
        with book.pinned(caller.user.name, request.fingerprint, num_groups):
            prepared: list[PreparedGroup] = await render_order.run(
                app, caller, render_order.request_chars(request),
                functools.partial(kind.prepare, request, checked, info, renderer),
            )
            await held.charge_tokens(sum(group.cost for group in prepared))
            outputs, from_cache = await score_groups(
                kind, app[ENGINE_KEY], prepared, uuid.uuid4().hex, app[RESULT_CACHE_KEY], queue_of(app), caller
            )

    results = []
    for gi, (wire, group, out, hit) in enumerate(zip(request.groups, prepared, outputs, from_cache, strict=True)):
        result = kind.result(wire, group, out, gi)
        if group.key is not None and hit:
            result = msgspec.structs.replace(result, from_result_cache=True)
        results.append(result)
        if group.key is None:
            continue
        if hit:
            metrics.result_cache_hits.inc()
        elif (observed := kind.observation(group, result)) is not None:
            metrics.observe_group(*observed)
    return ScoreResponse(model=info.name, fingerprint=info.fingerprint, results=tuple(results), scorer=info.scorer())
