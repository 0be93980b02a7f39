"""Routes of the scoring app: each reads the request, calls the module that does the work, replies.

- ``POST /v1/score``: :func:`score` → swap gate (:func:`rmserve.server.swap.scoring_slot`) →
  body (size-limited) → decode and validate (render thread) → model name →
  :func:`rmserve.server.scoring.score_request` (a generative judge:
  :func:`rmserve.server.judge_scoring.score_request`).
- ``GET /health``, ``GET /v1/models``, ``GET /metrics``: read the app's state.
- ``POST /v1/models/load``: :func:`load_model` → checks and
  :func:`rmserve.server.swap.start_swap` (which checks and takes the model's lease).
- ``POST /v1/models/release``: :func:`release_model` (:mod:`rmserve.server.leases`).

Errors are raised as :class:`~rmserve.errors.RMServeError` and answered by
:func:`rmserve.server.middleware.error_middleware`.
"""

from __future__ import annotations

from aiohttp import web
from rmserve.server import fair_queue, judge_scoring, render_pool, scoring, swap, wire
from rmserve.server.leases import leases_of
from rmserve.server.middleware import json_response
from rmserve.server.state import CONFIG_KEY, ENGINE_KEY, JUDGE_KEY, METRICS_KEY, STATE_KEY
from rmserve.server.users import ANONYMOUS, USER_KEY

from rmserve.errors import BodyTooLarge, InvalidCheckpoint, ModelNotFound
from rmserve.schema import LoadModelRequest, ReleaseModelRequest, ScoreRequest


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 ``{"status": "ready"}``; 503 with ``Retry-After`` otherwise
    (``loading``, ``failed``, ``stopping``, ``restarting`` while a checkpoint swap restarts
    the engine: no model is loaded then, scoring requests wait on the swap gate; or
    ``restoring`` while the previous weights are reloaded after a failed in-place reload)."""
    state = request.app[STATE_KEY]
    if state.status == "ready" and not state.restarting:
        return json_response(wire.encode_health("ready"), 200)
    status = "restarting" if state.status == "ready" else state.status
    headers = {"Retry-After": str(request.app[CONFIG_KEY].retry_after_s)}
    return json_response(wire.encode_health(status), 503, headers)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{"models": [ModelInfo]}`` (with ``lease_holder`` and
    ``lease_since`` while a lease is held); 503 ``engine_not_ready`` while loading."""
    info, _ = request.app[STATE_KEY].require_ready()
    return json_response(wire.encode_models([leases_of(request.app).annotate(info)]), 200)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the app's Prometheus registry in text format."""
    body, content_type = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def score(request: web.Request) -> web.Response:
    """``POST /v1/score``: score every group of the request (see the module docstring).

    During a checkpoint swap the request waits (up to ``swap_wait_s``) until the new model
    serves; requests already past the gate finish on the old weights before the swap starts.

    Raises (answered by the error middleware): ``EngineNotReady`` (503),
    ``InvalidRequest`` (400), ``ModelNotFound`` (404), ``Conflict`` (409: the request's
    ``fingerprint`` is not the served model's), ``SequenceTooLong`` /
    ``BodyTooLarge`` (413), ``Overloaded`` (429), ``EngineError`` (500).
    """
    return await score_on(request, request.app)


async def score_on(request: web.Request, app: web.Application) -> web.Response:
    """:func:`score` with the model app ``app`` (the request's own app, or on a server
    serving several models the one :mod:`rmserve.server.model_router` chose)."""
    state = app[STATE_KEY]
    state.require_ready()
    async with swap.scoring_slot(state, app[CONFIG_KEY].swap_wait_s):
        return await _score(request, app)


def check_body_size(request: web.Request, config) -> None:
    """Raise ``BodyTooLarge`` (413) when the declared body exceeds ``config.max_body_bytes``."""
    if request.content_length is not None and request.content_length > config.max_body_bytes:
        raise BodyTooLarge(
            f"request body is {request.content_length} bytes; the server's limit is "
            f"{config.max_body_bytes} bytes (max_body_bytes)",
            value=request.content_length,
            limit=config.max_body_bytes,
        )


async def _score(request: web.Request, app: web.Application) -> web.Response:
    config = app[CONFIG_KEY]
    info, renderer = app[STATE_KEY].require_ready()
    check_body_size(request, config)
    body = await request.read()
    caller = fair_queue.caller_of(request)
    score_request: ScoreRequest = await render_pool.run(
        app, caller, len(body), lambda: wire.decode_score_request(body, max_model_len=info.max_model_len)
    )
    if score_request.model is not None and score_request.model != info.name:
        raise ModelNotFound(
            f"model {score_request.model!r} is not served here; this server scores {info.name!r}",
            field="model",
            value=score_request.model,
        )
    judge = app[JUDGE_KEY]
    if judge is not None:
        reply = await judge_scoring.score_request(app, score_request, info, judge, caller)
    else:
        reply = await scoring.score_request(app, score_request, info, renderer, caller)
    return json_response(wire.encode_score_response(reply), 200)


