"""Request handlers and the error middleware of the scoring app.

``POST /v1/score`` flow: check the engine is ready → read the body (size-limited) → decode and
validate it (render thread) → check the model name and admission limit → render and tokenize
every group of the request in one render-thread call → score all groups concurrently, each
group's sequences in one ``engine.score_group`` call so they share the prompt's prefix-cache
blocks → reply. Cancelling the handler (client disconnect, with ``handler_cancellation``)
cancels every pending ``score_group`` call, and the engine aborts those requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec
from aiohttp import web
from rmserve.server import swap, wire
from rmserve.server.app import (
    CONFIG_KEY,
    ENGINE_KEY,
    EXECUTOR_KEY,
    METRICS_KEY,
    RENDERER_FACTORY_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
)
from rmserve.server.protocol import SequenceScore
from rmserve.server.render import RenderedGroup, Renderer
from rmserve.server.result_cache import ResultCache, group_key

from rmserve.errors import (
    BodyTooLarge,
    Conflict,
    EngineError,
    EngineNotReady,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    RMServeError,
    ServerFault,
)
from rmserve.schema import GroupResult, ModelInfo, ScoreRequest, ScoreResponse

logger = logging.getLogger("rmserve.server")

JSON_CONTENT_TYPE = "application/json"
CLIENT_CLOSED_STATUS = 499
"""Status recorded in the request counter when the client went away before the reply."""


# --- error middleware -------------------------------------------------------------------


def _json_response(body: bytes, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON_CONTENT_TYPE, headers=headers)


def error_response(exc: RMServeError, retry_after_s: int) -> web.Response:
    """The JSON reply for an rmserve error: status from its class, ``Retry-After`` when retryable."""
    headers = {"Retry-After": str(retry_after_s)} if exc.retryable else None
    return _json_response(wire.encode_error(exc), exc.status, headers)


def _endpoint(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


_PATH_LIKE = re.compile(
    r"(?<![\w:/\\])(?:[A-Za-z]:)?(?:(?:[/\\][\w.\-]+){3,}|(?:[/\\][\w.\-]+)+\.\w+)[/\\]?"
)
"""Absolute file-system paths (three or more components, or ending in a file name with an
extension), cut from 5xx messages; URL paths such as ``/v1/score`` are kept."""


def _public(exc: RMServeError) -> RMServeError:
    """``exc`` as the client may see it: server-fault messages lose file-system paths."""
    if exc.status < 500:
        return exc
    message = _PATH_LIKE.sub("<path>", exc.message)
    if message == exc.message:
        return exc
    public = type(exc)(message, field=exc.field)
    public.status = exc.status
    return public


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Write every error reply and count every request.

    - :class:`~rmserve.errors.RMServeError` → its ``status`` and
      ``{"error": {"type", "message", "field"}}``; ``Retry-After`` on retryable ones; server
      faults (5xx) are logged with their cause, and paths are cut from their messages.
    - aiohttp's body-size rejection → 413 ``body_too_large`` naming the limit.
    - other HTTP errors from routing (404 unknown path, 405 wrong method) → the same JSON shape.
    - anything else → logged with its traceback, answered 500 ``internal_error`` with a
      generic message (no exception text, paths or traceback in the body).
    - cancellation (client gone) → counted as status 499 and re-raised.
    """
    app = request.app
    config = app[CONFIG_KEY]
    metrics = app[METRICS_KEY]
    endpoint = _endpoint(request)
    started = time.perf_counter()
    try:
        response = await handler(request)
    except RMServeError as exc:
        if exc.status >= 500 and not exc.retryable:
            logger.error("%s %s failed: %s", request.method, request.path, exc.message, exc_info=exc)
        response = error_response(_public(exc), config.retry_after_s)
    except web.HTTPRequestEntityTooLarge:
        too_large = BodyTooLarge(
            f"request body exceeds the server's limit of {config.max_body_bytes} bytes (max_body_bytes)",
            limit=config.max_body_bytes,
        )
        response = error_response(too_large, config.retry_after_s)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = exc.reason.lower().replace(" ", "_")
        message = f"{exc.reason}: {request.method} {request.path}"
        allow = exc.headers.get("Allow")
        headers = {"Allow": allow} if allow is not None else None
        response = _json_response(wire.encode_error_fields(type_, message), exc.status, headers)
    except asyncio.CancelledError:
        metrics.observe_request(endpoint, CLIENT_CLOSED_STATUS, time.perf_counter() - started)
        logger.info("%s %s cancelled (client disconnected or server stopping)", request.method, request.path)
        raise
    except Exception:
        logger.exception("unexpected error while handling %s %s", request.method, request.path)
        generic = ServerFault("internal server error; the server log has the details")
        response = error_response(generic, config.retry_after_s)
    metrics.observe_request(endpoint, response.status, time.perf_counter() - started)
    return response


