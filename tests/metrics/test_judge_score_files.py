"""Score files of a generative judge: figures from the verdicts, parse failures, headers, CLI.

The records are built by hand as a judge run writes them (``ScoreRecord`` of kind ``judge``
with the ``JudgeGroupResult`` in ``judge``, encoded with :func:`rmserve.schema.encode`). Their
per-response ``rewards`` are deliberately set against the verdicts, so a figure computed from
the rewards instead of the verdicts fails these tests. Expected values are worked out in the
comments.
"""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from rmserve.metrics.comparison import compare_files
from rmserve.metrics.evaluation import MetricsConfig, evaluate_files, evaluate_records
from rmserve.metrics.figures import heatmap_figure
from rmserve.metrics.outputs import write_outputs
from rmserve.metrics.render_json import comparison_dict, result_dict
from rmserve.metrics.render_markdown import render_comparison, render_markdown
from rmserve.server.kinds.judge_protocols import rating_credit
from testkit.metrics_data import rmbench_record, write_jsonl
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError
from rmserve.judge_records import JudgeCall, JudgeGroupResult, JudgeParse
from rmserve.schema import RMBENCH_STYLES, ResponseError, ScoreKind, ScoreRecord

runner = CliRunner()


def call(protocol: str, reason: str = "ok", finish: str = "stop", *, verdict=None, rating=None) -> JudgeCall:
    parser = {"rmbench-pairwise": "rmbench-pairwise", "rb2-ranking": "rb2-ranking-official"}.get(protocol, "rb2-rating")
    return JudgeCall(
        protocol=protocol,
        messages_sha256="0" * 64,
        responses=(0, 1),
        text="[[A]]" if verdict else "...",
        parse=JudgeParse(parser, reason, verdict=verdict, rating=rating),
        prompt_tokens=40,
        completion_tokens=32 if finish == "length" else 6,
        finish_reason=finish,
    )


def rated_calls(ratings, truncated=()) -> tuple[JudgeCall, ...]:
    """One rating call per answer: None = no trailing rating (or ``truncated`` when listed there)."""
    out = []
    for k, r in enumerate(ratings):
        if r is None:
            reason = "truncated" if k in truncated else "no_trailing_rating"
            out.append(call("rb2-rating", reason, "length" if k in truncated else "stop"))
        else:
            out.append(call("rb2-rating", rating=r, finish="length" if k in truncated else "stop"))
    return tuple(out)


def judge_record(benchmark, domain, id, num_chosen, n, judge, *, mode="ratings", rewards=None) -> ScoreRecord:
    """A judge's score record; without ``judge`` the group is unscored (null rewards, errors)."""
    errors = None
    if judge is None:
        rewards = (None,) * n
        errors = (ResponseError("sequence_too_long", "judge prompt of 5,000 tokens, over max_model_len=4096"),) * n
    return ScoreRecord(
        benchmark=benchmark, domain=domain, id=id, num_chosen=num_chosen, rewards=tuple(rewards),
        num_tokens=(10,) * n, num_cached_tokens=(0,) * n, model="judge-lm", fingerprint="feed",
        styles=RMBENCH_STYLES + RMBENCH_STYLES if benchmark == "rm-bench" else None,
        errors=errors, kind="judge", mode=mode, compat="none", judge=judge,
    )


def rb2_rated(subset, id, ratings, *, num_chosen=1, truncated=()) -> ScoreRecord:
    protocol = "rb2-rating-ties" if subset == "Ties" else "rb2-rating"
    judge = JudgeGroupResult(
        benchmark="rewardbench2", domain=subset, id=id, protocol=protocol, compat="none", num_chosen=num_chosen,
        calls=rated_calls(ratings, truncated),
        credit=None if subset == "Ties" else rating_credit(ratings),
        ratings=tuple(ratings),
    )
    # Rewards against the verdicts: the correct answer gets the lowest value.
    contrary = tuple([0.0] * num_chosen + [10.0] * (len(ratings) - num_chosen))
    return judge_record("rewardbench2", subset, id, num_chosen, len(ratings), judge, rewards=contrary)


