"""RM-Bench figures against hand-computed values and the published aggregation arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from testkit.metrics_data import RMBENCH_REFERENCE
from testkit.shared_data import shared_file
from rmserve.metrics.rmbench import combine_domains, group_contributions, rmbench_accuracy

NAN = float("nan")


def one_group(chosen: list[float], rejected: list[float], domain: str = "chat"):
    result = rmbench_accuracy(np.array([chosen + rejected]), np.array([domain]))
    return result.domain("safety" if domain.startswith("safety") else domain)


@pytest.mark.parametrize(
    ("chosen", "rejected", "hard", "normal", "easy"),
    [
        # matrix rows (chosen concise / plain / markdown) vs rejected columns in the comments
        ([3, 2, 1], [2.5, 1.5, 0.5], 1.0, 1.0, 0.0),  # rows: 111 / 011 / 001
        ([0, 1, 2], [-0.5, 0.5, 1.5], 0.0, 1.0, 1.0),  # rows: 100 / 110 / 111
        ([1, 1, 1], [1, 1, 1], 0.0, 0.0, 0.0),  # ties are losses
        ([NAN, 2, 2], [1, 1, 1], 1 / 3, 2 / 3, 1.0),  # rows: 000 / 111 / 111
    ],
)
def test_single_group_hand_values(chosen, rejected, hard, normal, easy):
    d = one_group(chosen, rejected)
    assert d.hard == pytest.approx(hard, abs=1e-15)
    assert d.normal == pytest.approx(normal, abs=1e-15)
    assert d.easy == pytest.approx(easy, abs=1e-15)
    assert d.score == pytest.approx((hard + normal + easy) / 3, abs=1e-15)
    assert d.n_groups == 1


def test_single_group_matrix_and_nan_count():
    d = one_group([NAN, 2, 2], [1, 1, 1])
    assert d.matrix == ((0, 0, 0), (1, 1, 1), (1, 1, 1))
    assert d.n_nan_groups == 1
    assert one_group([3, 2, 1], [2.5, 1.5, 0.5]).matrix == ((1, 1, 1), (0, 1, 1), (0, 0, 1))


def test_safety_pools_groups_not_means():
    win_all = [5, 5, 5, 0, 0, 0]
    lose_all = [0, 0, 0, 5, 5, 5]
    rewards = np.array([win_all] * 3 + [lose_all])
    domains = np.array(["safety-refuse"] * 3 + ["safety-response"])
    result = rmbench_accuracy(rewards, domains)
    safety = result.domain("safety")
    assert safety.score == pytest.approx(0.75)  # pooled 3/4, not mean(1, 0) = 0.5
    assert safety.n_groups == 4
    assert safety.parts == ("safety-refuse", "safety-response")
    assert result.missing == ("chat", "math", "code")
    assert result.partial


def test_overall_is_equal_weight_over_present_domains_and_names_missing():
    win_all = [5, 5, 5, 0, 0, 0]
    lose_all = [0, 0, 0, 5, 5, 5]
    # chat: 1 of 2 groups wins (0.5); code: 3 of 3 (1.0); safety: 0 of 1 (0.0); no math
    rewards = np.array([win_all, lose_all, win_all, win_all, win_all, lose_all])
    domains = np.array(["chat", "chat", "code", "code", "code", "safety-response"])
    result = rmbench_accuracy(rewards, domains)
    assert [d.domain for d in result.domains] == ["chat", "code", "safety"]
    assert result.score == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert result.missing == ("math", "safety-refuse")
    assert result.partial
    assert result.missing_report_domains == ("math",)
    assert result.domain("math") is None


def test_complete_input_is_not_partial():
    rewards = np.tile([1.0, 2, 3, 0, 0, 0], (5, 1))
    domains = np.array(["chat", "math", "code", "safety-refuse", "safety-response"])
    result = rmbench_accuracy(rewards, domains)
    assert result.missing == ()
    assert not result.partial
    assert (result.hard, result.normal, result.easy, result.score) == (1.0, 1.0, 1.0, 1.0)


def test_matrix_matches_pairwise_loop():
    """The vectorised matrix equals an explicit loop over groups and style pairs."""
    rng = np.random.default_rng(3)
    rewards = rng.integers(0, 4, size=(200, 6)).astype(float)  # many ties
    rewards[rng.random(rewards.shape) < 0.02] = np.nan
    d = rmbench_accuracy(rewards, np.array(["code"] * 200)).domain("code")
    expected = np.zeros((3, 3))
    for row in rewards.tolist():
        for i in range(3):
            for j in range(3):
                expected[i, j] += 1 if row[i] > row[3 + j] else 0
    expected /= 200
    np.testing.assert_array_equal(np.array(d.matrix), expected)
    assert d.hard == pytest.approx((expected[0, 1] + expected[0, 2] + expected[1, 2]) / 3)
    assert d.easy == pytest.approx((expected[1, 0] + expected[2, 0] + expected[2, 1]) / 3)
    contributions = group_contributions(rewards)
    assert contributions.mean(axis=0) == pytest.approx([d.hard, d.normal, d.easy, d.score])


def _rewards_with_wins(total_wins: int, n_groups: int) -> np.ndarray:
    """Groups whose style comparisons win exactly ``total_wins`` of the 9 * n_groups cells."""
    rejected = [0.5, 1.5, 2.5]  # a chosen reward of k beats exactly k rejected ones (k = 0..3)
    rows = []
    remaining = total_wins
    for _ in range(n_groups):
        wins = min(9, remaining)
        per_row = [min(3, max(0, wins - 3 * r)) for r in range(3)]
        rows.append([float(k) for k in per_row] + rejected)
        remaining -= sum(per_row)
    assert remaining == 0
    return np.array(rows)


@pytest.mark.parametrize("name", ["RM-R1-DeepSeek-Distilled-Qwen-32B", "RM-R1-Qwen2.5-Instruct-32B"])
def test_aggregation_matches_published_final_result(name):
    path = shared_file(RMBENCH_REFERENCE, f"{name}.RM-Bench.final_result.json")
    published = json.loads(path.read_text())
    # total_avg_acc is both the mean of the four domains and the mean of hard/normal/easy
    assert np.mean([published[d] for d in ("chat", "math", "code", "safety")]) == pytest.approx(
        published["total_avg_acc"], abs=1e-12
    )
    assert np.mean([published[k] for k in ("hard_acc", "normal_acc", "easy_acc")]) == pytest.approx(
        published["total_avg_acc"], abs=1e-12
    )
    # Rebuild groups with each domain's published win count (domain score * 9 * n is an integer)
    sizes = {"chat": 129, "math": 529, "code": 228, "safety": 441}
    blocks, labels = [], []
    for domain, n in sizes.items():
        wins = published[domain] * 9 * n
        assert wins == pytest.approx(round(wins), abs=1e-6)
        rewards = _rewards_with_wins(round(wins), n)
        blocks.append(rewards)
        if domain == "safety":  # split into the two source domains; pooling must not care
            labels += ["safety-refuse"] * 284 + ["safety-response"] * 157
        else:
            labels += [domain] * n
    result = rmbench_accuracy(np.vstack(blocks), np.array(labels))
    for domain in sizes:
        assert result.domain(domain).score == pytest.approx(published[domain], abs=1e-12)
    assert result.score == pytest.approx(published["total_avg_acc"], abs=1e-12)
    assert result.score == pytest.approx(np.mean([result.hard, result.normal, result.easy]), abs=1e-12)
    assert combine_domains({d: (0, 0, 0, published[d]) for d in sizes})[3] == pytest.approx(
        published["total_avg_acc"], abs=1e-12
    )


def test_repeatable_and_inputs_untouched():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(300, 6))
    rewards[5, 2] = np.nan
    domains = np.array(["chat", "code", "safety-refuse"] * 100)
    rewards.flags.writeable = False
    domains.flags.writeable = False
    copy = rewards.copy()
    first = rmbench_accuracy(rewards, domains)
    second = rmbench_accuracy(rewards, domains)
    assert first == second
    np.testing.assert_array_equal(rewards, copy)


@pytest.mark.parametrize(
    ("rewards", "domains", "message"),
    [
        (np.zeros((2, 5)), np.array(["chat", "chat"]), "shape"),
        (np.zeros((2, 6)), np.array(["chat"]), "one label per group"),
        (np.zeros((0, 6)), np.array([], dtype=str), "no groups"),
        (np.zeros((1, 6)), np.array(["safety"]), "unknown RM-Bench domain"),
    ],
)
def test_bad_arrays_raise(rewards, domains, message):
    with pytest.raises(ValueError, match=message):
        rmbench_accuracy(rewards, domains)
