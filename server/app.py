"""The scoring server's aiohttp application: :func:`create_app` and :class:`ServerConfig`.

All state is owned by the app under typed :class:`aiohttp.web.AppKey` keys (no module
globals): the config, the engine, the renderer, the metrics, the engine's lifecycle state and
the thread pool that renders chat templates. Startup and shutdown live in ``cleanup_ctx``:
the engine is loaded in a background task once the app starts, so the HTTP listener answers
``GET /health`` with 503 while the model loads; on cleanup the load is cancelled if still
running and the engine is shut down.

Routes: ``POST /v1/score``, ``GET /health``, ``GET /v1/models``, ``POST /v1/models/load``
(checkpoint swap, admin token), ``GET /metrics`` (see
:mod:`rmserve.server.handlers`). Errors are written by one middleware
(:func:`rmserve.server.handlers.error_middleware`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web
from rmserve.server.protocol import PrefixCacheStats, RewardEngine, SupportsPrefixCacheStats
from rmserve.server.render import Renderer
from rmserve.server.result_cache import ResultCache

from rmserve.errors import EngineNotReady
from rmserve.schema import ModelInfo

if TYPE_CHECKING:  # prometheus_client is a server extra; importing this module must not need it
    from rmserve.server.observability import ServerMetrics

RendererFactory = Callable[[ModelInfo], Renderer]
"""Builds the renderer once the engine is loaded (it needs the model's max length)."""

logger = logging.getLogger("rmserve.server")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Default request body limit: 32 MiB.

Set on purpose (aiohttp's own default is 1 MiB): a request of 64 RM-Bench groups with six
long responses each is a few MiB of JSON; 32 MiB leaves room for long-context benchmarks while
bounding what one request can make the server buffer and decode.
"""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of the HTTP layer (the engine has its own ``EngineConfig``).

    Raises:
        ValueError: from ``__post_init__``, naming the field, the value and the limit.
    """

    host: str = "127.0.0.1"
    """Interface to listen on; default 127.0.0.1 (this machine only); 0.0.0.0 accepts remote clients."""

    port: int = 8000
    """TCP port, 0-65535; default 8000 (0 lets the OS pick a free port)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body accepted, bytes (≥ 1024); default 32 MiB. Larger bodies get 413 body_too_large."""

    max_inflight_groups: int = 0
    """Most groups admitted at once over all requests (≥ 0); beyond it 429 overloaded. 0 (default) = no limit."""

    served_model_name: str | None = None
    """Name reported in replies and matched against a request's model; None (default) = the engine's name."""

    retry_after_s: int = 5
    """Seconds sent in Retry-After with 503/429 replies (≥ 1); default 5."""

    render_threads: int = 2
    """Threads that decode request bodies, render chat templates and tokenize (≥ 1); default 2."""

    shutdown_timeout_s: float = 10.0
    """Seconds in-flight requests get to finish on shutdown before they are cancelled (≥ 0); default 10."""

    admin_token: str | None = field(default=None, repr=False)
    """Bearer token of POST /v1/models/load; None (default) disables the endpoint (403)."""

    checkpoint_roots: tuple[str, ...] = ()
    """Folders a checkpoint swap may load from (after resolving symlinks); empty = none (403)."""

    swap_wait_s: float = 30.0
    """Seconds a scoring request waits for a checkpoint swap to finish before 503 (≥ 0); default 30."""

    result_cache_groups: int = 100_000
    """Recent group results kept so a group sent again (a resumed or retrying client) is answered without engine work; ≥ 0, 0 = off. Keyed by fingerprint and token ids (:mod:`rmserve.server.result_cache`)."""

    swap_drain_timeout_s: float = 600.0
    """Seconds a checkpoint swap waits for in-flight scoring to finish (≥ 0); default 600. Past it the load fails with 503, nothing is loaded and scoring resumes."""

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("ServerConfig.host must be a non-empty host name or address")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServerConfig.port is {self.port}; it must be between 0 and 65535")
        if self.max_body_bytes < 1024:
            raise ValueError(f"ServerConfig.max_body_bytes is {self.max_body_bytes}; it must be at least 1024")
        if self.max_inflight_groups < 0:
            raise ValueError(
                f"ServerConfig.max_inflight_groups is {self.max_inflight_groups}; it must be ≥ 0 (0 = no limit)"
            )
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("ServerConfig.served_model_name must be None or a non-empty name")
        if self.retry_after_s < 1:
            raise ValueError(f"ServerConfig.retry_after_s is {self.retry_after_s}; it must be at least 1")
        if self.render_threads < 1:
            raise ValueError(f"ServerConfig.render_threads is {self.render_threads}; it must be at least 1")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"ServerConfig.shutdown_timeout_s is {self.shutdown_timeout_s}; it must be ≥ 0")
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("ServerConfig.admin_token must be None or a non-empty token")
        for root in self.checkpoint_roots:
            if not Path(root).is_dir():
                raise ValueError(f"ServerConfig.checkpoint_roots: {root!r} is not an existing folder")
        if self.result_cache_groups < 0:
            raise ValueError(f"ServerConfig.result_cache_groups is {self.result_cache_groups}; it must be ≥ 0 (0 = off)")
        if self.swap_wait_s < 0:
            raise ValueError(f"ServerConfig.swap_wait_s is {self.swap_wait_s}; it must be ≥ 0")
        if not self.swap_drain_timeout_s >= 0:
            raise ValueError(f"ServerConfig.swap_drain_timeout_s is {self.swap_drain_timeout_s}; it must be ≥ 0")

    @property
    def url(self) -> str:
        """Base URL clients use, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(slots=True)
class EngineState:
    """Lifecycle of the app's engine, mutated only by the app's startup task and cleanup.

    Attributes:
        status: ``loading`` → ``ready`` (or ``failed``) → ``stopping``; also ``ready`` →
            ``failed`` when a checkpoint swap restarted the engine, the new checkpoint did
            not start and neither did the previous one (no model is served).
        info: the served model's :class:`ModelInfo` (name overridden by
            ``served_model_name``); set when ready, None after such a failed restart.
        error: why loading (or that restart) failed, when ``status == "failed"``.
        settled: set once loading finished, successfully or not.
        renderer: the chat-template renderer (given to :func:`create_app`, or built by its
            ``renderer_factory`` once the engine is ready, and again after each engine
            restart).
        inflight_groups: groups admitted by ``/v1/score`` and not yet answered.
        scoring_requests: ``/v1/score`` requests past the swap gate and not yet answered.
        scoring_idle: set while ``scoring_requests == 0`` (a swap drains on it).
        serving: cleared while a checkpoint swap runs; scoring requests wait on it.
        swap_lock: held by the one checkpoint swap that may run at a time.
        restarting: True while a checkpoint swap restarts the engine (no model is loaded;
            ``/health`` answers 503 ``restarting`` while scoring requests wait on the gate).
        checkpoint_dir: folder of the loaded checkpoint (for the swap's compatibility check,
            and to restore it when a restart on another checkpoint fails); None when the
            engine does not say.
    """

    status: str = "loading"
    info: ModelInfo | None = None
    renderer: Renderer | None = None
    error: BaseException | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    inflight_groups: int = 0
    scoring_requests: int = 0
    scoring_idle: asyncio.Event = field(default_factory=asyncio.Event)
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    swap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restarting: bool = False
    checkpoint_dir: Path | None = None

    def __post_init__(self) -> None:
        self.scoring_idle.set()
        self.serving.set()

    def require_ready(self) -> tuple[ModelInfo, Renderer]:
        """Model info and renderer; raises :class:`EngineNotReady` unless the engine is ready."""
        if self.status != "ready" or self.info is None or self.renderer is None:
            raise EngineNotReady(f"the engine is not ready (status: {self.status}); retry later")
        return self.info, self.renderer


CONFIG_KEY = web.AppKey("config", ServerConfig)
ENGINE_KEY = web.AppKey("engine", RewardEngine)
RENDERER_FACTORY_KEY = web.AppKey("renderer_factory", object)
METRICS_KEY: web.AppKey[ServerMetrics] = web.AppKey("metrics")
STATE_KEY = web.AppKey("engine_state", EngineState)
EXECUTOR_KEY = web.AppKey("render_executor", ThreadPoolExecutor)
RESULT_CACHE_KEY = web.AppKey("result_cache", ResultCache)


def _engine_counter_reader(engine: RewardEngine) -> Callable[[], PrefixCacheStats | None] | None:
    """A zero-argument reader of the engine's prefix-cache counters, or None if it has none."""
    if not isinstance(engine, SupportsPrefixCacheStats):
        return None

    def reader() -> PrefixCacheStats | None:
        try:
            return engine.prefix_cache_stats()
        except Exception:  # a scrape must not fail because the engine is mid-shutdown
            logger.debug("engine prefix-cache counters unavailable", exc_info=True)
            return None

    return reader


