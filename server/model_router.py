"""Several models on one server: a node app in front of one model app per ``--model NAME=PATH``.

Each model is served by its own scoring app (:func:`rmserve.server.app.create_app`: its own
engine, renderer, engine state, fair queue, result cache, leases and engine metrics), built
exactly as for a server of one model. Those apps are never bound to a socket: the *node app*
built here listens, runs the middlewares (errors, who is asking) once, and hands each request
to the model app the request names:

- ``POST /v1/score``: the body's ``model`` (read before the body is decoded in full; 400
  ``invalid_request`` naming ``model`` and the served names when it is missing, 404
  ``model_not_found`` when no model of that name is served) → that app's scoring path
  (:func:`rmserve.server.handlers.score_on`).
- ``POST /v1/models/load``: the body's ``model`` names the served model to replace
  (the checkpoint then serves as ``name``); ``POST /v1/models/release``: the body's ``name``.
- ``GET /v1/models``: every model, each with its fingerprint and lease holder; 503 until
  every model is loaded.
- ``GET /health``: ``ready`` once every model is; else the first model's status that is not.
- ``GET /v1/queue?model=NAME``: that model's fair queue; without ``model``, every model's
  queue summed (per user: counts and tokens/s summed, the longest estimated wait).
- ``GET /v1/status``, ``GET /``: the status page over every model (statuses, counters and
  prefix-cache figures summed, one lease row per model).
- ``GET /metrics``: the node's own series (requests, users, authentication) without a
  ``model`` label, and every model app's series with ``model="NAME"``.

Node-wide, not per model: the users file and authentication, and each user's limits
(:class:`rmserve.server.limits.UserLimits` is shared, so a user's tokens per minute count
over all models). Per model: the engine's memory share (``gpu_memory_utilization`` /
``kv_cache_memory_bytes``, :class:`rmserve.server.config.ModelSpec`), the fair queue (each
engine is its own resource), ``max_inflight_groups``, leases and checkpoint swaps.

Engines start one after another, in the order given (two vLLM engines starting at once in
one process compete for the same cores and compilation caches); a model that fails to load
stops the others from starting, and the server exits (:func:`rmserve.server.serve.serve_app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import msgspec
from aiohttp import web
from rmserve.server import auth, handlers, limits, status_page, wire
from rmserve.server.config import ServerConfig
from rmserve.server.fair_queue import queue_of
from rmserve.server.leases import leases_of
from rmserve.server.middleware import auth_middleware, error_middleware, json_response
from rmserve.server.queue_routes import QueueReply, UserQueue, queue_reply
from rmserve.server.state import CONFIG_KEY, METRICS_KEY, STATE_KEY
from rmserve.server.users import ANONYMOUS, USER_KEY

from rmserve.errors import EngineNotReady, InvalidRequest, ModelNotFound

logger = logging.getLogger("rmserve.server")


class _ModelField(msgspec.Struct):
    """The one field of a request body read to choose the model (the rest is skipped)."""

    model: str | None = None


_model_field_decoder = msgspec.json.Decoder(_ModelField)


@dataclass(slots=True)
class ServedModels:
    """The model apps of a node, by the name each was given with ``--model NAME=PATH``.

    A model is found by the name it serves under now (a checkpoint swap may give it another
    name), else by that configured name.
    """

    apps: dict[str, web.Application]

    def names(self) -> list[str]:
        """The names requests may use now (served names of loaded models, else configured)."""
        return [self._served_name(name, app) for name, app in self.apps.items()]

    @staticmethod
    def _served_name(name: str, app: web.Application) -> str:
        info = app[STATE_KEY].info
        return info.name if info is not None else name

    def resolve(self, name: str | None, field: str = "model") -> web.Application:
        """The model app serving ``name``.

        Raises:
            InvalidRequest: ``name`` is None while several models are served (400, naming
                ``field`` and the served models; with one model, None means that one).
            ModelNotFound: no model of that name (404, naming the served models).
        """
        served = ", ".join(repr(n) for n in self.names())
        if name is None and len(self.apps) == 1:
            return next(iter(self.apps.values()))
        if name is None:
            raise InvalidRequest(
                f"{field} is required: this server serves several models ({served}); name one", field=field
            )
        for configured, app in self.apps.items():
            if self._served_name(configured, app) == name:
                return app
        if name in self.apps:
            return self.apps[name]
        raise ModelNotFound(f"model {name!r} is not served here; this server serves {served}", field=field, value=name)


MODELS_KEY = web.AppKey("served_models", ServedModels)


def served_models(app: web.Application) -> ServedModels:
    """The node app's :class:`ServedModels`."""
    return app[MODELS_KEY]


