"""The scoring server's aiohttp application factory: :func:`create_app`.

All state is owned by the app under the typed :class:`aiohttp.web.AppKey` keys of
:mod:`rmserve.server.swaps.state` (no module globals): the config, the engine, the renderer, the
metrics, the engine's lifecycle state, the result cache and the thread pool that renders chat
templates. Startup and shutdown live in ``cleanup_ctx``: the engine is loaded in a
background task once the app starts, so the HTTP listener answers ``GET /health`` with 503
while the model loads; on cleanup the load is cancelled if still running and the engine is
shut down.

A server of one model is a node of one model: the app is its own front door (its
:class:`~rmserve.server.http.routes.ServedModels` hold itself) and carries the one route table,
:func:`rmserve.server.http.routes.setup` (``POST /v1/score``, ``GET /health``, ``GET /v1/models``,
``POST /v1/models/load``, ``POST /v1/models/release``, ``GET /metrics``, ``GET /v1/queue``, the
status page). Behind a node of several models (:mod:`rmserve.server.http.node`) the same app
is a model app the node's routes hand requests to. The app installs the engine's
:class:`~rmserve.server.sharing.fair_queue.FairQueue` when ``ServerConfig.fair_share`` is on.
Errors are written by one middleware (:func:`rmserve.server.http.middleware.error_middleware`).

What differs between kinds of reward model is asked of the served model's kind
(:class:`~rmserve.server.kinds.base.RewardKind`, kept under ``KIND_KEY``): whether the app
builds a renderer (a generative judge's engine renders its own prompts), the model info it
publishes (a judge's: kind ``judge``, the protocol choice as ``mode``, its settings and a
fingerprint bound to them), and the hooks of the one scoring path.

Within the HTTP surface: ``middleware``, ``wire``, ``observability`` → ``queue_routes``,
``status_history`` → ``status_page`` → ``routes`` (the one route table) → ``app`` → ``node`` (several models behind
one front door) → ``serve``; no other part of the server imports ``routes``, ``app``, ``node``
or ``serve``.
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
from rmserve.server.http import routes
from rmserve.server.sharing import leases
from rmserve.server.config import DEFAULT_MAX_BODY_BYTES, ServerConfig, engine_window
from rmserve.server.sharing.fair_queue import QUEUE_KEY, FairQueue, queue_of
from rmserve.server.sharing import auth
from rmserve.server.sharing import limits
from rmserve.server.sharing import render_order
from rmserve.server.kinds.base import RewardKind, kind_of_engine
from rmserve.server.kinds import get_reward as get_reward_kind
from rmserve.schema import CLASSIFIER_KIND, ModelInfo
from rmserve.server.http.middleware import auth_middleware, error_middleware
from rmserve.server.engines.protocol import JudgeEngine, PrefixCacheStats, RewardEngine, SupportsPrefixCacheStats
from rmserve.server.render.chat import Renderer
from rmserve.server.kinds.result_cache import ResultCache
from rmserve.server.swaps import gc_heap
from rmserve.server.swaps.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    EXECUTOR_KEY,
    KIND_KEY,
    METRICS_KEY,
    RENDERER_FACTORY_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
    EngineState,
    RendererFactory,
)
from rmserve.server.swaps.swap import renderer_for

__all__ = [
    "CONFIG_KEY",
    "DEFAULT_MAX_BODY_BYTES",
    "ENGINE_KEY",
    "EXECUTOR_KEY",
    "KIND_KEY",
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


async def render_threads_ctx(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx`` of the app's render threads (``ServerConfig.render_threads``, under
    ``EXECUTOR_KEY``) and their per-user order (:func:`rmserve.server.sharing.render_order.install`);
    shut down on cleanup."""
    config = app[CONFIG_KEY]
    executor = ThreadPoolExecutor(max_workers=config.render_threads, thread_name_prefix="rmserve-render")
    app[EXECUTOR_KEY] = executor
    render_order.install(app, executor)  # per-user fair order of its jobs (with fair_share)
    try:
        yield
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _with_template_override(info: ModelInfo, engine: object) -> ModelInfo:
    """``info`` with ``chat_template_override`` set (:func:`rmserve.fingerprint.chat_template_digest`
    of the file's text) when ``engine`` was started with a chat template file (its
    ``config.chat_template``, ``--chat-template``); ``info`` itself otherwise. Checkpoint swaps
    keep it (:meth:`~rmserve.server.swaps.state.EngineState.swapped`): the template applies to
    every checkpoint the server loads.

    Raises:
        OSError: the template file cannot be read any more (the engine read it at its start).
    """
    from pathlib import Path

    from rmserve.fingerprint import chat_template_digest

    path = getattr(getattr(engine, "config", None), "chat_template", None)
    if path is None:
        return info
    text = Path(path).read_text(encoding="utf-8")
    return msgspec.structs.replace(info, chat_template_override=chat_template_digest(text))


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
            kind = app[KIND_KEY]
            info = await asyncio.to_thread(_with_template_override, kind.model_info(info), engine)  # reads a file
            renderer = await renderer_for(app, loaded) if kind.needs_renderer else None
            state.publish(info, renderer, loaded.checkpoint_dir)
            logger.info("engine ready: model %s (%s, %s)", info.name, info.engine, info.dtype)
            if renderer is not None and kind.name == CLASSIFIER_KIND:
                warning = get_reward_kind.start_warning(config.policy_template, renderer)
                if warning is not None:  # info: a run's own server serves no trainer (only warnings are echoed)
                    logger.info("%s", warning)
            queue = queue_of(app)
            if queue is not None:
                queue.set_window_tokens(engine_window(config, loaded.step_tokens))
                logger.info("fair queue: at most %d groups%s at the engine", queue.concurrency,
                            f" and {queue.window_tokens:,} prompt tokens" if queue.window_tokens else "")
            gc_heap.freeze_after(app, f"loading {info.name}")
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
    kind: RewardKind | None = None,
    judge: object = None,
) -> web.Application:
    """Build the scoring app around an engine and a renderer.

    Args:
        config: the HTTP layer's settings.
        engine: a :class:`~rmserve.server.engines.protocol.RewardEngine`, not yet started: the app
            starts it in the background when it starts and shuts it down on cleanup.
        renderer: a :class:`~rmserve.server.render.chat.Renderer` (chat template → token ids);
            called from the app's render threads, never on the event loop.
        renderer_factory: instead of ``renderer``: called (in a render thread) with the
            engine's :class:`~rmserve.server.engines.protocol.LoadedModel` once the engine has
            started (its info named ``served_model_name`` when set), and again after every
            engine restart (checkpoint swap to another architecture or tokenizer); the app
            is ready after it returns. A fixed ``renderer`` is kept across restarts. To
            render with the engine's own renderer, pass
            :func:`rmserve.server.http.serve.engine_renderer`.
        kind: the served model's kind (:func:`rmserve.server.kinds.base.kind_of_config`);
            None = the engine's (:func:`rmserve.server.kinds.base.kind_of_engine`).
        judge: with ``kind`` None, for a :class:`~rmserve.server.engines.protocol.JudgeEngine`
            only: the :class:`~rmserve.server.kinds.judge.JudgeSettings` it judges with; None
            takes them from the engine. A kind that renders its own prompts (a judge) takes no
            renderer and no factory.

    Raises:
        ValueError: for a kind that needs a renderer, not exactly one of ``renderer`` /
            ``renderer_factory`` given; ``judge`` given for another engine; for a kind that
            renders its own prompts, a renderer or factory given.

    Returns:
        The application; run it with ``aiohttp.web.AppRunner(app, handler_cancellation=True)``
        (see :mod:`rmserve.server.http.serve`) so a client disconnect cancels its engine work.
    """
    from rmserve.server.http.observability import ServerMetrics  # prometheus_client: a server extra

    kind = kind if kind is not None else kind_of_engine(engine, judge)
    if not kind.needs_renderer:
        if renderer is not None or renderer_factory is not None:
            raise ValueError(
                f"create_app: a {kind.name} engine renders its own prompts; pass no renderer or renderer_factory"
            )
    elif (renderer is None) == (renderer_factory is None):
        raise ValueError("create_app: pass exactly one of renderer or renderer_factory")
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware, auth_middleware])
    app[CONFIG_KEY] = config
    app[ENGINE_KEY] = engine
    app[RENDERER_FACTORY_KEY] = renderer_factory
    app[KIND_KEY] = kind
    app[STATE_KEY] = EngineState(renderer=renderer, needs_renderer=kind.needs_renderer)
    app[METRICS_KEY] = ServerMetrics(engine_counters=_engine_counter_reader(engine))
    app[RESULT_CACHE_KEY] = ResultCache(config.result_cache_groups)
    auth.install(app, config)  # who is asking (server/sharing/auth.py): users file or admin token
    limits.install(app)  # per-user limits (server/sharing/limits.py)
    if config.fair_share:  # the engine's fair queue (server/sharing/fair_queue.py)
        app[QUEUE_KEY] = FairQueue(config.engine_concurrency_groups, config.fair_share_quantum_tokens,
                                   interactive_boost=config.fair_share_interactive_boost)
    app.cleanup_ctx.append(render_threads_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    leases.setup(app, config.lease_idle_s)
    app[routes.MODELS_KEY] = routes.ServedModels({config.served_model_name or "": app}, configured=False)
    routes.setup(app)  # a node of one model: its own front door
    return app