def _engine_checkpoint_dir(engine: RewardEngine) -> Path | None:
    """The loaded checkpoint's folder: ``engine.checkpoint_dir``, else ``engine.config.model``
    when that is a local folder; None otherwise (hub ids, engines that do not say)."""
    folder = getattr(engine, "checkpoint_dir", None)
    if folder is None:
        folder = getattr(getattr(engine, "config", None), "model", None)
    if folder is None or not Path(folder).is_dir():
        return None
    return Path(folder).resolve()


async def _render_executor_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    executor = ThreadPoolExecutor(max_workers=config.render_threads, thread_name_prefix="rmserve-render")
    app[EXECUTOR_KEY] = executor
    try:
        yield
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine = app[ENGINE_KEY]
    state = app[STATE_KEY]
    config = app[CONFIG_KEY]
    factory = app[RENDERER_FACTORY_KEY]

    async def load() -> None:
        try:
            await engine.start()
            info = engine.info()
            if config.served_model_name is not None:
                info = msgspec.structs.replace(info, name=config.served_model_name)
            if state.renderer is None:
                loop = asyncio.get_running_loop()
                state.renderer = await loop.run_in_executor(app[EXECUTOR_KEY], factory, info)
            state.info = info
            state.checkpoint_dir = _engine_checkpoint_dir(engine)
            state.status = "ready"
            logger.info("engine ready: model %s (%s, %s)", info.name, info.engine, info.dtype)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.status = "failed"
            state.error = exc
            logger.exception("engine failed to start")
        finally:
            state.settled.set()

    task = asyncio.create_task(load(), name="rmserve-engine-start")
    try:
        yield
    finally:
        state.status = "stopping"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await engine.shutdown()
        except Exception:
            logger.exception("engine shutdown failed")


