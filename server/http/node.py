"""Several models on one server: a node app in front of one model app per ``--model NAME=PATH``.

Each model is served by its own scoring app (:func:`rmserve.server.http.app.create_app`: its own
engine, renderer, engine state, fair queue, result cache, leases and engine metrics), built
exactly as for a server of one model, which is its own front door. Behind a node those apps are
never bound to a socket: the *node app* built here listens, runs the middlewares (errors, who
is asking) once, and carries the same route table (:func:`rmserve.server.http.routes.setup`)
over its :class:`~rmserve.server.http.routes.ServedModels`; each request goes to the model app
it names:

- ``POST /v1/score``: the body, decoded once on the node's render threads (in the caller's
  fair turn), names the ``model`` (400 ``invalid_request`` naming ``model`` and the served
  names when it is missing, 404 ``model_not_found`` when no model of that name is served) →
  that app's scoring path.
- ``POST /v1/models/load``: the body's ``model`` names the served model to replace
  (the checkpoint then serves as ``name``); ``POST /v1/models/release``: the body's ``name``.
- ``GET /v1/models``: every model, each with its fingerprint and lease holder; 503 until
  every model is loaded.
- ``GET /health``: ``ready`` once every model is; else the first model's status that is not.
- ``GET /v1/queue?model=NAME``: that model's fair queue; without ``model``, every model's
  queue summed (per user: counts and tokens/s summed, the longest estimated wait).
- ``GET /v1/status``, ``GET /``: the status page over every model (statuses, counters and
  prefix-cache figures summed, one lease row per model; the history samples every model's fair
  queue, :mod:`rmserve.server.http.status_history`).
- ``GET /metrics``: the node's own series (requests, users, authentication) without a
  ``model`` label, and every model app's series with ``model="NAME"``.

Node-wide, not per model: the users file and authentication, each user's limits
(:class:`rmserve.server.sharing.limits.UserLimits` is shared, so a user's tokens per minute count
over all models), and the render threads that decode request bodies (each model app renders
chat templates on its own). Per model: the engine's memory share (``gpu_memory_utilization`` /
``kv_cache_memory_bytes``, :class:`rmserve.server.config.ModelSpec`), the fair queue (each
engine is its own resource), ``max_inflight_groups``, leases and checkpoint swaps.

Engines start one after another, in the order given (two vLLM engines starting at once in
one process compete for the same cores and compilation caches); a model that fails to load
stops the others from starting, and the server exits (:func:`rmserve.server.http.serve.serve_app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from aiohttp import web
from rmserve.server.config import ServerConfig
from rmserve.server.http import routes, status_history
from rmserve.server.http.app import render_threads_ctx
from rmserve.server.http.middleware import auth_middleware, error_middleware
from rmserve.server.http.queue_routes import merge_queue_replies
from rmserve.server.http.routes import MODELS_KEY, ServedModels, served_models
from rmserve.server.sharing import auth, limits
from rmserve.server.swaps.state import CONFIG_KEY, METRICS_KEY, STATE_KEY

__all__ = ["MODELS_KEY", "ServedModels", "create_node_app", "merge_queue_replies", "model_states", "served_models"]

logger = logging.getLogger("rmserve.server")


async def _models_ctx(node: web.Application) -> AsyncIterator[None]:
    """Start the model apps one after another (each once the previous one's engine has
    settled; none after a failure); on cleanup, clean up every started one, last first."""
    started: list[web.Application] = []

    async def start_all() -> None:
        for name, app in served_models(node).apps.items():
            app.freeze()
            await app.startup()
            started.append(app)
            state = app[STATE_KEY]
            await state.settled.wait()
            if state.status == "failed":
                logger.error("model %s failed to load; the models after it are not started", name)
                return

    task = asyncio.create_task(start_all(), name="rmserve-node-start")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for app in reversed(started):
            try:
                await app.cleanup()
            except Exception:
                logger.exception("model app cleanup failed")


def create_node_app(config: ServerConfig, apps: Sequence[tuple[str, web.Application]]) -> web.Application:
    """Build the node app in front of ``apps`` (configured name, not yet started model app
    from :func:`rmserve.server.http.app.create_app`), in the order the engines start.

    Shares one :class:`~rmserve.server.sharing.limits.UserLimits` (the node's) with every model app.

    Raises:
        ValueError: fewer than one app, or two with the same name.
    """
    from rmserve.server.http.observability import ServerMetrics  # prometheus_client: a server extra

    names = [name for name, _ in apps]
    if not names:
        raise ValueError("create_node_app: at least one model app is needed")
    if len(set(names)) != len(names):
        raise ValueError(f"create_node_app: model names must be unique, got {names}")
    node = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware, auth_middleware])
    node[CONFIG_KEY] = config
    node[METRICS_KEY] = ServerMetrics()
    auth.install(node, config)
    limits.install(node)
    for _, app in apps:
        app[limits.LIMITS_KEY] = node[limits.LIMITS_KEY]
    node[MODELS_KEY] = ServedModels(dict(apps))
    node[status_history.MODEL_APPS_KEY] = tuple(app for _, app in apps)  # the queues its history samples
    node.cleanup_ctx.append(render_threads_ctx)  # decoding request bodies, before a model is chosen
    node.cleanup_ctx.append(_models_ctx)
    routes.setup(node)
    return node


def model_states(app: web.Application) -> list:
    """The :class:`~rmserve.server.swaps.state.EngineState` of every model of ``app``: the node's
    model apps in order, or the app's own for a server of one model."""
    return [model_app[STATE_KEY] for model_app in served_models(app).apps.values()]