# Factuality, ratings protocol, 4 groups:
#   0: (9, 3, 2, 1)          correct answer alone on top             credit 1
#   1: (2, 8, 1, 1)          a wrong answer on top                   credit 0
#   2: (—, —, —, —)          every rating failed (official 0.25)     credit 0.25   4 failed calls, 1 cut
#   3: (7, 7, 7, 2)          three-way tie at the top                credit 1/3
#   Factuality = (1 + 0 + 0.25 + 1/3) / 4 = 0.3958333...
# Ties (hand-worked in test_judge_figures.test_ties_hand_values_through_the_judge_path):
#   ref:0 (8, 5, 3), tied:0 (9, 8, 4, —), ref:1 (6, 6, 2), tied:1 (7, 5, 6) -> 0.5002943966321548
#   one failed rating in tied:0.
# Average = (0.3958333... + 0.5002943966...) / 2 = 0.44806386498...
FACT = (1 + 0 + 0.25 + 1 / 3) / 4
TIES = 0.5 + 0.005 * (math.tanh(2.0) - math.tanh(1.5))


def rb2_records() -> list[ScoreRecord]:
    return [
        rb2_rated("Factuality", "0", (9, 3, 2, 1)),
        rb2_rated("Factuality", "1", (2, 8, 1, 1)),
        rb2_rated("Factuality", "2", (None, None, None, None), truncated=(3,)),
        rb2_rated("Factuality", "3", (7, 7, 7, 2)),
        rb2_rated("Ties", "ref:0", (8, 5, 3)),
        rb2_rated("Ties", "tied:0", (9, 8, 4, None), num_chosen=2),
        rb2_rated("Ties", "ref:1", (6, 6, 2)),
        rb2_rated("Ties", "tied:1", (7, 5, 6), num_chosen=2),
    ]


def test_rewardbench2_figures_come_from_the_verdicts():
    assert [rating_credit(r) for r in ((9, 3, 2, 1), (2, 8, 1, 1), (None,) * 4, (7, 7, 7, 2))] == [1, 0, 0.25, 1 / 3]
    evaluation = evaluate_records(rb2_records(), MetricsConfig(resamples=0))
    result = evaluation.result
    assert result.subset("Factuality").score == pytest.approx(0.3958333333333333, abs=1e-15)
    assert result.subset("Ties").score == pytest.approx(0.5002943966321548, abs=1e-15)
    assert result.average == pytest.approx(0.44806386498274405, abs=1e-15)
    assert (FACT + TIES) / 2 == pytest.approx(0.44806386498274405, abs=1e-15)
    # From the (contrary) rewards every group would score 0: the correct answers hold the lowest value.
    summary = evaluation.judge.summary
    assert summary.protocols == ("rb2-rating", "rb2-rating-ties") and summary.mode == "ratings"
    # calls: 4 * 4 Factuality + 3 + 4 + 3 + 3 Ties = 29; failed: 4 (Factuality 2) + 1 (tied:0); cut: 1.
    assert (summary.n_calls, summary.n_failed, summary.n_truncated, summary.seeds) == (29, 5, 1, ())


def test_rewardbench2_parse_failure_columns_and_header():
    evaluation = evaluate_records(rb2_records(), MetricsConfig(resamples=0))
    data = result_dict(evaluation)
    # Factuality: 4 failed of 16 calls = 25 %, 1 cut at max_tokens; Ties: 1 of 13 = 7.69 %.
    assert data["subsets"]["Factuality"]["parse_failures"] == {
        "rate": 0.25, "n_failed": 4, "n_calls": 16, "n_truncated": 1,
        "reasons": {"no_trailing_rating": 3, "truncated": 1},
    }
    assert data["subsets"]["Ties"]["parse_failures"]["rate"] == pytest.approx(1 / 13, abs=1e-15)
    assert data["judge"]["parse_failure_rate"] == pytest.approx(5 / 29, abs=1e-15)
    assert data["judge"]["n_truncated"] == 1 and data["judge"]["protocol_note"] is None
    assert data["judge"]["readers"] == ["rb2-rating"] and data["judge"]["thinking"] == []
    assert data["reward"] == {"name": "judge-verdicts", "formula": None}
    table = render_markdown(evaluation)
    assert "## RewardBench 2: generative judge" in table
    assert (
        "Judge: protocols rb2-rating, rb2-rating-ties (--protocol ratings); compat none (reader rb2-rating); "
        "seed: none drawn "
        "(only the ranking protocol draws answer positions); 29 calls, 5 without a verdict or rating (17.2%), "
        "1 cut at max_tokens"
    ) in table
    # Leaderboard row: Factuality 25.0 (4/16), Precise IF … Focus absent, Ties 7.7 (1/13), Avg 17.2 (5/29).
    assert "| Parse failures (%) | 25.0 (4/16) | — | — | — | — | 7.7 (1/13) | 17.2 (5/29) |" in table
    assert "| Factuality | 4 | 39.6 | — | 25.0% (4/16) | 1 |" in table
    assert "| Ties | 4 | 50.0 | — | 7.7% (1/13) | 0 |" in table


