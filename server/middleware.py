"""Error replies of the scoring app: :func:`error_middleware` and the error-to-response mapping.

Every reply that is not a success is written here, in one JSON shape
(``{"error": {"type", "message", "field"}}``, see :mod:`rmserve.server.wire`); every request
is counted here, by route and status, in the app's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from aiohttp import web
from rmserve.server import wire
from rmserve.server.state import CONFIG_KEY, METRICS_KEY

from rmserve.errors import BodyTooLarge, RMServeError, ServerFault

logger = logging.getLogger("rmserve.server")

JSON_CONTENT_TYPE = "application/json"
CLIENT_CLOSED_STATUS = 499
"""Status recorded in the request counter when the client went away before the reply."""


def json_response(body: bytes, status: int, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON reply with ``body`` (already encoded), ``status`` and optional extra headers."""
    return web.Response(body=body, status=status, content_type=JSON_CONTENT_TYPE, headers=headers)


def error_response(exc: RMServeError, retry_after_s: int) -> web.Response:
    """The JSON reply for an rmserve error: status from its class, ``Retry-After`` when retryable."""
    headers = {"Retry-After": str(retry_after_s)} if exc.retryable else None
    return json_response(wire.encode_error(exc), exc.status, headers)


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
        response = json_response(wire.encode_error_fields(type_, message), exc.status, headers)
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
