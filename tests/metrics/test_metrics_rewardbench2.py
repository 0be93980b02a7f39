"""RewardBench 2 scores against hand-computed values and the shared reference results."""

from __future__ import annotations

import math

import numpy as np
import pytest
from testkit.metrics_data import RB2_REFERENCE_AVERAGE, RB2_REFERENCE_SUBSETS, read_reference_rows
from rmserve.metrics.score_files import read_score_files
from rmserve.metrics.rewardbench2 import best_of_n_credit, rewardbench2_scores, ties_score

NAN = float("nan")


@pytest.mark.parametrize(
    ("row", "credit"),
    [
        ([1, 0, 0, 0], 1.0),
        ([1, 1, 0, 0], 0.5),
        ([1, 1, 1, 0], 1 / 3),
        ([1, 1, 1, 1], 0.25),
        ([0, 1, 1, 0], 0.0),
        ([2, NAN, 0, 0], 0.0),
    ],
)
def test_best_of_n_credit_hand_values(row, credit):
    got, has_nan = best_of_n_credit(np.array([row], dtype=float))
    assert got[0] == pytest.approx(credit, abs=1e-15)
    assert has_nan[0] == any(math.isnan(x) for x in row)


def test_best_of_n_ignores_padding():
    scores = np.array([[1.0, 0.0, 9.0, 9.0], [1.0, 1.0, 0.0, 5.0]])
    credit, _ = best_of_n_credit(scores, np.array([2, 3]))
    assert credit.tolist() == [1.0, 0.5]


def ties_rows(rows: list[tuple[str, list[float], int]]):
    width = max(len(s) for _, s, _ in rows)
    scores = np.full((len(rows), width), np.nan)
    for k, (_, s, _) in enumerate(rows):
        scores[k, : len(s)] = s
    lengths = np.array([len(s) for _, s, _ in rows])
    num_correct = np.array([c for _, _, c in rows])
    ids = np.array([i for i, _, _ in rows])
    return scores, lengths, num_correct, ids


def test_ties_hand_example_with_margins():
    rows = [
        # prompt 0: ref accurate, margin 5-2=3; tied [4,6 | 3,1]: accurate, spread 2, margin 1
        ("ref:0", [5, 1, 2], 1),
        ("tied:0", [4, 6, 3, 1], 2),
        # prompt 1: ref not accurate, margin 2-3=-1; tied [10,9 | 0,1]: accurate, spread 1, margin 8
        ("ref:1", [2, 3], 1),
        ("tied:1", [10, 9, 0, 1], 2),
        # prompt 2: ref only (counts for ref accuracy, not for the pair terms)
        ("ref:2", [1, 0], 1),
    ]
    t = ties_score(*ties_rows(rows))
    assert t.ref_accuracy == pytest.approx(2 / 3)
    assert t.tied_accuracy == pytest.approx(1.0)
    # preferred: 1 > 2 no; 8 > 1 yes.  hard: min(3,1)=1 > 2 no; min(-1,8)=-1 > 1 no
    assert t.correctness_preferred == pytest.approx(0.5)
    assert t.correctness_preferred_hard == pytest.approx(0.0)
    margin = (math.tanh(1 / 2 - 1) + math.tanh(-1 / 1 - 1)) / 2
    assert t.correctness_margin_score == pytest.approx(margin)
    expected = 0.3 * 1.0 + 0.3 * (2 / 3) + 0.2 * 0.5 + 0.2 * 0.0 + 0.01 * margin
    assert t.score == pytest.approx(expected, abs=1e-15)
    assert (t.n_ref, t.n_tied, t.n_prompts_paired, t.n_nan_groups) == (3, 2, 2, 0)


def test_ties_zero_spread_gives_full_margin_term():
    # tied correct answers score equally (spread 0) above every incorrect: x/0 = inf, tanh → 1
    t = ties_score(*ties_rows([("ref:7", [5, 0], 1), ("tied:7", [3, 3, 1], 2)]))
    assert t.correctness_margin_score == 1.0
    assert t.score == pytest.approx(1.01)


