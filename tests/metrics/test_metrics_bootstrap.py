"""Bootstrap intervals and paired comparisons."""

from __future__ import annotations

import numpy as np
import pytest
from rmserve.metrics.bootstrap import (
    BootstrapConfig,
    Interval,
    count_matrix,
    match_groups,
    paired_rb2,
    paired_rmbench,
    rb2_draws,
    rb2_intervals,
    rmbench_draws,
    rmbench_intervals,
    stratum_sums,
)
from rmserve.metrics.evaluation import MetricsConfig, figure_values
from rmserve.metrics.rewardbench2 import rewardbench2_scores
from rmserve.metrics.rmbench import rmbench_accuracy
from rmserve.metrics.score_files import read_score_files
from testkit.metrics_data import RB2_REFERENCE_AVERAGE

from rmserve.errors import DataError


def rmbench_arrays(seed: int = 0, shift: float = 0.8):
    rng = np.random.default_rng(seed)
    counts = {"chat": 60, "code": 80, "safety-refuse": 50, "safety-response": 40}
    domains = np.repeat(list(counts), list(counts.values()))
    base = rng.normal(size=(domains.size, 1))
    rewards = np.hstack([base + rng.normal(shift, 1, (domains.size, 3)), base + rng.normal(0, 1, (domains.size, 3))])
    return rewards, domains


def test_count_rows_are_resamples():
    counts = count_matrix(50, 20, np.random.default_rng(1))
    assert counts.shape == (20, 50)
    assert (counts.sum(axis=1) == 50).all()
    assert counts.min() >= 0


def test_stratum_sums_equal_gathered_resamples():
    """counts @ values equals summing the resampled rows picked by the same generator."""
    values = np.random.default_rng(5).normal(size=(37, 3))
    config = BootstrapConfig(resamples=64, seed=11)
    (sums,) = stratum_sums([values], config)
    picks = np.random.default_rng(11).integers(0, 37, size=(64, 37))
    np.testing.assert_allclose(sums, values[picks].sum(axis=1), rtol=1e-12)


def test_blocking_does_not_change_the_distribution_shape():
    values = np.arange(10, dtype=float)[:, None]
    (small,) = stratum_sums([values], BootstrapConfig(resamples=300, seed=3, block_cells=10))
    assert small.shape == (300, 1)
    assert (small >= 0).all() and (small <= 90).all()


def test_spread_matches_binomial_standard_error():
    """For a subset mean of 0/1 credits, the draws' sd is close to sqrt(p(1-p)/n)."""
    n, p = 400, 0.7
    credits = np.zeros((n, 4))
    credits[: int(n * p), 0] = 1.0  # chosen on top in 70% of groups
    credits[int(n * p) :, 1] = 1.0
    draws = rb2_draws(
        credits,
        np.full(n, 4),
        np.ones(n, int),
        np.array(["Focus"] * n),
        np.arange(n).astype(str),
        BootstrapConfig(resamples=4000, seed=0),
    )["Focus"]
    assert draws.mean() == pytest.approx(p, abs=0.005)
    assert draws.std() == pytest.approx(np.sqrt(p * (1 - p) / n), rel=0.1)


def test_same_seed_same_intervals_and_point_inside():
    rewards, domains = rmbench_arrays()
    config = BootstrapConfig(resamples=500, seed=7)
    first = rmbench_intervals(rewards, domains, config)
    second = rmbench_intervals(rewards, domains, config)
    assert first == second
    other = rmbench_intervals(rewards, domains, BootstrapConfig(resamples=500, seed=8))
    assert other != first
    point = figure_values(rmbench_accuracy(rewards, domains))
    assert set(first) == set(point)
    assert {"chat.hard", "safety.easy", "overall.score", "overall.normal"} <= set(first)
    for name, value in point.items():
        assert first[name].contains(value), name
        assert first[name].low < first[name].high, name


def test_rb2_intervals_cover_every_figure(rb2_reference):
    s = read_score_files([rb2_reference])
    arrays = (s.scores, s.lengths, s.num_correct, s.subsets, s.ids)
    intervals = rb2_intervals(*arrays, BootstrapConfig(resamples=400, seed=1))
    point = figure_values(rewardbench2_scores(*arrays))
    assert set(intervals) == set(point)
    for name, value in point.items():
        assert intervals[name].contains(value), name