def test_unscored_judge_groups_are_counted_as_the_classifier_counts_them():
    # A fifth Factuality group the judge could not take: credit 0 -> (1 + 0 + .25 + 1/3 + 0) / 5.
    unscored = judge_record("rewardbench2", "Factuality", "4", 1, 4, None)
    evaluation = evaluate_records([*rb2_records(), unscored], MetricsConfig(resamples=0))
    fact = evaluation.result.subset("Factuality")
    assert fact.score == pytest.approx(1.5833333333333333 / 5, abs=1e-15) and fact.n_nan_groups == 1
    assert evaluation.judge.summary.n_unjudged == 1
    data = result_dict(evaluation)
    assert data["subsets"]["Factuality"]["n_nan_groups"] == 1 and data["judge"]["n_unjudged"] == 1
    # Its calls were never made: the parse-failure counts are those of the four judged groups.
    assert data["subsets"]["Factuality"]["parse_failures"]["n_calls"] == 16
    assert (
        "Note: 1 group(s) could not be judged (no verdicts: null rewards and errors in the score file); they are "
        "counted as a classifier's unscored group is (credit 0; in Ties never accurate or preferred)."
    ) in render_markdown(evaluation)


# --- RM-Bench pairwise ------------------------------------------------------------------------

# chat/0 cells (row = chosen style, column = rejected style):   chat/1 cells:
#   [1,  .5, .5]                                                  [0,  0,  0]
#   [1,  1,  0 ]                                                  [.5, .5, 0]
#   [1,  1,  .5]                                                  [1,  .5, .5]
# mean: [[.5, .25, .25], [.75, .75, 0], [1, .75, .5]]
# hard = (.25 + .25 + 0) / 3 = 1/6; normal = (.5 + .75 + .5) / 3 = 7/12; easy = (.75 + 1 + .75) / 3 = 5/6
# chat score = (1/6 + 7/12 + 5/6) / 3 = 19/36.
# safety-refuse/0: the judge could not take it -> every cell 0, n_nan_groups 1.
# overall = mean of chat and safety: hard 1/12, normal 7/24, easy 5/12, score 19/72.
CHAT_CELLS = {
    "0": (1, 0.5, 0.5, 1, 1, 0, 1, 1, 0.5),
    "1": (0, 0, 0, 0.5, 0.5, 0, 1, 0.5, 0.5),
}


def pairwise_calls(n_failed: int, n_cut_failed: int, n_cut_ok: int) -> tuple[JudgeCall, ...]:
    """18 calls: ``n_failed`` without a verdict (``n_cut_failed`` of them cut), ``n_cut_ok`` cut with a verdict."""
    calls = [call("rmbench-pairwise", "truncated", "length") for _ in range(n_cut_failed)]
    calls += [call("rmbench-pairwise", "no_verdict") for _ in range(n_failed - n_cut_failed)]
    calls += [call("rmbench-pairwise", verdict="A>B", finish="length") for _ in range(n_cut_ok)]
    calls += [call("rmbench-pairwise", verdict="A>>B") for _ in range(18 - len(calls))]
    return tuple(calls)


def rmbench_records() -> list[ScoreRecord]:
    records = []
    for id, calls in (("0", pairwise_calls(2, 1, 1)), ("1", pairwise_calls(0, 0, 0))):
        cells = CHAT_CELLS[id]
        judge = JudgeGroupResult(
            benchmark="rm-bench", domain="chat", id=id, protocol="rmbench-pairwise", compat="none", num_chosen=3,
            calls=calls, cells=cells,
        )
        # Rewards against the verdicts: every rejected answer above every chosen one.
        records.append(judge_record("rm-bench", "chat", id, 3, 6, judge, mode="pairwise", rewards=(0,) * 3 + (1,) * 3))
    records.append(judge_record("rm-bench", "safety-refuse", "0", 3, 6, None, mode="pairwise"))
    return records


