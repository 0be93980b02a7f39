"""Scoring a decoded request with a generative judge: admission → plan → engine → group results.

The judge counterpart of :mod:`rmserve.server.scoring`, used when the app's engine is a
:class:`~rmserve.server.protocol.JudgeEngine`. Per request group (:func:`score_request`):

1. **rebuild** the benchmark :class:`~rmserve.schema.Group` from the wire group
   (:func:`rebuild_group`): benchmark and domain from the wire id ``benchmark/domain/id``
   (:meth:`~rmserve.schema.GroupKey.parse`), ``num_chosen`` and ``styles`` from the request
   group (a judge needs ``num_chosen``: its prompts depend on which answer is correct);
2. **check** the protocol choice against the benchmark (:meth:`JudgeSettings.check_group`:
   ``ranking``/``ratings`` are RewardBench 2 protocols, ``pairwise`` RM-Bench's);
3. **plan** the calls (:func:`rmserve.server.judge_protocols.plan_group`), on the render
   threads in the caller's fair turn (:mod:`rmserve.server.render_pool`);
4. **judge**: one :meth:`JudgeEngine.judge_group` call per group with all its calls (so the
   shared instruction and question hit the prefix cache), all groups concurrently; a client
   disconnect cancels the pending calls (the engine aborts them), the first engine failure
   cancels the others and fails the request;
5. **score** (:func:`rmserve.server.judge_protocols.score_group`) and answer one
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
:class:`~rmserve.server.result_cache.ResultCache`; the engine's outputs are a function of the
model, the settings the fingerprint covers and the messages, with greedy decoding.
``/metrics`` counts each judged group with its calls' prompt and cached tokens
(``observe_group``: one sequence per call), so prefix-cache hits show there.

The engine never sees HTTP: it gets chat messages and a request id, and answers
:class:`~rmserve.server.judge_protocols.JudgeOutput` records.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from aiohttp import web
from rmserve.server import limits, render_pool
from rmserve.server.fair_queue import ENGINE_PRIORITY, Caller, FairQueue, queue_of
from rmserve.server.leases import leases_of
from rmserve.server.judge_protocols import (
    JudgeOutput,
    JudgePlan,
    JudgeProtocolConfig,
    pairwise_preference,
    plan_group,
    score_group,
)
from rmserve.server.protocol import JudgeEngine
from rmserve.server.result_cache import ResultCache
from rmserve.server.scoring import admit, first_error
from rmserve.server.state import CONFIG_KEY, ENGINE_KEY, METRICS_KEY, RESULT_CACHE_KEY, STATE_KEY

from rmserve.errors import EngineError, InvalidRequest, SequenceTooLong
from rmserve.fingerprint import judge_fingerprint
from rmserve.judge_records import JudgeGroupResult
from rmserve.schema import (
    BENCHMARKS,
    Group,
    GroupKey,
    GroupResult,
    Message,
    ModelInfo,
    RequestGroup,
    ResponseError,
    ScoreRequest,
    ScoreResponse,
)

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
        compat: ``none`` or ``official`` (the official rating reader).
        system_prompt: send the ranking instructions as a system message (False: merged
            into the user turn, official ``--no_system_prompt``).

    Raises:
        ValueError: a field outside the values above (naming it).
    """

    protocol: str = "auto"
    max_tokens: int = 2048
    seed: int = 0
    compat: str = "none"
    system_prompt: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in JUDGE_PROTOCOL_CHOICES:
            raise ValueError(f"protocol: {self.protocol!r} is not one of {', '.join(JUDGE_PROTOCOL_CHOICES)}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: {self.max_tokens!r} must be an integer ≥ 1")
        self.protocol_config()  # seed and compat checks

    @classmethod
    def from_engine_config(cls, config: object) -> JudgeSettings:
        """The settings of an :class:`~rmserve.server.config.EngineConfig` (its ``protocol``,
        ``judge_max_tokens``, ``judge_seed``, ``compat``, ``judge_system_prompt``)."""
        return cls(
            protocol=config.protocol,
            max_tokens=config.judge_max_tokens,
            seed=config.judge_seed,
            compat=config.compat,
            system_prompt=config.judge_system_prompt,
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
        """The :class:`~rmserve.server.judge_protocols.JudgeProtocolConfig` these settings give."""
        return JudgeProtocolConfig(
            ratings=self.protocol == "ratings", seed=self.seed, compat=self.compat, system_role=self.system_prompt
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
        ``mode`` the protocol choice, ``compat``, ``judge_max_tokens``, ``judge_seed``, and a
        fingerprint (:func:`rmserve.fingerprint.judge_fingerprint`) binding the engine's
        model fingerprint to these settings."""
        return msgspec.structs.replace(
            info,
            kind="judge",
            mode=self.protocol,
            ref_model=None,
            compat=self.compat,
            judge_max_tokens=self.max_tokens,
            judge_seed=self.seed,
            fingerprint=judge_fingerprint(
                info.fingerprint,
                protocol=self.protocol,
                max_tokens=self.max_tokens,
                seed=self.seed,
                compat=self.compat,
                system_prompt=self.system_prompt,
            ),
        )


# --- one group ---------------------------------------------------------------------------


def rebuild_group(wire: RequestGroup, gi: int) -> Group:
    """The benchmark group a wire group stands for.

    Raises:
        InvalidRequest: ``groups[gi].id`` is not ``benchmark/domain/id`` with a known
            benchmark; ``groups[gi].num_chosen`` is missing or outside ``1 … responses - 1``;
            ``groups[gi].styles`` given with another length than ``responses``.
    """
    where = f"groups[{gi}]"
    try:
        key = GroupKey.parse(wire.id)
    except ValueError:
        raise InvalidRequest(
            f"{where}.id {wire.id!r} is not 'benchmark/domain/id'; a judge reads the benchmark and subset from it",
            field=f"{where}.id",
            value=wire.id,
        ) from None
    if key.benchmark not in BENCHMARKS:
        raise InvalidRequest(
            f"{where}.id {wire.id!r}: benchmark {key.benchmark!r} is not one of {', '.join(BENCHMARKS)}",
            field=f"{where}.id",
            value=key.benchmark,
            limit=BENCHMARKS,
        )
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
    preference for it (:func:`~rmserve.server.judge_protocols.pairwise_preference` for a
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


# --- a request ---------------------------------------------------------------------------


@dataclass
class _Planned:
    """One request group on its way: the group, its plan, then its outputs or why it has none."""

    group: Group
    plan: JudgePlan | None = None
    error: ResponseError | None = None
    key: bytes = b""
    outputs: list[JudgeOutput] | None = None
    from_cache: bool = False


def _plan(group: Group, config: JudgeProtocolConfig) -> tuple[JudgePlan | None, ResponseError | None]:
    """The group's plan, or why the protocol cannot take it (a per-group answer)."""
    try:
        return plan_group(group, config), None
    except InvalidRequest as exc:
        return None, ResponseError(UNSUPPORTED_GROUP, exc.message)


def _plan_all(groups: Sequence[Group], config: JudgeProtocolConfig, fingerprint: str) -> list[_Planned]:
    """Every group planned (:func:`_plan`) with its result-cache key (:func:`calls_key`)."""
    items = []
    for group in groups:
        plan, error = _plan(group, config)
        items.append(_Planned(group, plan, error, calls_key(fingerprint, plan) if plan is not None else b""))
    return items


CHARS_PER_TOKEN = 4
"""Characters per token assumed when a judge group's fair-queue cost is estimated before the
engine tokenizes it (the judge engine renders its own prompts)."""


def queue_cost(plan: JudgePlan, max_tokens: int) -> int:
    """A judge group's cost in the fair queue, in tokens: its calls' message characters divided
    by :data:`CHARS_PER_TOKEN` (an estimate of the prompt tokens) plus ``max_tokens`` per call
    (the most each call may generate: generation dominates a judge's engine time)."""
    chars = sum(len(m.content) for prompt in plan.prompts for m in prompt.messages)
    return chars // CHARS_PER_TOKEN + max_tokens * len(plan.prompts)


async def _judge_one(
    engine: JudgeEngine, item: _Planned, request_id: str, gi: int, queue: FairQueue | None, caller: Caller
) -> None:
    assert item.plan is not None
    calls = [prompt.messages for prompt in item.plan.prompts]
    turn = (
        queue.turn(caller.user, queue_cost(item.plan, engine.max_tokens), caller.priority)
        if queue is not None
        else contextlib.nullcontext()
    )
    try:
        async with turn:
            outputs = await engine.judge_group(calls, request_id, priority=ENGINE_PRIORITY[caller.priority])
    except SequenceTooLong as exc:
        item.error = ResponseError("sequence_too_long", exc.message)
        return
    check_outputs(outputs, len(calls), gi, str(item.group.key))
    item.outputs = list(outputs)


async def judge_groups(
    engine: JudgeEngine,
    items: list[_Planned],
    request_id: str,
    cache: ResultCache,
    queue: FairQueue | None = None,
    caller: Caller = Caller(),
) -> None:
    """Judge every planned group concurrently (cached ones from ``cache``); fills ``outputs``
    or ``error`` of each item. The first engine failure cancels the other groups. With a
    ``queue``, each group's engine call waits for ``caller``'s turn of the fair queue (cost:
    :func:`queue_cost`).

    Raises:
        EngineNotReady / EngineError: from the engine, or a wrong output count.
    """
    pending: list[tuple[int, _Planned]] = []
    for gi, item in enumerate(items):
        if item.plan is None:
            continue
        hit = cache.get(item.key)
        if hit is not None:
            item.outputs, item.from_cache = list(hit), True
        else:
            pending.append((gi, item))
    try:
        async with asyncio.TaskGroup() as tg:
            for gi, item in pending:
                tg.create_task(_judge_one(engine, item, f"{request_id}-{gi}", gi, queue, caller))
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    for _, item in pending:
        if item.outputs is not None:
            cache.put(item.key, item.outputs)


async def score_request(
    app: web.Application, request: ScoreRequest, info: ModelInfo, settings: JudgeSettings, caller: Caller = Caller()
) -> ScoreResponse:
    """Judge every group of a decoded, checked request with the judge ``info`` describes;
    ``caller`` (user and priority hint) takes each group's turn of the app's fair queue.

    The request's ``fingerprint``, when set, is checked first (409 ``conflict`` when it is not
    the judge's, :meth:`~rmserve.server.leases.LeaseBook.check_fingerprint`); its groups count
    as the caller's pinned work while they are judged.

    Raises:
        Conflict (409, field ``fingerprint``): the request is pinned to another fingerprint.
        InvalidRequest: ``truncation`` asked (a judge shows whole answers); a group that
            :func:`rebuild_group` or :meth:`JudgeSettings.check_group` refuses.
        InvalidRequest / Overloaded: admission (``max_inflight_groups``).
        EngineNotReady / EngineError: from the engine (the whole request fails), or outputs
            that do not make valid records (e.g. more cached than prompt tokens).
    """
    book = leases_of(app)
    book.check_fingerprint(request.fingerprint, info)
    if request.truncation is not None:
        raise InvalidRequest(
            "truncation: a generative judge shows whole answers and does not truncate; drop --truncation",
            field="truncation",
        )
    groups = [rebuild_group(wire, gi) for gi, wire in enumerate(request.groups)]
    for gi, group in enumerate(groups):
        settings.check_group(group, gi)
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    config = settings.protocol_config()
    num_groups = len(groups)
    admit(state, num_groups, app[CONFIG_KEY].max_inflight_groups)
    admission = limits.admit(app, caller.user, num_groups)
    state.admit_groups(num_groups)
    metrics.inflight_groups.inc(num_groups)
    try:
        # Templating the judge prompts and hashing them is the judge's render work: it runs on
        # the render threads, in the caller's fair turn (rmserve.server.render_pool).
        items = await render_pool.run(
            app, caller, render_pool.request_chars(request), lambda: _plan_all(groups, config, info.fingerprint)
        )
        # The user's tokens-per-minute budget is charged the same estimate the fair queue uses.
        engine = app[ENGINE_KEY]
        await admission.charge_tokens(
            sum(queue_cost(item.plan, engine.max_tokens) for item in items if item.plan is not None)
        )
        with book.pinned(caller.user.name, request.fingerprint, num_groups):
            await judge_groups(
                app[ENGINE_KEY], items, uuid.uuid4().hex, app[RESULT_CACHE_KEY], queue_of(app), caller
            )
    finally:
        admission.release()
        state.release_groups(num_groups)
        metrics.inflight_groups.dec(num_groups)

    results = []
    for gi, (wire, item) in enumerate(zip(request.groups, items, strict=True)):
        n = len(wire.responses)
        if item.outputs is None:
            assert item.error is not None
            results.append(unjudged_result(wire.id, n, item.error))
            continue
        assert item.plan is not None
        try:
            judged = score_group(item.group, item.plan, item.outputs, config)
        except ValueError as exc:  # e.g. negative token counts, cached tokens over the prompt's
            raise EngineError(
                f"the judge engine's outputs for groups[{gi}] (id {wire.id!r}) cannot be recorded: {exc}"
            ) from None
        results.append(judge_result(wire.id, judged, n))
        if item.from_cache:
            metrics.result_cache_hits.inc()
        else:
            metrics.observe_group(
                tuple(c.prompt_tokens for c in judged.calls), tuple(c.cached_tokens for c in judged.calls)
            )
    return ScoreResponse(model=info.name, fingerprint=info.fingerprint, results=tuple(results))
