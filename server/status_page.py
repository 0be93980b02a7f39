"""The status page at ``GET /`` and the JSON it reads besides ``/v1/models`` and ``/v1/queue``.

The page is plain HTML with a little JavaScript (``server/static/``, no build step). Every
:data:`REFRESH_S` seconds it reads ``GET /v1/models`` (models, fingerprints, swap count and
last swap time, who holds each lease), ``GET /v1/queue`` (per-user queue and throughput, as the caller may see it:
:mod:`rmserve.server.queue_routes`) and ``GET /v1/status`` (:class:`StatusReply`: engine state
and prefix-cache hit rate, from the server's metrics; leases with their pinned work in flight). The page holds no token and no secret;
when the server asks for one (401), the page offers a field whose token stays in the
browser's session storage and goes only to this server as a bearer token.

Routes: ``GET /`` (the page), ``GET /static/{name}`` (its script and style sheet),
``GET /v1/status``.
"""

from __future__ import annotations

import time
from importlib import resources

import msgspec
from aiohttp import web
from rmserve.server.fair_queue import queue_of
from rmserve.server.leases import LeaseState, SwapEntry, leases_of
from rmserve.server.middleware import json_response
from rmserve.server.state import METRICS_KEY, STATE_KEY

REFRESH_S = 3
"""Seconds between two refreshes of the page (the script reads it from the page's
``data-refresh-s``)."""

STATIC_FILES: dict[str, str] = {
    "status.js": "text/javascript",
    "status.css": "text/css",
}
"""Files served under ``/static/`` and their content types (nothing else is served)."""

STARTED_KEY = web.AppKey("status_started_s", float)


class PrefixCache(msgspec.Struct, frozen=True):
    """Prefix-cache counters in tokens, and hits / queries (None before any query)."""

    query_tokens: int
    hit_tokens: int
    hit_rate: float | None


class StatusReply(msgspec.Struct, frozen=True):
    """Body of ``GET /v1/status``.

    Attributes:
        status: the engine's state (``loading``, ``ready``, ``failed``, ``stopping``,
            ``restoring``; ``restarting`` while a swap restarts it).
        uptime_s: seconds since the app started.
        fair_share: whether a fair queue is in front of the engine.
        groups_scored: groups the engine has scored (result-cache hits not counted).
        engine_prefix_cache: the engine's own counters (``rmserve_engine_prefix_cache_*``);
            None when the engine has none.
        served_prefix_cache: the same figures summed from the replies this server sent
            (``rmserve_prefix_cache_*``).
        leases: the served model's lease and pinned work in flight
            (:class:`~rmserve.server.leases.LeaseState`: holder, since when, seconds until
            it ends if its holder stays idle, every user's pinned groups); empty while no
            model is served.
        swaps: the recent checkpoint swaps (up to 20 per model), newest first.
    """

    status: str
    uptime_s: float
    fair_share: bool
    groups_scored: int
    engine_prefix_cache: PrefixCache | None
    served_prefix_cache: PrefixCache
    leases: tuple[LeaseState, ...] = ()
    swaps: tuple[SwapEntry, ...] = ()


_encoder = msgspec.json.Encoder()


def _cache(queries: float | None, hits: float | None) -> PrefixCache | None:
    if queries is None or hits is None:
        return None
    return PrefixCache(int(queries), int(hits), hits / queries if queries > 0 else None)


async def status(request: web.Request) -> web.Response:
    """``GET /v1/status``: :class:`StatusReply`."""
    app = request.app
    return json_response(_encoder.encode(status_reply(app, app[STARTED_KEY])), 200)


def status_reply(app: web.Application, started_s: float) -> StatusReply:
    """The :class:`StatusReply` of one scoring app (``started_s``: ``time.monotonic()`` at start)."""
    registry = app[METRICS_KEY].registry
    state = app[STATE_KEY]
    value = registry.get_sample_value
    engine_status = "restarting" if state.status == "ready" and state.restarting else state.status
    served = _cache(value("rmserve_prefix_cache_queries_total") or 0.0, value("rmserve_prefix_cache_hits_total") or 0.0)
    assert served is not None
    return StatusReply(
        status=engine_status,
        uptime_s=time.monotonic() - started_s,
        fair_share=queue_of(app) is not None,
        groups_scored=int(value("rmserve_groups_total") or 0),
        engine_prefix_cache=_cache(
            value("rmserve_engine_prefix_cache_queries_total"), value("rmserve_engine_prefix_cache_hits_total")
        ),
        served_prefix_cache=served,
        leases=(leases_of(app).state(state.info),) if state.status == "ready" and state.info is not None else (),
        swaps=tuple(SwapEntry.of(record) for record in reversed(leases_of(app).swaps)),
    )


def _sum_cache(caches: list[PrefixCache | None]) -> PrefixCache | None:
    present = [c for c in caches if c is not None]
    if not present:
        return None
    return _cache(sum(c.query_tokens for c in present), sum(c.hit_tokens for c in present))


def merge_status(replies: list[StatusReply]) -> StatusReply:
    """Several models' :class:`StatusReply` as one: the first status that is not ``ready``
    (else ``ready``), the longest uptime, ``fair_share`` if any, groups and prefix-cache
    tokens summed (the hit rate recomputed from the sums), every model's lease row, every model's recent swaps, newest first.

    Raises:
        ValueError: no reply given.
    """
    if not replies:
        raise ValueError("merge_status: no reply to merge")
    not_ready = [r.status for r in replies if r.status != "ready"]
    served = _sum_cache([r.served_prefix_cache for r in replies])
    assert served is not None
    return StatusReply(
        status=not_ready[0] if not_ready else "ready",
        uptime_s=max(r.uptime_s for r in replies),
        fair_share=any(r.fair_share for r in replies),
        groups_scored=sum(r.groups_scored for r in replies),
        engine_prefix_cache=_sum_cache([r.engine_prefix_cache for r in replies]),
        served_prefix_cache=served,
        leases=tuple(lease for r in replies for lease in r.leases),
        swaps=tuple(sorted((swap for r in replies for swap in r.swaps), key=lambda swap: -swap.time)),
    )


def _read_static() -> dict[str, bytes]:
    folder = resources.files("rmserve.server").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in ("index.html", *STATIC_FILES)}


_FILES = _read_static()
"""The page's files, read once when the module is imported (never on the event loop)."""


async def page(request: web.Request) -> web.Response:
    """``GET /``: the status page (``static/index.html``)."""
    body = _FILES["index.html"].replace(b"{{REFRESH_S}}", str(REFRESH_S).encode())
    return web.Response(body=body, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store"})


async def static(request: web.Request) -> web.Response:
    """``GET /static/{name}``: one of :data:`STATIC_FILES`; 404 for any other name."""
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return web.Response(body=_FILES[name], content_type=STATIC_FILES[name], charset="utf-8",
                        headers={"Cache-Control": "no-store"})


def setup(app: web.Application, status_handler=status) -> None:
    """Add ``GET /``, ``GET /static/{name}`` and ``GET /v1/status`` (``status_handler``; a
    server of several models passes its own) to ``app``."""
    app[STARTED_KEY] = time.monotonic()
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/v1/status", status_handler)
