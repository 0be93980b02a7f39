"""Evaluate a score set: every figure, its bootstrap interval, and what the reader must know.

Library entry points (what ``rmserve metrics`` and ``rmserve eval`` call):
:func:`evaluate_files` / :func:`evaluate_records` / :func:`evaluate` → :class:`Evaluation`
(point figures from :mod:`rmserve.metrics.rmbench` / :mod:`rmserve.metrics.rewardbench2`
plus bootstrap intervals from :mod:`rmserve.metrics.bootstrap`), configured by
:class:`MetricsConfig`. The figures are rendered by :mod:`rmserve.metrics.render_json`,
:mod:`rmserve.metrics.render_markdown` and :mod:`rmserve.metrics.figures`, and written by
:func:`rmserve.metrics.outputs.write_outputs`.

Score records of a generative judge (kind ``judge``) are evaluated from their verdicts
(:mod:`rmserve.metrics.judge`), never from their per-response rewards: the same figures and
bootstrap strata as the classifier path, plus a :class:`JudgeReport` (protocols, compat,
seeds, calls cut at ``max_tokens``, parse failures per subset / domain) that the table, the
JSON and the heatmaps show. A group the judge could not take is counted as a classifier's
unscored group (``n_nan_groups``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
from rmserve.metrics.bootstrap import (
    BootstrapConfig,
    Interval,
    check_resampling,
    rb2_intervals,
    rmbench_intervals,
    strata_intervals,
)
from rmserve.metrics.dpo import DPO_REWARDS
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
from rmserve.metrics.judge_setup import JudgeSetup
from rmserve.metrics.rewardbench2 import TIES, TIES_WEIGHTS, RB2Result, rewardbench2_scores
from rmserve.metrics.rmbench import DOMAIN_PARTS, REPORT_DOMAINS, RMBenchResult, rmbench_accuracy
from rmserve.metrics.score_files import read_score_files, scores_from_records
from rmserve.metrics.scores import SCORED_REWARDS, RMBenchScores, ScoreSet

from rmserve.errors import DataError
from rmserve.schema import BENCHMARKS, RB2_SUBSETS, RMBENCH_DOMAINS, ScoreKind, ScoreRecord

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
        setup: the sampling and engine the score records state
            (:class:`~rmserve.metrics.judge_setup.JudgeSetup`); None when not read from records.
    """

    summary: JudgeSummary
    parse_failures: tuple[ParseFailures, ...]
    setup: JudgeSetup | None = None

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
        reward_extra: use the score records' extras of this name as the rewards (e.g.
            ``objective_2`` of a multi-objective head); excludes ``dpo_reward``.
        excluded: source domains (RM-Bench) or subsets (RewardBench 2) the run left out on
            purpose (``--only``); the notes name them as excluded rather than missing.
    """

    resamples: int = 1000
    seed: int = 0
    confidence: float = 0.95
    domain: str | None = None
    benchmark: str | None = None
    dpo_reward: str | None = None
    reward_extra: str | None = None
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
        if self.reward_extra is not None and (not isinstance(self.reward_extra, str) or not self.reward_extra):
            raise ValueError(f"reward_extra must be an extras name (e.g. objective_0), got {self.reward_extra!r}")
        if self.reward_extra is not None and self.dpo_reward is not None:
            raise ValueError("dpo_reward / reward_extra: give one; both name the reward the figures use")

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
        reward: the reward the figures use: ``rewards`` (as scored), ``dpo:<name>`` or ``extra:<name>``
            (recomputed from the DPO extras, ``MetricsConfig.dpo_reward``).
        models: the distinct ``(model name, fingerprint)`` pairs the score records name
            (empty when the files do not record them); the figures print them.
        heads: the reward heads the score records name (:attr:`BenchmarkScores.heads`); the
            report's header names them unless the only one is the plain ``classifier``.
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
    heads: tuple[str, ...] = ()
    judge: JudgeReport | None = None

    def figures(self) -> dict[str, float]:
        """Figure name → point value (names as the interval keys)."""
        return figure_values(self.result)

    def notes(self) -> list[str]:
        """What the reader of the figures must know, one sentence each: parts excluded by
        ``--only`` or missing (the averages are then partial), unscored groups, for rmserve's
        own judge protocol that it is not an official one, and for a judge whose records (some
        or all) do not state its sampling and engine that they are unknown."""
        return _notes(self)


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

    A generative judge's score set (``scores.judge`` set) is evaluated from its verdicts
    (:func:`judge_strata`); the evaluation then carries a :class:`JudgeReport` and its
    ``reward`` is :data:`JUDGE_VERDICTS`.

    Raises:
        ValueError: malformed arrays (only possible when ``scores`` was built by hand).
        DataError: a judge record that does not fit its group.
    """
    config = config or MetricsConfig()
    boot = config.bootstrap()
    reward, judge = scores.reward, None
    if scores.judge is not None:
        result, names, strata = judge_strata(scores)
        intervals = strata_intervals(scores.benchmark, names, strata, boot) if boot else {}
        reward, judge = JUDGE_VERDICTS, _judge_report(scores)
    elif isinstance(scores, RMBenchScores):
        result = rmbench_accuracy(scores.rewards, scores.domains)
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
        reward=reward,
        models=scores.models,
        heads=scores.heads,
        judge=judge,
    )