# --- simple routes ----------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 ``{"status": "ready"}``; 503 with ``Retry-After`` otherwise
    (``loading``, ``failed``, ``stopping``, or ``restarting`` while a checkpoint swap restarts
    the engine: no model is loaded then, scoring requests wait on the swap gate)."""
    state = request.app[STATE_KEY]
    if state.status == "ready" and not state.restarting:
        return _json_response(wire.encode_health("ready"), 200)
    status = "restarting" if state.status == "ready" else state.status
    headers = {"Retry-After": str(request.app[CONFIG_KEY].retry_after_s)}
    return _json_response(wire.encode_health(status), 503, headers)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{"models": [ModelInfo]}``; 503 ``engine_not_ready`` while loading."""
    info, _ = request.app[STATE_KEY].require_ready()
    return _json_response(wire.encode_models([info]), 200)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the app's Prometheus registry in text format."""
    body, content_type = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


# --- scoring ----------------------------------------------------------------------------


def _check_scores(scores: Sequence[SequenceScore], expected: int, gi: int, group_id: str) -> None:
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


def _first_error(group: BaseExceptionGroup) -> BaseException:
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


async def _score_groups(
    engine, rendered: list[RenderedGroup], request_id: str, cache: ResultCache, fingerprint: str
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
        raise _first_error(eg) from None
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


@contextlib.asynccontextmanager
async def _scoring_slot(state, wait_s: float) -> AsyncIterator[None]:
    """Admit one scoring request past the swap gate and count it until it is answered.

    While a checkpoint swap runs (``state.serving`` cleared) the request waits up to
    ``wait_s`` seconds, then gets :class:`EngineNotReady` (503, Retry-After). Between the
    gate opening and the count there is no await, so a swap that has started draining
    never sees a request slip in.
    """
    if not state.serving.is_set():
        try:
            async with asyncio.timeout(wait_s):
                while not state.serving.is_set():
                    await state.serving.wait()
        except TimeoutError:
            raise EngineNotReady(
                f"a checkpoint swap is in progress (waited swap_wait_s={wait_s:g} s); retry later"
            ) from None
    state.scoring_requests += 1
    state.scoring_idle.clear()
    try:
        yield
    finally:
        state.scoring_requests -= 1
        if state.scoring_requests == 0:
            state.scoring_idle.set()


async def score(request: web.Request) -> web.Response:
    """``POST /v1/score``: score every group of the request (see the module docstring).

    During a checkpoint swap the request waits (up to ``swap_wait_s``) until the new model
    serves; requests already past the gate finish on the old weights before the swap starts.

    Raises (answered by :func:`error_middleware`): ``EngineNotReady`` (503),
    ``InvalidRequest`` (400), ``ModelNotFound`` (404), ``SequenceTooLong`` /
    ``BodyTooLarge`` (413), ``Overloaded`` (429), ``EngineError`` (500).
    """
    state = request.app[STATE_KEY]
    state.require_ready()
    async with _scoring_slot(state, request.app[CONFIG_KEY].swap_wait_s):
        return await _score(request)


async def _score(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG_KEY]
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    executor = app[EXECUTOR_KEY]
    info, renderer = state.require_ready()

    if request.content_length is not None and request.content_length > config.max_body_bytes:
        raise BodyTooLarge(
            f"request body is {request.content_length} bytes; the server's limit is "
            f"{config.max_body_bytes} bytes (max_body_bytes)",
            value=request.content_length,
            limit=config.max_body_bytes,
        )
    body = await request.read()
    loop = asyncio.get_running_loop()
    score_request: ScoreRequest = await loop.run_in_executor(
        executor, lambda: wire.decode_score_request(body, max_model_len=info.max_model_len)
    )
    if score_request.model is not None and score_request.model != info.name:
        raise ModelNotFound(
            f"model {score_request.model!r} is not served here; this server scores {info.name!r}",
            field="model",
            value=score_request.model,
        )

    num_groups = len(score_request.groups)
    limit = config.max_inflight_groups
    if limit:
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

    state.inflight_groups += num_groups
    metrics.inflight_groups.inc(num_groups)
    try:
        rendered: list[RenderedGroup] = await loop.run_in_executor(executor, renderer.render_request, score_request)
        scores, from_cache = await _score_groups(
            app[ENGINE_KEY], rendered, uuid.uuid4().hex, app[RESULT_CACHE_KEY], info.fingerprint
        )
    finally:
        state.inflight_groups -= num_groups
        metrics.inflight_groups.dec(num_groups)

    results: list[GroupResult] = []
    for gi, (group, group_rendered, group_scores) in enumerate(zip(score_request.groups, rendered, scores)):
        _check_scores(group_scores, len(group.responses), gi, group.id)
        num_tokens = group_rendered.num_tokens
        num_cached = tuple(int(s.num_cached_tokens) for s in group_scores)
        results.append(
            GroupResult(
                id=group.id,
                rewards=tuple(float(s.reward) for s in group_scores),
                num_tokens=num_tokens,
                num_cached_tokens=num_cached,
                truncated_tokens=group_rendered.truncated_tokens,
            )
        )
    for result, hit in zip(results, from_cache, strict=True):
        if hit:
            metrics.result_cache_hits.inc()
        else:
            metrics.observe_group(result.num_tokens, result.num_cached_tokens)
    reply = ScoreResponse(model=info.name, fingerprint=info.fingerprint, results=tuple(results))
    return _json_response(wire.encode_score_response(reply), 200)


# --- checkpoint swap --------------------------------------------------------------------


async def load_model(request: web.Request) -> web.Response:
    """``POST /v1/models/load`` ``{"name", "path"}``: serve another checkpoint.

    Order: admin token → engine ready → body → path under a checkpoint root → the kind of
    swap (:func:`rmserve.server.swap.plan_swap`) → one swap at a time → drain: new scoring
    requests wait on the gate (up to ``swap_wait_s``, then 503), in-flight ones finish on
    the old model, for at most ``swap_drain_timeout_s`` → the swap → the served name
    becomes ``name``, the fingerprint is the new checkpoint's, ``swap_count`` /
    ``last_swap_time`` advance → the gate opens. The two kinds:

    - ``reload`` (same architecture/shape and tokenizer): engine ``reload_weights`` then
      ``reset_prefix_cache`` (cached prompt states of the old weights must not be reused).
    - ``restart`` (anything else, engines with ``restart``): the engine shuts its model
      down and starts the new checkpoint with its other settings unchanged; the renderer
      is rebuilt (``renderer_factory``), so the tokenizer, chat template and
      ``max_model_len`` are the new checkpoint's; ``/health`` answers 503 ``restarting``
      meanwhile. If it fails, the engine is restarted on the previous checkpoint: served
      again on success, else ``/health`` reports ``failed`` and nothing is served.

    Once it holds the swap lock, the swap runs to its end even if the admin client
    disconnects (a half-done restart would leave no model). Replies ``{"models": [ModelInfo],
    "swap_kind": "reload" | "restart"}`` (``GET /v1/models``'s reply plus the kind); the
    kind is also logged and counted in ``rmserve_checkpoint_swaps_total{kind, outcome}``.

    Raises (answered by :func:`error_middleware`; the served model is unchanged unless the
    engine itself failed): ``Forbidden`` (403: no admin token configured, path outside the
    roots), ``Unauthorized`` (401), ``InvalidRequest`` (400), ``Conflict`` (409: another
    swap in progress — a second load is refused, not queued — or a checkpoint the engine
    can neither reload nor restart on), ``EngineNotReady`` (503: not ready, or in-flight
    scoring outlasted ``swap_drain_timeout_s``), ``EngineError`` (500: a reload failed —
    the weights may be partly replaced — or a restart failed; its message says whether the
    previous checkpoint was restored).
    """
    app = request.app
    config = app[CONFIG_KEY]
    state = app[STATE_KEY]
    engine = app[ENGINE_KEY]
    swap.check_admin_token(request.headers.get("Authorization"), config.admin_token)
    state.require_ready()
    body = await request.read()
    load = wire.decode_load_request(body)
    folder = swap.resolve_checkpoint(load.path, config.checkpoint_roots)
    kind, reason = swap.plan_swap(engine, state.checkpoint_dir, folder)
    if state.swap_lock.locked():
        raise Conflict("another checkpoint swap is in progress; retry after it finishes")
    await state.swap_lock.acquire()  # free (checked just above): returns without yielding
    operation = asyncio.ensure_future(_swap(app, load, folder, kind, reason))
    operation.add_done_callback(lambda _: state.swap_lock.release())
    info = await asyncio.shield(operation)
    return _json_response(wire.encode_load_response([info], kind), 200)


async def _swap(app: web.Application, load, folder, kind: swap.SwapKind, reason: str | None) -> ModelInfo:
    """Drain, swap, publish the new model info; the gate reopens whatever happens."""
    config = app[CONFIG_KEY]
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    engine = app[ENGINE_KEY]
    if kind == "restart":
        logger.info("checkpoint swap to %s needs an engine restart: %s", folder.name, reason)
    started = time.perf_counter()
    state.serving.clear()
    try:
        try:
            async with asyncio.timeout(config.swap_drain_timeout_s):
                await state.scoring_idle.wait()
        except TimeoutError:
            metrics.swaps.labels(kind=kind, outcome="drain_timeout").inc()
            raise EngineNotReady(
                f"{state.scoring_requests} scoring requests were still in flight after "
                f"swap_drain_timeout_s={config.swap_drain_timeout_s:g} s; checkpoint {folder.name!r} was not "
                "loaded and the current model is still served; retry later"
            ) from None
        try:
            if kind == "reload":
                new_info = await engine.reload_weights(str(folder))
                await engine.reset_prefix_cache()
            else:
                new_info = await _restart(app, folder)
        except BaseException:
            metrics.swaps.labels(kind=kind, outcome="error").inc()
            raise
        old = state.require_ready()[0]
        state.info = msgspec.structs.replace(
            new_info, name=load.name, swap_count=old.swap_count + 1, last_swap_time=time.time()
        )
        state.checkpoint_dir = folder
    finally:
        state.serving.set()
    metrics.swaps.labels(kind=kind, outcome="ok").inc()
    metrics.swap_duration_s.labels(kind=kind).observe(time.perf_counter() - started)
    logger.info("checkpoint swap %d (%s): now serving %s (fingerprint %s, max_model_len %d)", state.info.swap_count,
                kind, load.name, state.info.fingerprint, state.info.max_model_len)
    return state.info


async def _renderer_after_restart(app: web.Application, info: ModelInfo) -> Renderer:
    """The renderer for the restarted engine: the app's factory's, else the fixed one."""
    factory = app[RENDERER_FACTORY_KEY]
    state = app[STATE_KEY]
    if factory is None:
        assert state.renderer is not None
        return state.renderer
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(app[EXECUTOR_KEY], factory, info)


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, RMServeError) else f"{type(exc).__name__}: {exc}"


