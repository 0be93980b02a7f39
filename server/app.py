"""The scoring server's aiohttp application factory: :func:`create_app`.

All state is owned by the app under the typed :class:`aiohttp.web.AppKey` keys of
:mod:`rmserve.server.state` (no module globals): the config, the engine, the renderer, the
metrics, the engine's lifecycle state, the result cache and the thread pool that renders chat
templates. Startup and shutdown live in ``cleanup_ctx``: the engine is loaded in a
background task once the app starts, so the HTTP listener answers ``GET /health`` with 503
while the model loads; on cleanup the load is cancelled if still running and the engine is
shut down.

Routes: ``POST /v1/score``, ``GET /health``, ``GET /v1/models``, ``POST /v1/models/load``
(checkpoint swap, admin token), ``POST /v1/models/release`` (end a checkpoint lease,
:mod:`rmserve.server.leases`), ``GET /metrics`` (:mod:`rmserve.server.handlers`). Errors are
written by one middleware (:func:`rmserve.server.middleware.error_middleware`).

A generative judge (an engine that is a :class:`~rmserve.server.protocol.JudgeEngine`) needs
no renderer: its engine renders the judge prompts itself. The app then scores with
:mod:`rmserve.server.judge_scoring` and publishes the engine's info as a judge's
(:meth:`~rmserve.server.judge_scoring.JudgeSettings.model_info`: kind ``judge``, the protocol
choice as ``mode``, ``compat``, ``judge_max_tokens``, ``judge_seed`` and a fingerprint bound
to those settings).

The module layout of the server, each importing only those above it:
``config``, ``protocol``, ``render``, ``result_cache`` → ``state`` → ``middleware``,
``scoring``, ``swap`` → ``judge_scoring`` → ``handlers`` → ``app``, ``model_router`` (several models
  behind one node app) → ``serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec
from aiohttp import web
from rmserve.server import handlers, leases, queue_routes
from rmserve.server.config import DEFAULT_MAX_BODY_BYTES, ServerConfig, engine_window
from rmserve.server.fair_queue import queue_of
from rmserve.server import auth, limits, render_pool
from rmserve.server.judge_scoring import JudgeSettings
from rmserve.server.middleware import auth_middleware, error_middleware
from rmserve.server.protocol import JudgeEngine, PrefixCacheStats, RewardEngine, SupportsPrefixCacheStats
from rmserve.server.render import Renderer
from rmserve.server.result_cache import ResultCache
from rmserve.server.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    EXECUTOR_KEY,
    JUDGE_KEY,
    METRICS_KEY,
    RENDERER_FACTORY_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
    EngineState,
    RendererFactory,
)
from rmserve.server.swap import renderer_for

__all__ = [
    "CONFIG_KEY",
    "DEFAULT_MAX_BODY_BYTES",
    "ENGINE_KEY",
    "EXECUTOR_KEY",
    "JUDGE_KEY",
    "JudgeSettings",
    "METRICS_KEY",
    "RENDERER_FACTORY_KEY",
    "RESULT_CACHE_KEY",
    "STATE_KEY",
    "RendererFactory",
    "ServerConfig",
    "create_app",
]

logger = logging.getLogger("rmserve.server")


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


async def _render_executor_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    executor = ThreadPoolExecutor(max_workers=config.render_threads, thread_name_prefix="rmserve-render")
    app[EXECUTOR_KEY] = executor
    render_pool.install(app, executor)  # per-user fair order of its jobs (with fair_share)
    try:
        yield
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine = app[ENGINE_KEY]
    state = app[STATE_KEY]
    config = app[CONFIG_KEY]

    async def load() -> None:
        try:
            loaded = await engine.start()
            info = loaded.info
            if config.served_model_name is not None:
                info = msgspec.structs.replace(info, name=config.served_model_name)
                loaded = dataclasses.replace(loaded, info=info)
            judge = app[JUDGE_KEY]
            if judge is not None:
                info = judge.model_info(info)
                renderer = None
            else:
                renderer = await renderer_for(app, loaded)
            state.publish(info, renderer, loaded.checkpoint_dir)
            logger.info("engine ready: model %s (%s, %s)", info.name, info.engine, info.dtype)
            queue = queue_of(app)
            if queue is not None:
                queue.set_window_tokens(engine_window(config, loaded.step_tokens))
                logger.info("fair queue: at most %d groups%s at the engine", queue.concurrency,
                            f" and {queue.window_tokens:,} prompt tokens" if queue.window_tokens else "")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.fail(exc)
            logger.exception("engine failed to start")
        finally:
            state.settle()

    task = asyncio.create_task(load(), name="rmserve-engine-start")
    try:
        yield
    finally:
        state.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await engine.shutdown()
        except Exception as exc:
            state.fail(exc)  # the stop is not clean: serve_app says so after the traceback
            logger.exception("engine shutdown failed")


def create_app(
    config: ServerConfig,
    engine: RewardEngine | JudgeEngine,
    renderer: Renderer | None = None,
    *,
    renderer_factory: RendererFactory | None = None,
    judge: JudgeSettings | None = None,
) -> web.Application:
    """Build the scoring app around an engine and a renderer.

    Args:
        config: the HTTP layer's settings.
        engine: a :class:`~rmserve.server.protocol.RewardEngine`, not yet started: the app
            starts it in the background when it starts and shuts it down on cleanup.
        renderer: a :class:`~rmserve.server.render.Renderer` (chat template → token ids);
            called from the app's render threads, never on the event loop.
        renderer_factory: instead of ``renderer``: called (in a render thread) with the
            engine's :class:`~rmserve.server.protocol.LoadedModel` once the engine has
            started (its info named ``served_model_name`` when set), and again after every
            engine restart (checkpoint swap to another architecture or tokenizer); the app
            is ready after it returns. A fixed ``renderer`` is kept across restarts. To
            render with the engine's own renderer, pass
            :func:`rmserve.server.serve.engine_renderer`.
        judge: for a :class:`~rmserve.server.protocol.JudgeEngine` only: the settings it
            judges with (:meth:`JudgeSettings.from_engine_config`); None takes them from the
            engine (:meth:`JudgeSettings.of_engine`). A judge takes no renderer and no factory.

    Raises:
        ValueError: for a reward engine, not exactly one of ``renderer`` /
            ``renderer_factory`` given, or ``judge`` given; for a judge engine, a renderer
            or factory given.

    Returns:
        The application; run it with ``aiohttp.web.AppRunner(app, handler_cancellation=True)``
        (see :mod:`rmserve.server.serve`) so a client disconnect cancels its engine work.
    """
    from rmserve.server.observability import ServerMetrics  # prometheus_client: a server extra

    is_judge = isinstance(engine, JudgeEngine)
    if is_judge:
        if renderer is not None or renderer_factory is not None:
            raise ValueError("create_app: a judge engine renders its own prompts; pass no renderer or renderer_factory")
        judge = judge if judge is not None else JudgeSettings.of_engine(engine)
    elif judge is not None:
        raise ValueError("create_app: judge settings are for a judge engine only")
    elif (renderer is None) == (renderer_factory is None):
        raise ValueError("create_app: pass exactly one of renderer or renderer_factory")
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware, auth_middleware])
    app[CONFIG_KEY] = config
    app[ENGINE_KEY] = engine
    app[RENDERER_FACTORY_KEY] = renderer_factory
    app[JUDGE_KEY] = judge
    app[STATE_KEY] = EngineState(renderer=renderer, needs_renderer=not is_judge)
    app[METRICS_KEY] = ServerMetrics(engine_counters=_engine_counter_reader(engine))
    app[RESULT_CACHE_KEY] = ResultCache(config.result_cache_groups)
    if config.users_file is not None:  # who is asking (server/auth.py) and per-user limits (server/limits.py)
        app[auth.USERS_KEY] = auth.UserRegistry(config.users)
        if config.admin_token is not None:
            logger.warning("the admin token (--admin-token-file / RMSERVE_ADMIN_TOKEN) is not used with a users "
                           "file: checkpoint swaps need a user with the role admin (rmserve users add NAME --role admin)")
    limits.install(app)
    app.cleanup_ctx.append(_render_executor_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    app.router.add_post("/v1/score", handlers.score)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_post("/v1/models/load", handlers.load_model)
    app.router.add_post("/v1/models/release", handlers.release_model)
    leases.setup(app, config.lease_idle_s)
    app.router.add_get("/metrics", handlers.metrics)
    queue_routes.setup(app)  # fair queue, GET /v1/queue, status page (GET /, /v1/status)
    return app
