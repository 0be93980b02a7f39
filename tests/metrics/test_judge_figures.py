"""The shared assembly of figures (classifier and judge paths) and the judge's unscored groups.

Array-level tests: :func:`rmbench_from_parts` and :func:`rb2_from_parts` (the one pooling /
assembly both paths use), a judge's groups without verdicts counted as the classifier path
counts a group without rewards, and the judge's bootstrap strata against the classifier's.
Every expected value is worked out by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from rmserve.metrics.bootstrap import BootstrapConfig, rb2_intervals, rmbench_intervals, strata_intervals
from rmserve.metrics.judge import (
    rb2_judge_strata,
    rewardbench2_judge_scores,
    rmbench_judge_accuracy,
    rmbench_judge_strata,
)
from rmserve.metrics.rewardbench2 import best_of_n_credit, rb2_from_parts, rewardbench2_scores, ties_score
from rmserve.metrics.rmbench import rmbench_accuracy, rmbench_from_parts, style_wins

NAN = float("nan")


# --- the shared assembly ----------------------------------------------------------------------


def test_rmbench_from_parts_pools_safety_by_group_count_and_counts_unscored_groups():
    # Source-domain order: chat, math, code, safety-refuse, safety-response.
    sums = np.zeros((5, 3, 3))
    sums[0] = [[2, 1, 0], [2, 2, 1], [2, 2, 2]]  # chat: 2 groups
    sums[3] = np.full((3, 3), 3.0)  # safety-refuse: 3 groups, every cell won
    sums[4] = np.zeros((3, 3))  # safety-response: 1 group, every cell lost (unscored)
    result = rmbench_from_parts(sums, np.array([2, 0, 0, 3, 1]), np.array([0, 0, 0, 0, 1]))
    chat, safety = result.domain("chat"), result.domain("safety")
    # chat matrix = sums / 2 = [[1, .5, 0], [1, 1, .5], [1, 1, 1]]: hard (.5 + 0 + .5)/3 = 1/3, normal 1, easy 1.
    assert chat.matrix == ((1.0, 0.5, 0.0), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0))
    assert (chat.hard, chat.normal, chat.easy) == pytest.approx((1 / 3, 1.0, 1.0), abs=1e-15)
    # safety = (3 + 0) / (3 + 1) = 0.75 in every cell; the unscored group is counted.
    assert safety.parts == ("safety-refuse", "safety-response")
    assert safety.matrix == ((0.75,) * 3,) * 3 and safety.n_groups == 4 and safety.n_nan_groups == 1
    # overall: equal-weight means of chat and safety.
    assert result.hard == pytest.approx((1 / 3 + 0.75) / 2, abs=1e-15)
    assert result.normal == pytest.approx((1.0 + 0.75) / 2, abs=1e-15)
    assert result.missing == ("math", "code") and result.partial


def test_rmbench_from_parts_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"cell_sums must have shape \(5, 3, 3\)"):
        rmbench_from_parts(np.zeros((4, 3, 3)), np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match="no groups"):
        rmbench_from_parts(np.zeros((5, 3, 3)), np.zeros(5), np.zeros(5))


def test_rb2_from_parts_hand_values():
    # Factuality credits 1, 0, 0.25, 1/3 -> (1 + 0 + 0.25 + 0.333...) / 4 = 0.3958333...
    # Math: one unscored group (credit 0, flagged) and one won -> 0.5, n_nan_groups 1.
    credit = np.array([1.0, 0.0, 0.25, 1 / 3, 0.0, 1.0])
    has_nan = np.array([False, False, False, False, True, False])
    subsets = np.array(["Factuality"] * 4 + ["Math"] * 2)
    result = rb2_from_parts(credit, has_nan, subsets, None)
    assert result.subset("Factuality").score == pytest.approx(0.3958333333333333, abs=1e-15)
    assert result.subset("Math").score == 0.5 and result.subset("Math").n_nan_groups == 1
    assert result.average == pytest.approx((0.3958333333333333 + 0.5) / 2, abs=1e-15)
    assert result.missing == ("Precise IF", "Safety", "Focus", "Ties")


def test_rb2_from_parts_needs_ties_exactly_with_ties_rows():
    with pytest.raises(ValueError, match="ties must be given exactly when there are Ties rows"):
        rb2_from_parts(np.array([NAN]), np.array([False]), np.array(["Ties"]), None)


# --- a judge's groups without verdicts --------------------------------------------------------


def test_rb2_unscored_groups_count_as_the_classifier_counts_a_group_without_rewards():
    # Rows: Factuality credit 1; Factuality unscored (its credit NaN is not read);
    # Ties ref:0 ratings (9, 1, 1) accurate, margin 8, spread 0;
    # Ties tied:0 unscored (all NaN): never accurate, not preferred, margin term 0.
    credit = np.array([1.0, NAN, NAN, NAN])
    ratings = np.array([[NAN] * 4, [NAN] * 4, [9.0, 1.0, 1.0, NAN], [NAN] * 4])
    lengths = np.array([4, 4, 3, 4])
    num_correct = np.array([1, 1, 1, 2])
    subsets = np.array(["Factuality", "Factuality", "Ties", "Ties"])
    ids = np.array(["0", "1", "ref:0", "tied:0"])
    unscored = np.array([False, True, False, True])
    result = rewardbench2_judge_scores(credit, subsets, ratings, lengths, num_correct, ids, unscored)
    fact, ties = result.subset("Factuality"), result.subset("Ties")
    assert fact.score == 0.5 and fact.n_nan_groups == 1
    # ref accuracy 1/1, tied accuracy 0/1, preferred 0, hard 0, margin 0 -> 0.3 * 1 = 0.3.
    assert ties.score == pytest.approx(0.3, abs=1e-15) and ties.n_nan_groups == 1
    # The classifier path on the same groups with NaN rewards for the unscored ones gives the same.
    scores = np.array([[5.0, 1.0, 1.0, 1.0], [NAN] * 4, [9.0, 1.0, 1.0, NAN], [NAN] * 4])
    assert rewardbench2_scores(scores, lengths, num_correct, subsets, ids) == result


def test_rmbench_unscored_groups_lose_every_comparison():
    cells = np.array([np.ones(9), np.full(9, NAN)])  # the second group's cells are not read
    result = rmbench_judge_accuracy(cells, np.array(["chat", "chat"]), np.array([False, True]))
    chat = result.domain("chat")
    # (1 + 0) / 2 in every cell; the classifier path counts a NaN reward the same way.
    assert chat.matrix == ((0.5,) * 3,) * 3 and chat.n_nan_groups == 1
    rewards = np.array([[2.0, 2.0, 2.0, 1.0, 1.0, 1.0], [NAN] * 6])
    assert rmbench_accuracy(rewards, np.array(["chat", "chat"])) == result


def test_rmbench_unscored_mask_must_match():
    with pytest.raises(ValueError, match=r"unscored must have shape \(1,\)"):
        rmbench_judge_accuracy(np.ones((1, 9)), np.array(["chat"]), np.array([True, False]))


# --- intervals from the judge's strata --------------------------------------------------------


def test_rmbench_judge_intervals_equal_the_classifier_intervals_on_win_cells():
    rng = np.random.default_rng(11)
    rewards = rng.integers(0, 3, size=(120, 6)).astype(float)
    domains = rng.choice(["chat", "math", "safety-refuse", "safety-response"], size=120)
    config = BootstrapConfig(resamples=200, seed=4)
    names, strata = rmbench_judge_strata(style_wins(rewards).astype(float), domains)
    assert strata_intervals("rm-bench", names, strata, config) == rmbench_intervals(rewards, domains, config)


def test_rb2_judge_intervals_equal_the_classifier_intervals_when_credits_and_ratings_agree():
    rng = np.random.default_rng(5)
    n = 40
    scores = rng.integers(1, 5, size=(n, 4)).astype(float)
    subsets = np.array(["Math"] * 20 + ["Focus"] * 20)
    ids = np.array([str(i) for i in range(n)])
    ones = np.ones(n, dtype=np.int64)
    credit, _ = best_of_n_credit(scores)
    # Ties: two prompts, ratings as rewards (no failed rating, so -1 never enters).
    ties_scores = np.array([[8.0, 5.0, 3.0, NAN], [9.0, 8.0, 4.0, 2.0], [6.0, 6.0, 2.0, NAN], [7.0, 5.0, 6.0, NAN]])
    all_scores = np.vstack([scores, ties_scores])
    lengths = np.array([4] * n + [3, 4, 3, 3])
    num_correct = np.concatenate([ones, [1, 2, 1, 2]])
    all_subsets = np.concatenate([subsets, ["Ties"] * 4])
    all_ids = np.concatenate([ids, ["ref:0", "tied:0", "ref:1", "tied:1"]])
    all_credit = np.concatenate([credit, [NAN] * 4])
    config = BootstrapConfig(resamples=150, seed=9)
    names, strata = rb2_judge_strata(all_credit, all_subsets, all_scores, lengths, num_correct, all_ids)
    judged = strata_intervals("rewardbench2", names, strata, config)
    assert judged == rb2_intervals(all_scores, lengths, num_correct, all_subsets, all_ids, config)


def test_ties_hand_values_through_the_judge_path():
    # ref:0 (8, 5, 3) nc=1: accurate (8 > 5), margin 3.   tied:0 (9, 8, 4, fail) nc=2: accurate (8 > 4),
    # margin 8 - 4 = 4, spread 1. Prompt 0: preferred 4 > 1, hard min(3, 4) = 3 > 1, margin tanh(3/1 - 1) = tanh 2.
    # ref:1 (6, 6, 2) nc=1: not accurate (6 > 6 fails), margin 0.  tied:1 (7, 5, 6) nc=2: not accurate
    # (5 > 6 fails), margin -1, spread 2. Prompt 1: preferred -1 > 2 no, hard -1 > 2 no, margin tanh(-1/2 - 1).
    # Ties = .3 * .5 + .3 * .5 + .2 * .5 + .2 * .5 + .01 * (tanh 2 - tanh 1.5) / 2 = 0.5002943966321548
    ratings = np.array([[8, 5, 3, NAN], [9, 8, 4, NAN], [6, 6, 2, NAN], [7, 5, 6, NAN]])
    lengths = np.array([3, 4, 3, 3])
    num_correct = np.array([1, 2, 1, 2])
    ids = np.array(["ref:0", "tied:0", "ref:1", "tied:1"])
    result = rewardbench2_judge_scores(np.full(4, NAN), np.array(["Ties"] * 4), ratings, lengths, num_correct, ids)
    assert result.ties.score == pytest.approx(0.5002943966321548, abs=1e-15)
    assert result.ties.correctness_margin_score == pytest.approx((math.tanh(2.0) - math.tanh(1.5)) / 2, abs=1e-15)
    filled = ratings.copy()
    filled[1, 3] = -1.0  # the failed rating, as the official script passes it on
    assert result.ties == ties_score(filled, lengths, num_correct, ids)
