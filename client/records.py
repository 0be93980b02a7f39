"""Score records and reply checks: the client's side of the wire schema.

:func:`request_group` turns a :class:`~rmserve.schema.Group` into the wire group sent in a
``POST /v1/score``; :func:`check_reply` checks a :class:`~rmserve.schema.ScoreResponse`
against the groups sent and orders its results like them; :func:`record_from_result` turns
one group and its result into the stored :class:`~rmserve.schema.ScoreRecord`, and
:func:`refused_record` records a group the server refused as over a whole limit.

No torch or vllm here: this module must import on a machine without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rmserve import errors
from rmserve.schema import (
    Group,
    GroupResult,
    RequestGroup,
    ResponseError,
    ScoreKind,
    Scorer,
    ScoreRecord,
    ScoreResponse,
    Truncation,
)

__all__ = ["check_reply", "record_from_result", "refused_record", "request_group"]


def request_group(group: Group, *, judge: bool = False) -> RequestGroup:
    """The wire form of ``group``: id ``str(group.key)``, its messages and responses; for a
    generative judge (``judge``: the server's kind is ``judge``) also ``num_chosen``,
    ``styles``, ``benchmark`` and ``domain``, which its prompts need. Other kinds never get
    them, so their requests are unchanged."""
    if judge:
        return RequestGroup(id=str(group.key), responses=group.responses, messages=group.messages,
                            num_chosen=group.num_chosen, styles=group.styles,
                            benchmark=group.benchmark, domain=group.domain)
    return RequestGroup(id=str(group.key), responses=group.responses, messages=group.messages)


def record_from_result(
    group: Group,
    result: GroupResult,
    *,
    model: str,
    fingerprint: str,
    truncation: Truncation | None = None,
    kind: ScoreKind | None = None,
    scorer: Scorer | None = None,
) -> ScoreRecord:
    """The stored record of one scored group: key, rewards (null where a response could not be
    scored, with its :class:`~rmserve.schema.ResponseError` in ``errors``), token counts, the
    engine's per-response ``extras`` (unchanged), model identity, the truncation it was scored
    under and, from ``kind`` (:meth:`ScoreKind.of` the run's
    :class:`~rmserve.schema.ModelInfo`; None: a classifier), what kind of score the rewards
    are; a generative judge's ``judge`` record (its calls, texts and the group's score) and
    its ``judge_sampling`` and ``judge_engine`` (how it decoded, what decoded) are copied
    unchanged; ``scorer`` is what scored it (the reply's :attr:`~rmserve.schema.ScoreResponse.scorer`:
    engine, attention implementation, head; None: the server did not say)."""
    kind = kind or ScoreKind()
    return ScoreRecord(
        benchmark=group.benchmark,
        domain=group.domain,
        id=group.id,
        num_chosen=group.num_chosen,
        rewards=result.rewards,
        num_tokens=result.num_tokens,
        num_cached_tokens=result.num_cached_tokens,
        model=model,
        fingerprint=fingerprint,
        truncated_tokens=result.truncated_tokens,
        styles=group.styles,
        errors=result.errors,
        truncation=truncation,
        extras=result.extras,
        kind=kind.kind,
        mode=kind.mode,
        ref_model=kind.ref_model,
        compat=kind.compat,
        judge=result.judge,
        judge_sampling=result.judge_sampling,
        judge_engine=result.judge_engine,
        scorer=scorer,
    )


def refused_record(
    group: Group,
    refusal: errors.OverLimit,
    *,
    model: str,
    fingerprint: str,
    truncation: Truncation | None = None,
    kind: ScoreKind | None = None,
) -> ScoreRecord:
    """The stored record of a group the server refused on its own as over a whole limit
    (413 ``request_over_limit`` for a request of this one group: its tokens alone exceed the
    user's ``tokens_per_minute``), so it can never be scored under that limit.

    Every response gets a null reward, zero token counts and the
    :class:`~rmserve.schema.ResponseError` ``request_over_limit`` with the server's message (which
    names the budget, the group's cost and the fix); ``model`` and ``fingerprint`` are the run's
    (no reply carried them). It counts as an unscored group, as the official code counts one.
    """
    kind = kind or ScoreKind()
    n = len(group.responses)
    error = ResponseError(type=refusal.type, message=refusal.message)
    return ScoreRecord(
        benchmark=group.benchmark,
        domain=group.domain,
        id=group.id,
        num_chosen=group.num_chosen,
        rewards=(None,) * n,
        num_tokens=(0,) * n,
        num_cached_tokens=(0,) * n,
        model=model,
        fingerprint=fingerprint,
        styles=group.styles,
        errors=(error,) * n,
        truncation=truncation,
        kind=kind.kind,
        mode=kind.mode,
        ref_model=kind.ref_model,
        compat=kind.compat,
    )


def check_reply(groups: Sequence[Group], reply: ScoreResponse) -> tuple[GroupResult, ...]:
    """The reply's results in the order of ``groups``, after checking they match.

    Raises:
        rmserve.errors.ServerFault: a result count different from the groups sent, an id
            sent but not answered, an id answered but not sent or answered twice, or a
            ``rewards``/``num_tokens``/``num_cached_tokens``/``truncated_tokens``/``errors``
            length (or that of one of the ``extras``) that differs from the group's number of
            responses, or a null reward
            without an error for that response (or an error beside a reward).
    """
    if len(reply.results) != len(groups):
        raise errors.ServerFault(
            f"reply holds {len(reply.results)} results for {len(groups)} groups sent", field="results"
        )
    by_id: dict[str, GroupResult] = {}
    for i, result in enumerate(reply.results):
        if result.id in by_id:
            raise errors.ServerFault(f"reply answers group {result.id!r} twice", field=f"results[{i}].id")
        by_id[result.id] = result
    ordered = []
    for group in groups:
        wire_id = str(group.key)
        result = by_id.pop(wire_id, None)
        if result is None:
            unexpected = sorted(by_id)[:3]
            raise errors.ServerFault(
                f"reply has no result for group {wire_id!r} (unexpected ids: {unexpected})", field="results"
            )
        n = len(group.responses)
        for name in ("rewards", "num_tokens", "num_cached_tokens", "truncated_tokens", "errors"):
            values = getattr(result, name)
            if values is not None and len(values) != n:
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {len(values)} {name} for {n} responses",
                    field=f"results[{wire_id}].{name}",
                    value=len(values),
                    limit=n,
                )
        for name, values in (result.extras or {}).items():
            if len(values) != n:
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {len(values)} extras[{name!r}] values for {n} responses",
                    field=f"results[{wire_id}].extras.{name}",
                    value=len(values),
                    limit=n,
                )
        reasons = result.errors or (None,) * n
        for j, (reward, reason) in enumerate(zip(result.rewards, reasons)):
            if (reward is None) != (reason is not None):
                state = "a null reward without an error" if reward is None else "both a reward and an error"
                raise errors.ServerFault(
                    f"reply for group {wire_id!r} has {state} for response {j}", field=f"results[{wire_id}].rewards[{j}]"
                )
        ordered.append(result)
    return tuple(ordered)