def judge_strata(scores: ScoreSet) -> tuple[RMBenchResult | RB2Result, list[str], list[np.ndarray]]:
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


def _judge_report(scores: ScoreSet) -> JudgeReport:
    """The :class:`JudgeReport` of a generative judge's score set (summary and parse failures)."""
    assert scores.judge is not None
    judged = [r for r in scores.judge if r is not None]
    mode = scores.score_kind.mode if scores.score_kind is not None else None
    return JudgeReport(
        summary=judge_summary(list(scores.judge), mode), parse_failures=judge_parse_failures(judged),
        setup=scores.judge_setup,
    )


def evaluate_files(paths: Sequence[str | Path], config: MetricsConfig | None = None) -> Evaluation:
    """Read score files (any supported format, see :mod:`rmserve.metrics.score_files`) and evaluate them.

    Raises:
        DataError: any input problem (names file, line and field).
    """
    config = config or MetricsConfig()
    scores = read_score_files(paths, domain=config.domain, benchmark=config.benchmark, dpo_reward=config.dpo_reward,
                              reward_extra=config.reward_extra)
    return evaluate(scores, config)


def evaluate_records(
    records: Iterable[ScoreRecord], config: MetricsConfig | None = None, *, source: str = "<records>"
) -> Evaluation:
    """Evaluate in-memory score records (e.g. straight from a scoring run).

    Raises:
        DataError: invalid records (names ``source``, the 1-based record number and field).
    """
    config = config or MetricsConfig()
    scores = scores_from_records(records, source=source, dpo_reward=config.dpo_reward,
                                 reward_extra=config.reward_extra)
    if config.benchmark is not None and scores.benchmark != config.benchmark:
        raise DataError(
            f"holds {scores.benchmark} scores, but {config.benchmark} scores were asked for",
            path=source,
            field="benchmark",
        )
    return evaluate(scores, config)


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
    if evaluation.judge is not None and evaluation.judge.setup is not None:
        setup_note = evaluation.judge.setup.note()
        if setup_note is not None:
            notes.append(setup_note)
    return notes


__all__ = [
    "Evaluation",
    "JUDGE_VERDICTS",
    "JudgeReport",
    "MetricsConfig",
    "RB2_COLUMNS",
    "REPORT_DOMAINS",
    "RMBENCH_COLUMNS",
    "RMSERVE_PROTOCOL_NOTE",
    "evaluate",
    "evaluate_files",
    "evaluate_records",
    "figure_values",
    "judge_strata",
]
