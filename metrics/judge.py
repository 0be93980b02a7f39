"""Generative-judge figures: RewardBench 2 and RM-Bench scores from judge verdicts, parse failures.

Pure array functions plus thin adapters from :class:`~rmserve.judge_records.JudgeGroupResult`
records (no I/O, no printing). The per-group rules (ranking credit, rating credit, pairwise
cells) are applied where the records are made (``rmserve.server.judge_protocols``); here they
are aggregated with the classifier path's formulas.

RewardBench 2 (allenai/reward-bench ``scripts/run_generative_v2.py``): a non-Ties subset scores
the mean per-group credit (``sum(results) / n`` upstream). Ties is always rated; its score is the
weighted Ties formula (:func:`rmserve.metrics.rewardbench2.ties_score`, upstream
``process_single_model``) with the ratings as rewards and a failed rating counted as −1
(:data:`FAILED_RATING`), exactly the list the official script passes on. Average = unweighted
mean of the subsets present, as the classifier path.

RM-Bench (rmserve's own judge protocol, not official): the 3×3 matrix of a reported domain is
the mean over its groups of the per-group cell values (each in [0, 1]); hard / normal / easy,
safety pooling and the overall figures are the classifier path's
(:mod:`rmserve.metrics.rmbench`). Fed 0/1 cells equal to the classifier win indicators it gives
exactly :func:`rmserve.metrics.rmbench.rmbench_accuracy`.

Parse failures (:func:`parse_failure_rates`): per (benchmark, subset or domain), the share of
judge calls whose output gave no verdict or rating, with the calls cut at ``max_tokens`` and the
failure reasons counted. Direction: lower is better.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rmserve.judge_records import JudgeGroupResult
from rmserve.metrics.rewardbench2 import TIES, RB2Result, SubsetScore, check_subsets, ties_score
from rmserve.metrics.rmbench import (
    DOMAIN_PARTS,
    NUM_STYLES,
    REPORT_DOMAINS,
    DomainAccuracy,
    RMBenchResult,
    combine_domains,
    domain_codes,
    matrix_figures,
)
from rmserve.schema import RB2_SUBSETS, RMBENCH_DOMAINS

FAILED_RATING = -1.0
"""The value a failed rating takes in the Ties formula (upstream ``get_single_rating`` returns −1)."""


@dataclass(frozen=True)
class ParseFailures:
    """Parse failures of one (benchmark, subset or domain).

    Attributes:
        benchmark: ``rewardbench2`` or ``rm-bench``.
        domain: RewardBench 2 subset or RM-Bench source domain.
        n_calls: judge calls made.
        n_failed: calls whose output gave no verdict / rating.
        rate: ``n_failed / n_calls``, a fraction.
        n_truncated: calls cut at ``max_tokens`` (parsed or not).
        reasons: (reason, count) for the failed calls, most frequent first (ties by name).
    """

    benchmark: str
    domain: str
    n_calls: int
    n_failed: int
    rate: float
    n_truncated: int
    reasons: tuple[tuple[str, int], ...]


@dataclass(frozen=True, eq=False)
class RB2JudgeArrays:
    """RewardBench 2 judge results as arrays (one row per group).

    Attributes:
        credit: ``(n,)`` per-group credit; NaN on Ties rows.
        ratings: ``(n, L)`` ratings padded with NaN; NaN within ``lengths`` = failed rating; all
            NaN on rows scored by ranking.
        lengths: ``(n,)`` responses per row.
        num_correct: ``(n,)`` correct responses per row.
        subsets: ``(n,)`` subset labels.
        ids: ``(n,)`` group ids.
    """

    credit: np.ndarray
    ratings: np.ndarray
    lengths: np.ndarray
    num_correct: np.ndarray
    subsets: np.ndarray
    ids: np.ndarray


def rewardbench2_judge_scores(
    credit: np.ndarray,
    subsets: np.ndarray,
    ratings: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    ids: np.ndarray,
) -> RB2Result:
    """RewardBench 2 subset scores of a generative judge.

    Args:
        credit: ``(n,)`` official per-group credit in [0, 1]; read on non-Ties rows only.
        subsets: ``(n,)`` labels from :data:`rmserve.schema.RB2_SUBSETS`.
        ratings: ``(n, L)`` ratings, NaN = failed (counted as :data:`FAILED_RATING`); read on
            Ties rows only, positions ``>= lengths`` ignored.
        lengths: ``(n,)`` responses per row.
        num_correct: ``(n,)`` correct responses per row (leading).
        ids: ``(n,)`` ids; Ties ids are ``ref:N`` / ``tied:N``.

    Returns:
        :class:`~rmserve.metrics.rewardbench2.RB2Result`; ``n_nan_groups`` is 0 everywhere
        (judge failures are counted by :func:`parse_failure_rates`).

    Raises:
        ValueError: bad shapes, zero groups, an unknown subset, a non-Ties credit that is not
            a finite value in [0, 1], or malformed Ties rows.

    Source: allenai/reward-bench ``scripts/run_generative_v2.py`` (per-subset
    ``sum(results) / n``; Ties via ``process_single_model`` on the ratings).
    """
    credit = np.asarray(credit, dtype=np.float64)
    ratings = np.asarray(ratings, dtype=np.float64)
    lengths = np.asarray(lengths)
    n = credit.shape[0] if credit.ndim == 1 else -1
    if credit.ndim != 1 or n == 0:
        raise ValueError(f"credit must be a non-empty 1-D array (n_groups,), got shape {credit.shape}")
    if ratings.ndim != 2 or ratings.shape[0] != n:
        raise ValueError(f"ratings must have shape ({n}, max_responses), got {ratings.shape}")
    subsets = check_subsets(subsets, n)
    num_correct = np.asarray(num_correct)
    ids = np.asarray(ids)
    if lengths.shape != (n,) or num_correct.shape != (n,) or ids.shape != (n,):
        raise ValueError(f"lengths, num_correct and ids must have shape ({n},)")
    is_ties = subsets == TIES
    bad = ~is_ties & ~((credit >= 0.0) & (credit <= 1.0))
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(f"credit must be a finite value in [0, 1] on non-Ties rows; rows {rows}")
    results: list[SubsetScore] = []
    ties = None
    for name in RB2_SUBSETS:
        mask = subsets == name
        count = int(mask.sum())
        if count == 0:
            continue
        if name == TIES:
            filled = np.where(np.isnan(ratings[mask]), FAILED_RATING, ratings[mask])
            ties = ties_score(filled, lengths[mask], num_correct[mask], ids[mask])
            results.append(SubsetScore(name, ties.score, count, 0))
        else:
            results.append(SubsetScore(name, float(credit[mask].mean()), count, 0))
    present = {s.subset for s in results}
    missing = tuple(s for s in RB2_SUBSETS if s not in present)
    return RB2Result(
        subsets=tuple(results),
        ties=ties,
        average=float(np.mean([s.score for s in results])),
        missing=missing,
        partial=bool(missing),
    )


def rmbench_judge_accuracy(cells: np.ndarray, domains: np.ndarray) -> RMBenchResult:
    """RM-Bench figures from per-group judge cells (rmserve's pairwise protocol, not official).

    Args:
        cells: ``(n, 3, 3)`` (or ``(n, 9)`` row-major) values in [0, 1]: row = chosen style,
            column = rejected style (concise, detailed plain, detailed markdown).
        domains: ``(n,)`` source-domain labels from :data:`rmserve.schema.RMBENCH_DOMAINS`.

    Returns:
        :class:`~rmserve.metrics.rmbench.RMBenchResult` (``n_nan_groups`` 0); per reported
        domain the matrix is the mean of its groups' cells (safety pools both parts by group
        count), then hard / normal / easy as :func:`rmserve.metrics.rmbench.matrix_figures`.

    Raises:
        ValueError: bad shapes, zero groups, a cell outside [0, 1] or NaN, an unknown domain.
    """
    cells = np.asarray(cells, dtype=np.float64)
    domains = np.asarray(domains)
    if cells.ndim == 2 and cells.shape[1] == NUM_STYLES * NUM_STYLES:
        cells = cells.reshape(-1, NUM_STYLES, NUM_STYLES)
    if cells.ndim != 3 or cells.shape[1:] != (NUM_STYLES, NUM_STYLES):
        raise ValueError(f"cells must have shape (n_groups, 3, 3) or (n_groups, 9), got {cells.shape}")
    if cells.shape[0] == 0:
        raise ValueError("cells holds no groups")
    if domains.shape != (cells.shape[0],):
        raise ValueError(f"domains must have shape ({cells.shape[0]},), got {domains.shape}")
    if not ((cells >= 0.0) & (cells <= 1.0)).all():
        raise ValueError("cells must lie in [0, 1] (NaN is not allowed)")
    codes = domain_codes(domains)
    part_index = {name: k for k, name in enumerate(RMBENCH_DOMAINS)}
    results: list[DomainAccuracy] = []
    for name in REPORT_DOMAINS:
        present = tuple(p for p in DOMAIN_PARTS[name] if (codes == part_index[p]).any())
        if not present:
            continue
        mask = np.isin(codes, [part_index[p] for p in present])
        matrix = cells[mask].mean(axis=0)
        hard, normal, easy, score = matrix_figures(matrix)
        results.append(
            DomainAccuracy(
                domain=name,
                parts=present,
                matrix=tuple(tuple(float(x) for x in row) for row in matrix),
                hard=hard,
                normal=normal,
                easy=easy,
                score=score,
                n_groups=int(mask.sum()),
                n_nan_groups=0,
            )
        )
    hard, normal, easy, score = combine_domains({d.domain: (d.hard, d.normal, d.easy, d.score) for d in results})
    missing = tuple(p for p in RMBENCH_DOMAINS if not (codes == part_index[p]).any())
    return RMBenchResult(
        domains=tuple(results), hard=hard, normal=normal, easy=easy, score=score, missing=missing, partial=bool(missing)
    )


def parse_failure_rates(
    benchmarks: np.ndarray, domains: np.ndarray, reasons: np.ndarray, truncated: np.ndarray
) -> tuple[ParseFailures, ...]:
    """Parse-failure rate per (benchmark, domain), one row per judge call.

    Args:
        benchmarks, domains: ``(m,)`` labels per call.
        reasons: ``(m,)`` :attr:`~rmserve.judge_records.JudgeParse.reason` per call (``ok``
            when a verdict / rating was read).
        truncated: ``(m,)`` bool, the call hit ``max_tokens``.

    Returns:
        One :class:`ParseFailures` per (benchmark, domain) present, sorted by benchmark, then
        in :data:`~rmserve.schema.RB2_SUBSETS` / :data:`~rmserve.schema.RMBENCH_DOMAINS` order
        (other names after, alphabetically).

    Raises:
        ValueError: arrays of different lengths.
    """
    benchmarks = np.asarray(benchmarks, dtype=str)
    domains = np.asarray(domains, dtype=str)
    reasons = np.asarray(reasons, dtype=str)
    truncated = np.asarray(truncated, dtype=bool)
    m = benchmarks.shape[0] if benchmarks.ndim == 1 else -1
    if any(a.shape != (m,) for a in (benchmarks, domains, reasons, truncated)):
        raise ValueError("benchmarks, domains, reasons and truncated must be 1-D arrays of one length")
    order = {name: k for k, name in enumerate(RB2_SUBSETS + RMBENCH_DOMAINS)}
    keys = sorted({(str(b), str(d)) for b, d in zip(benchmarks, domains)},
                  key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))
    out = []
    for benchmark, domain in keys:
        mask = (benchmarks == benchmark) & (domains == domain)
        failed = mask & (reasons != "ok")
        counts = Counter(reasons[failed].tolist())
        n_calls, n_failed = int(mask.sum()), int(failed.sum())
        out.append(
            ParseFailures(
                benchmark=benchmark,
                domain=domain,
                n_calls=n_calls,
                n_failed=n_failed,
                rate=n_failed / n_calls,
                n_truncated=int((mask & truncated).sum()),
                reasons=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            )
        )
    return tuple(out)


# --- adapters from records ----------------------------------------------------------------


def judge_parse_failures(results: Sequence[JudgeGroupResult]) -> tuple[ParseFailures, ...]:
    """:func:`parse_failure_rates` over every call of ``results``."""
    rows = [(r.benchmark, r.domain, c.parse.reason, c.truncated) for r in results for c in r.calls]
    if not rows:
        return ()
    b, d, reason, cut = zip(*rows)
    return parse_failure_rates(np.array(b), np.array(d), np.array(reason), np.array(cut, dtype=bool))


def rb2_judge_arrays(results: Sequence[JudgeGroupResult]) -> RB2JudgeArrays:
    """Arrays for :func:`rewardbench2_judge_scores` from RewardBench 2 judge records.

    Raises:
        ValueError: no records, a record of another benchmark, a non-Ties record without
            ``credit`` or a Ties record without ``ratings`` (the group is named).
    """
    if not results:
        raise ValueError("no judge results")
    n = len(results)
    width = max(len(r.ratings) if r.ratings is not None else r.num_chosen + 1 for r in results)
    credit = np.full(n, np.nan)
    ratings = np.full((n, width), np.nan)
    lengths = np.zeros(n, dtype=np.int64)
    for k, r in enumerate(results):
        where = f"{r.benchmark}/{r.domain}/{r.id}"
        if r.benchmark != "rewardbench2":
            raise ValueError(f"{where}: not a RewardBench 2 record")
        if r.domain == TIES:
            if r.ratings is None:
                raise ValueError(f"{where}: a Ties record needs ratings (protocol {r.protocol})")
        elif r.credit is None:
            raise ValueError(f"{where}: a non-Ties record needs a credit (protocol {r.protocol})")
        if r.credit is not None:
            credit[k] = r.credit
        if r.ratings is not None:
            lengths[k] = len(r.ratings)
            ratings[k, : len(r.ratings)] = [np.nan if x is None else x for x in r.ratings]
        else:
            lengths[k] = width
    return RB2JudgeArrays(
        credit=credit,
        ratings=ratings,
        lengths=lengths,
        num_correct=np.array([r.num_chosen for r in results], dtype=np.int64),
        subsets=np.array([r.domain for r in results]),
        ids=np.array([r.id for r in results]),
    )


def rewardbench2_from_judge(results: Sequence[JudgeGroupResult]) -> RB2Result:
    """RewardBench 2 scores of judge records (:func:`rb2_judge_arrays` then
    :func:`rewardbench2_judge_scores`)."""
    a = rb2_judge_arrays(results)
    return rewardbench2_judge_scores(a.credit, a.subsets, a.ratings, a.lengths, a.num_correct, a.ids)


def rmbench_from_judge(results: Sequence[JudgeGroupResult]) -> RMBenchResult:
    """RM-Bench figures of ``rmbench-pairwise`` judge records (:func:`rmbench_judge_accuracy`).

    Raises:
        ValueError: no records, or a record without ``cells`` (the group is named).
    """
    if not results:
        raise ValueError("no judge results")
    for r in results:
        if r.cells is None:
            raise ValueError(f"{r.benchmark}/{r.domain}/{r.id}: no pairwise cells (protocol {r.protocol})")
    cells = np.array([r.cells for r in results], dtype=np.float64)
    return rmbench_judge_accuracy(cells, np.array([r.domain for r in results]))
