"""The sequence-classifier kind: a reward head's logit per rendered sequence.

A group is rendered with the model's chat template (:class:`~rmserve.server.render.chat.Renderer`),
its sequences within ``max_model_len`` go to the engine in one
:meth:`~rmserve.server.engines.protocol.RewardEngine.score_group` call (so they share the
prompt's prefix-cache blocks), and the reply carries one reward per response (null with a
:class:`~rmserve.schema.ResponseError` for a sequence over the length, a non-finite reward or
an engine ``error``). A group's cost is its tokens sent; its result-cache key the served
fingerprint and the token ids sent (with the answer starts when the renderer set them, as a
DPO renderer does: :mod:`rmserve.server.kinds.dpo` is this kind with other model rules).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from rmserve.server.engines.protocol import ExtraValue, RewardEngine, SequenceScore
from rmserve.server.kinds.base import PreparedGroup
from rmserve.server.kinds.heads import HeadSettings
from rmserve.server.kinds.result_cache import group_key
from rmserve.server.render.chat import RenderedGroup, Renderer
from rmserve.server.swaps.checkpoints import check_checkpoint

from rmserve.errors import EngineError
from rmserve.schema import CLASSIFIER_KIND, GroupResult, ModelInfo, ModelKind, RequestGroup, ResponseError, ScoreRequest


def check_scores(scores: Sequence[SequenceScore], expected: int, gi: int, group_id: str) -> None:
    """Check the engine's answer for ``groups[gi]``: one score per sequence sent.

    Non-finite rewards are not an engine failure: :func:`group_result` answers them per
    response (null reward, ``non_finite_reward`` error).

    Raises:
        EngineError: not ``expected`` scores.
    """
    if len(scores) != expected:
        raise EngineError(
            f"the engine returned {len(scores)} scores for groups[{gi}] (id {group_id!r}) with {expected} sequences sent"
        )


def group_extras(
    scores: Sequence[SequenceScore], gi: int, group_id: str
) -> dict[str, tuple[ExtraValue, ...]] | None:
    """The group's per-response extras: name → one value per response (response order).

    Returns:
        None when no sequence carries extras (the reply then omits the field).

    Raises:
        EngineError: the sequences of the group carry different extra names (naming the
            first response that differs from response 0).
    """
    if not any(score.extras for score in scores):
        return None
    names = list(scores[0].extras)
    for ri, score in enumerate(scores):
        if set(score.extras) != set(names):
            raise EngineError(
                f"the engine returned extras {sorted(score.extras)} for groups[{gi}] (id {group_id!r}) "
                f"response {ri} but {sorted(names)} for response 0; every response needs the same names"
            )
    return {name: tuple(score.extras[name] for score in scores) for name in names}


def group_result(group: RequestGroup, rendered: RenderedGroup, scores: Sequence[SequenceScore], gi: int) -> GroupResult:
    """The reply's record for ``groups[gi]``.

    ``scores`` answer the sequences :attr:`RenderedGroup.scorable` sent to the engine, in that
    order. A response that was not sent (over-length), whose score carries an engine
    ``error`` (e.g. ``no_answer_tokens``) or whose reward is NaN/±inf gets a null reward and a
    :class:`~rmserve.schema.ResponseError` in ``errors``; the group's other
    responses keep their rewards. ``errors`` is absent when every response was scored.

    Raises:
        EngineError: a score count other than the sequences sent, or extras whose names
            differ between responses (:func:`group_extras`).
    """
    scorable = rendered.scorable
    check_scores(scores, len(scorable), gi, group.id)
    n = len(group.responses)
    rewards: list[float | None] = [None] * n
    cached = [0] * n
    errors: list[ResponseError | None] = list(rendered.errors) if rendered.errors is not None else [None] * n
    for j, score in zip(scorable, scores, strict=True):
        cached[j] = int(score.num_cached_tokens)
        reward = float(score.reward)
        if score.error is not None:
            errors[j] = score.error
        elif math.isfinite(reward):
            rewards[j] = reward
        else:
            errors[j] = ResponseError("non_finite_reward", f"the model gave a non-finite reward ({reward}) for it")
    extras = group_extras(scores, gi, group.id) if scorable else None
    if extras is not None and len(scorable) < n:  # spread to response order: None where not sent
        sent = dict(zip(scorable, range(len(scorable))))
        extras = {name: tuple(values[sent[j]] if j in sent else None for j in range(n)) for name, values in extras.items()}
    return GroupResult(
        id=group.id,
        rewards=tuple(rewards),
        num_tokens=rendered.num_tokens,
        num_cached_tokens=tuple(cached),
        truncated_tokens=rendered.truncated_tokens,
        extras=extras,
        errors=tuple(errors) if any(e is not None for e in errors) else None,
    )


def prepared_group(fingerprint: str, rendered: RenderedGroup) -> PreparedGroup:
    """A rendered group on its way: cost = its tokens sent, key = fingerprint + the token ids
    sent (+ their answer starts when set); no key when nothing is sent."""
    sent = [rendered.token_ids[j] for j in rendered.scorable]
    if not sent:
        return PreparedGroup(rendered)
    ids: list = list(sent)
    if rendered.answer_start is not None:
        ids.append([rendered.answer_start[j] for j in rendered.scorable])
    return PreparedGroup(rendered, cost=sum(map(len, sent)), key=group_key(fingerprint, ids))


class ClassifierKind:
    """The :class:`~rmserve.server.kinds.base.RewardKind` of a sequence classifier (see the
    module docstring). Checkpoint swaps reload or restart; the folder must hold a head rmserve
    serves under the server's head settings, the same head as the model served
    (:func:`rmserve.server.swaps.checkpoints.check_checkpoint`).

    Args:
        head: the server's head settings (``--head``, ``--label-index``, ``--label-weights``,
            ``--head-token-id``; default: none given, the head is found from the config).
    """

    name: ModelKind = CLASSIFIER_KIND
    needs_renderer = True
    swap_refusal: str | None = None

    def __init__(self, head: HeadSettings = HeadSettings()) -> None:
        self.head = head

    @classmethod
    def from_engine_config(cls, config: object) -> ClassifierKind:
        """The kind of an :class:`~rmserve.server.config.EngineConfig` (its head settings)."""
        return cls(getattr(config, "head_settings", HeadSettings()))

    @classmethod
    def serves(cls, engine: object) -> bool:
        """Whether an engine with no config is one of this kind's (the default kind: False)."""
        return False

    @classmethod
    def of_engine(cls, engine: object, settings: None = None) -> ClassifierKind:
        """The kind of ``engine`` (the head settings of its config, when it has one)."""
        return cls.from_engine_config(getattr(engine, "config", None))

    def check_request(self, request: ScoreRequest) -> None:
        """No request rule beyond the wire's."""
        return None

    def prepare(
        self, request: ScoreRequest, checked: None, info: ModelInfo, renderer: Renderer | None
    ) -> list[PreparedGroup]:
        """Every group rendered with ``renderer`` (a sequence over ``max_model_len`` marked,
        not raised)."""
        assert renderer is not None
        return [prepared_group(info.fingerprint, g) for g in renderer.render_request(request, too_long="mark")]

    async def call(
        self, engine: RewardEngine, group: PreparedGroup, request_id: str, gi: int, priority: int
    ) -> list[SequenceScore]:
        """The group's scorable sequences in one ``score_group`` call (with their answer starts)."""
        rendered: RenderedGroup = group.work
        ids = [rendered.token_ids[j] for j in rendered.scorable]
        starts = None if rendered.answer_start is None else [rendered.answer_start[j] for j in rendered.scorable]
        return await engine.score_group(ids, request_id, answer_starts=starts, priority=priority)

    def result(
        self, wire: RequestGroup, group: PreparedGroup, outputs: Sequence[SequenceScore] | None, gi: int
    ) -> GroupResult:
        """:func:`group_result` (no outputs: nothing was sent)."""
        return group_result(wire, group.work, [] if outputs is None else outputs, gi)

    def observation(self, group: PreparedGroup, result: GroupResult) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Tokens and cached tokens of the sequences sent."""
        scorable = group.work.scorable
        return tuple(result.num_tokens[j] for j in scorable), tuple(result.num_cached_tokens[j] for j in scorable)

    def model_info(self, info: ModelInfo) -> ModelInfo:
        """The engine's info, unchanged."""
        return info

    def check_checkpoint(self, folder: Path, served: ModelInfo | None = None) -> None:
        """:func:`rmserve.server.swaps.checkpoints.check_checkpoint` with this kind's rules and
        head settings; the folder's head must be ``served``'s (when it reports one)."""
        served_head = None if served is None or served.head is msgspec.UNSET else served.head
        check_checkpoint(folder, self.name, self.head, served_head)
