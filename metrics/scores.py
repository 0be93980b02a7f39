"""Score sets: the validated per-group arrays the metrics compute from.

One container per benchmark, both on :class:`BenchmarkScores` (the fields every score set
carries: files, warnings, kind of score, reward, models, judge records; the group keys, the
row count and row selection):

* :class:`RMBenchScores` — ``(n, 6)`` rewards, source domains, ids, for
  :mod:`rmserve.metrics.rmbench`;
* :class:`RB2Scores` — NaN-padded ``(n, L)`` scores, completion and correct counts, subsets,
  ids, for :mod:`rmserve.metrics.rewardbench2`.

:data:`ScoreSet` is either. The readers that build them from score files or records are in
:mod:`rmserve.metrics.score_files`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Self

import numpy as np

from rmserve.metrics.judge_setup import JudgeSetup
from rmserve.schema import ScoreKind

JUDGE_KIND = "judge"
"""``ScoreRecord.kind`` of a generative judge's records."""

SCORED_REWARDS = "rewards"
"""``reward`` of a score set whose rewards are the records' own (no DPO recomputation)."""


def read_only(array: np.ndarray) -> np.ndarray:
    """``array`` itself, made read-only (the arrays of a score set are never written)."""
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False, kw_only=True)
class BenchmarkScores:
    """What every score set carries beside its benchmark's arrays (keyword-only fields).

    A subclass names its benchmark (``benchmark``), its per-group arrays (``row_fields``, the
    first one's leading dimension is the group count) and which of them holds each group's
    domain or subset (``part_field``, the middle of the group key).

    Attributes:
        ids: ``(n,)`` str dataset ids (RewardBench 2 Ties: ``ref:N`` / ``tied:N``).
        files: the files read, in order.
        warnings: what the readers accepted but the caller should know (a dropped torn last
            line, ids repeated outside Ties), one sentence each.
        score_kind: what kind of score the records hold; None when no file says (official
            result files).
        reward: which reward the scores are: ``rewards`` (the records' own) or
            ``dpo:<avg|sum|norm|reference>`` (recomputed from the DPO extras) or ``extra:<name>``
            (the extras of that name, ``--reward-extra``).
        models: the distinct ``(model name, fingerprint)`` pairs of the score records, in
            order of first appearance; empty when the files do not record them (official
            result files).
        heads: the distinct reward heads the score records name (``remote-code``, ``multi-label
            (label 2)``, …), in order of first appearance; empty when no record names one.
        judge: for score records of kind ``judge``, an ``(n,)`` object array, read-only: per
            group its :class:`~rmserve.judge_records.JudgeGroupResult`, None where the judge
            could not take the group (null rewards and errors); the figures are computed from
            these (:mod:`rmserve.metrics.judge`), never from the rewards. None for every other
            kind of score.
        judge_setup: for score records of kind ``judge``, the sampling and engine they state
            (:class:`~rmserve.metrics.judge_setup.JudgeSetup`, with how many state none); None
            for every other kind of score.
    """

    benchmark: ClassVar[str]
    row_fields: ClassVar[tuple[str, ...]]
    part_field: ClassVar[str]
    ids: np.ndarray
    files: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
    score_kind: ScoreKind | None = None
    reward: str = SCORED_REWARDS
    models: tuple[tuple[str, str], ...] = field(default=())
    heads: tuple[str, ...] = field(default=())
    judge: np.ndarray | None = None
    judge_setup: JudgeSetup | None = None

    @property
    def n_groups(self) -> int:
        """The number of groups (rows)."""
        return int(getattr(self, self.row_fields[0]).shape[0])

    @property
    def parts(self) -> np.ndarray:
        """``(n,)`` str: each group's RM-Bench source domain or RewardBench 2 subset."""
        return getattr(self, self.part_field)

    def keys(self) -> np.ndarray:
        """``(n,)`` group keys as ``str(GroupKey)``: ``<benchmark>/<domain or subset>/<id>``."""
        return np.char.add(np.char.add(f"{self.benchmark}/", np.char.add(self.parts, "/")), self.ids)

    def take(self, order: np.ndarray) -> Self:
        """The same score set with rows reordered/selected by ``order`` (arrays read-only)."""
        rows = {name: read_only(getattr(self, name)[order]) for name in self.row_fields}
        return replace(self, **rows, judge=None if self.judge is None else read_only(self.judge[order]))


@dataclass(frozen=True, eq=False)
class RMBenchScores(BenchmarkScores):
    """RM-Bench rewards of ``n`` groups, ready for :mod:`rmserve.metrics.rmbench`.

    Attributes:
        rewards: ``(n, 6)`` float64, read-only: chosen concise, detailed plain, detailed
            markdown, then rejected in the same order; NaN where a reward is missing.
        domains: ``(n,)`` str source-domain labels (:data:`rmserve.schema.RMBENCH_DOMAINS`).
        ids, files, warnings, score_kind, reward, models, judge, judge_setup: see :class:`BenchmarkScores`.
    """

    benchmark: ClassVar[str] = "rm-bench"
    row_fields: ClassVar[tuple[str, ...]] = ("rewards", "domains", "ids")
    part_field: ClassVar[str] = "domains"
    rewards: np.ndarray
    domains: np.ndarray


@dataclass(frozen=True, eq=False)
class RB2Scores(BenchmarkScores):
    """RewardBench 2 rewards of ``n`` groups, ready for :mod:`rmserve.metrics.rewardbench2`.

    Attributes:
        scores: ``(n, L)`` float64, read-only, padded with NaN after ``lengths[g]``
            completions; correct completions first; NaN where a reward is missing.
        lengths: ``(n,)`` int64 completions per group.
        num_correct: ``(n,)`` int64 correct completions per group.
        subsets: ``(n,)`` str subset labels (:data:`rmserve.schema.RB2_SUBSETS`).
        ids, files, warnings, score_kind, reward, models, judge, judge_setup: see :class:`BenchmarkScores`.
    """

    benchmark: ClassVar[str] = "rewardbench2"
    row_fields: ClassVar[tuple[str, ...]] = ("scores", "lengths", "num_correct", "subsets", "ids")
    part_field: ClassVar[str] = "subsets"
    scores: np.ndarray
    lengths: np.ndarray
    num_correct: np.ndarray
    subsets: np.ndarray


ScoreSet = RMBenchScores | RB2Scores
"""Either benchmark's score set."""


def repeated_keys(scores: ScoreSet) -> list[str]:
    """The group keys (``str(GroupKey)``) that occur more than once in ``scores``, sorted.

    Only a RewardBench 2 file with an id repeated outside Ties can produce any (see
    :func:`rmserve.metrics.score_files.read_score_files`).
    """
    keys, counts = np.unique(scores.keys(), return_counts=True)
    return keys[counts > 1].tolist()


__all__ = [
    "JUDGE_KIND",
    "SCORED_REWARDS",
    "BenchmarkScores",
    "RB2Scores",
    "RMBenchScores",
    "ScoreSet",
    "read_only",
    "repeated_keys",
]
