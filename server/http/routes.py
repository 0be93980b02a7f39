"""The server's one route table (:func:`setup`) and its routes: each reads the request, picks the
model app, calls the module that does the work, replies.

A server of one model is a node of one model. The app that listens is the *front door*: for one
model, the model's own app (:func:`rmserve.server.http.app.create_app`); for several, the node app
(:func:`rmserve.server.http.node.create_node_app`) in front of one model app each. The front door
holds the :class:`ServedModels`, runs the middlewares (errors, who is asking) once, and every
route picks its model app with :meth:`ServedModels.resolve`, the one place a model name is
resolved.

- ``POST /v1/score``: :func:`score` → body size-checked (413) and read → decoded and validated
  once, on the front door's render threads in the caller's fair turn
  (:func:`rmserve.server.sharing.render_order.run`) → model app (:meth:`ServedModels.resolve`:
  the body's ``model``) → swap gate (:func:`rmserve.server.swaps.swap.scoring_slot`) → ready
  (:meth:`~rmserve.server.swaps.state.EngineState.require_ready`, once; a second time only
  before waiting at a closed gate, so that a model being restored is refused at once) → the truncation bound of
  the model's ``max_model_len`` and the name it serves under now
  (:meth:`ServedModels.require_serves`) → :func:`rmserve.server.kinds.scoring.score_request`
  (the one scoring path; the served kind's hooks do what differs between kinds).
- ``POST /classify``, ``POST /pooling``: :func:`classify`, :func:`pooling` → vLLM's request
  decoded (:func:`rmserve.server.http.wire.decode_classify_request`) the same way, model app,
  swap gate, ready, the served kind a classifier
  (:func:`rmserve.server.kinds.raw_input.check_served_kind`) → the same
  :func:`~rmserve.server.kinds.scoring.score_request` with the request's own
  :class:`~rmserve.server.kinds.raw_input.RawInputKind` (each input one group, scored as it
  is) → vLLM's reply shape (:func:`pooling_reply`).
- ``POST /get_reward``: :func:`get_reward` → OpenRLHF's body
  (:func:`rmserve.server.http.wire.decode_get_reward_request`) the same way, model app, the
  served kind a classifier, swap gate, ready → the same
  :func:`~rmserve.server.kinds.scoring.score_request` with the request's own
  :class:`~rmserve.server.kinds.get_reward.GetRewardKind` (each query one group, re-templated
  from the policy's chat template to the reward model's, or passed through) → OpenRLHF's reply.
- The caller's fair-queue class (:func:`caller_of`): the ``X-RMServe-Priority`` header, else
  ``batch`` for ``/v1/score`` and ``interactive``
  (:data:`~rmserve.server.sharing.fair_queue.TRAINER_PRIORITY`) for the trainer routes
  ``/get_reward``, ``/classify`` and ``/pooling``, whose clients send no header.
- With ``--training-log``, a trainer route's scored inputs go to the front door's sampled
  record (:func:`record_training`, :mod:`rmserve.server.http.training_log`) once its reply is
  made; the reply never waits for the file.
- ``GET /health``, ``GET /v1/models``, ``GET /v1/queue``, ``GET /v1/status``, ``GET /metrics``:
  read every served model's state (one model's as it is; several summed or listed, see
  :mod:`rmserve.server.http.node`).
- ``POST /v1/models/load``: :func:`load_model` → access, body, model app, checks and
  :func:`rmserve.server.swaps.swap.start_swap` (which checks and takes the model's lease).
- ``POST /v1/models/release``: :func:`release_model` (:mod:`rmserve.server.sharing.leases`).
- ``GET /``, ``GET /static/{name}``: the status page (:mod:`rmserve.server.http.status_page`),
  with its hardening headers (:data:`~rmserve.server.http.status_page.PAGE_HEADERS`).

Every reply carries ``X-Content-Type-Options: nosniff``
(:func:`rmserve.server.http.middleware.nosniff`).

Errors are raised as :class:`~rmserve.errors.RMServeError` and answered by
:func:`rmserve.server.http.middleware.error_middleware`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from rmserve.server.http import queue_routes, status_page, training_log, wire
from rmserve.server.http.middleware import json_response, nosniff
from rmserve.server.kinds import get_reward as get_reward_kind
from rmserve.server.kinds import raw_input, scoring
from rmserve.server.sharing import render_order
from rmserve.server.sharing.fair_queue import (
    DEFAULT_PRIORITY,
    PRIORITY_HEADER,
    TRAINER_PRIORITY,
    Caller,
    Priority,
    parse_priority,
)
from rmserve.server.sharing.leases import leases_of
from rmserve.server.sharing.users import ANONYMOUS, USER_KEY
from rmserve.server.swaps import swap
from rmserve.server.swaps.state import CONFIG_KEY, ENGINE_KEY, KIND_KEY, METRICS_KEY, STATE_KEY

from rmserve.errors import BodyTooLarge, EngineNotReady, InvalidCheckpoint, InvalidRequest, ModelNotFound, OverLimit
from rmserve.schema import (
    ClassifyData,
    ClassifyResponse,
    GroupResult,
    ModelInfo,
    PoolingData,
    PoolingNote,
    PoolingResponse,
    PoolingUsage,
    PromptTokensDetails,
)


@dataclass(slots=True)
class ServedModels:
    """The model apps behind a front door, by the name each was configured with.

    Attributes:
        apps: configured name → model app, in the order the engines start. A node's names
            come from ``--model NAME=PATH``; a server of one model is keyed by its
            ``served_model_name`` (or ``""``).
        configured: whether a model may also be named by its configured name once a
            checkpoint swap has given it another (a node's ``--model`` names); False for a
            server of one model, which answers only to the name it serves under now.
    """

    apps: dict[str, web.Application]
    configured: bool = True

    def names(self) -> list[str]:
        """The names requests may use now (served names of loaded models, else configured)."""
        return [self.served_name(name, app) for name, app in self.apps.items()]

    @staticmethod
    def served_name(name: str, app: web.Application) -> str:
        info = app[STATE_KEY].info
        return info.name if info is not None else name

    def resolve(self, name: str | None, field: str = "model") -> web.Application:
        """The model app serving ``name``.

        With one model, None or that model's served name picks it, and so does any name while
        it is not loaded (its readiness check then answers 503). With several, the served
        name, else the configured one.

        Raises:
            InvalidRequest: ``name`` is None while several models are served (400, naming
                ``field`` and the served models).
            ModelNotFound: no model of that name (404, naming the served model(s)).
        """
        if len(self.apps) == 1:
            configured, app = next(iter(self.apps.items()))
            info = app[STATE_KEY].info
            if name is None or info is None or name == info.name or (self.configured and name == configured):
                return app
            raise ModelNotFound(f"model {name!r} is not served here; this server scores {info.name!r}",
                                field=field, value=name)
        served = ", ".join(repr(n) for n in self.names())
        if name is None:
            raise InvalidRequest(
                f"{field} is required: this server serves several models ({served}); name one", field=field
            )
        for configured, app in self.apps.items():
            if self.served_name(configured, app) == name:
                return app
        if self.configured and name in self.apps:
            return self.apps[name]
        raise ModelNotFound(f"model {name!r} is not served here; this server serves {served}", field=field, value=name)

    @staticmethod
    def require_serves(name: str | None, info: ModelInfo, field: str = "model") -> None:
        """Past the swap gate: the chosen model still serves under ``name`` (None: any name).

        Raises:
            ModelNotFound: a swap gave it another name meanwhile, or ``name`` is not its name.
        """
        if name is not None and name != info.name:
            raise ModelNotFound(f"model {name!r} is not served here; this server scores {info.name!r}",
                                field=field, value=name)

    def is_only(self, app: web.Application) -> bool:
        """Whether ``app`` is the one model served (a server of one model: its own front door)."""
        return len(self.apps) == 1 and next(iter(self.apps.values())) is app


MODELS_KEY = web.AppKey("served_models", ServedModels)
"""Where the front door keeps its :class:`ServedModels`."""


def served_models(app: web.Application) -> ServedModels:
    """The front door's :class:`ServedModels`."""
    return app[MODELS_KEY]


def caller_of(request: web.Request, default_priority: Priority = DEFAULT_PRIORITY) -> Caller:
    """The request's :class:`~rmserve.server.sharing.fair_queue.Caller`: the user the
    authentication middleware stored under :data:`~rmserve.server.sharing.users.USER_KEY`
    (:data:`~rmserve.server.sharing.users.ANONYMOUS` when none did) and the
    :data:`~rmserve.server.sharing.fair_queue.PRIORITY_HEADER` hint, ``default_priority``
    without one (``batch`` for ``/v1/score``; the trainer routes pass
    :data:`~rmserve.server.sharing.fair_queue.TRAINER_PRIORITY`, ``interactive``).

    Raises:
        InvalidRequest: a priority header other than ``interactive`` / ``batch``.
    """
    user = request.get(USER_KEY, ANONYMOUS)
    return Caller(user=user, priority=parse_priority(request.headers.get(PRIORITY_HEADER), default_priority))


def setup(front: web.Application) -> None:
    """Put the route table on the app that listens (``front[MODELS_KEY]`` set)."""
    front.router.add_post("/v1/score", score)
    front.router.add_post("/classify", classify)
    front.router.add_post("/pooling", pooling)
    front.router.add_post("/get_reward", get_reward)
    front.router.add_get("/health", health)
    front.router.add_get("/v1/models", models)
    front.router.add_post("/v1/models/load", load_model)
    front.router.add_post("/v1/models/release", release_model)
    front.router.add_get("/metrics", metrics)
    front.router.add_get("/v1/queue", queue)
    status_page.setup(front, status_handler=status)
    training_log.install(front, front[CONFIG_KEY])  # --training-log: the trainer routes' records
    front.on_response_prepare.append(nosniff)  # X-Content-Type-Options on every reply


# --- reading the served models ----------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 ``{"status": "ready"}`` once every model is ready; 503 with
    ``Retry-After`` otherwise, with the status of the first model that is not (``loading``,
    ``failed``, ``stopping``, ``restarting`` while a checkpoint swap restarts the engine: no
    model is loaded then, scoring requests wait on the swap gate; or ``restoring`` while the
    previous weights are reloaded after a failed in-place reload)."""
    for app in served_models(request.app).apps.values():
        state = app[STATE_KEY]
        if state.status != "ready" or state.restarting:
            status = "restarting" if state.status == "ready" else state.status
            headers = {"Retry-After": str(request.app[CONFIG_KEY].retry_after_s)}
            return json_response(wire.encode_health(status), 503, headers)
    return json_response(wire.encode_health("ready"), 200)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{"models": [ModelInfo]}``, every model in the order given, each with
    ``lease_holder`` and ``lease_since`` while a lease is held; 503 ``engine_not_ready`` while
    one is loading (on a node, naming it)."""
    served = served_models(request.app)
    infos = []
    for name, app in served.apps.items():
        try:
            info, _ = app[STATE_KEY].require_ready()
        except EngineNotReady as exc:
            if served.is_only(request.app):
                raise
            raise EngineNotReady(f"model {name!r}: {exc.message}") from None
        infos.append(leases_of(app).annotate(info))
    return json_response(wire.encode_models(infos), 200)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: a server of one model, its registry in Prometheus text format; a node,
    its own series and every model's with ``model="NAME"``
    (:class:`rmserve.server.http.observability.NodeMetricsCollector`)."""
    front = request.app
    served = served_models(front)
    if served.is_only(front):
        body, content_type = front[METRICS_KEY].render()
        return web.Response(body=body, headers={"Content-Type": content_type})
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from rmserve.server.http.observability import NodeMetricsCollector

    registry = CollectorRegistry(auto_describe=False)
    per_model = {served.served_name(name, app): app[METRICS_KEY] for name, app in served.apps.items()}
    registry.register(NodeMetricsCollector(front[METRICS_KEY], per_model))
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def queue(request: web.Request) -> web.Response:
    """``GET /v1/queue[?model=NAME]``: :class:`~rmserve.server.http.queue_routes.QueueReply` for
    the request's user, of the model ``model`` names; without it, every model's queue summed
    (:func:`~rmserve.server.http.queue_routes.merge_queue_replies`)."""
    served = served_models(request.app)
    name = request.query.get("model")
    apps = [served.resolve(name)] if name is not None else list(served.apps.values())
    replies = [queue_routes.queue_reply_of(request, app) for app in apps]
    return json_response(msgspec.json.encode(queue_routes.merge_queue_replies(replies)), 200)


async def status(request: web.Request) -> web.Response:
    """``GET /v1/status``: :func:`rmserve.server.http.status_page.merge_status` over every model
    (one model's :class:`~rmserve.server.http.status_page.StatusReply` as it is)."""
    started = request.app[status_page.STARTED_KEY]
    replies = [status_page.status_reply(app, started) for app in served_models(request.app).apps.values()]
    return json_response(msgspec.json.encode(status_page.with_history(status_page.merge_status(replies), request)), 200)


# --- scoring --------------------------------------------------------------------------------


async def _decode_in_turn(
    request: web.Request, decode: Callable[[bytes], Any], default_priority: Priority = DEFAULT_PRIORITY
) -> tuple[Caller, Any]:
    """The start of every scoring route: the body's size checked against the front app's
    limit, read, and decoded by ``decode`` in the caller's turn of the render threads
    (:func:`rmserve.server.sharing.render_order.run`, cost: the body's bytes). The caller's
    priority without a header is ``default_priority`` (:func:`caller_of`).

    Returns:
        (the caller, the decoded body).

    Raises:
        BodyTooLarge (413), and what ``decode`` raises (InvalidRequest, 400).
    """
    front = request.app
    check_body_size(request, front[CONFIG_KEY])
    body = await request.read()
    caller = caller_of(request, default_priority)
    return caller, await render_order.run(front, caller, len(body), lambda: decode(body))


async def score(request: web.Request) -> web.Response:
    """``POST /v1/score``: score every group of the request (see the module docstring).

    During a checkpoint swap the request waits (up to ``swap_wait_s``) until the new model
    serves; requests already past the gate finish on the old weights before the swap starts.

    Raises (answered by the error middleware): ``BodyTooLarge`` (413), ``InvalidRequest``
    (400), ``ModelNotFound`` (404), ``EngineNotReady`` (503), ``Conflict`` (409: the
    request's ``fingerprint`` is not the served model's), ``SequenceTooLong`` (413),
    ``OverLimit`` (413: the request alone is over a whole limit of its user or the server),
    ``Overloaded`` (429), ``EngineError`` (500).
    """
    caller, score_request = await _decode_in_turn(request, wire.decode_score_request)
    served = served_models(request.app)
    app = served.resolve(score_request.model)
    state = app[STATE_KEY]
    if not state.serving.is_set():  # behind a closed gate a state that is not ready (restoring) is refused now
        state.require_ready()
    async with swap.scoring_slot(state, app[CONFIG_KEY].swap_wait_s):
        info, renderer = state.require_ready()
        wire.check_truncation(score_request.truncation, max_model_len=info.max_model_len)
        served.require_serves(score_request.model, info)
        reply = await scoring.score_request(app, score_request, info, renderer, caller, app[KIND_KEY])
    return json_response(wire.encode_score_response(reply), 200)


async def classify(request: web.Request) -> web.Response:
    """``POST /classify``: vLLM's classification route (text or token-id ``input``), each input
    scored as it is by the served sequence classifier (see the module docstring and
    :mod:`rmserve.server.kinds.raw_input`).

    Replies ``{"id", "object": "list", "created", "model", "data": [{"index", "label",
    "probs", "num_classes"}], "usage", "rmserve": {"activation", "fingerprint"}}``: ``probs``
    hold σ(reward) unless ``use_activation`` or ``activation`` is false (then the raw reward,
    the ``/v1/score`` value); an input that could not be scored has ``probs`` null and an
    ``error``.

    Raises (answered by the error middleware): as :func:`score`, and ``InvalidRequest`` (400)
    for a server of another kind than classifier (field ``model``).
    """
    reply = await _score_inputs(request, wire.decode_classify_request, "POST /classify", "classify")
    return json_response(wire.encode_pooling_response(reply), 200)


async def pooling(request: web.Request) -> web.Response:
    """``POST /pooling``: vLLM's pooling route for the classify task; as :func:`classify`, the
    reply's ``data`` entries are ``{"index", "object": "pooling", "data": [value]}``."""
    reply = await _score_inputs(request, wire.decode_pooling_request, "POST /pooling", "pooling")
    return json_response(wire.encode_pooling_response(reply), 200)


async def _score_inputs(request: web.Request, decode, route: str, shape: str) -> ClassifyResponse | PoolingResponse:
    """The path of :func:`score` for a vLLM-compatible body: size check, decode in the
    caller's render turn, model app, swap gate, ready, kind, the scoring path, the reply."""
    caller, pool_request = await _decode_in_turn(request, decode, TRAINER_PRIORITY)
    inputs = wire.check_pooling_inputs(pool_request.input)
    served = served_models(request.app)
    app = served.resolve(pool_request.model)
    raw_input.check_served_kind(app[KIND_KEY], route)
    state = app[STATE_KEY]
    if not state.serving.is_set():
        state.require_ready()
    async with swap.scoring_slot(state, app[CONFIG_KEY].swap_wait_s):
        info, renderer = state.require_ready()
        raw_input.check_served_head(info, route)
        truncation = wire.pooling_truncation(
            pool_request, max_model_len=info.max_model_len, default_side=renderer.truncation_side
        )
        served.require_serves(pool_request.model, info)
        kind = raw_input.RawInputKind(
            inputs, add_special_tokens=pool_request.add_special_tokens, truncation=truncation,
            checkpoint_dir=state.checkpoint_dir,
        )
        with each_one_group("input"):
            reply = await scoring.score_request(app, raw_input.wire_request(inputs), info, renderer, caller, kind)
    activation = raw_input.applied_activation(pool_request.use_activation, pool_request.activation)
    record_training(request, route.removeprefix("POST "), caller, info, inputs, reply.results)
    return pooling_reply(
        shape, reply.results, model=info.name, fingerprint=info.fingerprint, activation=activation,
        label=kind.label, request_id=pool_request.request_id, truncated=truncation is not None,
    )


@contextlib.contextmanager
def each_one_group(field: str):
    """Name ``field`` in a refusal of the request's groups, where each entry of ``field`` (an
    ``input``, a ``query``) was sent as one group: a request alone over a limit stays 413
    ``request_over_limit`` and a bad group count 400, with ``field`` and its message."""
    try:
        yield
    except OverLimit as exc:  # the request alone is over a limit: 413, the field named
        if exc.field != "groups":
            raise
        raise OverLimit(f"{field}: {exc.message} (each {field} is one group)", limit_name=exc.limit_name,
                        unit=exc.unit, limit=exc.limit, value=exc.value, field=field) from None
    except InvalidRequest as exc:
        if exc.field != "groups":
            raise
        raise InvalidRequest(f"{field}: {exc.message} (each {field} is one group)", field=field,
                             value=exc.value, limit=exc.limit) from None


async def get_reward(request: web.Request) -> web.Response:
    """``POST /get_reward``: OpenRLHF's remote reward model (:mod:`rmserve.server.kinds.get_reward`):
    each ``query`` (policy-templated prompt + response) scored with the reward model's own chat
    template, on the path of :func:`score` (size check, decode in the caller's render turn,
    model app, kind a classifier, swap gate, ready, the one scoring path).

    Replies ``{"rewards": [float], "scores": [float], "extra_logs": {"rm_tokens": [float]},
    "rmserve": {"template", "model", "fingerprint", "num_tokens"}}``
    (:class:`~rmserve.schema.GetRewardResponse`).

    Raises (answered by the error middleware): as :func:`score`, ``InvalidRequest`` (400) for
    a server of another kind (field ``model``) or a query not in the expected form (field
    ``query[i]``), ``SequenceTooLong`` (413, ``query[i]``) and ``EngineError`` (500,
    ``query[i]``: no reward) — a whole-request answer, never a null reward.
    """
    caller, reward_request = await _decode_in_turn(request, wire.decode_get_reward_request, TRAINER_PRIORITY)
    served = served_models(request.app)
    app = served.resolve(reward_request.model)
    raw_input.check_served_kind(app[KIND_KEY], "POST /get_reward")
    state = app[STATE_KEY]
    if not state.serving.is_set():
        state.require_ready()
    config = app[CONFIG_KEY]
    async with swap.scoring_slot(state, config.swap_wait_s):
        info, renderer = state.require_ready()
        served.require_serves(reward_request.model, info)
        kind = get_reward_kind.GetRewardKind(
            reward_request, setting=config.policy_template, family=config.policy_family,
            file_text=config.policy_template_text,
        )
        with each_one_group("query"):
            scored = await scoring.score_request(
                app, raw_input.wire_request(reward_request.query), info, renderer, caller, kind
            )
    reply = get_reward_kind.reply(scored, kind)
    record_training(request, "/get_reward", caller, info, reward_request.query, scored.results)
    return json_response(wire.encode_get_reward_response(reply), 200)


def record_training(request: web.Request, route: str, caller: Caller, info: ModelInfo,
                    inputs: list, results: tuple[GroupResult, ...]) -> None:
    """Hand the scored inputs of a trainer route's request to the front door's training log
    (``--training-log``; :mod:`rmserve.server.http.training_log`): ``inputs[i]`` as sent,
    answered by ``results[i]`` (one response each); an input without a reward is left out.
    Returns at once; nothing without a training log."""
    log = training_log.training_log_of(request.app)
    if log is None:
        return
    scored = [
        training_log.ScoredInput(index=i, value=value, reward=result.rewards[0], num_tokens=result.num_tokens[0])
        for i, (value, result) in enumerate(zip(inputs, results, strict=True))
        if result.rewards[0] is not None
    ]
    log.record(route=route, user=caller.user.name, model=info.name, fingerprint=info.fingerprint, inputs=scored)


def pooling_reply(
    shape: str, results: tuple[GroupResult, ...], *, model: str, fingerprint: str, activation: str,
    label: str | None, request_id: str | None = None, truncated: bool = False, created: int | None = None,
) -> ClassifyResponse | PoolingResponse:
    """vLLM's reply for one input per result (``results[i]`` answers ``input[i]``).

    Args:
        shape: ``classify`` (:class:`~rmserve.schema.ClassifyResponse`) or ``pooling``
            (:class:`~rmserve.schema.PoolingResponse`).
        activation: ``none`` (values are the raw rewards) or ``sigmoid`` (σ(reward)).
        label: the name of class 0 (``label`` of each scored input).
        request_id: the request's ``request_id``: the reply's ``id`` is ``{shape}-{request_id}``
            (vLLM's form), else ``{shape}-`` and a random hex id.
        truncated: whether a cut was asked (``rmserve.truncated_tokens`` is then sent).
        created: Unix time, seconds (None: now).

    ``usage.prompt_tokens`` counts the tokens of the inputs sent to the engine (an input that
    was not scored is not sent), ``prompt_tokens_details.cached_tokens`` those served from the
    prefix cache.
    """
    values: list[tuple[float, ...] | None] = []
    sent = cached = 0
    for result in results:
        reward = result.rewards[0]
        if reward is None:
            values.append(None)
            continue
        values.append((reward if activation == "none" else raw_input.sigmoid(reward),))
        sent += result.num_tokens[0]
        cached += result.num_cached_tokens[0]
    errors = [result.errors[0] if result.errors is not None else None for result in results]
    usage = PoolingUsage(prompt_tokens=sent, total_tokens=sent, prompt_tokens_details=PromptTokensDetails(cached))
    cuts = tuple(result.truncated_tokens[0] for result in results) if truncated else None
    note = PoolingNote(activation=activation, fingerprint=fingerprint, truncated_tokens=cuts)
    reply_id = f"{shape}-{request_id if request_id is not None else uuid.uuid4().hex}"
    created = int(time.time()) if created is None else created
    if shape == "classify":
        data = tuple(
            ClassifyData(index=i, label=label if value is not None else None, probs=value, num_classes=1, error=error)
            for i, (value, error) in enumerate(zip(values, errors, strict=True))
        )
        return ClassifyResponse(id=reply_id, object="list", created=created, model=model, data=data, usage=usage,
                                rmserve=note)
    data = tuple(
        PoolingData(index=i, object="pooling", data=value, error=error)
        for i, (value, error) in enumerate(zip(values, errors, strict=True))
    )
    return PoolingResponse(id=reply_id, object="list", created=created, model=model, data=data, usage=usage,
                           rmserve=note)


def check_body_size(request: web.Request, config) -> None:
    """Raise ``BodyTooLarge`` (413) when the declared body exceeds ``config.max_body_bytes``."""
    if request.content_length is not None and request.content_length > config.max_body_bytes:
        raise BodyTooLarge(
            f"request body is {request.content_length} bytes; the server's limit is "
            f"{config.max_body_bytes} bytes (max_body_bytes)",
            value=request.content_length,
            limit=config.max_body_bytes,
        )



# --- checkpoint swaps and leases --------------------------------------------------------------


async def load_model(request: web.Request) -> web.Response:
    """``POST /v1/models/load`` ``{"name", "path", "force"?}``: serve another checkpoint as ``name``.

    Checks, in order, none of which touches the engine or pauses scoring: who is asking (the
    auth middleware, before this route: the admin role with a users file, else the admin token;
    401/403), body (400), the model it replaces (:meth:`ServedModels.resolve`: the body's
    ``model``; 400 on a node when missing, 404), engine ready (503), path under a checkpoint root (403), the
    checkpoint's own files (422 ``invalid_checkpoint``: config, label count, tokenizer,
    weights), the kind of swap (409 when neither applies), one swap at a time (409). Then
    :func:`rmserve.server.swaps.swap.start_swap`: new scoring requests wait (up to ``swap_wait_s``,
    then 503), in-flight ones finish on the old model (up to ``swap_drain_timeout_s``, else
    503 and nothing changes), the engine reloads the weights in place (same shape and
    tokenizer) or restarts on the checkpoint, and the gate reopens. The swap runs to its end
    even if the caller disconnects.

    Leases (:mod:`rmserve.server.sharing.leases`): once the gate is closed, a swap by a user
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

    A kind that refuses swaps (a generative judge,
    :attr:`~rmserve.server.kinds.base.RewardKind.swap_refusal`) answers 422 ``invalid_checkpoint``
    (after the admin token, body, model and readiness checks) saying to restart the server on the
    other model.
    """
    load = wire.decode_load_request(await request.read())
    app = served_models(request.app).resolve(load.model)
    config = app[CONFIG_KEY]
    served, _ = app[STATE_KEY].require_ready()
    _refuse_swap(app)
    folder = swap.resolve_checkpoint(load.path, config.checkpoint_roots)
    await swap.check_files(folder, app[ENGINE_KEY], app[KIND_KEY], served)
    user = request.get(USER_KEY, ANONYMOUS)
    info, kind = await swap.start_swap(app, load, folder, user)
    return json_response(wire.encode_load_response([leases_of(app).annotate(info)], kind), 200)


def _refuse_swap(app: web.Application) -> None:
    refusal = app[KIND_KEY].swap_refusal
    if refusal is not None:
        raise InvalidCheckpoint(refusal, field="path")


async def release_model(request: web.Request) -> web.Response:
    """``POST /v1/models/release`` ``{"name"}``: end the lease on the model ``name``.

    Without a users file, the admin token of ``POST /v1/models/load`` (403/401, checked by the auth
    middleware); with one, any user's token, and the lease's holder or an admin may end it. Replies ``{"models": [ModelInfo]}``
    (no lease fields any more).

    Raises (answered by the error middleware): ``Forbidden`` / ``Unauthorized``, ``InvalidRequest``
    (400, bad body), ``ModelNotFound`` (404, no served model of that name), ``EngineNotReady`` (503),
    ``Conflict`` (409, no lease held), ``Forbidden`` (403, neither the holder nor an admin).
    """
    release = wire.decode_release_request(await request.read())
    app = served_models(request.app).resolve(release.name, field="name")
    info, _ = app[STATE_KEY].require_ready()
    book = leases_of(app)
    ended = book.release(request.get(USER_KEY, ANONYMOUS), release.name)
    swap.logger.info("lease on %s released (held by %s)", ended.model, ended.holder)
    return json_response(wire.encode_models([book.annotate(info)]), 200)