def test_rmbench_pairwise_figures_and_unscored_group():
    evaluation = evaluate_records(rmbench_records(), MetricsConfig(resamples=0))
    result = evaluation.result
    chat, safety = result.domain("chat"), result.domain("safety")
    assert chat.matrix == ((0.5, 0.25, 0.25), (0.75, 0.75, 0.0), (1.0, 0.75, 0.5))
    assert (chat.hard, chat.normal, chat.easy, chat.score) == pytest.approx((1 / 6, 7 / 12, 5 / 6, 19 / 36), abs=1e-15)
    assert safety.matrix == ((0.0,) * 3,) * 3 and safety.n_nan_groups == 1 and safety.parts == ("safety-refuse",)
    assert (result.hard, result.normal, result.easy, result.score) == pytest.approx(
        (1 / 12, 7 / 24, 5 / 12, 19 / 72), abs=1e-15
    )


def test_rmbench_table_says_the_protocol_is_rmserve_own():
    evaluation = evaluate_records(rmbench_records(), MetricsConfig(resamples=0))
    table = render_markdown(evaluation)
    # chat: 2 failed of 36 calls (5.6 %), 2 cut (1 failed, 1 with a verdict); safety: no calls made.
    assert (
        "Judge: protocol rmbench-pairwise (--protocol pairwise); rmbench-pairwise is rmserve's own protocol for "
        "RM-Bench, not an official one; compat none (reader rmbench-pairwise); seed: none drawn"
    ) in table
    assert "36 calls, 2 without a verdict or rating (5.6%), 2 cut at max_tokens" in table
    assert "| Parse failures (%) | 5.6 (2/36) | — | — | — |  |  |  | 5.6 (2/36) |" in table
    assert "| chat | 2 | 83.3 | 58.3 | 16.7 | 52.8 | 5.6% (2/36) | 2 |" in table
    assert "| safety | 1 | 0.0 | 0.0 | 0.0 | 0.0 | — | — |" in table
    assert "Note: rmbench-pairwise is rmserve's own judge protocol for RM-Bench" in table
    data = result_dict(evaluation)
    assert data["domains"]["chat"]["parse_failures"]["reasons"] == {"no_verdict": 1, "truncated": 1}
    assert data["domains"]["safety"]["parse_failures"] is None
    assert data["judge"]["rmserve_protocols"] == ["rmbench-pairwise"]
    assert "not an official one" in data["judge"]["protocol_note"]


def test_an_auto_run_names_the_protocol_it_used_and_that_auto_chose_it():
    records = [msgspec.structs.replace(r, mode="auto") for r in rmbench_records()]
    evaluation = evaluate_records(records, MetricsConfig(resamples=0))
    table = render_markdown(evaluation)
    assert "Scores: judge (protocol rmbench-pairwise, chosen by --protocol auto, compat none);" in table
    assert "Judge: protocol rmbench-pairwise (chosen by --protocol auto); rmbench-pairwise is rmserve's own" in table
    assert "mode auto" not in table
    fig = heatmap_figure(evaluation.result.domain("chat"), evaluation.models, kind=evaluation.score_kind,
                         reward=evaluation.reward, protocols=evaluation.judge.summary.protocols)
    assert "generative judge (protocol rmbench-pairwise, chosen by --protocol auto, compat none)" in " ".join(
        fig.axes[0].get_title().split())
    explicit = render_markdown(evaluate_records(rmbench_records(), MetricsConfig(resamples=0)))
    assert "Scores: judge (protocol rmbench-pairwise, --protocol pairwise, compat none);" in explicit


def test_judge_heatmap_names_the_kind_and_the_protocol():
    evaluation = evaluate_records(rmbench_records(), MetricsConfig(resamples=0))
    fig = heatmap_figure(evaluation.result.domain("chat"), evaluation.models, kind=evaluation.score_kind,
                         reward=evaluation.reward)
    title = fig.axes[0].get_title()
    assert "generative judge (--protocol pairwise, compat none)" in title
    assert "not an official one" in fig._supxlabel.get_text()
    assert fig.axes[1].get_ylabel() == "judge prefers chosen (%, mean of both orders)"


