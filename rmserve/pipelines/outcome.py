"""What a run's records say about groups that could not be scored and about truncation.

Pure functions over :class:`~rmserve.schema.ScoreRecord` sequences (data order), used by the
``eval``/``run``/``sweep`` pipelines to name at the end of a run what did not go as asked:
groups with a response the server could not score (counted by the metrics as the official
code counts them: a NaN comparison is lost in RM-Bench, a NaN reward never wins in
RewardBench 2) and, when truncation was asked, how much was cut.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rmserve.client.score_log import SEQUENCE_TOO_LONG, length_limit_of
from rmserve.errors import GroupNotScored, name_some
from rmserve.schema import ScoreRecord

REASONS: dict[str, str] = {
    SEQUENCE_TOO_LONG: "over the length limit",
    "non_finite_reward": "non-finite reward",
    "request_over_limit": "over the user's token budget",
}
"""How a summary names each :class:`~rmserve.schema.ResponseError` type."""


@dataclass(frozen=True)
class Unscored:
    """Groups with at least one response that has no reward.

    Attributes:
        n_groups: all groups of the run.
        keys: ``benchmark/domain/id`` of each unscored group, data order.
        by_reason: unscored groups per reason (a group counts under the type of its first
            response error).
    """

    n_groups: int
    keys: tuple[str, ...]
    by_reason: dict[str, int]
    length_limit: int | None = None
    """The ``max_model_len`` the groups over the length limit were over, when their errors
    name one and it is the same for all (tokens); None otherwise."""

    @property
    def count(self) -> int:
        """How many groups were not fully scored."""
        return len(self.keys)

    def sentence(self, scores_path: str) -> str | None:
        """``"3 of 798 groups not scored (2 over the length limit, 1 non-finite reward):
        counted as losses; see scores.jsonl"``, or None when every group was scored."""
        if not self.keys:
            return None

        def reason_text(reason: str, n: int) -> str:
            text = f"{n} {REASONS.get(reason, reason)}"
            if reason == SEQUENCE_TOO_LONG and self.length_limit is not None:
                text += f" of {self.length_limit:,} tokens"
            return text

        reasons = ", ".join(reason_text(reason, n) for reason, n in self.by_reason.items())
        fix = (
            "; to score those over the length limit, raise the server's --max-model-len or pass --truncation, and "
            "run the same command again (only they are sent again)" if SEQUENCE_TOO_LONG in self.by_reason else ""
        )
        return (
            f"{self.count} of {self.n_groups} groups not scored ({reasons}): counted as losses, as the official "
            f"code counts them; see {scores_path}{fix}"
        )


def unscored(records: Sequence[ScoreRecord]) -> Unscored:
    """The groups of ``records`` that hold a response without a reward (see :class:`Unscored`)."""
    keys: list[str] = []
    reasons: Counter[str] = Counter()
    limits: set[int | None] = set()
    for record in records:
        if record.scored:
            continue
        keys.append(str(record.key))
        reasons[record.first_error.type] += 1
        limits.update(length_limit_of(e) for e in record.errors or () if e is not None and e.type == SEQUENCE_TOO_LONG)
    return Unscored(n_groups=len(records), keys=tuple(keys), by_reason=dict(reasons.most_common()),
                    length_limit=next(iter(limits)) if len(limits) == 1 else None)


def strict_stop(record: ScoreRecord, *, kept: str, prefix: str = "") -> GroupNotScored:
    """The error ``--strict`` stops a run with at ``record``, a group that could not be scored.

    Args:
        record: the unscored group (``record.first_error`` is not None).
        kept: where the record was written, named in the message.
        prefix: put before the message (the sweep names the checkpoint).
    """
    first = record.first_error
    assert first is not None
    return GroupNotScored(
        f"{prefix}group {str(record.key)!r} could not be scored ({first.type}: {first.message}); "
        f"--strict stops here ({kept})"
    )


@dataclass(frozen=True)
class TruncationSummary:
    """How much a requested truncation cut.

    Attributes:
        n_groups: groups scored under truncation.
        n_groups_cut: groups with at least one response cut.
        n_tokens_cut: tokens cut over all responses.
        identical_after_cut: ``benchmark/domain/id`` of groups where a chosen and a rejected
            response came out identical (same length after the cut, same reward): the cut
            removed everything that told them apart, so their comparison is a tie. (A right
            cut that would leave nothing of a response itself does not score it: the server
            answers ``sequence_too_long`` for it instead.)
    """

    n_groups: int
    n_groups_cut: int
    n_tokens_cut: int
    identical_after_cut: tuple[str, ...]

    def sentence(self) -> str:
        """E.g. ``"truncation: 12 of the 798 groups scored under it were cut, 3,456 tokens in all; no chosen and
        rejected response came out identical"``, or the identical groups named."""
        text = (
            f"truncation: {self.n_groups_cut} of the {self.n_groups} groups scored under it were cut, "
            f"{self.n_tokens_cut:,} tokens in all"
        )
        if self.identical_after_cut:
            text += (
                f"; {len(self.identical_after_cut)} groups have a chosen and a rejected response identical after the "
                f"cut (it left nothing that told them apart: {name_some(self.identical_after_cut)})"
            )
        else:
            text += "; no chosen and rejected response came out identical"
        return text


def truncation_summary(records: Sequence[ScoreRecord]) -> TruncationSummary | None:
    """Summary of the cuts in ``records`` scored under truncation; None when none was."""
    cut_records = [r for r in records if r.truncation is not None and r.truncated_tokens is not None]
    if not cut_records:
        return None
    identical: list[str] = []
    for record in cut_records:
        chosen = range(record.num_chosen)
        rejected = range(record.num_chosen, len(record.rewards))
        if any(_identical_after_cut(record, i, j) for i in chosen for j in rejected):
            identical.append(str(record.key))
    return TruncationSummary(
        n_groups=len(cut_records),
        n_groups_cut=sum(1 for r in cut_records if any(r.truncated_tokens)),
        n_tokens_cut=sum(sum(r.truncated_tokens) for r in cut_records),
        identical_after_cut=tuple(identical),
    )


def _identical_after_cut(record: ScoreRecord, i: int, j: int) -> bool:
    cut = record.truncated_tokens
    assert cut is not None
    return (
        cut[i] > 0
        and cut[j] > 0
        and record.num_tokens[i] == record.num_tokens[j]
        and record.rewards[i] is not None
        and record.rewards[i] == record.rewards[j]
    )
