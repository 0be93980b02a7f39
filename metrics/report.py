"""Evaluate score files and render the figures: Markdown tables, a JSON dict, heatmaps.

Library entry points (what ``rmserve metrics`` and ``rmserve eval`` call):

* :func:`evaluate_files` / :func:`evaluate_records` → :class:`Evaluation` (point figures from
  :mod:`rmserve.metrics.rmbench` / :mod:`rmserve.metrics.rewardbench2` plus bootstrap
  intervals from :mod:`rmserve.metrics.bootstrap`);
* :func:`render_markdown`, :func:`result_dict`, :func:`write_outputs` (``results.json``,
  ``table.md`` and, for RM-Bench, one ``heatmap-<domain>.png`` per domain);
* :func:`compare_files` → :class:`Comparison` (paired B − A), rendered by
  :func:`render_comparison` / :func:`comparison_dict`.

Score records of a generative judge (kind ``judge``) are evaluated from their verdicts
(:mod:`rmserve.metrics.judge`), never from their per-response rewards: the same figures and
bootstrap strata as the classifier path, plus a :class:`JudgeReport` (protocols, compat,
seeds, calls cut at ``max_tokens``, parse failures per subset / domain) that the table, the
JSON and the heatmaps show. A group the judge could not take is counted as a classifier's
unscored group (``n_nan_groups``).

Tables follow the leaderboard column order and show percent with one decimal; the JSON
holds fractions at full precision. matplotlib is imported only when plotting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import orjson
from rmserve.metrics.bootstrap import (
    BootstrapConfig,
    Interval,
    PairedFigure,
    check_resampling,
    match_groups,
    paired_rb2,
    paired_rmbench,
    paired_strata,
    rb2_intervals,
    rmbench_intervals,
    score_strata,
    strata_intervals,
)
from rmserve.metrics.dpo import DPO_REWARD_FORMULAS, DPO_REWARDS
from rmserve.metrics.inputs import (
    JUDGE_KIND,
    SCORED_REWARDS,
    RB2Scores,
    RMBenchScores,
    ScoreSet,
    read_score_files,
    repeated_keys,
    scores_from_records,
)
from rmserve.metrics.judge import (
    JudgeSummary,
    ParseFailures,
    judge_parse_failures,
    judge_summary,
    rb2_judge_rows,
    rb2_judge_strata,
    rewardbench2_judge_scores,
    rmbench_judge_accuracy,
    rmbench_judge_rows,
    rmbench_judge_strata,
)
from rmserve.metrics.rewardbench2 import TIES, TIES_WEIGHTS, RB2Result, rewardbench2_scores
from rmserve.metrics.rmbench import DOMAIN_PARTS, REPORT_DOMAINS, DomainAccuracy, RMBenchResult, rmbench_accuracy

from rmserve.errors import DataError
from rmserve.schema import BENCHMARKS, RB2_SUBSETS, RMBENCH_DOMAINS, RMBENCH_STYLES, ScoreKind, ScoreRecord

RMBENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Chat", "chat.score"),
    ("Math", "math.score"),
    ("Code", "code.score"),
    ("Safety", "safety.score"),
    ("Easy", "overall.easy"),
    ("Normal", "overall.normal"),
    ("Hard", "overall.hard"),
    ("Avg", "overall.score"),
)
"""RM-Bench leaderboard columns: (header, figure name)."""

RB2_COLUMNS: tuple[tuple[str, str], ...] = tuple((s, s) for s in RB2_SUBSETS) + (("Avg", "average"),)
"""RewardBench 2 leaderboard columns: (header, figure name)."""

MISSING_CELL = "—"
"""Table cell for a figure with no groups."""

_STYLE_LABELS = tuple(s.replace("_", "\n") for s in RMBENCH_STYLES)

JUDGE_VERDICTS = "judge-verdicts"
"""``reward`` of an evaluation of a generative judge: the figures come from the judge's
verdicts (credits, ratings, pairwise cells in the score records' ``judge``), not from rewards."""

RMSERVE_PROTOCOL_NOTE = (
    "rmbench-pairwise is rmserve's own judge protocol for RM-Bench (each chosen/rejected style pair judged in "
    "both orders), not an official one: RM-Bench publishes no judge protocol"
)
"""The sentence every output showing RM-Bench judge figures carries."""


@dataclass(frozen=True)
class JudgeReport:
    """What an evaluation of a generative judge adds to its figures.

    Attributes:
        summary: protocols, mode, compat, seeds and call counts (:class:`~rmserve.metrics.judge.JudgeSummary`).
        parse_failures: per source domain / subset the calls without a verdict or rating
            (:class:`~rmserve.metrics.judge.ParseFailures`; truncated calls counted).
    """

    summary: JudgeSummary
    parse_failures: tuple[ParseFailures, ...]

    def pooled(self, parts: Sequence[str]) -> ParseFailures | None:
        """The parse failures of ``parts`` together (e.g. both safety parts of RM-Bench), or
        None when no call was made for any of them."""
        rows = [p for p in self.parse_failures if p.domain in parts]
        if not rows:
            return None
        n_calls = sum(r.n_calls for r in rows)
        n_failed = sum(r.n_failed for r in rows)
        reasons: dict[str, int] = {}
        for r in rows:
            for reason, count in r.reasons:
                reasons[reason] = reasons.get(reason, 0) + count
        return ParseFailures(
            benchmark=rows[0].benchmark,
            domain="+".join(r.domain for r in rows),
            n_calls=n_calls,
            n_failed=n_failed,
            rate=n_failed / n_calls if n_calls else float("nan"),
            n_truncated=sum(r.n_truncated for r in rows),
            reasons=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        )


@dataclass(frozen=True)
class MetricsConfig:
    """Settings of one metrics run.

    Attributes:
        resamples: bootstrap draws per figure (default 1,000; 0 turns intervals off; ≤ 1,000,000).
        seed: bootstrap seed (default 0; ≥ 0).
        confidence: interval coverage (default 0.95; in (0, 1)).
        domain: RM-Bench source domain for result records that carry none (default None:
            take it from the file name).
        benchmark: expected benchmark (``rm-bench`` / ``rewardbench2``); None = detect.
        dpo_reward: recompute the rewards of a DPO run's score records from their extras:
            ``avg``, ``sum``, ``norm`` or ``reference`` (:mod:`rmserve.metrics.dpo`); None
            (default) uses the records' ``rewards`` as scored.
        excluded: source domains (RM-Bench) or subsets (RewardBench 2) the run left out on
            purpose (``--only``); the notes name them as excluded rather than missing.
    """

    resamples: int = 1000
    seed: int = 0
    confidence: float = 0.95
    domain: str | None = None
    benchmark: str | None = None
    dpo_reward: str | None = None
    excluded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "excluded", tuple(self.excluded))
        check_resampling(self.resamples, self.seed, self.confidence, least_resamples=0)
        if self.domain is not None and self.domain not in RMBENCH_DOMAINS:
            raise ValueError(f"domain must be one of {', '.join(RMBENCH_DOMAINS)}, got {self.domain!r}")
        if self.benchmark is not None and self.benchmark not in BENCHMARKS:
            raise ValueError(f"benchmark must be one of {', '.join(BENCHMARKS)}, got {self.benchmark!r}")
        if self.dpo_reward is not None and self.dpo_reward not in DPO_REWARDS:
            raise ValueError(f"dpo_reward must be one of {', '.join(DPO_REWARDS)}, got {self.dpo_reward!r}")

    def bootstrap(self) -> BootstrapConfig | None:
        """The bootstrap settings, or None when ``resamples`` is 0."""
        if self.resamples == 0:
            return None
        return BootstrapConfig(resamples=self.resamples, seed=self.seed, confidence=self.confidence)