async def load_model(request: web.Request) -> web.Response:
    """``POST /v1/models/load`` ``{"name", "path", "force"?}``: serve another checkpoint as ``name``.

    Checks, in order, none of which touches the engine or pauses scoring: admin token
    (403/401), engine ready (503), body (400), path under a checkpoint root (403), the
    checkpoint's own files (422 ``invalid_checkpoint``: config, label count, tokenizer,
    weights), the kind of swap (409 when neither applies), one swap at a time (409). Then
    :func:`rmserve.server.swap.start_swap`: new scoring requests wait (up to ``swap_wait_s``,
    then 503), in-flight ones finish on the old model (up to ``swap_drain_timeout_s``, else
    503 and nothing changes), the engine reloads the weights in place (same shape and
    tokenizer) or restarts on the checkpoint, and the gate reopens. The swap runs to its end
    even if the caller disconnects.

    Leases (:mod:`rmserve.server.leases`): once the gate is closed, a swap by a user
    (``request[USER_KEY]``, the anonymous user without authentication) is refused with 409
    while another user holds the model's lease or has pinned work in flight on it, unless an
    admin passes ``force: true`` (403 for anyone else); a successful swap gives the lease to
    the user.

    Replies ``{"models": [ModelInfo], "swap_kind": "reload" | "restart"}``: the new name and
    fingerprint, ``swap_count`` + 1 (after a restart also the new ``max_model_len`` and
    tokenizer); the result cache is cleared; ``rmserve_checkpoint_swaps_total{kind, outcome}``
    counts it. If the engine fails, the previous checkpoint is loaded again (``/health``
    says ``restoring`` after a reload, ``restarting`` after a restart) and the reply is 500
    ``engine_error`` saying whether it serves again; if not, ``/health`` says ``failed`` and
    scoring answers 503.

    A generative judge is not swapped: 422 ``invalid_checkpoint`` (after the admin token and
    readiness checks) saying to restart the server on the other model.
    """
    check_load_access(request)
    info, _ = request.app[STATE_KEY].require_ready()
    _refuse_judge_swap(request.app)
    load = wire.decode_load_request(await request.read())
    if load.model is not None and load.model != info.name:
        raise ModelNotFound(f"model {load.model!r} is not served here; this server scores {info.name!r}",
                            field="model", value=load.model)
    return await load_model_on(request, request.app, load)


def check_load_access(request: web.Request) -> None:
    """The admin-token check of ``POST /v1/models/load`` and ``/v1/models/release`` on a
    server without a users file (with one, the auth middleware has checked the user and its
    role, and the leases decide who may release): ``Unauthorized`` (401) / ``Forbidden`` (403)."""
    config = request.app[CONFIG_KEY]
    if config.users_file is None:
        swap.check_admin_token(request.headers.get("Authorization"), config.admin_token)


def _refuse_judge_swap(app: web.Application) -> None:
    if app[JUDGE_KEY] is not None:
        raise InvalidCheckpoint(
            "checkpoint swap is not supported for a generative judge (kind judge): its verdicts are bound to "
            "the model and the judge settings it started with; restart the server on the other model",
            field="path",
        )


async def load_model_on(request: web.Request, app: web.Application, load: LoadModelRequest) -> web.Response:
    """:func:`load_model` past the access check and body decoding, on the model app ``app``."""
    config = app[CONFIG_KEY]
    app[STATE_KEY].require_ready()
    _refuse_judge_swap(app)
    folder = swap.resolve_checkpoint(load.path, config.checkpoint_roots)
    await swap.check_files(folder, app[ENGINE_KEY])
    user = request.get(USER_KEY, ANONYMOUS)
    info, kind = await swap.start_swap(app, load, folder, user)
    return json_response(wire.encode_load_response([leases_of(app).annotate(info)], kind), 200)


async def release_model(request: web.Request) -> web.Response:
    """``POST /v1/models/release`` ``{"name"}``: end the lease on the model ``name``.

    Without a users file, the admin token of ``POST /v1/models/load`` (403/401); with one, any
    user's token, and the lease's holder or an admin may end it. Replies ``{"models": [ModelInfo]}``
    (no lease fields any more).

    Raises (answered by the error middleware): ``Forbidden`` / ``Unauthorized``, ``EngineNotReady``
    (503), ``InvalidRequest`` (400, bad body), ``ModelNotFound`` (404, not the served model),
    ``Conflict`` (409, no lease held), ``Forbidden`` (403, neither the holder nor an admin).
    """
    check_load_access(request)
    info, _ = request.app[STATE_KEY].require_ready()
    release = wire.decode_release_request(await request.read())
    if release.name != info.name:
        raise ModelNotFound(f"model {release.name!r} is not served here; this server scores {info.name!r}",
                            field="name", value=release.name)
    return release_on(request, request.app, release)


def release_on(request: web.Request, app: web.Application, release: ReleaseModelRequest) -> web.Response:
    """:func:`release_model` past the token check and body decoding, on the model app ``app``
    (whose served model is ``release.name``)."""
    info, _ = app[STATE_KEY].require_ready()
    book = leases_of(app)
    ended = book.release(request.get(USER_KEY, ANONYMOUS), release.name)
    swap.logger.info("lease on %s released (held by %s)", ended.model, ended.holder)
    return json_response(wire.encode_models([book.annotate(info)]), 200)
