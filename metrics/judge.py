"""Generative-judge figures: RewardBench 2 and RM-Bench scores from judge verdicts, parse failures.

Pure array functions plus thin adapters from :class:`~rmserve.judge_records.JudgeGroupResult`
records (no I/O, no printing). The per-group rules (ranking credit, rating credit, pairwise
cells) are applied where the records are made (``rmserve.server.kinds.judge_protocols``); here they
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

Both paths share one assembly: :func:`rmserve.metrics.rmbench.rmbench_from_parts` (domain
pooling, :class:`~rmserve.metrics.rmbench.DomainAccuracy`) and
:func:`rmserve.metrics.rewardbench2.rb2_from_parts` (per-subset means, ``RB2Result``); the
bootstrap resamples the same strata (:func:`rb2_judge_strata`, :func:`rmbench_judge_strata`).
A group the judge could not take (no judge record: null rewards and errors in its score
record) is counted exactly as the classifier path counts a group without rewards: credit 0
outside Ties, all-NaN rewards in Ties, every RM-Bench cell lost, and in ``n_nan_groups``.

Parse failures (:func:`parse_failure_rates`): per (benchmark, subset or domain), the share of
judge calls whose output gave no verdict or rating, with the calls cut at ``max_tokens`` and the
failure reasons counted. Direction: lower is better.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from rmserve.judge_records import JUDGE_PROTOCOLS, JudgeGroupResult
from rmserve.metrics.rewardbench2 import TIES, RB2Result, check_subsets, rb2_from_parts, subset_strata, ties_prompts, ties_score
from rmserve.metrics.rmbench import NUM_STYLES, RMBenchResult, cell_contributions, domain_codes, domain_strata, rmbench_from_parts
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
        unscored: ``(n,)`` bool, the group has no judge record (the judge could not take it);
            None when every group has one.
    """

    credit: np.ndarray
    ratings: np.ndarray
    lengths: np.ndarray
    num_correct: np.ndarray
    subsets: np.ndarray
    ids: np.ndarray
    unscored: np.ndarray | None = None


def _unscored_mask(unscored: np.ndarray | None, n: int) -> np.ndarray:
    if unscored is None:
        return np.zeros(n, dtype=bool)
    unscored = np.asarray(unscored, dtype=bool)
    if unscored.shape != (n,):
        raise ValueError(f"unscored must have shape ({n},), got {unscored.shape}")
    return unscored


def _rb2_judge_inputs(
    credit: np.ndarray,
    subsets: np.ndarray,
    ratings: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    ids: np.ndarray,
    unscored: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None]:
    """Validated (credit with 0 on unscored rows, unscored mask, subsets, Ties inputs or None).

    The Ties inputs are ``(ratings, lengths, num_correct, ids)`` of the Ties rows with a failed
    rating filled with :data:`FAILED_RATING` and an unscored row left all NaN (counted as the
    classifier path counts a group without rewards).
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
    unscored = _unscored_mask(unscored, n)
    is_ties = subsets == TIES
    bad = ~is_ties & ~unscored & ~((credit >= 0.0) & (credit <= 1.0))
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(f"credit must be a finite value in [0, 1] on non-Ties rows; rows {rows}")
    credit = np.where(unscored, 0.0, credit)
    ties_inputs = None
    if is_ties.any():
        filled = np.where(np.isnan(ratings) & ~unscored[:, None], FAILED_RATING, ratings)
        filled[unscored] = np.nan
        ties_inputs = (filled[is_ties], lengths[is_ties], num_correct[is_ties], ids[is_ties])
    return credit, unscored, subsets, ties_inputs


def rewardbench2_judge_scores(
    credit: np.ndarray,
    subsets: np.ndarray,
    ratings: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    ids: np.ndarray,
    unscored: np.ndarray | None = None,
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
        unscored: ``(n,)`` bool, groups the judge could not take (no judge record), or None
            (none). They are counted as the classifier path counts a group without rewards:
            credit 0 outside Ties, all-NaN rewards in Ties (never accurate, never preferred,
            margin term 0), and in ``n_nan_groups``; their ``credit`` / ``ratings`` are not read.

    Returns:
        :class:`~rmserve.metrics.rewardbench2.RB2Result` (assembled by
        :func:`~rmserve.metrics.rewardbench2.rb2_from_parts`, as the classifier path);
        ``n_nan_groups`` counts the unscored groups (parse failures are counted by
        :func:`parse_failure_rates`).

    Raises:
        ValueError: bad shapes, zero groups, an unknown subset, a non-Ties credit that is not
            a finite value in [0, 1] on a scored row, or malformed Ties rows.

    Source: allenai/reward-bench ``scripts/run_generative_v2.py`` (per-subset
    ``sum(results) / n``; Ties via ``process_single_model`` on the ratings).
    """
    credit, unscored, subsets, ties_inputs = _rb2_judge_inputs(
        credit, subsets, ratings, lengths, num_correct, ids, unscored
    )
    ties = ties_score(*ties_inputs) if ties_inputs is not None else None
    return rb2_from_parts(credit, unscored, subsets, ties)