@dataclass(frozen=True)
class Evaluation:
    """Figures of one score set.

    Attributes:
        benchmark: ``rm-bench`` or ``rewardbench2``.
        files: the score files (or record source) read.
        n_groups: groups evaluated.
        result: :class:`~rmserve.metrics.rmbench.RMBenchResult` or
            :class:`~rmserve.metrics.rewardbench2.RB2Result`.
        intervals: figure name → bootstrap interval (empty when resamples is 0).
        config: the settings used.
        warnings: the readers' warnings (a dropped torn last line, ids repeated outside
            Ties), one sentence each.
        score_kind: what kind of score the score records hold (classifier, or DPO with mode,
            reference and compat); None for official result files, which do not say.
        reward: the reward the figures use: ``rewards`` (as scored) or ``dpo:<name>``
            (recomputed from the DPO extras, ``MetricsConfig.dpo_reward``).
        models: the distinct ``(model name, fingerprint)`` pairs the score records name
            (empty when the files do not record them); the figures print them.
        judge: for a generative judge's score records, its :class:`JudgeReport` (the figures
            then come from the verdicts and ``reward`` is :data:`JUDGE_VERDICTS`); else None.
    """

    benchmark: str
    files: tuple[str, ...]
    n_groups: int
    result: RMBenchResult | RB2Result
    intervals: Mapping[str, Interval]
    config: MetricsConfig
    warnings: tuple[str, ...] = ()
    score_kind: ScoreKind | None = None
    reward: str = SCORED_REWARDS
    models: tuple[tuple[str, str], ...] = ()
    judge: JudgeReport | None = None

    def figures(self) -> dict[str, float]:
        """Figure name → point value (names as the interval keys)."""
        return figure_values(self.result)


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
        reward: the reward A's figures use (see :attr:`Evaluation.reward`; a generative
            judge's side uses :data:`JUDGE_VERDICTS`).
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


# --- evaluation -------------------------------------------------------------------------


def figure_values(result: RMBenchResult | RB2Result) -> dict[str, float]:
    """Figure name → point value, named as the bootstrap intervals are.

    RM-Bench: ``<domain>.<hard|normal|easy|score>`` and ``overall.<…>``; RewardBench 2: the
    subset names, ``Ties.<component>`` and ``average``.
    """
    out: dict[str, float] = {}
    if isinstance(result, RMBenchResult):
        for d in result.domains:
            out.update({f"{d.domain}.hard": d.hard, f"{d.domain}.normal": d.normal, f"{d.domain}.easy": d.easy})
            out[f"{d.domain}.score"] = d.score
        out.update({"overall.hard": result.hard, "overall.normal": result.normal, "overall.easy": result.easy})
        out["overall.score"] = result.score
        return out
    for s in result.subsets:
        out[s.subset] = s.score
    if result.ties is not None:
        for component in TIES_WEIGHTS:
            out[f"{TIES}.{component}"] = getattr(result.ties, component)
    out["average"] = result.average
    return out


