"""Middlewares of the scoring app: error replies (:func:`error_middleware`) and who is asking
(:func:`auth_middleware`); and the ``nosniff`` header of every reply (:func:`nosniff`).

Every reply that is not a success is written here, in one JSON shape
(``{"error": {"type", "message", "field"}}``, see :mod:`rmserve.server.http.wire`); every request
is counted here, by route and status (and, once its user is known, by user), in the app's
metrics. The app lists them as ``[error_middleware, auth_middleware]``: authentication runs
inside the error middleware (its 401/403 replies are written and counted like any error) and
before every route, so a refused request never reaches a handler or the engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time

from aiohttp import web
from rmserve.server.http import wire
from rmserve.server.sharing.auth import ADMIN_TOKEN_KEY, USERS_KEY, AuthRejected, RoleForbidden, route_user
from rmserve.server.swaps.state import CONFIG_KEY, METRICS_KEY
from rmserve.server.sharing.users import CURRENT_USER, USER_KEY

from rmserve.errors import BodyTooLarge, RMServeError, ServerFault

logger = logging.getLogger("rmserve.server")

JSON_CONTENT_TYPE = "application/json"
CLIENT_CLOSED_STATUS = 499
"""Status recorded in the request counter when the client went away before the reply."""


def json_response(body: bytes, status: int, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON reply with ``body`` (already encoded), ``status`` and optional extra headers."""
    return web.Response(body=body, status=status, content_type=JSON_CONTENT_TYPE, headers=headers)


NOSNIFF_HEADER = ("X-Content-Type-Options", "nosniff")
"""Sent with every reply (:func:`nosniff`): a browser takes each reply as the type it is
labelled with (JSON stays JSON, never a script or a page)."""


async def nosniff(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook of the front door: add :data:`NOSNIFF_HEADER` to every
    reply (JSON, the status page and its files, ``/metrics``, routing errors)."""
    response.headers.setdefault(*NOSNIFF_HEADER)


BEARER_CHALLENGE = 'Bearer realm="rmserve"'
"""``WWW-Authenticate`` of every 401 reply (RFC 9110 §11.6.1, RFC 6750 §3)."""


def error_response(exc: RMServeError, retry_after_s: int) -> web.Response:
    """The JSON reply for an rmserve error: status from its class; ``Retry-After`` when retryable
    (the error's own ``retry_after_s`` rounded up to whole seconds, at least 1, when it carries
    one — a per-user limit knows when it frees —, else ``retry_after_s``); ``WWW-Authenticate:
    Bearer`` on 401."""
    headers: dict[str, str] = {}
    if exc.retryable:
        own = exc.retry_after_s
        headers["Retry-After"] = str(max(1, math.ceil(own)) if own is not None else retry_after_s)
    if exc.status == 401:
        headers["WWW-Authenticate"] = BEARER_CHALLENGE
    return json_response(wire.encode_error(exc), exc.status, headers or None)


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
            logger.error("%s %s failed: %s%s", request.method, request.path, exc.message, _by(request), exc_info=exc)
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
        response = json_response(wire.encode_error_fields(type_, message), exc.status, headers)
    except asyncio.CancelledError:
        metrics.observe_request(endpoint, CLIENT_CLOSED_STATUS, time.perf_counter() - started)
        _observe_user(request, endpoint, CLIENT_CLOSED_STATUS)
        logger.info(
            "%s %s cancelled (client disconnected or server stopping)%s", request.method, request.path, _by(request)
        )
        raise
    except Exception:
        logger.exception("unexpected error while handling %s %s%s", request.method, request.path, _by(request))
        generic = ServerFault("internal server error; the server log has the details")
        response = error_response(generic, config.retry_after_s)
    metrics.observe_request(endpoint, response.status, time.perf_counter() - started)
    _observe_user(request, endpoint, response.status)
    return response


def _by(request: web.Request) -> str:
    """`` [user NAME]`` for a log line about ``request`` once its user is known, else ``""``.

    Inside :func:`auth_middleware` the log filter adds it (:class:`~rmserve.server.sharing.users.RequestUserLogFilter`);
    the error middleware runs outside it, so it names the user itself."""
    user = request.get(USER_KEY)
    return f" [user {user.name}]" if user is not None and CURRENT_USER.get() is None else ""


def _observe_user(request: web.Request, endpoint: str, status: int) -> None:
    user = request.get(USER_KEY)
    if user is not None:
        request.app[METRICS_KEY].observe_user_request(user.name, endpoint, status)


@web.middleware
async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Find who is asking and put the :class:`~rmserve.server.sharing.users.User` on the request under
    :data:`~rmserve.server.sharing.users.USER_KEY` before any route runs.

    Without a users file (no :data:`~rmserve.server.sharing.auth.USERS_KEY` in the app) every request
    is :data:`~rmserve.server.sharing.users.ANONYMOUS`, and checkpoint loads and lease releases need
    the admin token (:data:`~rmserve.server.sharing.auth.ADMIN_TOKEN_KEY`; 403 without one). With one,
    the public paths (``/health``, ``/``, ``/static/…``) pass without a user; every other request
    needs a valid token for a role that may use the route
    (:func:`rmserve.server.sharing.auth.route_user`). Both modes check tokens with the same
    function (:func:`rmserve.server.sharing.auth.check_token`). A refused request is refused here:
    401 with ``WWW-Authenticate: Bearer`` (missing, malformed, unknown or expired token) or
    403 (role, or no admin token), counted in ``rmserve_auth_rejections_total{reason}`` and
    logged at INFO with the reason and client address (never the token). While the route runs
    the user is also in :data:`~rmserve.server.sharing.users.CURRENT_USER`, so every log line
    names it.
    """
    registry = request.app.get(USERS_KEY)
    try:
        user = route_user(registry, request, now_s=time.time(), admin=request.app.get(ADMIN_TOKEN_KEY))
    except (AuthRejected, RoleForbidden) as exc:
        request.app[METRICS_KEY].auth_rejections.labels(reason=exc.reason).inc()
        logger.info(
            "%s %s refused (%s, %d): %s [from %s]",
            request.method, request.path, exc.reason, exc.status, exc.message, request.remote,
        )
        raise
    if user is None:
        return await handler(request)
    request[USER_KEY] = user
    token = CURRENT_USER.set(user)
    try:
        return await handler(request)
    finally:
        CURRENT_USER.reset(token)