async def _restart(app: web.Application, folder) -> ModelInfo:
    """Restart the engine on ``folder``; on failure restart it on the previous checkpoint.

    Returns the new model info (the new renderer is in place). Raises EngineError naming
    both outcomes when the new checkpoint failed: the previous one served again (status
    stays ``ready``, info unchanged) or not (status ``failed``, no info, no renderer).
    """
    state = app[STATE_KEY]
    state.restarting = True
    try:
        return await _restart_or_restore(app, folder)
    finally:
        state.restarting = False


async def _restart_or_restore(app: web.Application, folder) -> ModelInfo:
    engine = app[ENGINE_KEY]
    state = app[STATE_KEY]
    previous = state.checkpoint_dir
    assert previous is not None  # plan_swap restarts only from a known folder
    try:
        info = await engine.restart(str(folder))
        state.renderer = await _renderer_after_restart(app, info)
        return info
    except Exception as exc:  # noqa: BLE001 - any failure: restore the previous checkpoint
        failure = exc
    logger.error("engine restart on checkpoint %s failed (%s); restarting on the previous checkpoint %s",
                 folder.name, _why(failure), previous.name)
    try:
        restored = await engine.restart(str(previous))
        state.renderer = await _renderer_after_restart(app, restored)
    except Exception as exc:  # noqa: BLE001
        state.status, state.error, state.info, state.renderer = "failed", exc, None, None
        logger.error("restoring checkpoint %s failed too (%s): no model is served", previous.name, _why(exc))
        raise EngineError(
            f"restarting the engine on checkpoint {folder.name!r} failed ({_why(failure)}); restoring the previous "
            f"checkpoint {previous.name!r} failed too ({_why(exc)}); no model is served: restart the server"
        ) from failure
    old = state.require_ready()[0]
    state.info = msgspec.structs.replace(restored, name=old.name, swap_count=old.swap_count,
                                         last_swap_time=old.last_swap_time)
    raise EngineError(
        f"restarting the engine on checkpoint {folder.name!r} failed ({_why(failure)}); the previous checkpoint "
        f"{previous.name!r} was restored and is served again (fingerprint {restored.fingerprint})"
    ) from failure