def evaluate(scores: ScoreSet, config: MetricsConfig | None = None) -> Evaluation:
    """Compute every figure (and its interval) of a score set.

    Raises:
        ValueError: malformed arrays (only possible when ``scores`` was built by hand).
    """
    config = config or MetricsConfig()
    boot = config.bootstrap()
    if scores.judge is not None:
        return _evaluate_judge(scores, config, boot)
    if isinstance(scores, RMBenchScores):
        result: RMBenchResult | RB2Result = rmbench_accuracy(scores.rewards, scores.domains)
        intervals = rmbench_intervals(scores.rewards, scores.domains, boot) if boot else {}
    else:
        arrays = (scores.scores, scores.lengths, scores.num_correct, scores.subsets, scores.ids)
        result = rewardbench2_scores(*arrays)
        intervals = rb2_intervals(*arrays, boot) if boot else {}
    return Evaluation(
        benchmark=scores.benchmark,
        files=scores.files,
        n_groups=scores.n_groups,
        result=result,
        intervals=MappingProxyType(dict(intervals)),
        config=config,
        warnings=scores.warnings,
        score_kind=scores.score_kind,
        reward=scores.reward,
        models=scores.models,
    )


def _judge_strata(scores: ScoreSet) -> tuple[RMBenchResult | RB2Result, list[str], list[np.ndarray]]:
    """Figures and bootstrap strata of a judge's score set, from its verdicts (never its rewards).

    Raises:
        DataError: a judge record that does not fit its group (names the files).
    """
    assert scores.judge is not None
    results = list(scores.judge)
    try:
        if isinstance(scores, RMBenchScores):
            cells, unscored = rmbench_judge_rows(results, scores.domains, scores.ids)
            result: RMBenchResult | RB2Result = rmbench_judge_accuracy(cells, scores.domains, unscored)
            names, strata = rmbench_judge_strata(cells, scores.domains, unscored)
        else:
            a = rb2_judge_rows(results, scores.lengths, scores.num_correct, scores.subsets, scores.ids)
            arrays = (a.credit, a.subsets, a.ratings, a.lengths, a.num_correct, a.ids, a.unscored)
            result = rewardbench2_judge_scores(*arrays)
            names, strata = rb2_judge_strata(*arrays)
    except ValueError as exc:
        raise DataError(str(exc), path=", ".join(scores.files), field="judge") from None
    return result, names, strata


def _evaluate_judge(scores: ScoreSet, config: MetricsConfig, boot: BootstrapConfig | None) -> Evaluation:
    """:func:`evaluate` of a generative judge's score records (figures from the verdicts)."""
    assert scores.judge is not None
    result, names, strata = _judge_strata(scores)
    intervals = strata_intervals(scores.benchmark, names, strata, boot) if boot else {}
    judged = [r for r in scores.judge if r is not None]
    mode = scores.score_kind.mode if scores.score_kind is not None else None
    return Evaluation(
        benchmark=scores.benchmark,
        files=scores.files,
        n_groups=scores.n_groups,
        result=result,
        intervals=MappingProxyType(dict(intervals)),
        config=config,
        warnings=scores.warnings,
        score_kind=scores.score_kind,
        reward=JUDGE_VERDICTS,
        models=scores.models,
        judge=JudgeReport(summary=judge_summary(list(scores.judge), mode), parse_failures=judge_parse_failures(judged)),
    )


def evaluate_files(paths: Sequence[str | Path], config: MetricsConfig | None = None) -> Evaluation:
    """Read score files (any supported format, see :mod:`rmserve.metrics.inputs`) and evaluate them.

    Raises:
        DataError: any input problem (names file, line and field).
    """
    config = config or MetricsConfig()
    scores = read_score_files(paths, domain=config.domain, benchmark=config.benchmark, dpo_reward=config.dpo_reward)
    return evaluate(scores, config)


def evaluate_records(
    records: Iterable[ScoreRecord], config: MetricsConfig | None = None, *, source: str = "<records>"
) -> Evaluation:
    """Evaluate in-memory score records (e.g. straight from a scoring run).

    Raises:
        DataError: invalid records (names ``source``, the 1-based record number and field).
    """
    config = config or MetricsConfig()
    scores = scores_from_records(records, source=source, dpo_reward=config.dpo_reward)
    if config.benchmark is not None and scores.benchmark != config.benchmark:
        raise DataError(
            f"holds {scores.benchmark} scores, but {config.benchmark} scores were asked for",
            path=source,
            field="benchmark",
        )
    return evaluate(scores, config)