def rb2_judge_strata(
    credit: np.ndarray,
    subsets: np.ndarray,
    ratings: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    ids: np.ndarray,
    unscored: np.ndarray | None = None,
) -> tuple[list[str], list[np.ndarray]]:
    """Bootstrap strata of a judge's RewardBench 2 results (arguments as
    :func:`rewardbench2_judge_scores`): per subset present, in leaderboard order, its name and
    per-unit values: ``(n_s, 1)`` credits, or for Ties the ``(P, 8)`` per-prompt table
    (:meth:`~rmserve.metrics.rewardbench2.TiesPrompts.unit_values`). The same strata the
    classifier path resamples, so intervals and paired comparisons treat both alike."""
    credit, _, subsets, ties_inputs = _rb2_judge_inputs(credit, subsets, ratings, lengths, num_correct, ids, unscored)

    def ties_units(mask: np.ndarray) -> np.ndarray:
        assert ties_inputs is not None
        return ties_prompts(*ties_inputs)[0].unit_values()

    return subset_strata(subsets, credit, ties_units)


def _judge_cells(
    cells: np.ndarray, domains: np.ndarray, unscored: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``(n, 3, 3)`` cells (0 on unscored rows), domain codes and the unscored mask."""
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
    unscored = _unscored_mask(unscored, cells.shape[0])
    cells = np.where(unscored[:, None, None], 0.0, cells)
    if not ((cells >= 0.0) & (cells <= 1.0)).all():
        raise ValueError("cells must lie in [0, 1] (NaN is not allowed)")
    return cells, domain_codes(domains), unscored


def rmbench_judge_accuracy(cells: np.ndarray, domains: np.ndarray, unscored: np.ndarray | None = None) -> RMBenchResult:
    """RM-Bench figures from per-group judge cells (rmserve's pairwise protocol, not official).

    Args:
        cells: ``(n, 3, 3)`` (or ``(n, 9)`` row-major) values in [0, 1]: row = chosen style,
            column = rejected style (concise, detailed plain, detailed markdown).
        domains: ``(n,)`` source-domain labels from :data:`rmserve.schema.RMBENCH_DOMAINS`.
        unscored: ``(n,)`` bool, groups the judge could not take (no judge record), or None.
            Their cells are not read and count 0 (every comparison lost, as the classifier
            path counts a NaN reward) and they are counted in ``n_nan_groups``.

    Returns:
        :class:`~rmserve.metrics.rmbench.RMBenchResult`; per reported domain the matrix is the
        mean of its groups' cells (safety pools both parts by group count), then hard / normal
        / easy, all assembled by :func:`~rmserve.metrics.rmbench.rmbench_from_parts` as the
        classifier path.

    Raises:
        ValueError: bad shapes, zero groups, a cell of a scored row outside [0, 1] or NaN, an
            unknown domain.
    """
    cells, codes, unscored = _judge_cells(cells, domains, unscored)
    n_parts = len(RMBENCH_DOMAINS)
    sums = np.zeros((n_parts, NUM_STYLES, NUM_STYLES))
    np.add.at(sums, codes, cells)
    return rmbench_from_parts(
        sums, np.bincount(codes, minlength=n_parts), np.bincount(codes[unscored], minlength=n_parts)
    )


def rmbench_judge_strata(
    cells: np.ndarray, domains: np.ndarray, unscored: np.ndarray | None = None
) -> tuple[list[str], list[np.ndarray]]:
    """Bootstrap strata of a judge's RM-Bench cells (arguments as :func:`rmbench_judge_accuracy`):
    per source domain present, its name and the ``(n_s, 4)`` per-group hard / normal / easy /
    score shares (:func:`~rmserve.metrics.rmbench.cell_contributions`), as the classifier path."""
    cells, codes, _ = _judge_cells(cells, domains, unscored)
    return domain_strata(codes, cell_contributions(cells))


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
    """Arrays for :func:`rewardbench2_judge_scores` from RewardBench 2 judge records alone
    (:func:`rb2_judge_rows` with each record's own key; a record without ratings gets the
    widest row's length).

    Raises:
        ValueError: no records, a record of another benchmark, a non-Ties record without
            ``credit`` or a Ties record without ``ratings`` (the group is named).
    """
    if not results:
        raise ValueError("no judge results")
    for r in results:
        if r.benchmark != "rewardbench2":
            raise ValueError(f"{r.benchmark}/{r.domain}/{r.id}: not a RewardBench 2 record")
    width = max(len(r.ratings) if r.ratings is not None else r.num_chosen + 1 for r in results)
    arrays = rb2_judge_rows(
        results,
        np.array([len(r.ratings) if r.ratings is not None else width for r in results], dtype=np.int64),
        np.array([r.num_chosen for r in results], dtype=np.int64),
        np.array([r.domain for r in results]),
        np.array([r.id for r in results]),
    )
    return replace(arrays, unscored=None)


def rewardbench2_from_judge(results: Sequence[JudgeGroupResult]) -> RB2Result:
    """RewardBench 2 scores of judge records (:func:`rb2_judge_arrays` then
    :func:`rewardbench2_judge_scores`)."""
    a = rb2_judge_arrays(results)
    return rewardbench2_judge_scores(a.credit, a.subsets, a.ratings, a.lengths, a.num_correct, a.ids)


def rmbench_from_judge(results: Sequence[JudgeGroupResult]) -> RMBenchResult:
    """RM-Bench figures of ``rmbench-pairwise`` judge records (:func:`rmbench_judge_rows`, then
    :func:`rmbench_judge_accuracy`).

    Raises:
        ValueError: no records, or a record without ``cells`` (the group is named).
    """
    if not results:
        raise ValueError("no judge results")
    domains = np.array([r.domain for r in results])
    cells, _ = rmbench_judge_rows(results, domains, np.array([r.id for r in results]))
    return rmbench_judge_accuracy(cells, domains)


def _keyed_records(
    results: Sequence[JudgeGroupResult | None],
    benchmark: str,
    domains: np.ndarray,
    ids: np.ndarray,
    unscored: np.ndarray,
) -> Iterator[tuple[int, JudgeGroupResult, str]]:
    """Per row ``k`` with a record: ``(k, record, "benchmark/domain/id")``, in row order, each
    checked (as it is reached) to carry its row's key; a None row sets ``unscored[k]``.

    Raises:
        ValueError: a record whose key differs from its row's (the group is named).
    """
    for k, r in enumerate(results):
        if r is None:
            unscored[k] = True
            continue
        where = f"{benchmark}/{domains[k]}/{ids[k]}"
        if (r.benchmark, r.domain, r.id) != (benchmark, str(domains[k]), str(ids[k])):
            raise ValueError(f"{where}: its judge record is for {r.benchmark}/{r.domain}/{r.id}")
        yield k, r, where


def rb2_judge_rows(
    results: Sequence[JudgeGroupResult | None],
    lengths: np.ndarray,
    num_correct: np.ndarray,
    subsets: np.ndarray,
    ids: np.ndarray,
) -> RB2JudgeArrays:
    """Arrays for :func:`rewardbench2_judge_scores` from the rows of a score set of judge records.

    Args:
        results: ``(n,)`` per group its judge record, None where the judge could not take the
            group (the score record has null rewards and errors, no ``judge``).
        lengths, num_correct, subsets, ids: ``(n,)`` the score set's columns (responses per
            group, correct responses, subset, id), which the judge records must agree with.

    Returns:
        :class:`RB2JudgeArrays` with ``unscored`` set where ``results`` holds None.

    Raises:
        ValueError: a length mismatch, a record whose key, ``num_chosen`` or rating count
            differs from its row, a non-Ties record without ``credit`` or a Ties record
            without ``ratings`` (the group is named).
    """
    n = len(results)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.shape != (n,) or np.shape(num_correct) != (n,) or np.shape(subsets) != (n,) or np.shape(ids) != (n,):
        raise ValueError(f"lengths, num_correct, subsets and ids must have shape ({n},)")
    width = int(lengths.max()) if n else 0
    credit = np.full(n, np.nan)
    ratings = np.full((n, width), np.nan)
    unscored = np.zeros(n, dtype=bool)
    for k, r, where in _keyed_records(results, "rewardbench2", subsets, ids, unscored):
        if r.num_chosen != int(num_correct[k]):
            raise ValueError(f"{where}: judge num_chosen {r.num_chosen} differs from the group's {int(num_correct[k])}")
        if subsets[k] == TIES:
            if r.ratings is None:
                raise ValueError(f"{where}: a Ties record needs ratings (protocol {r.protocol})")
        elif r.credit is None:
            raise ValueError(f"{where}: a non-Ties record needs a credit (protocol {r.protocol})")
        if r.credit is not None:
            credit[k] = r.credit
        if r.ratings is not None:
            if len(r.ratings) != lengths[k]:
                raise ValueError(f"{where}: {len(r.ratings)} ratings for {int(lengths[k])} responses")
            ratings[k, : len(r.ratings)] = [np.nan if x is None else x for x in r.ratings]
    return RB2JudgeArrays(
        credit=credit,
        ratings=ratings,
        lengths=lengths,
        num_correct=np.asarray(num_correct, dtype=np.int64),
        subsets=np.asarray(subsets),
        ids=np.asarray(ids),
        unscored=unscored,
    )


def rmbench_judge_rows(
    results: Sequence[JudgeGroupResult | None], domains: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(cells (n, 9), unscored (n,))`` for :func:`rmbench_judge_accuracy` from the rows of a
    score set of judge records (None = the judge could not take the group: its cells are NaN
    and ``unscored`` is True).

    Raises:
        ValueError: a length mismatch, a record whose key differs from its row, or a record
            without ``cells`` (the group is named).
    """
    n = len(results)
    if np.shape(domains) != (n,) or np.shape(ids) != (n,):
        raise ValueError(f"domains and ids must have shape ({n},)")
    cells = np.full((n, NUM_STYLES * NUM_STYLES), np.nan)
    unscored = np.zeros(n, dtype=bool)
    for k, r, where in _keyed_records(results, "rm-bench", domains, ids, unscored):
        if r.cells is None:
            raise ValueError(f"{where}: no pairwise cells (protocol {r.protocol})")
        cells[k] = r.cells
    return cells, unscored


RMSERVE_PROTOCOLS: tuple[str, ...] = ("rmbench-pairwise",)
"""Judge protocols that are rmserve's own, not an official benchmark protocol (RM-Bench ships
no judge script); every output that shows their figures says so."""


@dataclass(frozen=True)
class JudgeSummary:
    """What a table header says about a judge's score set.

    Attributes:
        mode: the protocol choice the run was made with (``auto``, ``ranking``, ``ratings``,
            ``pairwise``; the score records' ``mode``), None when not recorded.
        protocols: the protocols of the judge records, in :data:`~rmserve.judge_records.JUDGE_PROTOCOLS`
            order (e.g. ``rb2-ranking`` and ``rb2-rating-ties``).
        compat: the compat values the records were read under (``none`` / ``official``), sorted.
        readers: the readers that read the calls (``JudgeParse.parser``, e.g. ``rb2-ranking``,
            ``rb2-ranking-official``, ``rb2-rating``), sorted.
        thinking: the thinking switches the records were judged with (``on`` / ``off``),
            sorted; empty when none was set.
        seeds: the distinct seeds the ranking positions were drawn from, sorted (empty when no
            record draws one: the rating and pairwise protocols draw nothing).
        n_groups: groups in the score set.
        n_judged: groups with a judge record.
        n_calls: judge calls over all records.
        n_failed: calls without a verdict / rating (truncated ones included).
        n_truncated: calls cut at ``max_tokens`` (parsed or not).
        rmserve_protocols: the protocols among ``protocols`` that are rmserve's own
            (:data:`RMSERVE_PROTOCOLS`), not official ones.
    """

    mode: str | None
    protocols: tuple[str, ...]
    compat: tuple[str, ...]
    seeds: tuple[int, ...]
    n_groups: int
    n_judged: int
    n_calls: int
    n_failed: int
    n_truncated: int
    rmserve_protocols: tuple[str, ...]
    readers: tuple[str, ...] = ()
    thinking: tuple[str, ...] = ()

    @property
    def n_unjudged(self) -> int:
        """Groups the judge could not take (no judge record)."""
        return self.n_groups - self.n_judged

    @property
    def no_verdicts(self) -> bool:
        """True when calls were made and not one gave a verdict or rating: every figure is then
        what the protocols' official code gives a judge that never answers, not a measurement."""
        return self.n_calls > 0 and self.n_failed == self.n_calls

    def no_verdicts_sentence(self) -> str:
        """The one sentence said (table and stderr) when :attr:`no_verdicts` holds."""
        cut = (
            f"; {self.n_truncated:,} of them were cut at max_tokens (raise --judge-max-tokens)"
            if self.n_truncated else ""
        )
        return (
            f"no verdict was read from any of the {self.n_calls:,} judge calls{cut}: every figure is what the official "
            "code gives a judge that never answers, not a measurement of this judge; the calls' text is in the "
            "score file (judge.calls)"
        )


def judge_summary(results: Sequence[JudgeGroupResult | None], mode: str | None = None) -> JudgeSummary:
    """The :class:`JudgeSummary` of a score set's judge records (None = a group without one)."""
    judged = [r for r in results if r is not None]
    used = {r.protocol for r in judged}
    protocols = tuple(p for p in JUDGE_PROTOCOLS if p in used)
    calls = [c for r in judged for c in r.calls]
    return JudgeSummary(
        mode=mode,
        protocols=protocols,
        compat=tuple(sorted({r.compat for r in judged})),
        seeds=tuple(sorted({r.seed for r in judged if r.seed is not None})),
        n_groups=len(results),
        n_judged=len(judged),
        n_calls=len(calls),
        n_failed=sum(1 for c in calls if not c.parse.ok),
        n_truncated=sum(1 for c in calls if c.truncated),
        rmserve_protocols=tuple(p for p in protocols if p in RMSERVE_PROTOCOLS),
        readers=tuple(sorted({c.parse.parser for c in calls})),
        thinking=tuple(sorted({r.thinking for r in judged if r.thinking is not None})),
    )
