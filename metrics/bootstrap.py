"""Percentile bootstrap intervals for every RM-Bench and RewardBench 2 figure.

Groups are resampled with replacement *within* each stratum, so every stratum keeps its size:
RM-Bench strata are the source domains (``chat``, ``math``, ``code``, ``safety-refuse``,
``safety-response``; the pooled safety figure sums its two strata), RewardBench 2 strata are
the subsets, and the Ties subset is resampled by prompt number so a prompt's ``ref:N`` and
``tied:N`` rows stay together.

Speed: every figure is a (ratio of) sums of per-unit contribution vectors, so a resample is
a row of multinomial counts and all draws of a stratum are one matrix product
``counts (B, n) @ values (n, k)`` — no gathering of resampled rows. Counts are built from
uniform indices with ``np.bincount`` (a multinomial(n, 1/n) draw per row), in blocks of
rows to bound memory. The generator is ``numpy.random.default_rng(seed)`` and strata are
drawn in a fixed order, so one seed always gives the same intervals.

Interval: the ``(1 − confidence)/2`` and ``(1 + confidence)/2`` quantiles of the draws
(percentile method; Efron & Tibshirani 1993, ch. 13). Draws where a figure is undefined
(e.g. no paired Ties prompt resampled) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from rmserve.metrics.rewardbench2 import (
    TIES,
    TIES_WEIGHTS,
    best_of_n_credit,
    check_groups,
    check_subsets,
    subset_strata,
    ties_from_sums,
    ties_prompts,
)
from rmserve.metrics.rmbench import DOMAIN_PARTS, REPORT_DOMAINS, check_rewards, domain_codes, domain_strata, group_contributions

from rmserve.errors import DataError

RMBENCH_FIGURES: tuple[str, ...] = ("hard", "normal", "easy", "score")
"""Per-domain and overall RM-Bench figures; names are ``<domain>.<figure>`` / ``overall.<figure>``."""


def check_resampling(resamples: int, seed: int, confidence: float, *, least_resamples: int) -> None:
    """Check resampling settings shared by the configs of this stage.

    Raises:
        ValueError: ``resamples`` outside ``[least_resamples, 1000000]``, ``seed < 0``, or
            ``confidence`` outside (0, 1); the message names the field and its limit.
    """
    if not least_resamples <= resamples <= 1_000_000:
        raise ValueError(f"resamples must lie in [{least_resamples}, 1000000], got {resamples}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


@dataclass(frozen=True)
class BootstrapConfig:
    """How to resample.

    Attributes:
        resamples: number of bootstrap draws (default 1,000; range 1 … 1,000,000).
        seed: seed of ``numpy.random.default_rng`` (default 0; ≥ 0).
        confidence: central coverage of the interval (default 0.95; in (0, 1)).
        block_cells: most count-matrix cells (draws × units) held at once (default 2**22;
            ≥ 1); bounds memory to about 8 bytes × this per block.
    """

    resamples: int = 1000
    seed: int = 0
    confidence: float = 0.95
    block_cells: int = 1 << 22

    def __post_init__(self) -> None:
        check_resampling(self.resamples, self.seed, self.confidence, least_resamples=1)
        if self.block_cells < 1:
            raise ValueError(f"block_cells must be >= 1, got {self.block_cells}")


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval ``[low, high]`` (same unit as its figure: a fraction)."""

    low: float
    high: float

    def contains(self, value: float) -> bool:
        """Whether ``low <= value <= high``."""
        return self.low <= value <= self.high

    @property
    def excludes_zero(self) -> bool:
        """True when 0 lies outside the interval (a paired difference is then resolved)."""
        return bool(self.low > 0 or self.high < 0)


@dataclass(frozen=True)
class PairedFigure:
    """One figure of a paired comparison of score sets A and B over the same groups.

    Attributes:
        figure: figure name (``chat.hard``, ``overall.score``, ``Ties``, ``average`` …).
        a, b: the figure for A and for B.
        difference: ``b − a``.
        interval: bootstrap interval of ``b − a`` (same resamples applied to both).
    """

    figure: str
    a: float
    b: float
    difference: float
    interval: Interval

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval of the difference excludes 0."""
        return self.interval.excludes_zero


# --- core -------------------------------------------------------------------------------


def count_matrix(n_units: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_draws, n_units)`` float64 resample counts; each row is multinomial(n_units, 1/n_units).

    Built as ``bincount`` of uniform unit indices (one resample per row), which has the same
    distribution as ``rng.multinomial`` and is far faster for many units.
    """
    picks = rng.integers(0, n_units, size=(n_draws, n_units), dtype=np.int64)
    picks += (np.arange(n_draws, dtype=np.int64) * n_units)[:, None]
    return np.bincount(picks.ravel(), minlength=n_draws * n_units).reshape(n_draws, n_units).astype(np.float64)