# --- comparison -------------------------------------------------------------------------


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
            shown = ", ".join(repeated[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
            raise DataError(
                f"{len(repeated)} group key(s) appear more than once ({shown}); a comparison pairs each group of A "
                "with the group of B that has the same key, so every key must be unique: correct the ids in the "
                "file (in the published RewardBench 2 per-item files the first ten Factuality ids, 30-39, should "
                "be 0-9) and compare again",
                path=name,
                field="id",
            )
    if a.benchmark != b.benchmark:
        raise DataError(f"holds {b.benchmark} scores but {name_a} holds {a.benchmark}", path=name_b, field="benchmark")
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
    """The reward a score set's figures use (:data:`JUDGE_VERDICTS` for a judge's)."""
    return JUDGE_VERDICTS if scores.judge is not None else scores.reward


def _strata(scores: ScoreSet) -> tuple[list[str], list[np.ndarray]]:
    """Bootstrap strata of a score set: from a judge's verdicts, or from the rewards."""
    if scores.judge is not None:
        _, names, strata = _judge_strata(scores)
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
    a = read_score_files([path_a], domain=config.domain, benchmark=config.benchmark, dpo_reward=config.dpo_reward)
    b = read_score_files([path_b], domain=config.domain, benchmark=config.benchmark, dpo_reward=config.dpo_reward)
    return compare_scores(a, b, config, fingerprints=(score_file_fingerprints(path_a), score_file_fingerprints(path_b)))


def score_file_fingerprints(path: str | Path) -> frozenset[str]:
    """The model fingerprints an rmserve score file's records name (empty for the official
    result formats, which carry none, and for lines that are not JSON objects)."""
    found: set[str] = set()
    with open(path, "rb") as fh:
        for line in fh:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) and record["fingerprint"]:
                found.add(record["fingerprint"])
    return frozenset(found)


# --- JSON -------------------------------------------------------------------------------


def _pair(interval: Interval | None) -> list[float] | None:
    return None if interval is None else [interval.low, interval.high]


def _absent_sentence(absent: Sequence[str], excluded: Sequence[str], kind: str) -> str:
    """"Excluded by --only: X. Missing domain(s): Y." for the parts in neither table column."""
    left_out = [a for a in absent if a in excluded]
    missing = [a for a in absent if a not in excluded]
    parts = []
    if left_out:
        parts.append(f"Excluded by --only: {', '.join(left_out)}.")
    if missing:
        parts.append(f"Missing {kind}(s): {', '.join(missing)}.")
    return " ".join(parts)


def _notes(evaluation: Evaluation) -> list[str]:
    result = evaluation.result
    excluded = evaluation.config.excluded
    notes = []
    if isinstance(result, RMBenchResult):
        absent = result.missing_report_domains
        present = [d.domain for d in result.domains]
        # A reported domain counts as excluded when every source domain under it was.
        excluded_report = [d for d in absent if all(p in excluded for p in DOMAIN_PARTS[d])]
        if absent:
            notes.append(
                f"{_absent_sentence(absent, excluded_report, 'domain')} Easy, Normal, Hard and Avg are means over "
                f"{', '.join(present)} only (partial)."
            )
        for d in result.domains:
            if d.parts != DOMAIN_PARTS[d.domain]:
                lacking = [p for p in DOMAIN_PARTS[d.domain] if p not in d.parts]
                why = "; ".join(
                    f"{', '.join(group)} {label}"
                    for group, label in (
                        ([p for p in lacking if p in excluded], "excluded by --only"),
                        ([p for p in lacking if p not in excluded], "missing"),
                    )
                    if group
                )
                notes.append(f"{d.domain} covers {', '.join(d.parts)} only ({why}); partial.")
        nan_groups = sum(d.n_nan_groups for d in result.domains)
    else:
        if result.missing:
            present = [s.subset for s in result.subsets]
            notes.append(
                f"{_absent_sentence(result.missing, excluded, 'subset')} "
                f"Avg is the mean of {', '.join(present)} only (partial)."
            )
        nan_groups = sum(s.n_nan_groups for s in result.subsets)
    if nan_groups and evaluation.judge is not None:
        what = "every comparison counts as lost" if isinstance(result, RMBenchResult) else (
            "credit 0; in Ties never accurate or preferred"
        )
        notes.append(
            f"{nan_groups} group(s) could not be judged (no verdicts: null rewards and errors in the score file); "
            f"they are counted as a classifier's unscored group is ({what})."
        )
    elif nan_groups:
        notes.append(f"{nan_groups} group(s) have a missing (NaN) reward; their comparisons count as losses.")
    if evaluation.judge is not None and evaluation.judge.summary.rmserve_protocols:
        notes.append(RMSERVE_PROTOCOL_NOTE + ".")
    return notes


def _bootstrap_dict(config: MetricsConfig) -> dict[str, Any] | None:
    if config.resamples == 0:
        return None
    return {
        "resamples": config.resamples,
        "seed": config.seed,
        "confidence": config.confidence,
        "method": "percentile; groups resampled within each domain/subset (Ties: by prompt)",
    }


def _score_kind_dict(kind: ScoreKind | None) -> dict[str, Any] | None:
    if kind is None:
        return None
    return {"kind": kind.kind, "mode": kind.mode, "ref_model": kind.ref_model, "compat": kind.compat}


def _reward_dict(reward: str) -> dict[str, Any]:
    if reward in (SCORED_REWARDS, JUDGE_VERDICTS):
        return {"name": reward, "formula": None}
    name = reward.removeprefix("dpo:")
    return {"name": reward, "formula": DPO_REWARD_FORMULAS[name]}


def reward_text(reward: str) -> str:
    """Words for the reward the figures use: ``rewards as scored`` or e.g. ``DPO reward avg =
    policy_logp / answer_tokens, recomputed from the extras``."""
    if reward == SCORED_REWARDS:
        return "rewards as scored"
    if reward == JUDGE_VERDICTS:
        return "figures from the judge's verdicts (credits, ratings, pairwise cells), not from its rewards"
    name = reward.removeprefix("dpo:")
    return f"DPO reward {name} = {DPO_REWARD_FORMULAS[name]}, recomputed from the extras"


def _failures_dict(failures: ParseFailures | None) -> dict[str, Any] | None:
    if failures is None:
        return None
    return {
        "rate": failures.rate,
        "n_failed": failures.n_failed,
        "n_calls": failures.n_calls,
        "n_truncated": failures.n_truncated,
        "reasons": dict(failures.reasons),
    }


def _judge_dict(judge: JudgeReport | None) -> dict[str, Any] | None:
    if judge is None:
        return None
    summary = judge.summary
    return {
        "mode": summary.mode,
        "protocols": list(summary.protocols),
        "compat": list(summary.compat),
        "seeds": list(summary.seeds),
        "n_groups": summary.n_groups,
        "n_judged": summary.n_judged,
        "n_unjudged": summary.n_unjudged,
        "n_calls": summary.n_calls,
        "n_failed": summary.n_failed,
        "parse_failure_rate": summary.n_failed / summary.n_calls if summary.n_calls else None,
        "n_truncated": summary.n_truncated,
        "rmserve_protocols": list(summary.rmserve_protocols),
        "protocol_note": RMSERVE_PROTOCOL_NOTE if summary.rmserve_protocols else None,
    }


def result_dict(evaluation: Evaluation) -> dict[str, Any]:
    """The JSON form of an evaluation: fractions at full precision, intervals as ``[low, high]``.

    Keys: ``benchmark``, ``files``, ``n_groups``, ``score_kind`` (``kind``, ``mode``,
    ``ref_model``, ``compat`` of the score records; null for official result files),
    ``reward`` (``name``: ``rewards`` or ``dpo:<avg|sum|norm|reference>``; ``formula``: the
    DPO formula or null; ``judge-verdicts`` for a generative judge), ``partial``, ``missing``,
    ``notes``, ``warnings``, ``bootstrap``, ``judge`` (null unless the records are a generative
    judge's: ``mode``, ``protocols``, ``compat``, ``seeds``, ``n_calls``, ``n_failed``,
    ``parse_failure_rate``, ``n_truncated`` (calls cut at ``max_tokens``), ``n_unjudged``
    (groups the judge could not take), ``rmserve_protocols`` and ``protocol_note``; each
    domain / subset then also has ``parse_failures``: ``rate``, ``n_failed``, ``n_calls``,
    ``n_truncated``, ``reasons``) and,
    for RM-Bench, ``domains`` (score / hard / normal / easy / matrix / n_groups / n_nan_groups /
    parts / interval) and ``overall``; for RewardBench 2,
    ``subsets`` (score / n_groups / n_nan_groups / interval; Ties also its components) and
    ``average``.
    """
    result = evaluation.result
    iv = evaluation.intervals
    out: dict[str, Any] = {
        "benchmark": evaluation.benchmark,
        "files": list(evaluation.files),
        "n_groups": evaluation.n_groups,
        "score_kind": _score_kind_dict(evaluation.score_kind),
        "reward": _reward_dict(evaluation.reward),
        "partial": result.partial,
        "missing": list(result.missing),
        "notes": _notes(evaluation),
        "warnings": list(evaluation.warnings),
        "bootstrap": _bootstrap_dict(evaluation.config),
        "judge": _judge_dict(evaluation.judge),
    }
    judge = evaluation.judge
    if isinstance(result, RMBenchResult):
        figures = ("score", "hard", "normal", "easy")
        out["domains"] = {
            d.domain: {
                "score": d.score,
                "hard": d.hard,
                "normal": d.normal,
                "easy": d.easy,
                "matrix": [list(row) for row in d.matrix],
                "n_groups": d.n_groups,
                "n_nan_groups": d.n_nan_groups,
                "parts": list(d.parts),
                "interval": {f: _pair(iv.get(f"{d.domain}.{f}")) for f in figures} if iv else None,
                **({"parse_failures": _failures_dict(judge.pooled(d.parts))} if judge is not None else {}),
            }
            for d in result.domains
        }
        out["overall"] = {
            "score": result.score,
            "hard": result.hard,
            "normal": result.normal,
            "easy": result.easy,
            "domains": [d.domain for d in result.domains],
            "interval": {f: _pair(iv.get(f"overall.{f}")) for f in figures} if iv else None,
        }
        return out
    subsets: dict[str, Any] = {}
    for s in result.subsets:
        entry: dict[str, Any] = {
            "score": s.score,
            "n_groups": s.n_groups,
            "n_nan_groups": s.n_nan_groups,
            "interval": _pair(iv.get(s.subset)),
        }
        if judge is not None:
            entry["parse_failures"] = _failures_dict(judge.pooled((s.subset,)))
        if s.subset == TIES and result.ties is not None:
            ties = result.ties
            entry["components"] = {c: getattr(ties, c) for c in TIES_WEIGHTS}
            entry["component_intervals"] = {c: _pair(iv.get(f"{TIES}.{c}")) for c in TIES_WEIGHTS} if iv else None
            entry.update(n_ref=ties.n_ref, n_tied=ties.n_tied, n_prompts_paired=ties.n_prompts_paired)
        subsets[s.subset] = entry
    out["subsets"] = subsets
    out["average"] = {
        "score": result.average,
        "subsets": [s.subset for s in result.subsets],
        "interval": _pair(iv.get("average")),
    }
    return out


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    """The JSON form of a comparison: ``score_kind_a``/``score_kind_b`` and ``reward`` (as in
    :func:`result_dict`; also ``reward_b`` when B's differs from A's, e.g. a judge against a
    classifier), ``warnings`` and, per figure, ``a``, ``b``, ``difference`` (B − A),
    ``interval`` and ``excludes_zero``; fractions at full precision."""
    return {
        "benchmark": comparison.benchmark,
        "files_a": list(comparison.files_a),
        "files_b": list(comparison.files_b),
        "n_groups": comparison.n_groups,
        "score_kind_a": _score_kind_dict(comparison.score_kind_a),
        "score_kind_b": _score_kind_dict(comparison.score_kind_b),
        "reward": _reward_dict(comparison.reward),
        **({"reward_b": _reward_dict(comparison.reward_b)} if comparison.reward_b is not None else {}),
        "warnings": list(comparison.warnings),
        "notes": list(comparison.notes),
        "partial": comparison.partial,
        "bootstrap": _bootstrap_dict(comparison.config),
        "figures": {
            f.figure: {
                "a": f.a,
                "b": f.b,
                "difference": f.difference,
                "interval": _pair(f.interval),
                "excludes_zero": f.excludes_zero,
            }
            for f in comparison.figures
        },
    }


def to_json(data: Mapping[str, Any]) -> str:
    """Indented JSON text (NaN becomes ``null``)."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()


# --- Markdown ---------------------------------------------------------------------------


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return MISSING_CELL
    if math.isnan(value):
        return "n/a"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _span(interval: Interval | None, signed: bool = False) -> str:
    if interval is None:
        return MISSING_CELL
    return f"[{_pct(interval.low, signed)}, {_pct(interval.high, signed)}]"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(cells: Sequence[str], first_left: bool = True) -> list[str]:
    align = [":---" if first_left and i == 0 else "---:" for i in range(len(cells))]
    return [_row(cells), _row(align)]


def render_markdown(evaluation: Evaluation) -> str:
    """Markdown report: the title (naming a recomputed DPO reward), a header line with the
    groups, files, kind of score and reward, the leaderboard-order table (percent, 1 decimal)
    with its interval row, notes on missing parts, and a per-domain / Ties detail table."""
    result = evaluation.result
    figures = evaluation.figures()
    iv = evaluation.intervals
    level = round(100 * evaluation.config.confidence)
    if isinstance(result, RMBenchResult):
        title, columns = "RM-Bench", RMBENCH_COLUMNS
    else:
        title, columns = "RewardBench 2", RB2_COLUMNS
    judge = evaluation.judge
    heading = title
    if judge is not None:
        heading += ": generative judge"
    elif evaluation.reward != SCORED_REWARDS:
        heading += f": DPO reward {evaluation.reward.removeprefix('dpo:')}"
    kind = _kind_text(evaluation.score_kind)
    lines = [
        f"## {heading}",
        "",
        f"{evaluation.n_groups} groups from {', '.join(evaluation.files)}. "
        f"Scores: {kind}; {reward_text(evaluation.reward)}.",
        "",
    ]
    if judge is not None:
        lines += [judge_header(judge.summary), ""]
    lines += _header([""] + [h for h, _ in columns])
    lines.append(
        _row(["Accuracy (%)" if title == "RM-Bench" else "Score (%)"] + [_pct(figures.get(f)) for _, f in columns])
    )
    if iv:
        lines.append(_row([f"{level}% CI"] + [_span(iv.get(f)) if f in figures else MISSING_CELL for _, f in columns]))
    if judge is not None:
        lines.append(_row(["Parse failures (%)"] + [_column_failures(judge, result, f) for _, f in columns]))
    notes = _notes(evaluation)
    if notes or evaluation.warnings:
        lines.append("")
        lines += [f"Warning: {w}" for w in evaluation.warnings]
        lines += [f"Note: {n}" for n in notes]
    lines.append("")
    if isinstance(result, RMBenchResult):
        extra = ["Parse failures", "Cut at max_tokens"] if judge is not None else []
        lines += _header(["Domain", "Groups", "Easy", "Normal", "Hard", "Score", *extra])
        for d in result.domains:
            cells = [d.domain, str(d.n_groups)]
            for f in ("easy", "normal", "hard", "score"):
                name = f"{d.domain}.{f}"
                cells.append(_pct(figures[name]) + (f" ({_span(iv[name])})" if name in iv else ""))
            if judge is not None:
                cells += _failure_cells(judge.pooled(d.parts))
            lines.append(_row(cells))
    else:
        extra = ["Parse failures", "Cut at max_tokens"] if judge is not None else []
        lines += _header(["Subset", "Groups", "Score", f"{level}% CI", *extra])
        for s in result.subsets:
            cells = [s.subset, str(s.n_groups), _pct(s.score), _span(iv.get(s.subset)) if iv else MISSING_CELL]
            if judge is not None:
                cells += _failure_cells(judge.pooled((s.subset,)))
            lines.append(_row(cells))
        if result.ties is not None:
            lines += ["", *_header(["Ties component", "Weight", "Value", f"{level}% CI"])]
            for c, weight in TIES_WEIGHTS.items():
                name = f"{TIES}.{c}"
                lines.append(
                    _row([c, f"{weight:.2f}", _pct(figures[name]), _span(iv.get(name)) if iv else MISSING_CELL])
                )
    if iv:
        lines += [
            "",
            f"Intervals: {level}% percentile bootstrap, {evaluation.config.resamples} resamples, "
            f"seed {evaluation.config.seed}.",
        ]
    return "\n".join(lines) + "\n"


def _failure_text(failures: ParseFailures | None) -> str:
    """``"2.5 (3/120)"``: percent of calls without a verdict or rating, then the counts."""
    if failures is None or failures.n_calls == 0:
        return MISSING_CELL
    return f"{_pct(failures.rate)} ({failures.n_failed}/{failures.n_calls})"


def _failure_cells(failures: ParseFailures | None) -> list[str]:
    """The detail table's parse-failure cells: ``"2.5% (3/120)"`` and the calls cut at ``max_tokens``."""
    if failures is None or failures.n_calls == 0:
        return [MISSING_CELL, MISSING_CELL]
    return [f"{_pct(failures.rate)}% ({failures.n_failed}/{failures.n_calls})", str(failures.n_truncated)]


def _column_failures(judge: JudgeReport, result: RMBenchResult | RB2Result, figure: str) -> str:
    """The parse-failure cell under a leaderboard column: its domain's or subset's, every
    call's under Avg, empty under RM-Bench's Easy / Normal / Hard (they span all domains)."""
    if figure in ("overall.score", "average"):
        parts = [p.domain for p in judge.parse_failures]
        return _failure_text(judge.pooled(parts))
    if isinstance(result, RMBenchResult):
        if figure.startswith("overall."):
            return ""
        domain = result.domain(figure.split(".", 1)[0])
        return _failure_text(judge.pooled(domain.parts)) if domain is not None else MISSING_CELL
    return _failure_text(judge.pooled((figure,)))


def judge_header(summary: JudgeSummary) -> str:
    """The header line of a judge's table: protocol(s) and the ``--protocol`` choice, compat,
    seed, calls, parse failures and calls cut at ``max_tokens``, and, for rmserve's own
    protocol, that it is not an official one."""
    plural = "s" if len(summary.protocols) > 1 else ""
    protocol = f"protocol{plural} {', '.join(summary.protocols) or 'none recorded'}"
    if summary.mode:
        protocol += f" (--protocol {summary.mode})"
    if summary.rmserve_protocols:
        own = ", ".join(summary.rmserve_protocols)
        protocol += f"; {own} is rmserve's own protocol for RM-Bench, not an official one"
    if summary.seeds:
        seed = f"seed{'s' if len(summary.seeds) > 1 else ''} {', '.join(map(str, summary.seeds))}"
    else:
        seed = "seed: none drawn (only the ranking protocol draws answer positions)"
    rate = f" ({100 * summary.n_failed / summary.n_calls:.1f}%)" if summary.n_calls else ""
    return (
        f"Judge: {protocol}; compat {', '.join(summary.compat) or 'not recorded'}; {seed}; "
        f"{summary.n_calls:,} calls, {summary.n_failed:,} without a verdict or rating{rate}, "
        f"{summary.n_truncated:,} cut at max_tokens (a cut call counts as a failure when nothing was read)."
    )


def _figure_label(figure: str) -> str:
    for header, name in RMBENCH_COLUMNS + RB2_COLUMNS:
        if name == figure:
            return header
    return figure


def _kind_text(kind: ScoreKind | None) -> str:
    return kind.describe() if kind is not None else "kind not recorded in the files"


def render_comparison(comparison: Comparison) -> str:
    """Markdown table of a paired comparison: A, B, B − A (percentage points), its interval
    and whether the interval excludes 0."""
    level = round(100 * comparison.config.confidence)
    lines = [
        f"## {comparison.benchmark}: B − A over {comparison.n_groups} paired groups",
        "",
        f"A: {', '.join(comparison.files_a)} ({_kind_text(comparison.score_kind_a)})  ",
        f"B: {', '.join(comparison.files_b)} ({_kind_text(comparison.score_kind_b)})  ",
        f"Reward: {reward_text(comparison.reward)}."
        if comparison.reward_b is None
        else f"Reward: A {reward_text(comparison.reward)}; B {reward_text(comparison.reward_b)}.",
        "",
        *(f"Warning: {w}" for w in comparison.warnings),
        *([""] if comparison.warnings else []),
        *(f"Note: {n}" for n in comparison.notes),
        *([""] if comparison.notes else []),
        *_header(["Figure", "A (%)", "B (%)", "B − A (pp)", f"{level}% CI of B − A", "Excludes 0"]),
    ]
    for f in comparison.figures:
        lines.append(
            _row(
                [
                    _figure_label(f.figure),
                    _pct(f.a),
                    _pct(f.b),
                    _pct(f.difference, signed=True),
                    _span(f.interval, signed=True),
                    "yes" if f.excludes_zero else "no",
                ]
            )
        )
    lines += [
        "",
        f"Intervals: {level}% percentile bootstrap of B − A, {comparison.config.resamples} resamples "
        f"(same resampled groups for A and B), seed {comparison.config.seed}.",
    ]
    return "\n".join(lines) + "\n"


# --- files ------------------------------------------------------------------------------


def heatmap_region(row: int, column: int) -> str:
    """The region of cell (``row`` = chosen style, ``column`` = rejected style) of the 3×3 matrix.

    hard = above the diagonal (a plainer chosen response against a fancier rejected one),
    normal = the diagonal, easy = below it: ``np.triu(m, 1)``, ``np.diag(m)`` and
    ``np.tril(m, -1)`` in RM-Bench's ``scripts/utils.py`` ``compute_accuracy``.
    """
    return "hard" if row < column else "normal" if row == column else "easy"


def model_label(models: Sequence[tuple[str, str]], *, width: int = 90) -> str:
    """One line (wrapped at ``width`` characters) naming the model(s) and fingerprint(s) of a figure.

    ``models`` holds ``(name, fingerprint)`` pairs; several pairs are all listed (a score set
    that mixes checkpoints says so); none gives a sentence saying the files do not record them.
    """
    import textwrap

    if not models:
        text = "model and fingerprint: not recorded in the score files"
    elif len(models) == 1:
        name, fingerprint = models[0]
        text = f"model: {name or '(unnamed)'}   fingerprint: {fingerprint or '(none)'}"
    else:
        pairs = ", ".join(f"{name or '(unnamed)'} [{fingerprint or 'none'}]" for name, fingerprint in models)
        text = f"{len(models)} models in one score set: {pairs}"
    return "\n".join(textwrap.wrap(text, width=width))


def kind_label(kind: ScoreKind | None, reward: str = SCORED_REWARDS) -> str:
    """Which kind of score a figure shows, in words for a plot: ``classifier rewards``, ``DPO
    implicit reward (mode reference, reference 'ref')`` (or the recomputed ``DPO reward avg``),
    ``generative judge (--protocol pairwise, compat none)``, or
    ``kind of score not recorded`` (official result files)."""
    if reward.startswith("dpo:"):
        return f"DPO reward {reward.removeprefix('dpo:')} (recomputed from the extras)"
    if kind is None:
        return "kind of score not recorded"
    if kind.kind == "classifier":
        return "classifier rewards" + (f" (compat {kind.compat})" if kind.compat != "none" else "")
    if kind.kind == "dpo":
        parts = [f"mode {kind.mode}"] if kind.mode else []
        if kind.ref_model:
            parts.append(f"reference {kind.ref_model!r}")
        parts.append(f"compat {kind.compat}")
        return f"DPO implicit reward ({', '.join(parts)})"
    if kind.kind == JUDGE_KIND:
        mode = f"--protocol {kind.mode}, " if kind.mode else ""
        return f"generative judge ({mode}compat {kind.compat})"
    return kind.describe()


def plot_heatmaps(
    result: RMBenchResult,
    out_dir: str | Path,
    *,
    models: Sequence[tuple[str, str]] = (),
    kind: ScoreKind | None = None,
    reward: str = SCORED_REWARDS,
) -> list[Path]:
    """Write one PNG per RM-Bench domain present: its 3×3 win matrix in percent.

    Rows are the chosen style, columns the rejected style; a cell is the percentage of the
    domain's groups whose chosen response of that style outscores the rejected one of that
    style. Each cell names its region (:func:`heatmap_region`: hard above the diagonal,
    normal on it, easy below; the diagonal is outlined); the title gives the domain, its
    group count and its hard / normal / easy figures; the foot names the model and
    fingerprint (:func:`model_label` of ``models``) and the title the kind of score
    (:func:`kind_label` of ``kind`` and ``reward``: classifier, DPO or generative judge). Uses
    matplotlib's Agg canvas (no pyplot, no display).

    Returns:
        The written paths (``heatmap-<domain>.png``).
    """
    out_dir = Path(out_dir)
    paths = []
    for d in result.domains:
        fig = heatmap_figure(d, models, kind=kind, reward=reward)
        path = out_dir / f"heatmap-{d.domain}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def heatmap_figure(
    domain: DomainAccuracy,
    models: Sequence[tuple[str, str]] = (),
    *,
    kind: ScoreKind | None = None,
    reward: str = SCORED_REWARDS,
) -> Any:
    """The matplotlib ``Figure`` of one domain's heatmap (see :func:`plot_heatmaps`), not saved.

    ``domain`` is one entry of :attr:`RMBenchResult.domains` (its ``matrix`` holds 3×3
    fractions); ``models`` as in :func:`model_label`; ``kind`` and ``reward`` as in
    :func:`kind_label` (the title's first line names the kind of score). For a generative
    judge a cell is the judge's mean preference for the chosen answer (both orders), and the
    colour bar says so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    d = domain
    matrix = 100 * np.array(d.matrix)
    fig = Figure(figsize=(6.0, 5.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, vmin=0, vmax=100, cmap="viridis")
    ax.set_xticks(range(3), _STYLE_LABELS)
    ax.set_yticks(range(3), _STYLE_LABELS)
    ax.set_xlabel("rejected response style")
    ax.set_ylabel("chosen response style")
    for i in range(3):
        for j in range(3):
            color = "white" if matrix[i, j] < 60 else "black"
            ax.text(j, i - 0.08, f"{matrix[i, j]:.1f}%", ha="center", va="center", color=color, fontsize=11)
            ax.text(j, i + 0.22, heatmap_region(i, j), ha="center", va="center", color=color, fontsize=8,
                    style="italic")
    for k in range(3):  # the normal (diagonal) cells, outlined
        ax.add_patch(Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="white", linewidth=2.5))
        ax.add_patch(Rectangle((k - 0.5, k - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1, linestyle="--"))
    import textwrap

    judged = kind is not None and kind.kind == JUDGE_KIND
    ax.set_title(
        f"RM-Bench {d.domain} ({d.n_groups} groups)\n"
        + "\n".join(textwrap.wrap(kind_label(kind, reward), width=70))
        + "\n"
        f"hard {100 * d.hard:.1f}%  ·  normal {100 * d.normal:.1f}%  ·  easy {100 * d.easy:.1f}%",
        fontsize=10,
    )
    bar = (
        "judge prefers chosen (%, mean of both orders)" if judged else "chosen outscores rejected (% of groups)"
    )
    fig.colorbar(image, ax=ax, label=bar, shrink=0.8)
    protocol = "\n".join(textwrap.wrap(RMSERVE_PROTOCOL_NOTE, width=95)) + "\n" if judged else ""
    fig.supxlabel(
        "hard = above the diagonal (plainer chosen vs fancier rejected), normal = diagonal, easy = below\n"
        + protocol
        + model_label(models),
        fontsize=8,
    )
    return fig


def write_outputs(evaluation: Evaluation, out_dir: str | Path) -> list[Path]:
    """Write ``results.json``, ``table.md`` and (RM-Bench) the heatmaps into ``out_dir``.

    The folder is created when absent. Returns the written paths.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    results.write_text(to_json(result_dict(evaluation)) + "\n")
    table = out_dir / "table.md"
    table.write_text(render_markdown(evaluation))
    paths = [results, table]
    if isinstance(evaluation.result, RMBenchResult):
        paths += plot_heatmaps(
            evaluation.result, out_dir, models=evaluation.models, kind=evaluation.score_kind, reward=evaluation.reward
        )
    return paths


__all__ = [
    "Comparison",
    "Evaluation",
    "JUDGE_VERDICTS",
    "JudgeReport",
    "MetricsConfig",
    "REPORT_DOMAINS",
    "compare_files",
    "compare_scores",
    "comparison_dict",
    "evaluate",
    "evaluate_files",
    "evaluate_records",
    "figure_values",
    "heatmap_figure",
    "heatmap_region",
    "judge_header",
    "kind_label",
    "model_label",
    "plot_heatmaps",
    "render_comparison",
    "render_markdown",
    "result_dict",
    "to_json",
    "write_outputs",
]