# --- routes ---------------------------------------------------------------------------------


async def score(request: web.Request) -> web.Response:
    """``POST /v1/score`` on a node: the model app named by the body's ``model`` scores it."""
    handlers.check_body_size(request, request.app[CONFIG_KEY])
    body = await request.read()  # kept by aiohttp: the model app's path reads the same bytes
    loop = asyncio.get_running_loop()
    name = await loop.run_in_executor(None, _model_of, body)
    return await handlers.score_on(request, served_models(request.app).resolve(name))


def _model_of(body: bytes) -> str | None:
    """The ``model`` of a JSON body; None when absent or unreadable (the full decode then
    names what is wrong)."""
    try:
        return _model_field_decoder.decode(body).model
    except msgspec.DecodeError:
        return None


async def load_model(request: web.Request) -> web.Response:
    """``POST /v1/models/load`` on a node: replace the served model named by the body's
    ``model`` (see :func:`rmserve.server.handlers.load_model`)."""
    handlers.check_load_access(request)
    load = wire.decode_load_request(await request.read())
    return await handlers.load_model_on(request, served_models(request.app).resolve(load.model), load)


async def release_model(request: web.Request) -> web.Response:
    """``POST /v1/models/release`` on a node: end the lease on the served model ``name``."""
    handlers.check_load_access(request)
    release = wire.decode_release_request(await request.read())
    app = served_models(request.app).resolve(release.name, field="name")
    return handlers.release_on(request, app, release)


async def health(request: web.Request) -> web.Response:
    """``GET /health`` on a node: ``ready`` once every model is ready; else 503 with the
    status of the first model that is not (``loading``, ``failed``, ``restarting`` …)."""
    for app in served_models(request.app).apps.values():
        state = app[STATE_KEY]
        if state.status != "ready" or state.restarting:
            status = "restarting" if state.status == "ready" else state.status
            headers = {"Retry-After": str(request.app[CONFIG_KEY].retry_after_s)}
            return json_response(wire.encode_health(status), 503, headers)
    return json_response(wire.encode_health("ready"), 200)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models`` on a node: every model's :class:`~rmserve.schema.ModelInfo` with its
    lease, in the order given; 503 ``engine_not_ready`` naming the model not ready yet."""
    infos = []
    for name, app in served_models(request.app).apps.items():
        try:
            info, _ = app[STATE_KEY].require_ready()
        except EngineNotReady as exc:
            raise EngineNotReady(f"model {name!r}: {exc.message}") from None
        infos.append(leases_of(app).annotate(info))
    return json_response(wire.encode_models(infos), 200)


async def queue(request: web.Request) -> web.Response:
    """``GET /v1/queue[?model=NAME]`` on a node (see the module docstring)."""
    user = request.get(USER_KEY, ANONYMOUS)
    served = served_models(request.app)
    name = request.query.get("model")
    apps = [served.resolve(name)] if name is not None else list(served.apps.values())
    replies = []
    for app in apps:
        fair = queue_of(app)
        replies.append(queue_reply(fair.snapshot() if fair is not None else None, user.name, user.weight, user.is_admin))
    return json_response(msgspec.json.encode(merge_queue_replies(replies)), 200)


def merge_queue_replies(replies: Sequence[QueueReply]) -> QueueReply:
    """Several models' :class:`QueueReply` as one: counts, tokens and tokens/s summed (per
    user and in total), a user's estimated wait the longest of its models' (None if any is
    None while that user has work queued there), ``fair_share`` true if any model has a queue.

    Raises:
        ValueError: no reply given.
    """
    if not replies:
        raise ValueError("merge_queue_replies: no reply to merge")
    if len(replies) == 1:
        return replies[0]
    users: dict[str, list[UserQueue]] = {}
    for reply in replies:
        for entry in reply.users:
            users.setdefault(entry.user, []).append(entry)
    merged = []
    for name in sorted(users):
        entries = users[name]
        waits = [e.estimated_wait_s for e in entries]
        merged.append(UserQueue(
            user=name,
            weight=entries[0].weight,
            queued_groups=sum(e.queued_groups for e in entries),
            queued_tokens=sum(e.queued_tokens for e in entries),
            inflight_groups=sum(e.inflight_groups for e in entries),
            inflight_tokens=sum(e.inflight_tokens for e in entries),
            served_groups=sum(e.served_groups for e in entries),
            served_tokens=sum(e.served_tokens for e in entries),
            tokens_per_s=sum(e.tokens_per_s for e in entries),
            estimated_wait_s=None if any(w is None for w in waits) else max(waits),  # type: ignore[type-var]
        ))
    first = replies[0]
    return QueueReply(
        user=first.user,
        admin=first.admin,
        fair_share=any(r.fair_share for r in replies),
        concurrency=sum(r.concurrency for r in replies),
        inflight_groups=sum(r.inflight_groups for r in replies),
        queued_groups=sum(r.queued_groups for r in replies),
        tokens_per_s=sum(r.tokens_per_s for r in replies),
        users=tuple(merged),
    )


async def status(request: web.Request) -> web.Response:
    """``GET /v1/status`` on a node: :func:`rmserve.server.status_page.merge_status` over every model."""
    served = served_models(request.app)
    started = request.app[status_page.STARTED_KEY]
    replies = [status_page.status_reply(app, started) for app in served.apps.values()]
    return json_response(msgspec.json.encode(status_page.merge_status(replies)), 200)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics`` on a node: see :class:`NodeMetricsCollector`."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeMetricsCollector(request.app))
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


class NodeMetricsCollector:
    """Prometheus collector of a node: the node app's own families (requests, users,
    authentication; no ``model`` label) and every model app's families with a ``model``
    label added to each sample. A family both have is written once; the node's unlabelled
    samples of such a family (a counter the node never moves, e.g. ``rmserve_groups_total``)
    are left out, so that summing over ``model`` gives the node's total."""

    def __init__(self, node: web.Application) -> None:
        self._node = node

    def collect(self) -> Iterable:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        per_model = {}
        for name, app in served_models(self._node).apps.items():
            info = app[STATE_KEY].info
            per_model[info.name if info is not None else name] = list(app[METRICS_KEY].registry.collect())
        model_families = {fam.name for families in per_model.values() for fam in families}
        out: dict[str, Metric] = {}

        def family(source) -> Metric:
            if source.name not in out:
                out[source.name] = Metric(source.name, source.documentation, source.type, source.unit)
            return out[source.name]

        for fam in self._node[METRICS_KEY].registry.collect():
            target = family(fam)
            for sample in fam.samples:
                if fam.name in model_families and not sample.labels:
                    continue
                target.samples.append(sample)
        for model, families in per_model.items():
            for fam in families:
                target = family(fam)
                for s in fam.samples:
                    target.samples.append(Sample(s.name, {**s.labels, "model": model}, s.value, s.timestamp, s.exemplar))
        yield from out.values()


