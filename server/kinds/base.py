"""The kind seam: what differs between kinds of reward model, and the registry of kinds.

Every kind (classifier, DPO policy, generative judge, length baseline) is one module of
``rmserve.server.kinds`` with one class implementing :class:`RewardKind`. The one scoring path
(:func:`rmserve.server.kinds.scoring.score_request`) does the fingerprint check, admission,
pinning, the render order, the token charge, the fair queue, the result cache and the metrics
once, and calls the hooks below for the rest:

- :meth:`RewardKind.check_request` — a request rule of the kind, before admission (the judge
  refuses truncation, rebuilds and checks its benchmark groups);
- :meth:`RewardKind.prepare` — render or plan every group, on the render threads; each
  :class:`PreparedGroup` carries its ``cost`` (computed once: charged to the user's token
  budget and used as the group's fair-queue turn) and its result-cache ``key``;
- :meth:`RewardKind.call` — the engine call of one group;
- :meth:`RewardKind.result` — the reply's :class:`~rmserve.schema.GroupResult` of one group;
- :meth:`RewardKind.observation` — what ``/metrics`` counts for a group the engine scored;
- :meth:`RewardKind.model_info` — the model info the app publishes for the engine's;
- :attr:`RewardKind.swap_refusal` — None where checkpoint swaps (reload, restart) are allowed,
  else the message of the 422 that refuses them;
- :meth:`RewardKind.check_checkpoint` — the kind's file rules for a swap's folder (given the
  model served: a classifier's head may not change);
- :attr:`RewardKind.needs_renderer` — whether the app builds a renderer from the engine.

:data:`KINDS` maps each :data:`~rmserve.schema.ModelKind` to its class as ``"module:attr"``,
imported only when asked (:func:`kind_class`), like the engines of
:mod:`rmserve.server.engines.registry`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rmserve.schema import MODEL_KINDS, GroupResult, ModelInfo, ModelKind, RequestGroup, ScoreRequest

if TYPE_CHECKING:
    from rmserve.server.render.chat import Renderer

KINDS: dict[ModelKind, str] = {
    "classifier": "rmserve.server.kinds.classifier:ClassifierKind",
    "dpo": "rmserve.server.kinds.dpo:DPOKind",
    "judge": "rmserve.server.kinds.judge:JudgeKind",
    "length": "rmserve.server.kinds.length:LengthKind",
}
"""Model kind → ``"module:attr"`` of its :class:`RewardKind` class (one line per kind)."""


@dataclass
class PreparedGroup:
    """One request group rendered or planned by its kind, on its way to the engine.

    Attributes:
        work: what the kind's :meth:`RewardKind.call` and :meth:`RewardKind.result` read
            (a :class:`~rmserve.server.render.chat.RenderedGroup`, a judge's plan, ...).
        cost: the group's engine work in tokens: charged to the user's tokens-per-minute
            budget and the cost of its fair-queue turn (0 with ``key`` None).
        key: the result-cache key (same served fingerprint, same engine input); None when the
            group has nothing to send (answered without the engine, never cached).
    """

    work: Any
    cost: int = 0
    key: bytes | None = None


@runtime_checkable
class RewardKind(Protocol):
    """What one kind of reward model does differently (see the module docstring).

    A kind object is built once per served model, from its engine config
    (:meth:`from_engine_config`) or by the app from the engine; it holds the kind's settings
    (a judge's protocol, the length baseline's sign).
    """

    name: ModelKind
    needs_renderer: bool
    swap_refusal: str | None

    def check_request(self, request: ScoreRequest) -> Any:
        """Refuse a request the kind cannot take before admission (400); returns what
        :meth:`prepare` needs beside the request (None when nothing)."""

    def prepare(
        self, request: ScoreRequest, checked: Any, info: ModelInfo, renderer: Renderer | None
    ) -> list[PreparedGroup]:
        """Every group rendered or planned, in request order (runs on a render thread)."""

    async def call(self, engine: Any, group: PreparedGroup, request_id: str, gi: int, priority: int) -> Any:
        """The engine's answer for ``groups[gi]`` (cached as is unless it is a
        :class:`~rmserve.schema.ResponseError`: a per-group refusal)."""

    def result(self, wire: RequestGroup, group: PreparedGroup, outputs: Any, gi: int) -> GroupResult:
        """The reply's record of ``groups[gi]`` (``outputs`` None: the group had no engine work)."""

    def observation(
        self, group: PreparedGroup, result: GroupResult
    ) -> tuple[Sequence[int], Sequence[int]] | None:
        """(tokens, cached tokens) per engine sequence for ``/metrics``; None: nothing to count."""

    def model_info(self, info: ModelInfo) -> ModelInfo:
        """The model info the app publishes, from the engine's."""

    def check_checkpoint(self, folder: Path, served: ModelInfo | None = None) -> None:
        """Refuse a swap's checkpoint folder from its files (``InvalidCheckpoint``, 422);
        ``served`` is the model served now (a classifier keeps its head), None when unknown."""


def kind_class(name: str) -> type:
    """Import and return the :class:`RewardKind` class of the kind ``name``.

    Raises:
        ValueError: ``name`` is not a registered kind; the message lists the choices.
    """
    try:
        target = KINDS[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"kind: {name!r} is not one of {', '.join(MODEL_KINDS)}") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def kind_of_config(config: Any) -> RewardKind:
    """The kind object of an :class:`~rmserve.server.config.EngineConfig` (its ``kind`` and settings)."""
    return kind_class(config.kind).from_engine_config(config)


def kind_of_engine(engine: Any, settings: Any = None) -> RewardKind:
    """The kind object of ``engine``: the kind its ``config`` names when it has one, else the
    first registered kind whose class claims it (``serves(engine)``: a judge engine is a
    judge's), else a classifier; ``settings`` are that kind's own (a judge's
    :class:`~rmserve.server.kinds.judge.JudgeSettings`; None: from the engine).

    Raises:
        ValueError: ``settings`` given for an engine of a kind that takes none.
    """
    config = getattr(engine, "config", None)
    name = getattr(config, "kind", None)
    if not (isinstance(name, str) and name in KINDS):
        name = next((n for n in KINDS if kind_class(n).serves(engine)), "classifier")
    if settings is not None and not kind_class(name).serves(engine):
        raise ValueError(f"create_app: settings of type {type(settings).__name__} are not for a {name} engine")
    return kind_class(name).of_engine(engine, settings)
