"""Paired comparison of two score sets over the same groups: B − A with bootstrap intervals.

:func:`compare_files` / :func:`compare_scores` → :class:`Comparison`, rendered by
:func:`rmserve.metrics.render_markdown.render_comparison` and
:func:`rmserve.metrics.render_json.comparison_dict`. Groups are paired by key; a generative
judge's side is compared on its verdicts (the strata of :func:`rmserve.metrics.evaluation.judge_strata`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rmserve.metrics.bootstrap import (
    PairedFigure,
    match_groups,
    paired_rb2,
    paired_rmbench,
    paired_strata,
    score_strata,
)
from rmserve.metrics.evaluation import JUDGE_VERDICTS, RB2_COLUMNS, RMBENCH_COLUMNS, MetricsConfig, judge_strata
from rmserve.metrics.judge_setup import compare_setups
from rmserve.metrics.score_files import read_score_files, score_file_fingerprints
from rmserve.metrics.scores import SCORED_REWARDS, RB2Scores, RMBenchScores, ScoreSet, repeated_keys

from rmserve.errors import DataError, name_some
from rmserve.schema import RB2_SUBSETS, ScoreKind


@dataclass(frozen=True)
class Comparison:
    """Paired comparison of score sets A and B over the same groups.

    Attributes:
        benchmark: the benchmark of both.
        files_a, files_b: the files of A and B.
        n_groups: groups compared.
        figures: one :class:`~rmserve.metrics.bootstrap.PairedFigure` per figure, table order.
        config: the settings used (``resamples`` ≥ 1).
        warnings: the readers' warnings for A then B (e.g. a dropped torn last line).
        score_kind_a, score_kind_b: what kind of score each side's records hold (None for
            official result files).
        reward: the reward A's figures use (see :attr:`rmserve.metrics.evaluation.Evaluation.reward`;
            a generative judge's side uses :data:`~rmserve.metrics.evaluation.JUDGE_VERDICTS`).
        reward_b: B's, when it differs from A's (a classifier against a judge); else None.
        notes: what the reader of the table must know, one sentence each: groups or domains
            present on one side only (the comparison is then partial), and A and B being
            the same model (same fingerprint) or holding identical scores.
        partial: True when some groups of A or B are not in the comparison.
    """

    benchmark: str
    files_a: tuple[str, ...]
    files_b: tuple[str, ...]
    n_groups: int
    figures: tuple[PairedFigure, ...] = field(default=())
    config: MetricsConfig = field(default_factory=MetricsConfig)
    warnings: tuple[str, ...] = ()
    score_kind_a: ScoreKind | None = None
    score_kind_b: ScoreKind | None = None
    reward: str = SCORED_REWARDS
    notes: tuple[str, ...] = ()
    partial: bool = False
    reward_b: str | None = None


def _table_order(benchmark: str, names: Iterable[str]) -> list[str]:
    names = list(names)
    if benchmark == "rm-bench":
        head = [figure for _, figure in RMBENCH_COLUMNS]
    else:
        head = [figure for _, figure in RB2_COLUMNS]
    return [n for n in head if n in names] + [n for n in names if n not in head]


def _part_of(key: str) -> str:
    """The domain/subset of a group key ``<benchmark>/<part>/<id>``."""
    return key.split("/", 2)[1]


def _one_side_note(only: np.ndarray, side: str) -> str:
    """"3 group(s) only in A (chat 2, code 1)": the groups of one side the other lacks, per part."""
    parts: dict[str, int] = {}
    for key in only.tolist():
        parts[_part_of(key)] = parts.get(_part_of(key), 0) + 1
    return f"{only.size} group(s) only in {side} ({', '.join(f'{p} {n}' for p, n in parts.items())})"


def compare_scores(
    a: ScoreSet,
    b: ScoreSet,
    config: MetricsConfig | None = None,
    *,
    fingerprints: tuple[frozenset[str], frozenset[str]] | None = None,
) -> Comparison:
    """Paired comparison B − A over the groups both sides hold.

    Groups present on one side only are left out and the comparison is marked partial, its
    notes naming how many groups of each side, and of which domains/subsets, were left out.
    ``fingerprints`` (the model fingerprints each side's records name, when known) add a
    note when A and B are the same model; identical scores get a note too.

    Two judges' score sets judged under different set-ups (sampling, engine and its version,
    batch invariance) get a note naming the fields that differ, and a side whose records state
    none gets a note (:func:`~rmserve.metrics.judge_setup.compare_setups`).

    Raises:
        DataError: a group key repeated on either side (groups are paired by key), different
            benchmarks, no group in common (counts and examples given), or a group whose
            completion count differs between A and B.
        ValueError: ``config.resamples`` is 0 (a comparison needs intervals).
    """
    config = config or MetricsConfig()
    boot = config.bootstrap()
    if boot is None:
        raise ValueError("resamples must be >= 1 for a paired comparison")
    name_a = ", ".join(a.files) or "A"
    name_b = ", ".join(b.files) or "B"
    for name, side in ((name_a, a), (name_b, b)):
        repeated = repeated_keys(side)
        if repeated:
            raise DataError(
                f"{len(repeated)} group key(s) appear more than once ({name_some(repeated)}); a comparison pairs each group of A "
                "with the group of B that has the same key, so every key must be unique: correct the ids in the "
                "file (in the published RewardBench 2 per-item files the first ten Factuality ids, 30-39, should "
                "be 0-9) and compare again",
                path=name,
                field="id",
            )
    if a.benchmark != b.benchmark:
        raise DataError(f"holds {b.benchmark} scores but {name_a} holds {a.benchmark}", path=name_b, field="benchmark")
    setup_notes = compare_setups(a.judge_setup, b.judge_setup, name_a=name_a, name_b=name_b)
    keys_a, keys_b = a.keys(), b.keys()
    shared = np.intersect1d(keys_a, keys_b)
    notes: list[str] = []
    partial = False
    if shared.size and (shared.size < keys_a.size or shared.size < keys_b.size):
        partial = True
        sides = [
            _one_side_note(only, side)
            for only, side in ((np.setdiff1d(keys_a, keys_b), "A"), (np.setdiff1d(keys_b, keys_a), "B"))
            if only.size
        ]
        notes.append(
            f"Partial comparison: {'; '.join(sides)}; they are left out, and the figures of both sides cover the "
            f"{shared.size} group(s) both hold."
        )
        a = a.take(np.flatnonzero(np.isin(keys_a, shared)))
        b = b.take(np.flatnonzero(np.isin(keys_b, shared)))
    order_a, order_b = match_groups(a.keys(), b.keys(), name_a=name_a, name_b=name_b)
    a, b = a.take(order_a), b.take(order_b)
    absent = _absent_note(a)
    if absent:
        notes.append(absent)
    if fingerprints is not None:
        fa, fb = fingerprints
        if len(fa) == 1 and fa == fb:
            notes.append(
                f"A and B are the same model (same fingerprint {next(iter(fa))}): differences are only "
                "scoring noise, 0 when scoring is deterministic."
            )
    judged = a.judge is not None or b.judge is not None
    same_scores = not judged and (
        np.array_equal(a.rewards, b.rewards, equal_nan=True)
        if isinstance(a, RMBenchScores)
        else np.array_equal(a.scores, b.scores, equal_nan=True)  # type: ignore[union-attr]
    )
    if same_scores:
        notes.append("A and B hold identical scores for every group: every difference is 0.")
    notes += setup_notes
    if isinstance(a, RB2Scores):
        assert isinstance(b, RB2Scores)
        differs = (a.lengths != b.lengths) | (a.num_correct != b.num_correct)
        if differs.any():
            key = a.keys()[differs][0]
            raise DataError(
                f"{int(differs.sum())} group(s) have a different number of completions or correct completions "
                f"in A and B (e.g. {key})",
                path=name_b,
                field="scores",
            )
    if judged:
        names, strata_a = _strata(a)
        _, strata_b = _strata(b)
        paired = paired_strata(a.benchmark, names, strata_a, strata_b, boot)
    elif isinstance(a, RMBenchScores):
        assert isinstance(b, RMBenchScores)
        paired = paired_rmbench(a.rewards, b.rewards, a.domains, boot)
    else:
        assert isinstance(b, RB2Scores)
        paired = paired_rb2(a.scores, a.lengths, b.scores, b.lengths, a.num_correct, a.subsets, a.ids, boot)
    return Comparison(
        notes=tuple(notes),
        partial=partial,
        benchmark=a.benchmark,
        files_a=a.files,
        files_b=b.files,
        n_groups=a.n_groups,
        figures=tuple(paired[n] for n in _table_order(a.benchmark, paired)),
        config=config,
        warnings=a.warnings + b.warnings,
        score_kind_a=a.score_kind,
        score_kind_b=b.score_kind,
        reward=_set_reward(a),
        reward_b=_set_reward(b) if _set_reward(b) != _set_reward(a) else None,
    )


def _set_reward(scores: ScoreSet) -> str:
    """The reward a score set's figures use (:data:`~rmserve.metrics.evaluation.JUDGE_VERDICTS` for a judge's)."""
    return JUDGE_VERDICTS if scores.judge is not None else scores.reward


def _strata(scores: ScoreSet) -> tuple[list[str], list[np.ndarray]]:
    """Bootstrap strata of a score set: from a judge's verdicts, or from the rewards."""
    if scores.judge is not None:
        _, names, strata = judge_strata(scores)
        return names, strata
    if isinstance(scores, RMBenchScores):
        return score_strata("rm-bench", scores.rewards, scores.domains)
    return score_strata("rewardbench2", scores.scores, scores.lengths, scores.num_correct, scores.subsets, scores.ids)