def stratum_sums(strata: Sequence[np.ndarray], config: BootstrapConfig) -> list[np.ndarray]:
    """Resampled column totals of each stratum.

    Args:
        strata: per stratum an ``(n_s, k_s)`` array of per-unit values (``n_s >= 1``).
        config: resamples, seed and block size.

    Returns:
        Per stratum a ``(resamples, k_s)`` array: row ``b`` = counts_b @ values. Strata are
        drawn in the order given from one generator seeded with ``config.seed``.
    """
    rng = np.random.default_rng(config.seed)
    out = []
    for values in strata:
        values = np.asarray(values, dtype=np.float64)
        n = values.shape[0]
        block = max(1, config.block_cells // max(n, 1))
        sums = np.empty((config.resamples, values.shape[1]), dtype=np.float64)
        for start in range(0, config.resamples, block):
            stop = min(config.resamples, start + block)
            sums[start:stop] = count_matrix(n, stop - start, rng) @ values
        out.append(sums)
    return out


def percentile_interval(draws: np.ndarray, confidence: float) -> Interval:
    """Percentile interval of ``(B,)`` draws, ignoring NaN draws (all NaN → ``[nan, nan]``)."""
    draws = np.asarray(draws, dtype=np.float64)
    finite = draws[~np.isnan(draws)]
    if finite.size == 0:
        return Interval(float("nan"), float("nan"))
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return Interval(float(low), float(high))


def _intervals(draws: dict[str, np.ndarray], confidence: float) -> dict[str, Interval]:
    return {name: percentile_interval(values, confidence) for name, values in draws.items()}


def _paired(
    strata_a: Sequence[np.ndarray],
    strata_b: Sequence[np.ndarray],
    figures: Callable[[Sequence[np.ndarray]], dict[str, np.ndarray]],
    config: BootstrapConfig,
) -> dict[str, PairedFigure]:
    """Apply the same resamples to A and B (values stacked side by side) and difference them."""
    widths = [np.shape(a)[1] for a in strata_a]
    stacked = [
        np.hstack([np.asarray(a, np.float64), np.asarray(b, np.float64)])
        for a, b in zip(strata_a, strata_b, strict=True)
    ]
    sums = stratum_sums(stacked, config)
    draws_a = figures([s[:, :w] for s, w in zip(sums, widths, strict=True)])
    draws_b = figures([s[:, w:] for s, w in zip(sums, widths, strict=True)])
    point_a = figures([np.asarray(a, np.float64).sum(axis=0, keepdims=True) for a in strata_a])
    point_b = figures([np.asarray(b, np.float64).sum(axis=0, keepdims=True) for b in strata_b])
    out = {}
    for name in draws_a:
        a = float(point_a[name][0])
        b = float(point_b[name][0])
        out[name] = PairedFigure(
            figure=name,
            a=a,
            b=b,
            difference=b - a,
            interval=percentile_interval(draws_b[name] - draws_a[name], config.confidence),
        )
    return out


# --- RM-Bench ---------------------------------------------------------------------------


def _rmbench_strata(rewards: np.ndarray, domains: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    rewards, domains = check_rewards(rewards, domains)
    codes = domain_codes(domains)
    return domain_strata(codes, group_contributions(rewards))


def _rmbench_figure_fn(parts: list[str], sizes: list[int]) -> Callable[[Sequence[np.ndarray]], dict[str, np.ndarray]]:
    def figures(sums: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        by_part = dict(zip(parts, sums, strict=True))
        n_by_part = dict(zip(parts, sizes, strict=True))
        out: dict[str, np.ndarray] = {}
        reported = []
        for domain in REPORT_DOMAINS:
            present = [p for p in DOMAIN_PARTS[domain] if p in by_part]
            if not present:
                continue
            mean = sum(by_part[p] for p in present) / sum(n_by_part[p] for p in present)
            reported.append(mean)
            for j, figure in enumerate(RMBENCH_FIGURES):
                out[f"{domain}.{figure}"] = mean[:, j]
        overall = np.mean(reported, axis=0)
        for j, figure in enumerate(RMBENCH_FIGURES):
            out[f"overall.{figure}"] = overall[:, j]
        return out

    return figures


def rmbench_draws(rewards: np.ndarray, domains: np.ndarray, config: BootstrapConfig) -> dict[str, np.ndarray]:
    """Bootstrap draws of every RM-Bench figure.

    Args:
        rewards: ``(n, 6)`` rewards (see :func:`rmserve.metrics.rmbench.rmbench_accuracy`).
        domains: ``(n,)`` source-domain labels.
        config: resampling settings.

    Returns:
        ``{"<domain>.<hard|normal|easy|score>": (B,), "overall.<…>": (B,)}`` for the
        reported domains present.

    Raises:
        ValueError: as :func:`rmserve.metrics.rmbench.rmbench_accuracy`.
    """
    parts, strata = _rmbench_strata(rewards, domains)
    figures = _rmbench_figure_fn(parts, [s.shape[0] for s in strata])
    return figures(stratum_sums(strata, config))


def rmbench_intervals(rewards: np.ndarray, domains: np.ndarray, config: BootstrapConfig) -> dict[str, Interval]:
    """Percentile interval of every RM-Bench figure (names as :func:`rmbench_draws`)."""
    return _intervals(rmbench_draws(rewards, domains, config), config.confidence)


def paired_rmbench(
    rewards_a: np.ndarray, rewards_b: np.ndarray, domains: np.ndarray, config: BootstrapConfig
) -> dict[str, PairedFigure]:
    """Paired comparison B − A of two RM-Bench score sets over the same groups, row-aligned.

    Args:
        rewards_a, rewards_b: ``(n, 6)`` rewards; row ``g`` of both is the same group.
        domains: ``(n,)`` source-domain labels shared by both.
        config: resampling settings; each draw resamples the groups once and applies the same
            counts to A and B.

    Returns:
        ``{figure: PairedFigure}`` for every figure of :func:`rmbench_draws`.
    """
    parts, strata_a = _rmbench_strata(rewards_a, domains)
    _, strata_b = _rmbench_strata(rewards_b, domains)
    figures = _rmbench_figure_fn(parts, [s.shape[0] for s in strata_a])
    return _paired(strata_a, strata_b, figures, config)


# --- RewardBench 2 ----------------------------------------------------------------------


def _rb2_strata(
    scores: np.ndarray, lengths: np.ndarray, num_correct: np.ndarray, subsets: np.ndarray, ids: np.ndarray
) -> tuple[list[str], list[np.ndarray]]:
    scores, lengths, _ = check_groups(scores, lengths)
    subsets = check_subsets(subsets, scores.shape[0])
    num_correct = np.asarray(num_correct)
    ids = np.asarray(ids)
    credit, _ = best_of_n_credit(scores, lengths)

    def ties_units(mask: np.ndarray) -> np.ndarray:
        return ties_prompts(scores[mask], lengths[mask], num_correct[mask], ids[mask])[0].unit_values()

    return subset_strata(subsets, credit, ties_units)


def _rb2_figure_fn(names: list[str], sizes: list[int]) -> Callable[[Sequence[np.ndarray]], dict[str, np.ndarray]]:
    def figures(sums: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, total, n in zip(names, sums, sizes, strict=True):
            if name == TIES:
                parts = ties_from_sums(total)
                out[TIES] = parts["score"]
                for component in TIES_WEIGHTS:
                    out[f"{TIES}.{component}"] = parts[component]
            else:
                out[name] = total[:, 0] / n
        out["average"] = np.mean([out[name] for name in names], axis=0)
        return out

    return figures


def rb2_draws(
    scores: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    subsets: np.ndarray,
    ids: np.ndarray,
    config: BootstrapConfig,
) -> dict[str, np.ndarray]:
    """Bootstrap draws of every RewardBench 2 figure.

    Args:
        scores, lengths, num_correct, subsets, ids: as
            :func:`rmserve.metrics.rewardbench2.rewardbench2_scores`.
        config: resampling settings.

    Returns:
        ``{subset: (B,), "Ties.<component>": (B,), "average": (B,)}`` for subsets present.
    """
    names, strata = _rb2_strata(scores, lengths, num_correct, subsets, ids)
    figures = _rb2_figure_fn(names, [s.shape[0] for s in strata])
    return figures(stratum_sums(strata, config))


def rb2_intervals(
    scores: np.ndarray,
    lengths: np.ndarray,
    num_correct: np.ndarray,
    subsets: np.ndarray,
    ids: np.ndarray,
    config: BootstrapConfig,
) -> dict[str, Interval]:
    """Percentile interval of every RewardBench 2 figure (names as :func:`rb2_draws`)."""
    return _intervals(rb2_draws(scores, lengths, num_correct, subsets, ids, config), config.confidence)


def paired_rb2(
    scores_a: np.ndarray,
    lengths_a: np.ndarray,
    scores_b: np.ndarray,
    lengths_b: np.ndarray,
    num_correct: np.ndarray,
    subsets: np.ndarray,
    ids: np.ndarray,
    config: BootstrapConfig,
) -> dict[str, PairedFigure]:
    """Paired comparison B − A of two RewardBench 2 score sets over the same, row-aligned groups.

    Each draw resamples rows within each subset (Ties: prompts) once and applies the same
    counts to A and B.
    """
    names, strata_a = _rb2_strata(scores_a, lengths_a, num_correct, subsets, ids)
    _, strata_b = _rb2_strata(scores_b, lengths_b, num_correct, subsets, ids)
    figures = _rb2_figure_fn(names, [s.shape[0] for s in strata_a])
    return _paired(strata_a, strata_b, figures, config)


# --- any kind of score, from its strata ------------------------------------------------


def _figure_fn(benchmark: str, names: list[str], strata: Sequence[np.ndarray]):
    sizes = [np.shape(s)[0] for s in strata]
    if benchmark == "rm-bench":
        return _rmbench_figure_fn(names, sizes)
    return _rb2_figure_fn(names, sizes)


def strata_intervals(
    benchmark: str, names: list[str], strata: Sequence[np.ndarray], config: BootstrapConfig
) -> dict[str, Interval]:
    """Percentile interval of every figure from a score set's strata, whatever scored it.

    Args:
        benchmark: ``rm-bench`` or ``rewardbench2``.
        names: the strata names: RM-Bench source domains, or RewardBench 2 subsets, in the
            order of :data:`rmserve.schema.RMBENCH_DOMAINS` / :data:`rmserve.schema.RB2_SUBSETS`.
        strata: per name the per-unit values: RM-Bench ``(n_s, 4)`` hard / normal / easy /
            score shares; RewardBench 2 ``(n_s, 1)`` credits, Ties ``(P, 8)`` per-prompt sums.
            (A generative judge's strata come from :mod:`rmserve.metrics.judge`.)
        config: resampling settings.

    Returns:
        Figure name → interval, names as :func:`rmbench_draws` / :func:`rb2_draws`.
    """
    figures = _figure_fn(benchmark, names, strata)
    return _intervals(figures(stratum_sums(strata, config)), config.confidence)


def score_strata(benchmark: str, *arrays: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """The strata of a reward-scored set: RM-Bench ``(rewards, domains)``, RewardBench 2
    ``(scores, lengths, num_correct, subsets, ids)``."""
    if benchmark == "rm-bench":
        return _rmbench_strata(*arrays)
    return _rb2_strata(*arrays)


def paired_strata(
    benchmark: str,
    names: list[str],
    strata_a: Sequence[np.ndarray],
    strata_b: Sequence[np.ndarray],
    config: BootstrapConfig,
) -> dict[str, PairedFigure]:
    """Paired comparison B − A from both sides' strata over the same, row-aligned groups (each
    side may come from rewards or from a judge's verdicts; see :func:`strata_intervals`).

    Raises:
        ValueError: strata of different sizes on the two sides.
    """
    if [np.shape(a)[0] for a in strata_a] != [np.shape(b)[0] for b in strata_b]:
        raise ValueError("A and B strata must have the same units")
    return _paired(strata_a, strata_b, _figure_fn(benchmark, names, strata_a), config)


# --- pairing ----------------------------------------------------------------------------


def match_groups(
    keys_a: Sequence[str], keys_b: Sequence[str], *, name_a: str = "A", name_b: str = "B"
) -> tuple[np.ndarray, np.ndarray]:
    """Row orders that align two score sets by group key.

    Args:
        keys_a, keys_b: one unique key string per group (e.g. ``str(GroupKey)``).
        name_a, name_b: labels used in the error message (e.g. file names).

    Returns:
        ``(order_a, order_b)`` with ``keys_a[order_a] == keys_b[order_b]`` (sorted by key).

    Raises:
        DataError: the key sets differ; the message gives how many keys each side lacks and
            up to three examples of each.
    """
    a = np.asarray(keys_a, dtype=str)
    b = np.asarray(keys_b, dtype=str)
    order_a = np.argsort(a, kind="stable")
    order_b = np.argsort(b, kind="stable")
    if a.shape == b.shape and np.array_equal(a[order_a], b[order_b]):
        return order_a, order_b
    only_a = np.setdiff1d(a, b)
    only_b = np.setdiff1d(b, a)
    parts = []
    if only_a.size:
        parts.append(f"{only_a.size} group(s) only in {name_a} (e.g. {', '.join(only_a[:3].tolist())})")
    if only_b.size:
        parts.append(f"{only_b.size} group(s) only in {name_b} (e.g. {', '.join(only_b[:3].tolist())})")
    if not parts:
        parts.append(f"{name_a} has {a.size} groups, {name_b} has {b.size} (repeated keys)")
    raise DataError("a paired comparison needs the same groups on both sides: " + "; ".join(parts), field="id")