def test_constant_model_scores_zero_on_ties():
    rows = [("ref:0", [0.0] * 5, 1), ("tied:0", [0.0] * 6, 3), ("ref:1", [0.0] * 4, 1), ("tied:1", [0.0] * 4, 2)]
    t = ties_score(*ties_rows(rows))
    assert t.score == 0.0
    assert (t.ref_accuracy, t.tied_accuracy, t.correctness_margin_score) == (0.0, 0.0, 0.0)


def test_nan_rows_are_never_accurate():
    t = ties_score(*ties_rows([("ref:0", [5, NAN], 1), ("tied:0", [4, 4.5, 1], 2)]))
    assert t.ref_accuracy == 0.0
    assert t.tied_accuracy == 1.0
    assert t.correctness_preferred_hard == 0.0  # min(NaN, 3) comparison is false
    assert t.correctness_margin_score == 0.0  # NaN term → 0
    assert t.n_nan_groups == 1


def test_ties_rejects_duplicate_and_malformed_rows():
    with pytest.raises(ValueError, match="more than one 'ref' row"):
        ties_score(*ties_rows([("ref:0", [1, 0], 1), ("ref:0", [1, 0], 1)]))
    with pytest.raises(ValueError, match="ref:<n>"):
        ties_score(*ties_rows([("tie:0", [1, 0], 1)]))
    with pytest.raises(ValueError, match="num_correct"):
        ties_score(*ties_rows([("tied:0", [1, 0], 2)]))


def test_partial_average_names_missing_subsets():
    scores = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [1.0, 1.0, 0, 0]])
    result = rewardbench2_scores(
        scores,
        np.full(3, 4),
        np.ones(3, int),
        np.array(["Factuality", "Factuality", "Focus"]),
        np.array(["0", "1", "0"]),
    )
    assert [s.subset for s in result.subsets] == ["Factuality", "Focus"]
    assert result.subset("Factuality").score == 0.5
    assert result.average == pytest.approx((0.5 + 0.5) / 2)
    assert result.missing == ("Precise IF", "Math", "Safety", "Ties")
    assert result.partial and result.ties is None


def test_non_ties_with_several_correct_is_rejected():
    with pytest.raises(ValueError, match="num_correct must be 1"):
        rewardbench2_scores(np.zeros((1, 4)), [4], [2], np.array(["Math"]), np.array(["0"]))


def test_credits_equal_reference_results_per_item(rb2_reference):
    rows = [r for r in read_reference_rows(rb2_reference) if r["subset"] != "Ties"]
    assert len(rows) == 1763
    scores = np.array([[s[0] for s in r["scores"]] for r in rows])
    credit, has_nan = best_of_n_credit(scores)
    expected = np.array([r["results"] for r in rows], dtype=float)
    np.testing.assert_array_equal(credit, expected)
    assert not has_nan.any()


def test_reference_aggregates(rb2_reference):
    s = read_score_files([rb2_reference])
    result = rewardbench2_scores(s.scores, s.lengths, s.num_correct, s.subsets, s.ids)
    for name, value in RB2_REFERENCE_SUBSETS.items():
        assert result.subset(name).score == pytest.approx(value, abs=5e-5), name
    assert result.average == pytest.approx(RB2_REFERENCE_AVERAGE, abs=5e-5)
    assert not result.partial
    assert result.ties.n_prompts_paired == 51


def test_repeatable_and_inputs_untouched(rb2_reference):
    s = read_score_files([rb2_reference])
    arrays = (s.scores, s.lengths, s.num_correct, s.subsets, s.ids)
    assert all(not a.flags.writeable for a in arrays)
    copies = [a.copy() for a in arrays]
    first = rewardbench2_scores(*arrays)
    second = rewardbench2_scores(*arrays)
    assert first == second
    for a, c in zip(arrays, copies, strict=True):
        np.testing.assert_array_equal(a, c)