def compare_files(path_a: str | Path, path_b: str | Path, config: MetricsConfig | None = None) -> Comparison:
    """Read two score files (one score set each) and compare them (see :func:`compare_scores`).

    Raises:
        DataError: any input problem, or mismatched groups.
    """
    config = config or MetricsConfig()
    a, b = (read_score_files([path], domain=config.domain, benchmark=config.benchmark, dpo_reward=config.dpo_reward,
                             reward_extra=config.reward_extra) for path in (path_a, path_b))
    return compare_scores(a, b, config, fingerprints=(score_file_fingerprints(path_a), score_file_fingerprints(path_b)))


__all__ = ["Comparison", "compare_files", "compare_scores"]


def _absent_note(paired: ScoreSet) -> str | None:
    """"No paired group of math: the averages are over chat, code, safety only (partial)." when
    the paired groups lack a reported RM-Bench domain or a RewardBench 2 subset (absent from the
    data, or held by one side only); None otherwise."""
    from rmserve.metrics.rmbench import DOMAIN_PARTS, REPORT_DOMAINS

    if isinstance(paired, RMBenchScores):
        held = set(np.unique(paired.domains).tolist())
        present = [d for d in REPORT_DOMAINS if held.intersection(DOMAIN_PARTS[d])]
        missing = [d for d in REPORT_DOMAINS if d not in present]
    else:
        held = set(np.unique(paired.subsets).tolist())  # type: ignore[union-attr]
        present = [s for s in RB2_SUBSETS if s in held]
        missing = [s for s in RB2_SUBSETS if s not in held]
    if not missing:
        return None
    return f"No paired group of {', '.join(missing)}: the averages are over {', '.join(present)} only (partial)."