def create_app(
    config: ServerConfig,
    engine: RewardEngine,
    renderer: Renderer | None = None,
    *,
    renderer_factory: RendererFactory | None = None,
) -> web.Application:
    """Build the scoring app around an engine and a renderer.

    Args:
        config: the HTTP layer's settings.
        engine: a :class:`~rmserve.server.protocol.RewardEngine`, not yet started: the app
            starts it in the background when it starts and shuts it down on cleanup.
        renderer: a :class:`~rmserve.server.render.Renderer` (chat template → token ids);
            called from the app's render threads, never on the event loop.
        renderer_factory: instead of ``renderer``: called (in a render thread) with the
            engine's :class:`ModelInfo` once the engine has started, and again after every
            engine restart (checkpoint swap to another architecture or tokenizer); the app
            is ready after it returns. A fixed ``renderer`` is kept across restarts.

    Raises:
        ValueError: not exactly one of ``renderer`` / ``renderer_factory`` given.

    Returns:
        The application; run it with ``aiohttp.web.AppRunner(app, handler_cancellation=True)``
        (see :mod:`rmserve.server.serve`) so a client disconnect cancels its engine work.
    """
    from rmserve.server import handlers  # handlers import the keys defined above
    from rmserve.server.observability import ServerMetrics

    if (renderer is None) == (renderer_factory is None):
        raise ValueError("create_app: pass exactly one of renderer or renderer_factory")
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[handlers.error_middleware])
    app[CONFIG_KEY] = config
    app[ENGINE_KEY] = engine
    app[RENDERER_FACTORY_KEY] = renderer_factory
    app[STATE_KEY] = EngineState(renderer=renderer)
    app[METRICS_KEY] = ServerMetrics(engine_counters=_engine_counter_reader(engine))
    app[RESULT_CACHE_KEY] = ResultCache(config.result_cache_groups)
    app.cleanup_ctx.append(_render_executor_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    app.router.add_post("/v1/score", handlers.score)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_post("/v1/models/load", handlers.load_model)
    app.router.add_get("/metrics", handlers.metrics)
    return app
