"""The status page at ``GET /`` and the JSON it reads besides ``/v1/models`` and ``/v1/queue``.

The page is plain HTML with a little JavaScript (``server/static/``, no build step). Every
:data:`REFRESH_S` seconds it reads ``GET /v1/models`` (models, fingerprints, swap count and
last swap time, who holds each lease), ``GET /v1/queue`` (per-user queue and throughput, as the caller may see it:
:mod:`rmserve.server.http.queue_routes`) and ``GET /v1/status`` (:class:`StatusReply`: engine state
and prefix-cache hit rate, from the server's metrics; leases with their pinned work in flight; the
last 15 minutes of the fair queue, :mod:`rmserve.server.http.status_history`, which the page
draws as charts of tokens/s per user and of the queue's depth). The page holds no token and no secret;
when the server asks for one (401), the page offers a field whose token stays in the
browser's session storage and goes only to this server as a bearer token.

Routes: ``GET /`` (the page), ``GET /static/{name}`` (its script and style sheet),
``GET /v1/status``.

**Hardening.** Every reply under ``/`` and ``/static/`` (files and errors alike) carries
:data:`PAGE_HEADERS`: a Content-Security-Policy that lets the page load only its own script,
style sheet and JSON (no inline script or style, no ``eval``, no plugins, no ``<base>``, no
form submission, no framing), ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and
``X-Content-Type-Options: nosniff``. The page is written to need nothing more: its script is
``static/status.js``, its styles ``static/status.css``, and the script builds the tables and
the charts (inline SVG) with DOM calls (``textContent``, ``className``, ``hidden``, SVG
presentation attributes such as ``stroke``), never markup or inline styles.
"""

from __future__ import annotations

import time
from importlib import resources

import msgspec
from aiohttp import web
from rmserve.server.http import status_history
from rmserve.server.http.status_history import StatusHistory
from rmserve.server.sharing.fair_queue import queue_of
from rmserve.server.sharing.leases import LeaseState, SwapEntry, leases_of
from rmserve.server.sharing.users import ANONYMOUS, USER_KEY
from rmserve.server.swaps.state import CONFIG_KEY, METRICS_KEY, STATE_KEY

REFRESH_S = 3
"""Seconds between two refreshes of the page (the script reads it from the page's
``data-refresh-s``)."""

STATIC_FILES: dict[str, str] = {
    "status.js": "text/javascript",
    "status.css": "text/css",
}
"""Files served under ``/static/`` and their content types (nothing else is served)."""

STARTED_KEY = web.AppKey("status_started_s", float)

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The status page's Content-Security-Policy: scripts, styles, images and ``fetch`` from the
server's own origin only (no inline script or style, no ``eval``); no plugins, no ``<base>``,
no form submission (the token form is handled by the script), never inside a frame."""

PAGE_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
"""Headers of every reply under ``/`` and ``/static/`` (:func:`page_headers`)."""


def is_page_path(path: str) -> bool:
    """Whether ``path`` is the status page's: ``/`` or under ``/static/``."""
    return path == "/" or path.startswith("/static/")


async def page_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: :data:`PAGE_HEADERS` on every reply to a page path
    (:func:`is_page_path`), the files and any error answered there."""
    if is_page_path(request.path):
        response.headers.update(PAGE_HEADERS)


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
            (:class:`~rmserve.server.sharing.leases.LeaseState`: holder, since when, seconds until
            it ends if its holder stays idle, every user's pinned groups); empty while no
            model is served.
        swaps: the recent checkpoint swaps (up to 20 per model), newest first.
        history: the last 15 minutes of the fair queue, every model together
            (:class:`~rmserve.server.http.status_history.StatusHistory`: sample times in Unix
            seconds, queue depths in groups, per-user prompt tokens/s and groups/s); None
            only in one model's reply before the route adds it (:func:`with_history`).
        replica: which replica of a Ray replica set this server is
            (:attr:`~rmserve.server.config.ServerConfig.replica`); None outside one.
    """

    status: str
    uptime_s: float
    fair_share: bool
    groups_scored: int
    engine_prefix_cache: PrefixCache | None
    served_prefix_cache: PrefixCache
    leases: tuple[LeaseState, ...] = ()
    swaps: tuple[SwapEntry, ...] = ()
    history: StatusHistory | None = None
    replica: str | None = None


def _cache(queries: float | None, hits: float | None) -> PrefixCache | None:
    if queries is None or hits is None:
        return None
    return PrefixCache(int(queries), int(hits), hits / queries if queries > 0 else None)


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
        replica=app[CONFIG_KEY].replica,
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
    One reply is returned as it is.

    Raises:
        ValueError: no reply given.
    """
    if not replies:
        raise ValueError("merge_status: no reply to merge")
    if len(replies) == 1:
        return replies[0]
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
        replica=replies[0].replica,
    )


def with_history(reply: StatusReply, request: web.Request) -> StatusReply:
    """``reply`` with the history of the app that answers ``request``: every user's rates for
    an admin, only the caller's own for anyone else (as ``GET /v1/queue``)."""
    user = request.get(USER_KEY, ANONYMOUS)
    history = request.app[status_history.HISTORY_KEY].history(None if user.is_admin else user.name)
    return msgspec.structs.replace(reply, history=history)


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


def setup(app: web.Application, status_handler) -> None:
    """Add ``GET /``, ``GET /static/{name}`` and ``GET /v1/status`` (``status_handler``:
    :func:`rmserve.server.http.routes.status`, which answers :func:`status_reply` merged over
    the served models) to ``app``, the :data:`PAGE_HEADERS` of the page's replies
    (:func:`page_headers`) and the sampling of the history
    (:func:`rmserve.server.http.status_history.setup`)."""
    app[STARTED_KEY] = time.monotonic()
    status_history.setup(app)
    app.on_response_prepare.append(page_headers)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/v1/status", status_handler)