# --- the node app ---------------------------------------------------------------------------


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
    from :func:`rmserve.server.app.create_app`), in the order the engines start.

    Shares one :class:`~rmserve.server.limits.UserLimits` (the node's) with every model app.

    Raises:
        ValueError: fewer than one app, or two with the same name.
    """
    from rmserve.server.observability import ServerMetrics  # prometheus_client: a server extra

    names = [name for name, _ in apps]
    if not names:
        raise ValueError("create_node_app: at least one model app is needed")
    if len(set(names)) != len(names):
        raise ValueError(f"create_node_app: model names must be unique, got {names}")
    node = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware, auth_middleware])
    node[CONFIG_KEY] = config
    node[METRICS_KEY] = ServerMetrics()
    if config.users_file is not None:
        node[auth.USERS_KEY] = auth.UserRegistry(config.users)
    limits.install(node)
    for _, app in apps:
        app[limits.LIMITS_KEY] = node[limits.LIMITS_KEY]
    node[MODELS_KEY] = ServedModels(dict(apps))
    node.cleanup_ctx.append(_models_ctx)
    node.router.add_post("/v1/score", score)
    node.router.add_get("/health", health)
    node.router.add_get("/v1/models", models)
    node.router.add_post("/v1/models/load", load_model)
    node.router.add_post("/v1/models/release", release_model)
    node.router.add_get("/metrics", metrics)
    node.router.add_get("/v1/queue", queue)
    status_page.setup(node, status_handler=status)
    return node


def model_states(app: web.Application) -> list:
    """The :class:`~rmserve.server.state.EngineState` of every model of ``app``: the node's
    model apps in order, or the app's own for a server of one model."""
    served = app.get(MODELS_KEY)
    if served is None:
        return [app[STATE_KEY]]
    return [model_app[STATE_KEY] for model_app in served.apps.values()]