def test_resampling_is_stratified():
    """Every draw keeps each domain's group count, so a domain that always wins stays at 1."""
    rewards = np.array([[1.0, 1, 1, 0, 0, 0]] * 10 + [[0.0, 0, 0, 1, 1, 1]] * 10)
    domains = np.array(["chat"] * 10 + ["code"] * 10)
    draws = rmbench_draws(rewards, domains, BootstrapConfig(resamples=200))
    np.testing.assert_allclose(draws["chat.score"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(draws["code.score"], 0.0, atol=1e-12)
    np.testing.assert_allclose(draws["overall.score"], 0.5, rtol=1e-12)


def test_paired_with_itself_is_exactly_zero():
    rewards, domains = rmbench_arrays()
    paired = paired_rmbench(rewards, rewards, domains, BootstrapConfig(resamples=300))
    for figure in paired.values():
        assert figure.difference == 0.0
        assert figure.interval == Interval(0.0, 0.0)
        assert not figure.excludes_zero


def test_paired_detects_a_clear_improvement():
    rewards, domains = rmbench_arrays(shift=0.2)
    better = rewards.copy()
    better[:, :3] += 2.0  # B's chosen rewards far higher: every figure improves
    paired = paired_rmbench(rewards, better, domains, BootstrapConfig(resamples=300))
    a = rmbench_accuracy(rewards, domains)
    b = rmbench_accuracy(better, domains)
    assert paired["overall.score"].difference == pytest.approx(b.score - a.score)
    assert paired["overall.score"].excludes_zero
    assert paired["overall.score"].interval.low > 0


def test_paired_rb2_with_itself(rb2_reference):
    s = read_score_files([rb2_reference])
    paired = paired_rb2(
        s.scores, s.lengths, s.scores, s.lengths, s.num_correct, s.subsets, s.ids, BootstrapConfig(resamples=200)
    )
    assert paired["average"].a == pytest.approx(RB2_REFERENCE_AVERAGE, abs=5e-5)
    assert all(f.difference == 0.0 and f.interval == Interval(0.0, 0.0) for f in paired.values())


def test_match_groups_aligns_and_reports_differences():
    order_a, order_b = match_groups(["x/2", "x/1", "x/3"], ["x/3", "x/2", "x/1"])
    assert np.array(["x/2", "x/1", "x/3"])[order_a].tolist() == np.array(["x/3", "x/2", "x/1"])[order_b].tolist()
    with pytest.raises(
        DataError, match=r"2 group\(s\) only in a.jsonl \(e.g. x/1, x/2\); 1 group\(s\) only in b.jsonl"
    ):
        match_groups(["x/1", "x/2", "x/3"], ["x/3", "x/9"], name_a="a.jsonl", name_b="b.jsonl")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"resamples": 0}, "resamples"), ({"seed": -1}, "seed"), ({"confidence": 1.0}, "confidence")],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BootstrapConfig(**kwargs)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: BootstrapConfig(resamples=0), "resamples must lie in [1, 1000000], got 0"),
        (lambda: BootstrapConfig(resamples=1_000_001), "resamples must lie in [1, 1000000], got 1000001"),
        (lambda: MetricsConfig(resamples=-1), "resamples must lie in [0, 1000000], got -1"),
        (lambda: MetricsConfig(resamples=1_000_001), "resamples must lie in [0, 1000000], got 1000001"),
        (lambda: BootstrapConfig(seed=-1), "seed must be >= 0, got -1"),
        (lambda: MetricsConfig(seed=-1), "seed must be >= 0, got -1"),
        (lambda: BootstrapConfig(confidence=1.0), "confidence must lie in (0, 1), got 1.0"),
        (lambda: MetricsConfig(confidence=0.0), "confidence must lie in (0, 1), got 0.0"),
    ],
)
def test_resampling_settings_out_of_range_name_field_and_limit(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_resampling_limits_are_inclusive():
    assert (BootstrapConfig(resamples=1).resamples, BootstrapConfig(resamples=1_000_000).resamples) == (1, 1_000_000)
    assert (MetricsConfig(resamples=0).resamples, MetricsConfig(seed=0).seed) == (0, 0)