def test_dpo_and_classifier_heatmaps_name_their_kind():
    record = rmbench_record("chat", "0", [3.0, 1.0, 5.0, 2.0, 4.0, 6.0])
    dpo = msgspec.structs.replace(record, kind="dpo", mode="reference", ref_model="sft-ref")
    for records, expected in (
        ([dpo], "DPO implicit reward (mode reference, reference 'sft-ref', compat none)"),
        ([record], "classifier rewards"),
    ):
        evaluation = evaluate_records(records, MetricsConfig(resamples=0))
        fig = heatmap_figure(evaluation.result.domains[0], kind=evaluation.score_kind, reward=evaluation.reward)
        assert expected in fig.axes[0].get_title()


# --- files and the CLI ------------------------------------------------------------------------


def test_cli_on_a_score_file_of_judge_records(tmp_path):
    path = write_jsonl(tmp_path / "scores.jsonl", rmbench_records())
    out = tmp_path / "report"
    result = runner.invoke(app, ["metrics", "rm-bench", str(path), "--out", str(out), "--resamples", "100"])
    assert result.exit_code == 0, result.stderr
    assert "## RM-Bench: generative judge" in result.stdout
    assert "| Parse failures (%) | 5.6 (2/36) |" in result.stdout
    assert "| Accuracy (%) | 52.8 | — | — | 0.0 | 41.7 | 29.2 | 8.3 | 26.4 |" in result.stdout
    assert {p.name for p in out.iterdir()} == {"results.json", "table.md", "heatmap-chat.png", "heatmap-safety.png"}
    data = json.loads((out / "results.json").read_text())
    assert data["overall"]["score"] == pytest.approx(19 / 72, abs=1e-15)
    assert data["score_kind"] == {"kind": "judge", "mode": "pairwise", "ref_model": None, "compat": "none"}
    assert data["domains"]["chat"]["interval"]["score"] is not None
    assert (out / "table.md").read_text() == result.stdout


