"""Scoring a decoded request with a generative judge: admission → plan → engine → group results.

The judge counterpart of :mod:`rmserve.server.kinds.scoring`, used when the app's engine is a
:class:`~rmserve.server.engines.protocol.JudgeEngine`. Per request group (:func:`score_request`):

1. **rebuild** the benchmark :class:`~rmserve.schema.Group` from the wire group
   (:func:`rebuild_group`): benchmark and domain from the wire id ``benchmark/domain/id``
   (:meth:`~rmserve.schema.GroupKey.parse`), ``num_chosen`` and ``styles`` from the request
   group (a judge needs ``num_chosen``: its prompts depend on which answer is correct);
2. **check** the protocol choice against the benchmark (:meth:`JudgeSettings.check_group`:
   ``ranking``/``ratings`` are RewardBench 2 protocols, ``pairwise`` RM-Bench's);
3. **plan** the calls (:func:`rmserve.server.kinds.judge_protocols.plan_group`), on the render
   threads in the caller's fair turn (:mod:`rmserve.server.sharing.render_order`);
4. **judge**: one :meth:`JudgeEngine.judge_group` call per group with all its calls (so the
   shared instruction and question hit the prefix cache), all groups concurrently; a client
   disconnect cancels the pending calls (the engine aborts them), the first engine failure
   cancels the others and fails the request;
5. **score** (:func:`rmserve.server.kinds.judge_protocols.score_group`) and answer one
   :class:`~rmserve.schema.GroupResult` per group (:func:`judge_result`).

Steps 1–2 failing is an error of the request (400, naming the field). A group the judge
protocol cannot take — a multi-turn conversation, the wrong number of responses or styles
(``plan_group`` refuses it) or a call whose templated prompt leaves no room to generate
(:class:`~rmserve.errors.SequenceTooLong` from the engine) — is answered per group (null
rewards, the reason in ``errors`` for every response, no ``judge``) while the other groups are
judged (:func:`unjudged_result`).

**Token counts of a judge's** :class:`~rmserve.schema.GroupResult`: every call's templated
prompt tokens (``prompt_tokens``) and their prefix-cache hits (``cached_tokens``) are shared
out among the responses the call shows, evenly, the remainder one token each to the first
shown (:func:`share_tokens`). So ``num_tokens[j]`` is response ``j``'s share of the prompt
tokens of the calls showing it, ``num_cached_tokens[j]`` its share of their cached tokens
(never above ``num_tokens[j]``), and each sums over the group to the calls' totals; a rating
call's counts go wholly to its one response. Generated tokens are per call in
``judge.calls[k].completion_tokens``. A group with no call (answered per group) has zeros.

Groups already judged (same served fingerprint, same rendered calls) come from the
:class:`~rmserve.server.kinds.result_cache.ResultCache`; the engine's outputs are a function of the
model, the settings the fingerprint covers and the messages, with greedy decoding.
``/metrics`` counts each judged group with its calls' prompt and cached tokens
(``observe_group``: one sequence per call), so prefix-cache hits show there.

The engine never sees HTTP: it gets chat messages and a request id, and answers
:class:`~rmserve.server.kinds.judge_protocols.JudgeOutput` records.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from rmserve.server.kinds.base import PreparedGroup
from rmserve.server.kinds.judge_protocols import (
    JudgeOutput,
    JudgePlan,
    JudgeProtocolConfig,
    pairwise_preference,
    plan_group,
    score_group,
)
from rmserve.server.engines.protocol import JudgeEngine

from rmserve.errors import EngineError, InvalidCheckpoint, InvalidRequest, SequenceTooLong
from rmserve.fingerprint import judge_fingerprint
from rmserve.judge_records import JudgeGroupResult
from rmserve.schema import (
    BENCHMARKS,
    Group,
    GroupKey,
    JUDGE_KIND,
    GroupResult,
    Message,
    ModelInfo,
    ModelKind,
    RequestGroup,
    ResponseError,
    ScoreRequest,
)

logger = logging.getLogger("rmserve.server")

JUDGE_PROTOCOL_CHOICES: tuple[str, ...] = ("auto", "ranking", "ratings", "pairwise")
"""The protocol choices of a judge server (``EngineConfig.protocol``)."""

_CHOICE_BENCHMARK = {"ranking": "rewardbench2", "ratings": "rewardbench2", "pairwise": "rm-bench"}
"""The one benchmark each explicit protocol choice applies to."""

FAILED_RATING_REWARD = -1.0
"""The per-response reward of a rating that could not be read (the official −1)."""

UNSUPPORTED_GROUP = "unsupported_group"
"""``ResponseError.type`` of a group the judge protocol cannot take (multi-turn, wrong shape)."""


@dataclass(frozen=True)
class JudgeSettings:
    """What a judge server judges with, beyond the model: everything that changes verdicts.

    Attributes:
        protocol: ``auto`` (RewardBench 2: 4-way ranking, Ties rated; RM-Bench: pairwise),
            ``ranking``, ``ratings`` (RewardBench 2 only) or ``pairwise`` (RM-Bench only).
        max_tokens: generated tokens per call at most (≥ 1; official 2,048).
        seed: the ranking positions' seed (≥ 0).
        compat: ``none`` or ``official`` (the official ranking and rating readers).
        system_prompt: send the ranking instructions as a system message (False: merged
            into the user turn, official ``--no_system_prompt``).
        thinking: the chat template's thinking switch, ``on`` or ``off`` (``enable_thinking``);
            None = not passed (the template's default).

    Raises:
        ValueError: a field outside the values above (naming it).
    """

    protocol: str = "auto"
    max_tokens: int = 2048
    seed: int = 0
    compat: str = "none"
    system_prompt: bool = True
    thinking: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in JUDGE_PROTOCOL_CHOICES:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {', '.join(JUDGE_PROTOCOL_CHOICES)}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: {self.max_tokens!r} must be an integer ≥ 1")
        self.protocol_config()  # seed, compat and thinking checks

    @classmethod
    def from_engine_config(cls, config: object) -> JudgeSettings:
        """The settings of an :class:`~rmserve.server.config.EngineConfig` (its ``protocol``,
        ``judge_max_tokens``, ``judge_seed``, ``compat``, ``judge_system_prompt``,
        ``judge_thinking``)."""
        return cls(
            protocol=config.protocol,
            max_tokens=config.judge_max_tokens,
            seed=config.judge_seed,
            compat=config.compat,
            system_prompt=config.judge_system_prompt,
            thinking=getattr(config, "judge_thinking", None),
        )

    @classmethod
    def of_engine(cls, engine: JudgeEngine) -> JudgeSettings:
        """The settings of a judge engine built from an ``EngineConfig`` (its ``config``
        attribute); otherwise the defaults with the engine's ``max_tokens``."""
        config = getattr(engine, "config", None)
        if config is not None and hasattr(config, "judge_max_tokens"):
            return cls.from_engine_config(config)
        return cls(max_tokens=int(engine.max_tokens))

    def protocol_config(self) -> JudgeProtocolConfig:
        """The :class:`~rmserve.server.kinds.judge_protocols.JudgeProtocolConfig` these settings give."""
        return JudgeProtocolConfig(
            ratings=self.protocol == "ratings", seed=self.seed, compat=self.compat, system_role=self.system_prompt,
            thinking=self.thinking,
        )

    def check_group(self, group: Group, gi: int) -> None:
        """Refuse a group whose benchmark the chosen protocol does not apply to.

        Raises:
            InvalidRequest: field ``protocol``, naming the choice, the group and its benchmark.
        """
        wanted = _CHOICE_BENCHMARK.get(self.protocol)
        if wanted is not None and group.benchmark != wanted:
            raise InvalidRequest(
                f"groups[{gi}] ({group.key}) is a {group.benchmark} group; this judge server runs protocol "
                f"{self.protocol!r}, which applies to {wanted} only (serve with --protocol auto to judge both)",
                field="protocol",
                value=group.benchmark,
                limit=wanted,
            )

    def model_info(self, info: ModelInfo) -> ModelInfo:
        """What the app publishes for a judge whose engine reported ``info``: kind ``judge``,
        ``mode`` the protocol choice, ``compat`` (which readers read the outputs),
        ``judge_max_tokens``, ``judge_seed``, ``judge_thinking`` when the switch is set, the
        engine's ``judge_sampling`` and ``judge_engine`` as it reported them, and a
        fingerprint (:func:`rmserve.fingerprint.judge_fingerprint`) binding the engine's
        model fingerprint to these settings and the sampling."""
        sampling = None if info.judge_sampling is msgspec.UNSET else info.judge_sampling
        return msgspec.structs.replace(
            info,
            kind=JUDGE_KIND,
            mode=self.protocol,
            ref_model=None,
            compat=self.compat,
            judge_max_tokens=self.max_tokens,
            judge_seed=self.seed,
            judge_thinking=msgspec.UNSET if self.thinking is None else self.thinking,
            fingerprint=judge_fingerprint(
                info.fingerprint,
                protocol=self.protocol,
                max_tokens=self.max_tokens,
                seed=self.seed,
                compat=self.compat,
                system_prompt=self.system_prompt,
                thinking=self.thinking,
                sampling=sampling,
            ),
        )


# --- one group ---------------------------------------------------------------------------


LEGACY_ID_WARNING = (
    "groups carry their benchmark and domain in the id ('benchmark/domain/id') and not in the fields "
    "benchmark and domain; that form is deprecated and read for one more release: update the client"
)
"""What the server logs (once per request) when a judge request uses the old id form."""


def group_origin(wire: RequestGroup, gi: int) -> tuple[GroupKey, bool]:
    """The benchmark, domain and dataset id of a wire group, and whether they came from the
    deprecated id form.

    With ``benchmark`` and ``domain`` set (what the client sends to a judge), they are taken
    from those fields and the dataset id is ``id`` less a leading ``benchmark/domain/`` (the
    client's ids carry it), else ``id`` itself. Without both fields, the id must be
    ``benchmark/domain/id`` (:meth:`~rmserve.schema.GroupKey.parse`; deprecated, read for one
    release).

    Raises:
        InvalidRequest: only one of the two fields given; no fields and an id not of the old
            form; a benchmark other than :data:`~rmserve.schema.BENCHMARKS`.
    """
    where = f"groups[{gi}]"
    if (wire.benchmark is None) != (wire.domain is None):
        missing = "domain" if wire.domain is None else "benchmark"
        raise InvalidRequest(
            f"{where}.{missing} (id {wire.id!r}) is missing; a judge needs both benchmark and domain",
            field=f"{where}.{missing}",
        )
    legacy = wire.benchmark is None
    if legacy:
        try:
            key = GroupKey.parse(wire.id)
        except ValueError:
            raise InvalidRequest(
                f"{where}.id {wire.id!r} is not 'benchmark/domain/id'; a judge reads the benchmark and subset "
                f"from {where}.benchmark and {where}.domain, or (deprecated) from the id",
                field=f"{where}.id",
                value=wire.id,
            ) from None
        field = f"{where}.id"
    else:
        prefix = f"{wire.benchmark}/{wire.domain}/"
        item = wire.id[len(prefix):] if wire.id.startswith(prefix) and len(wire.id) > len(prefix) else wire.id
        key = GroupKey(wire.benchmark, wire.domain, item)
        field = f"{where}.benchmark"
    if key.benchmark not in BENCHMARKS:
        raise InvalidRequest(
            f"{field} (id {wire.id!r}): benchmark {key.benchmark!r} is not one of {', '.join(BENCHMARKS)}",
            field=field,
            value=key.benchmark,
            limit=BENCHMARKS,
        )
    return key, legacy


def rebuild_group(wire: RequestGroup, gi: int) -> Group:
    """The benchmark group a wire group stands for (benchmark, domain and dataset id from
    :func:`group_origin`).

    Raises:
        InvalidRequest: :func:`group_origin` refuses it; ``groups[gi].num_chosen`` is missing
            or outside ``1 … responses - 1``; ``groups[gi].styles`` given with another length
            than ``responses``.
    """
    where = f"groups[{gi}]"
    key, _ = group_origin(wire, gi)
    n = len(wire.responses)
    if wire.num_chosen is None:
        raise InvalidRequest(
            f"{where}.num_chosen (id {wire.id!r}) is missing; a judge needs how many leading responses are "
            "chosen (the client sends it when the server's kind is judge)",
            field=f"{where}.num_chosen",
        )
    if not 1 <= wire.num_chosen < n:
        raise InvalidRequest(
            f"{where}.num_chosen (id {wire.id!r}) is {wire.num_chosen}; with {n} responses it must lie in 1 … {n - 1}",
            field=f"{where}.num_chosen",
            value=wire.num_chosen,
            limit=n - 1,
        )
    if wire.styles is not None and len(wire.styles) != n:
        raise InvalidRequest(
            f"{where}.styles (id {wire.id!r}) holds {len(wire.styles)} styles for {n} responses",
            field=f"{where}.styles",
            value=len(wire.styles),
            limit=n,
        )
    messages = wire.messages if wire.messages is not None else (Message("user", wire.prompt or ""),)
    return Group(
        benchmark=key.benchmark,
        domain=key.domain,
        id=key.id,
        messages=messages,
        responses=wire.responses,
        num_chosen=wire.num_chosen,
        styles=wire.styles,
    )


def share_tokens(counts: Sequence[int], shown: Sequence[Sequence[int]], num_responses: int) -> tuple[int, ...]:
    """Per response, its share of per-call token counts (see the module docstring).

    Args:
        counts: one count per call.
        shown: per call, the response indices it shows, in shown order.
        num_responses: responses in the group.

    Returns:
        ``num_responses`` integers summing to ``sum(counts)``: call ``k``'s count ``c`` over
        ``m`` shown responses gives ``c // m`` to each and one more to each of the first
        ``c % m`` shown. E.g. 10 tokens over responses (2, 0, 1) → response 2: 4, 0: 3, 1: 3.
    """
    shares = [0] * num_responses
    for count, responses in zip(counts, shown, strict=True):
        base, extra = divmod(int(count), len(responses))
        for rank, j in enumerate(responses):
            shares[j] += base + (1 if rank < extra else 0)
    return tuple(shares)


def judge_rewards(judged: JudgeGroupResult, num_responses: int) -> tuple[float, ...]:
    """Per response, the value :data:`rmserve.schema.JUDGE_REWARDS_DOC` describes.

    Rating protocols: the rating, −1 where none was read. ``rb2-ranking``: 1 for the
    response at the position the verdict names, 0 for the others, 0.25 each when no verdict
    was read. ``rmbench-pairwise``: per response, the mean over the calls showing it of the
    preference for it (:func:`~rmserve.server.kinds.judge_protocols.pairwise_preference` for a
    chosen answer, one minus it for a rejected one).
    """
    if judged.ratings is not None:
        return tuple(FAILED_RATING_REWARD if r is None else float(r) for r in judged.ratings)
    if judged.protocol == "rb2-ranking":
        call = judged.calls[0]
        verdict = call.parse.verdict
        if verdict is None:
            return (0.25,) * num_responses
        named = call.responses["ABCD".index(verdict)]
        return tuple(1.0 if j == named else 0.0 for j in range(num_responses))
    totals = [0.0] * num_responses
    seen = [0] * num_responses
    for call in judged.calls:
        a, b = call.responses
        chosen_first = a < judged.num_chosen
        chosen, rejected = (a, b) if chosen_first else (b, a)
        preference = pairwise_preference(call.parse.verdict, chosen_first)
        totals[chosen] += preference
        totals[rejected] += 1.0 - preference
        seen[chosen] += 1
        seen[rejected] += 1
    return tuple(total / count for total, count in zip(totals, seen, strict=True))


def judge_result(wire_id: str, judged: JudgeGroupResult, num_responses: int) -> GroupResult:
    """The reply's record of a judged group: rewards (:func:`judge_rewards`), token shares
    (:func:`share_tokens`) and the whole ``judge`` record."""
    shown = [call.responses for call in judged.calls]
    return GroupResult(
        id=wire_id,
        rewards=judge_rewards(judged, num_responses),
        num_tokens=share_tokens([c.prompt_tokens for c in judged.calls], shown, num_responses),
        num_cached_tokens=share_tokens([c.cached_tokens for c in judged.calls], shown, num_responses),
        judge=judged,
    )


def unjudged_result(wire_id: str, num_responses: int, error: ResponseError) -> GroupResult:
    """The reply's record of a group the judge could not take: null rewards, zero token
    counts, ``error`` for every response, no ``judge``."""
    return GroupResult(
        id=wire_id,
        rewards=(None,) * num_responses,
        num_tokens=(0,) * num_responses,
        num_cached_tokens=(0,) * num_responses,
        errors=(error,) * num_responses,
    )


def with_setup(result: GroupResult, info: ModelInfo) -> GroupResult:
    """``result`` carrying the ``judge_sampling`` and ``judge_engine`` the served ``info``
    reports (left None where it reports none)."""
    sampling = None if info.judge_sampling is msgspec.UNSET else info.judge_sampling
    engine = None if info.judge_engine is msgspec.UNSET else info.judge_engine
    if sampling is None and engine is None:
        return result
    return msgspec.structs.replace(result, judge_sampling=sampling, judge_engine=engine)


def calls_key(fingerprint: str, plan: JudgePlan) -> bytes:
    """Result-cache key of a planned group: the served fingerprint and every call's messages
    (their SHA-256, in order) and shown responses."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(b"judge\0" + fingerprint.encode() + b"\0" + plan.protocol.encode() + b"\0")
    for prompt in plan.prompts:
        digest.update(prompt.sha256.encode() + repr(prompt.responses).encode() + b"\0")
    return digest.digest()


def check_outputs(outputs: Sequence[JudgeOutput], expected: int, gi: int, group_id: str) -> None:
    """Check the engine's answer for ``groups[gi]``: one output per call sent.

    Raises:
        EngineError: not ``expected`` outputs.
    """
    if len(outputs) != expected:
        raise EngineError(
            f"the judge engine returned {len(outputs)} outputs for groups[{gi}] (id {group_id!r}) "
            f"with {expected} calls sent"
        )



# --- the kind ----------------------------------------------------------------------------


@dataclass
class JudgeWork:
    """One request group on its way: the benchmark group and its plan, or why it has none."""

    group: Group
    plan: JudgePlan | None = None
    error: ResponseError | None = None
    info: ModelInfo | None = None
    """The served model's record at planning time (its sampling and engine go into the result)."""


CHARS_PER_TOKEN = 4
"""Characters per token assumed when a judge group's fair-queue cost is estimated before the
engine tokenizes it (the judge engine renders its own prompts)."""


def queue_cost(plan: JudgePlan, max_tokens: int) -> int:
    """A judge group's cost in the fair queue, in tokens: its calls' message characters divided
    by :data:`CHARS_PER_TOKEN` (an estimate of the prompt tokens) plus ``max_tokens`` per call
    (the most each call may generate: generation dominates a judge's engine time)."""
    chars = sum(len(m.content) for prompt in plan.prompts for m in prompt.messages)
    return chars // CHARS_PER_TOKEN + max_tokens * len(plan.prompts)


SWAP_REFUSAL = (
    "checkpoint swap is not supported for a generative judge (kind judge): its verdicts are bound to "
    "the model and the judge settings it started with; restart the server on the other model"
)
"""The 422 ``invalid_checkpoint`` message of ``POST /v1/models/load`` on a judge server."""


class JudgeKind:
    """The :class:`~rmserve.server.kinds.base.RewardKind` of a generative judge (see the module
    docstring): no renderer (the engine templates its own prompts), groups planned
    (:func:`~rmserve.server.kinds.judge_protocols.plan_group`), one
    :meth:`~rmserve.server.engines.protocol.JudgeEngine.judge_group` call per group, no
    checkpoint swap.

    Args:
        settings: what it judges with.
        max_tokens: the engine's generated tokens per call at most, which prices each call
            (:func:`queue_cost`); None = ``settings.max_tokens`` (equal for an engine built
            from the same config).
    """

    name: ModelKind = JUDGE_KIND
    needs_renderer = False
    swap_refusal: str | None = SWAP_REFUSAL

    def __init__(self, settings: JudgeSettings, max_tokens: int | None = None) -> None:
        self.settings = settings
        self.config = settings.protocol_config()
        self.max_tokens = settings.max_tokens if max_tokens is None else int(max_tokens)

    @classmethod
    def from_engine_config(cls, config: object) -> JudgeKind:
        """The kind of a ``kind="judge"`` config (:meth:`JudgeSettings.from_engine_config`)."""
        return cls(JudgeSettings.from_engine_config(config))

    @classmethod
    def serves(cls, engine: object) -> bool:
        """Whether ``engine`` is a :class:`~rmserve.server.engines.protocol.JudgeEngine`."""
        return isinstance(engine, JudgeEngine)

    @classmethod
    def of_engine(cls, engine: JudgeEngine, settings: JudgeSettings | None = None) -> JudgeKind:
        """The kind of ``engine``: ``settings``, else :meth:`JudgeSettings.of_engine`; calls
        priced with the engine's ``max_tokens``."""
        return cls(settings if settings is not None else JudgeSettings.of_engine(engine), engine.max_tokens)

    def check_request(self, request: ScoreRequest) -> list[Group]:
        """Refuse truncation; rebuild every group (:func:`rebuild_group`) and check it against
        the protocol choice (:meth:`JudgeSettings.check_group`). Logs :data:`LEGACY_ID_WARNING`
        when a group uses the deprecated id form.

        Raises:
            InvalidRequest: ``truncation`` asked (a judge shows whole answers); a group that
                :func:`rebuild_group` or :meth:`JudgeSettings.check_group` refuses.
        """
        if request.truncation is not None:
            raise InvalidRequest(
                "truncation: a generative judge shows whole answers and does not truncate; drop --truncation",
                field="truncation",
            )
        groups = [rebuild_group(wire, gi) for gi, wire in enumerate(request.groups)]
        for gi, group in enumerate(groups):
            self.settings.check_group(group, gi)
        if any(wire.benchmark is None for wire in request.groups):
            logger.warning(LEGACY_ID_WARNING)
        return groups

    def prepare(
        self, request: ScoreRequest, checked: list[Group], info: ModelInfo, renderer: object
    ) -> list[PreparedGroup]:
        """Every group planned (templating the judge prompts and hashing them is the judge's
        render work), with its cost (:func:`queue_cost`) and key (:func:`calls_key`); a group
        the protocol cannot take gets no key and its reason (answered per group)."""
        prepared = []
        for group in checked:
            try:
                plan = plan_group(group, self.config)
            except InvalidRequest as exc:
                error = ResponseError(UNSUPPORTED_GROUP, exc.message)
                prepared.append(PreparedGroup(JudgeWork(group, error=error, info=info)))
                continue
            prepared.append(PreparedGroup(
                JudgeWork(group, plan, info=info), cost=queue_cost(plan, self.max_tokens),
                key=calls_key(info.fingerprint, plan),
            ))
        return prepared

    async def call(
        self, engine: JudgeEngine, group: PreparedGroup, request_id: str, gi: int, priority: int
    ) -> list[JudgeOutput] | ResponseError:
        """The group's calls in one ``judge_group`` call; a call with no room to generate
        answers the group with ``sequence_too_long``.

        Raises:
            EngineError: not one output per call (:func:`check_outputs`).
        """
        work: JudgeWork = group.work
        assert work.plan is not None
        calls = [prompt.messages for prompt in work.plan.prompts]
        try:
            outputs = await engine.judge_group(calls, request_id, priority=priority)
        except SequenceTooLong as exc:
            return ResponseError("sequence_too_long", exc.message)
        check_outputs(outputs, len(calls), gi, str(work.group.key))
        return list(outputs)

    def result(
        self, wire: RequestGroup, group: PreparedGroup, outputs: list[JudgeOutput] | ResponseError | None, gi: int
    ) -> GroupResult:
        """:func:`judge_result` of the scored outputs (:func:`score_group`), or
        :func:`unjudged_result` of a group with none; either carries the served model's
        sampling and engine (:func:`with_setup`).

        Raises:
            EngineError: outputs that do not make valid records (e.g. more cached than prompt tokens).
        """
        work: JudgeWork = group.work
        result = self._result(wire, work, outputs, gi)
        return result if work.info is None else with_setup(result, work.info)

    def _result(
        self, wire: RequestGroup, work: JudgeWork, outputs: list[JudgeOutput] | ResponseError | None, gi: int
    ) -> GroupResult:
        n = len(wire.responses)
        if outputs is None or isinstance(outputs, ResponseError):
            error = outputs if outputs is not None else work.error
            assert error is not None
            return unjudged_result(wire.id, n, error)
        assert work.plan is not None
        try:
            judged = score_group(work.group, work.plan, outputs, self.config)
        except ValueError as exc:  # e.g. negative token counts, cached tokens over the prompt's
            raise EngineError(
                f"the judge engine's outputs for groups[{gi}] (id {wire.id!r}) cannot be recorded: {exc}"
            ) from None
        return judge_result(wire.id, judged, n)

    def observation(self, group: PreparedGroup, result: GroupResult) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Per call, its prompt and cached tokens (one sequence per call); None when not judged."""
        if result.judge is None:
            return None
        calls = result.judge.calls
        return tuple(c.prompt_tokens for c in calls), tuple(c.cached_tokens for c in calls)

    def model_info(self, info: ModelInfo) -> ModelInfo:
        """:meth:`JudgeSettings.model_info` (kind, protocol, settings and the bound fingerprint)."""
        return self.settings.model_info(info)

    def check_checkpoint(self, folder: Path, served: ModelInfo | None = None) -> None:
        """A judge is never swapped (:attr:`swap_refusal`)."""
        raise InvalidCheckpoint(SWAP_REFUSAL, field="path")
