"""Generative-judge figures against hand-computed values and the classifier-path functions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from rmserve.metrics.judge import (
    judge_parse_failures,
    parse_failure_rates,
    rb2_judge_arrays,
    rewardbench2_from_judge,
    rewardbench2_judge_scores,
    rmbench_from_judge,
    rmbench_judge_accuracy,
)
from rmserve.metrics.rewardbench2 import best_of_n_credit, ties_score
from rmserve.metrics.rmbench import rmbench_accuracy, style_wins
from rmserve.server.kinds.judge_protocols import rating_credit

from rmserve.judge_records import JudgeCall, JudgeGroupResult, JudgeParse

NAN = float("nan")


def call(reason: str = "ok", finish: str = "stop", *, rating: int | None = None, verdict: str | None = None,
         protocol: str = "rb2-rating") -> JudgeCall:
    if reason == "ok" and rating is None and verdict is None:
        rating = 5
    return JudgeCall(
        protocol=protocol,
        messages_sha256="0" * 64,
        responses=(0,),
        text="...",
        parse=JudgeParse("rb2-rating", reason, verdict=verdict, rating=rating),
        prompt_tokens=10,
        completion_tokens=5,
        finish_reason=finish,
    )


def rb2_record(subset: str, id: str, *, credit=None, ratings=None, num_chosen=1, calls=()) -> JudgeGroupResult:
    protocol = "rb2-rating-ties" if subset == "Ties" else ("rb2-rating" if ratings is not None else "rb2-ranking")
    return JudgeGroupResult(
        benchmark="rewardbench2", domain=subset, id=id, protocol=protocol, compat="none",
        num_chosen=num_chosen, calls=tuple(calls), credit=credit, ratings=ratings,
    )


# Hand-made Ties rows (ratings, None = failed rating, counted -1 as upstream):
#   ref:0  [8, 5, 3]        nc=1  margin 8-5=3, accurate
#   tied:0 [9, 8, 4, None]  nc=2  margin 8-4=4, spread 1, accurate
#   ref:1  [None, 6, 2]     nc=1  margin -1-6=-7, not accurate
#   tied:1 [7, 7, 7, 5]     nc=3  margin 2, spread 0, accurate
# prompt 0: preferred 4>1 yes; hard min(3,4)=3>1 yes; margin tanh(3/1-1)=tanh(2)
# prompt 1: preferred 2>0 yes; hard min(-7,2)>0 no; margin tanh(-7/0-1)=tanh(-inf)=-1
TIES_ROWS = [
    ("ref:0", (8, 5, 3), 1),
    ("tied:0", (9, 8, 4, None), 2),
    ("ref:1", (None, 6, 2), 1),
    ("tied:1", (7, 7, 7, 5), 3),
]
TIES_EXPECTED = {
    "ref_accuracy": 0.5,
    "tied_accuracy": 1.0,
    "correctness_preferred": 1.0,
    "correctness_preferred_hard": 0.5,
    "correctness_margin_score": (math.tanh(2.0) - 1.0) / 2,
}
TIES_SCORE = 0.3 * 1.0 + 0.3 * 0.5 + 0.2 * 1.0 + 0.2 * 0.5 + 0.01 * (math.tanh(2.0) - 1.0) / 2  # 0.7498201379...


def hand_made_rb2() -> list[JudgeGroupResult]:
    records = [
        rb2_record("Factuality", "0", credit=1.0),
        rb2_record("Factuality", "1", credit=0.0),
        rb2_record("Factuality", "2", credit=0.25),
        rb2_record("Factuality", "3", credit=0.5, ratings=(9, 9, 7, None)),
        rb2_record("Math", "0", credit=1 / 3, ratings=(6, 6, 6, 1)),
    ]
    records += [rb2_record("Ties", i, ratings=r, num_chosen=nc) for i, r, nc in TIES_ROWS]
    return records


def test_rewardbench2_judge_hand_values():
    result = rewardbench2_from_judge(hand_made_rb2())
    assert [s.subset for s in result.subsets] == ["Factuality", "Math", "Ties"]
    assert result.subset("Factuality").score == pytest.approx(1.75 / 4, abs=1e-15)
    assert result.subset("Math").score == pytest.approx(1 / 3, abs=1e-15)
    assert result.subset("Ties").score == pytest.approx(TIES_SCORE, abs=1e-12)
    assert TIES_SCORE == pytest.approx(0.749820137900379, abs=1e-12)
    for name, value in TIES_EXPECTED.items():
        assert getattr(result.ties, name) == pytest.approx(value, abs=1e-12), name
    assert result.average == pytest.approx((1.75 / 4 + 1 / 3 + TIES_SCORE) / 3, abs=1e-12)
    assert result.missing == ("Precise IF", "Safety", "Focus") and result.partial


def test_ties_path_matches_the_classifier_function_with_minus_one():
    width = max(len(r) for _, r, _ in TIES_ROWS)
    padded = np.full((4, width), 123.0)  # padding is ignored whatever it holds
    for k, (_, ratings, _) in enumerate(TIES_ROWS):
        padded[k, : len(ratings)] = [-1.0 if x is None else x for x in ratings]
    lengths = np.array([len(r) for _, r, _ in TIES_ROWS])
    num_correct = np.array([nc for *_, nc in TIES_ROWS])
    ids = np.array([i for i, *_ in TIES_ROWS])
    classifier = ties_score(padded, lengths, num_correct, ids)
    judged = rewardbench2_from_judge(hand_made_rb2()).ties
    assert judged == classifier
    # A failed rating is -1 (as upstream), not "missing": as NaN the margin term would be 0 for prompt 1.
    nan_filled = padded.copy()
    nan_filled[nan_filled == -1.0] = NAN
    as_nan = ties_score(nan_filled, lengths, num_correct, ids)
    assert as_nan.score != pytest.approx(judged.score, abs=1e-6)


def test_rb2_arrays_from_records():
    arrays = rb2_judge_arrays(hand_made_rb2())
    assert arrays.lengths.tolist() == [4, 4, 4, 4, 4, 3, 4, 3, 4]
    assert np.isnan(arrays.credit[5:]).all() and arrays.credit[:5].tolist() == [1.0, 0.0, 0.25, 0.5, 1 / 3]
    assert np.isnan(arrays.ratings[3, 3]) and arrays.ratings[3, :3].tolist() == [9, 9, 7]
    assert arrays.num_correct.tolist() == [1, 1, 1, 1, 1, 1, 2, 1, 3]


def test_rb2_records_must_carry_their_score():
    with pytest.raises(ValueError, match="Ties record needs ratings"):
        rb2_judge_arrays([rb2_record("Ties", "ref:0", credit=1.0)])
    with pytest.raises(ValueError, match="non-Ties record needs a credit"):
        rb2_judge_arrays([rb2_record("Math", "0", ratings=(1, 2, 3, 4))])


def test_rb2_scores_reject_bad_credit():
    with pytest.raises(ValueError, match="credit"):
        rewardbench2_judge_scores(np.array([NAN]), np.array(["Math"]), np.zeros((1, 4)), np.array([4]),
                                  np.array([1]), np.array(["0"]))


RATING_VALUES = (None, 1, 5, 10)


def test_official_rating_credit_equals_best_of_n_with_minus_one_for_four_answers():
    # The official rule (failed ratings left out, 0.25 when all fail) and best-of-4 over the ratings
    # with -1 for a failure agree on every 4-answer group: all four failed tie 4 ways = 1/4.
    combos = list(itertools.product(RATING_VALUES, repeat=4))
    rewards = np.array([[-1.0 if x is None else x for x in c] for c in combos])
    vectorised, _ = best_of_n_credit(rewards)
    assert [rating_credit(c) for c in combos] == pytest.approx(vectorised.tolist(), abs=1e-15)


def test_rating_credit_and_best_of_n_differ_off_four_answers():
    # With 3 answers and all failed, the official constant 0.25 is not 1/3: the rule is the constant.
    assert rating_credit((None, None, None)) == 0.25
    assert best_of_n_credit(np.array([[-1.0, -1.0, -1.0]]))[0][0] == pytest.approx(1 / 3)


# --- RM-Bench ---------------------------------------------------------------------------------


def test_rmbench_judge_hand_values():
    cells = np.array([
        [[1, 0.5, 0], [1, 1, 0.5], [1, 1, 1]],
        [[0.5, 0, 0], [1, 0.5, 0], [1, 1, 0.5]],
        [[0, 0, 0], [0, 0, 0], [0, 0, 0.5]],
    ])
    result = rmbench_judge_accuracy(cells, np.array(["chat", "chat", "code"]))
    chat, code = result.domain("chat"), result.domain("code")
    assert chat.matrix == ((0.75, 0.25, 0.0), (1.0, 0.75, 0.25), (1.0, 1.0, 0.75))
    assert (chat.hard, chat.normal, chat.easy) == pytest.approx((1 / 6, 0.75, 1.0), abs=1e-15)
    assert chat.score == pytest.approx((1 / 6 + 0.75 + 1.0) / 3, abs=1e-15)
    assert (code.hard, code.normal, code.easy) == pytest.approx((0.0, 0.5 / 3, 0.0), abs=1e-15)
    assert result.hard == pytest.approx(1 / 12, abs=1e-15)
    assert result.normal == pytest.approx((0.75 + 0.5 / 3) / 2, abs=1e-15)
    assert result.easy == pytest.approx(0.5, abs=1e-15)
    assert result.missing == ("math", "safety-refuse", "safety-response") and result.partial


def test_rmbench_judge_pools_safety_by_group_count():
    ones, zeros = np.ones((3, 3)), np.zeros((3, 3))
    result = rmbench_judge_accuracy(np.stack([ones, zeros, zeros]),
                                    np.array(["safety-refuse", "safety-response", "safety-response"]))
    safety = result.domain("safety")
    assert safety.parts == ("safety-refuse", "safety-response") and safety.n_groups == 3
    assert safety.score == pytest.approx(1 / 3, abs=1e-15)


def test_rmbench_judge_with_win_cells_equals_the_classifier_path():
    rng = np.random.default_rng(7)
    rewards = rng.integers(0, 4, size=(200, 6)).astype(float)  # many exact ties: strict > counts them as losses
    domains = rng.choice(["chat", "code", "safety-refuse", "safety-response"], size=200)
    judged = rmbench_judge_accuracy(style_wins(rewards).astype(float), domains)
    assert judged == rmbench_accuracy(rewards, domains)


def test_rmbench_judge_rejects_bad_cells():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rmbench_judge_accuracy(np.full((1, 9), 1.5), np.array(["chat"]))
    with pytest.raises(ValueError, match="shape"):
        rmbench_judge_accuracy(np.zeros((1, 4)), np.array(["chat"]))


def test_rmbench_from_records():
    record = JudgeGroupResult(
        benchmark="rm-bench", domain="chat", id="1", protocol="rmbench-pairwise", compat="none", num_chosen=3,
        calls=(), cells=(0.75, 0.0, 0.75, 1.0, 0.5, 0.5, 1.0, 0.75, 0.0),
    )
    chat = rmbench_from_judge([record]).domain("chat")
    assert (chat.hard, chat.normal, chat.easy) == pytest.approx((1.25 / 3, 1.25 / 3, 2.75 / 3), abs=1e-15)


# --- parse failures ---------------------------------------------------------------------------


def test_parse_failure_rates_hand_values():
    records = [
        rb2_record("Math", "0", credit=0.25, ratings=(None, None, None, None), calls=(
            call("no_trailing_rating"), call("truncated", "length"), call("not_integer"), call("no_trailing_rating"))),
        rb2_record("Math", "1", credit=1.0, ratings=(9, 1, 1, 1), calls=(
            call(rating=9), call(rating=1, finish="length"), call(rating=1), call(rating=1))),
        rb2_record("Factuality", "0", credit=1.0, calls=(call(verdict="A", protocol="rb2-ranking"),)),
    ]
    rows = judge_parse_failures(records)
    assert [(r.benchmark, r.domain) for r in rows] == [("rewardbench2", "Factuality"), ("rewardbench2", "Math")]
    fact, math_ = rows
    assert (fact.n_calls, fact.n_failed, fact.rate, fact.n_truncated, fact.reasons) == (1, 0, 0.0, 0, ())
    assert (math_.n_calls, math_.n_failed, math_.rate, math_.n_truncated) == (8, 4, 0.5, 2)
    assert math_.reasons == (("no_trailing_rating", 2), ("not_integer", 1), ("truncated", 1))


def test_parse_failure_rates_checks_lengths():
    with pytest.raises(ValueError, match="one length"):
        parse_failure_rates(np.array(["rm-bench"]), np.array(["chat", "code"]), np.array(["ok"]), np.array([False]))