def test_mixed_kinds_in_one_score_file_are_refused(tmp_path):
    classifier = rmbench_record("code", "0", [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    path = write_jsonl(tmp_path / "mixed.jsonl", [*rmbench_records(), classifier])
    with pytest.raises(DataError, match="mixed kinds of score: this record is classifier") as info:
        evaluate_files([path], MetricsConfig(resamples=0))
    assert info.value.line == 4 and info.value.field == "kind"
    result = runner.invoke(app, ["metrics", "rm-bench", str(path)])
    assert result.exit_code == 2 and "mixed kinds of score" in result.stderr
    # The other order, and an official result file next to judge records.
    path = write_jsonl(tmp_path / "mixed2.jsonl", [classifier, *rmbench_records()])
    with pytest.raises(DataError, match="this record is judge"):
        evaluate_files([path], MetricsConfig(resamples=0))
    official = tmp_path / "chat_results.json"
    official.write_text(json.dumps([{"id": 9, "score_chosen": [1, 1, 1], "score_rejected": [0, 0, 0]}]))
    judged = write_jsonl(tmp_path / "judge.jsonl", rmbench_records())
    with pytest.raises(DataError, match="cannot be mixed with the judge score records"):
        evaluate_files([judged, official], MetricsConfig(resamples=0))
    with pytest.raises(DataError, match="cannot be mixed with official result records"):
        evaluate_files([official, judged], MetricsConfig(resamples=0))


def test_judge_records_that_do_not_fit_their_group_are_refused(tmp_path):
    good = rmbench_records()[0]
    wrong_key = msgspec.structs.replace(good, judge=msgspec.structs.replace(good.judge, id="7"))
    no_judge = msgspec.structs.replace(good, judge=None)
    classifier_with_judge = msgspec.structs.replace(good, kind="classifier", mode=None)
    for record, message in (
        (wrong_key, r"is for group \(rm-bench, chat, 7\)"),
        (no_judge, "missing: a judge's score record holds the judge's verdicts"),
        (classifier_with_judge, "a judge record in a score record of kind 'classifier'"),
    ):
        with pytest.raises(DataError, match=message):
            evaluate_records([record], MetricsConfig(resamples=0))
    with pytest.raises(DataError, match="--dpo-reward avg recomputes a DPO run's rewards"):
        evaluate_records([good], MetricsConfig(resamples=0, dpo_reward="avg"))


def test_compare_a_classifier_with_a_judge_over_the_same_groups(tmp_path):
    # Classifier rewards on the same three groups: chat/0 and chat/1 win every cell, safety-refuse/0 loses all.
    classifier = [
        rmbench_record("chat", "0", [2.0] * 3 + [1.0] * 3),
        rmbench_record("chat", "1", [2.0] * 3 + [1.0] * 3),
        rmbench_record("safety-refuse", "0", [0.0] * 3 + [1.0] * 3),
    ]
    a = write_jsonl(tmp_path / "a.jsonl", classifier)
    b = write_jsonl(tmp_path / "b.jsonl", rmbench_records())
    comparison = compare_files(a, b, MetricsConfig(resamples=50))
    by_name = {f.figure: f for f in comparison.figures}
    # A: chat 1, safety 0 -> overall 0.5. B (judge): chat 19/36, safety 0 -> overall 19/72.
    assert by_name["overall.score"].a == pytest.approx(0.5, abs=1e-15)
    assert by_name["overall.score"].b == pytest.approx(19 / 72, abs=1e-15)
    assert by_name["chat.hard"].difference == pytest.approx(1 / 6 - 1, abs=1e-15)
    assert comparison.score_kind_b == ScoreKind(kind="judge", mode="pairwise")
    assert (comparison.reward, comparison.reward_b) == ("rewards", "judge-verdicts")
    assert "Reward: A rewards as scored; B figures from the judge's verdicts" in render_comparison(comparison)
    assert comparison_dict(comparison)["reward_b"] == {"name": "judge-verdicts", "formula": None}


def test_write_outputs_of_a_rewardbench2_judge(tmp_path):
    evaluation = evaluate_records(rb2_records(), MetricsConfig(resamples=20))
    paths = write_outputs(evaluation, tmp_path)
    assert sorted(p.name for p in paths) == ["results.json", "table.md"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["subsets"]["Factuality"]["score"] == pytest.approx(FACT, abs=1e-15)
    low, high = data["subsets"]["Factuality"]["interval"]
    assert 0.0 <= low <= FACT <= high <= 1.0


def test_sweep_curves_name_the_kind_of_score():
    from rmserve.metrics.sweep import SweepPoint, curve_figure

    record = rmbench_record("chat", "0", [3.0, 1.0, 5.0, 2.0, 4.0, 6.0])
    dpo = msgspec.structs.replace(record, kind="dpo", mode="avg")
    evaluations = [{"rm-bench": evaluate_records([dpo], MetricsConfig(resamples=0))}]
    points = [SweepPoint(step=100, name="step-100", path="runs/x/step-100", fingerprint="ab", model="policy",
                         records={"rm-bench": [dpo]})]
    fig = curve_figure(points, evaluations, "rm-bench", "overall.score")
    assert "DPO implicit reward (mode avg, compat none)" in fig.axes[0].get_title()


def ranking_record(id: str, credit: float, verdict: str | None, position: int, seed: int) -> ScoreRecord:
    reason = "ok" if verdict else "no_verdict"
    judge = JudgeGroupResult(
        benchmark="rewardbench2", domain="Math", id=id, protocol="rb2-ranking", compat="official", num_chosen=1,
        calls=(call("rb2-ranking", reason, verdict=verdict),), credit=credit, position=position, seed=seed,
    )
    record = judge_record("rewardbench2", "Math", id, 1, 4, judge, mode="auto", rewards=(0.0, 1.0, 0.0, 0.0))
    return msgspec.structs.replace(record, compat="official")


def test_ranking_protocol_header_names_seed_and_compat():
    # Math credits 1 (verdict names the correct answer), 0 (another), 0.25 (no verdict) -> 1.25 / 3.
    records = [
        ranking_record("0", 1.0, "C", 2, 7),
        ranking_record("1", 0.0, "A", 3, 7),
        ranking_record("2", 0.25, None, 0, 7),
    ]
    evaluation = evaluate_records(records, MetricsConfig(resamples=0))
    assert evaluation.result.subset("Math").score == pytest.approx(1.25 / 3, abs=1e-15)
    table = render_markdown(evaluation)
    assert (
        "Judge: protocol rb2-ranking (chosen by --protocol auto); compat official (reader rb2-ranking-official); "
        "seed 7; 3 calls, 1 without a verdict"
    ) in table
    assert "Scores: judge (protocol rb2-ranking, chosen by --protocol auto, compat official);" in table
    assert "mode auto" not in table
    assert "| Math | 3 | 41.7 | — | 33.3% (1/3) | 0 |" in table
    data = result_dict(evaluation)["judge"]
    assert (data["compat"], data["readers"], data["thinking"]) == (["official"], ["rb2-ranking-official"], [])


def test_judge_header_names_every_reader_and_the_thinking_switch():
    records = [ranking_record("0", 1.0, "C", 2, 7), ranking_record("1", 0.0, "A", 3, 7)]
    rmserve_read = msgspec.structs.replace(
        records[1].judge, compat="none", thinking="on",
        calls=(msgspec.structs.replace(records[1].judge.calls[0], parse=JudgeParse("rb2-ranking", "ok", verdict="A")),),
    )
    records[0] = msgspec.structs.replace(records[0], judge=msgspec.structs.replace(records[0].judge, thinking="on"))
    records[1] = msgspec.structs.replace(records[1], judge=rmserve_read)
    evaluation = evaluate_records(records, MetricsConfig(resamples=0))
    assert (
        "compat none, official (readers rb2-ranking, rb2-ranking-official); thinking on; seed 7; 2 calls"
    ) in render_markdown(evaluation)
    data = result_dict(evaluation)["judge"]
    assert (data["compat"], data["readers"], data["thinking"]) == (
        ["none", "official"], ["rb2-ranking", "rb2-ranking-official"], ["on"]
    )


def test_judge_heatmap_fits_its_canvas_with_a_long_model_name():
    records = [msgspec.structs.replace(r, model="an-organisation-with-a-long-name/Judge-Model-V2-70B-instruct")
               for r in rmbench_records()]
    evaluation = evaluate_records(records, MetricsConfig(resamples=0))
    fig = heatmap_figure(evaluation.result.domain("chat"), evaluation.models, kind=evaluation.score_kind,
                         reward=evaluation.reward)
    fig.canvas.draw()
    width, height = fig.canvas.get_width_height()
    for text in (fig.axes[0].title, fig._supxlabel):
        box = text.get_window_extent(fig.canvas.get_renderer())
        assert -1.0 <= box.x0 and box.x1 <= width + 1.0 and -1.0 <= box.y0 and box.y1 <= height + 1.0, text.get_text()


def test_the_run_pipeline_reports_a_judge_score_file(tmp_path):
    """``rmserve run``'s report of a finished score file (the pipelines' metrics entry) on judge records."""
    from rmserve.pipelines.evaluate import EvalConfig, evaluate_from_file
    from rmserve.schema import ModelInfo
    from testkit.servers import write_rmbench_data

    data = write_rmbench_data(tmp_path / "data.jsonl", n_chat=2, n_code=1)
    out = tmp_path / "run"
    out.mkdir()
    chat = [msgspec.structs.replace(r, fingerprint="fp-judge") for r in rmbench_records()[:2]]
    # code/0: the judge could not take it (null rewards, errors): counted as every comparison lost.
    code = judge_record("rm-bench", "code", "0", 3, 6, None, mode="pairwise")
    code = msgspec.structs.replace(code, fingerprint="fp-judge")
    write_jsonl(out / "scores.jsonl", [*chat, code])
    info = ModelInfo(name="judge-lm", max_model_len=4096, dtype="float32", fingerprint="fp-judge", engine="vllm",
                     kind="judge", mode="pairwise")
    config = EvalConfig(bench="rm-bench", data=str(data), out_dir=out, resamples=0, quiet=True)
    result = evaluate_from_file(config, "fp-judge", lambda name: info)
    assert result is not None
    # chat as hand-worked above (19/36); code 0 -> overall score (19/36 + 0) / 2 = 19/72.
    assert result.results["overall"]["score"] == pytest.approx(19 / 72, abs=1e-15)
    assert result.results["domains"]["code"]["n_nan_groups"] == 1
    assert result.unscored.keys == ("rm-bench/code/0",)
    assert "| Parse failures (%) | 5.6 (2/36) | — | — | — |  |  |  | 5.6 (2/36) |" in result.table_md
    assert "rmbench-pairwise is rmserve's own protocol for RM-Bench, not an official one" in result.table_md
    assert (out / "heatmap-chat.png").is_file() and (out / "table.md").read_text() == result.table_md
