"""Evaluation entry points, Markdown and JSON rendering, output files and comparisons."""

from __future__ import annotations

import json

import numpy as np
import pytest
from testkit.metrics_data import RB2_REFERENCE_AVERAGE, random_rmbench_records, rmbench_record
from rmserve.metrics.comparison import compare_files
from rmserve.metrics.evaluation import MetricsConfig, evaluate_files, evaluate_records
from rmserve.metrics.outputs import write_outputs
from rmserve.metrics.render_json import comparison_dict, result_dict
from rmserve.metrics.render_markdown import render_comparison, render_markdown
from rmserve.metrics.rmbench import rmbench_accuracy

from rmserve.errors import DataError

COUNTS = {"chat": 40, "code": 50, "safety-refuse": 30, "safety-response": 20}


@pytest.fixture
def rmbench_file(jsonl_writer):
    return jsonl_writer("scores.jsonl", random_rmbench_records(COUNTS, seed=2))


def test_rmbench_table_marks_missing_math(rmbench_file):
    evaluation = evaluate_files([rmbench_file], MetricsConfig(resamples=200))
    text = render_markdown(evaluation)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("|  | Chat"))
    assert header == "|  | Chat | Math | Code | Safety | Easy | Normal | Hard | Avg |"
    values = next(line for line in lines if line.startswith("| Accuracy (%)")).split(" | ")
    result = evaluation.result
    assert values[2] == "—"  # Math
    assert values[1] == f"{100 * result.domain('chat').score:.1f}"
    assert values[-1].rstrip(" |") == f"{100 * result.score:.1f}"
    ci = next(line for line in lines if line.startswith("| 95% CI")).split(" | ")
    assert ci[2] == "—" and ci[1].startswith("[")
    assert (
        "Note: Missing domain(s): math. Easy, Normal, Hard and Avg are means over chat, code, safety only (partial)."
        in lines
    )
    rows = {line.split(" | ")[0]: line.split(" | ")[1] for line in lines if line.startswith(("| chat", "| code", "| safety"))}
    assert rows == {"| chat": "40", "| code": "50", "| safety": "50 (refuse 30, response 20)"}  # safety's two parts


def test_rmbench_json_holds_fractions_and_intervals(rmbench_file):
    evaluation = evaluate_files([rmbench_file], MetricsConfig(resamples=200, seed=4))
    data = json.loads(json.dumps(result_dict(evaluation)))
    assert data["benchmark"] == "rm-bench"
    assert data["partial"] is True and data["missing"] == ["math"]
    assert data["files"] == [str(rmbench_file)]
    assert data["n_groups"] == sum(COUNTS.values())
    assert set(data["domains"]) == {"chat", "code", "safety"}
    safety = data["domains"]["safety"]
    assert safety["n_groups"] == 50 and safety["parts"] == ["safety-refuse", "safety-response"]
    assert safety["part_groups"] == {"safety-refuse": 30, "safety-response": 20}
    assert data["domains"]["chat"]["part_groups"] == {"chat": 40}
    assert np.mean(safety["matrix"]) == pytest.approx(safety["score"])
    low, high = data["overall"]["interval"]["score"]
    assert low <= data["overall"]["score"] <= high
    assert data["bootstrap"]["resamples"] == 200 and data["bootstrap"]["seed"] == 4


def test_evaluate_records_equals_evaluate_files(rmbench_file):
    records = random_rmbench_records(COUNTS, seed=2)
    config = MetricsConfig(resamples=100)
    assert result_dict(evaluate_records(records, config, source=str(rmbench_file))) == result_dict(
        evaluate_files([rmbench_file], config)
    )
    direct = rmbench_accuracy(
        np.array([r.rewards for r in records], dtype=float), np.array([r.domain for r in records])
    )
    assert evaluate_records(records, config).result == direct


def test_zero_resamples_turns_intervals_off(rmbench_file):
    evaluation = evaluate_files([rmbench_file], MetricsConfig(resamples=0))
    assert dict(evaluation.intervals) == {}
    assert result_dict(evaluation)["bootstrap"] is None
    assert "95% CI" not in render_markdown(evaluation)


def test_write_outputs_for_rmbench(rmbench_file, tmp_path):
    evaluation = evaluate_files([rmbench_file], MetricsConfig(resamples=50))
    paths = write_outputs(evaluation, tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == ["heatmap-chat.png", "heatmap-code.png", "heatmap-safety.png", "results.json", "table.md"]
    assert (tmp_path / "out" / "heatmap-chat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == json.loads(
        json.dumps(result_dict(evaluation))
    )
    assert (tmp_path / "out" / "table.md").read_text() == render_markdown(evaluation)


def test_rb2_table_and_outputs(rb2_reference, tmp_path):
    evaluation = evaluate_files([rb2_reference], MetricsConfig(resamples=100))
    lines = render_markdown(evaluation).splitlines()
    assert "|  | Factuality | Precise IF | Math | Safety | Focus | Ties | Avg |" in lines
    assert "| Score (%) | 84.6 | 65.6 | 77.6 | 96.7 | 98.4 | 81.2 | 84.0 |" in lines
    paths = write_outputs(evaluation, tmp_path)
    assert sorted(p.name for p in paths) == ["results.json", "table.md"]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["subsets"]["Ties"]["components"]["ref_accuracy"] == pytest.approx(50 / 51)
    assert data["average"]["score"] == pytest.approx(RB2_REFERENCE_AVERAGE, abs=5e-5)


def test_rb2_partial_average(jsonl_writer):
    rows = [
        {"id": str(i), "subset": "Focus", "num_correct": 1, "scores": [[1], [0], [0], [float(i % 2)]]} for i in range(4)
    ]
    evaluation = evaluate_files([jsonl_writer("f.jsonl", rows)], MetricsConfig(resamples=0))
    data = result_dict(evaluation)
    # credits 1, 0.5, 1, 0.5 → 0.75
    assert data["subsets"]["Focus"]["score"] == pytest.approx(0.75)
    assert data["average"]["score"] == pytest.approx(0.75)
    assert data["missing"] == ["Factuality", "Precise IF", "Math", "Safety", "Ties"]
    assert "| Score (%) | — | — | — | — | 75.0 | — | 75.0 |" in render_markdown(evaluation)


def test_nan_rewards_are_counted_and_noted(jsonl_writer):
    path = jsonl_writer(
        "s.jsonl", [rmbench_record("chat", "1", [None, 2, 2, 1, 1, 1]), rmbench_record("chat", "2", [1] * 6)]
    )
    evaluation = evaluate_files([path], MetricsConfig(resamples=0))
    assert result_dict(evaluation)["domains"]["chat"]["n_nan_groups"] == 1
    assert "1 group(s) have a missing (NaN) reward" in render_markdown(evaluation)


def test_compare_same_file_is_zero(rmbench_file):
    comparison = compare_files(rmbench_file, rmbench_file, MetricsConfig(resamples=100))
    data = comparison_dict(comparison)
    assert list(data["figures"])[:8] == [
        "chat.score",
        "code.score",
        "safety.score",
        "overall.easy",
        "overall.normal",
        "overall.hard",
        "overall.score",
        "chat.hard",
    ]
    for figure in data["figures"].values():
        assert figure["difference"] == 0.0 and figure["interval"] == [0.0, 0.0] and not figure["excludes_zero"]
    assert "| Avg |" in render_comparison(comparison)
    assert data["notes"][0] == (  # the files hold no math: the averages are over three domains
        "No paired group of math: the averages are over chat, code, safety only (partial).")
    assert f"Note: {data['notes'][0]}" in render_comparison(comparison).splitlines()


def test_compare_reorders_groups_and_finds_a_difference(jsonl_writer):
    records = random_rmbench_records(COUNTS, seed=5, shift=0.1)
    improved = [
        type(r)(
            **{
                **{f: getattr(r, f) for f in r.__struct_fields__},
                "rewards": tuple(x + 3 for x in r.rewards[:3]) + r.rewards[3:],
            }
        )
        for r in records
    ]
    a = jsonl_writer("a.jsonl", records)
    b = jsonl_writer("b.jsonl", improved[::-1])  # other order: pairing is by key
    comparison = compare_files(a, b, MetricsConfig(resamples=200))
    overall = {f.figure: f for f in comparison.figures}["overall.score"]
    assert overall.difference > 0.2 and overall.excludes_zero
    expected_a = evaluate_files([a], MetricsConfig(resamples=0)).result.score
    assert overall.a == pytest.approx(expected_a)


def test_compare_over_the_shared_groups_is_marked_partial(jsonl_writer):
    # A: chat 0-4 and code 0; B: chat 2-5. Shared: chat 2, 3, 4.
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", str(i), [1] * 6) for i in range(5)]
                     + [rmbench_record("code", "0", [1] * 6)])
    b = jsonl_writer("b.jsonl", [rmbench_record("chat", str(i), [2, 2, 2, 1, 1, 1]) for i in range(2, 6)])
    comparison = compare_files(a, b, MetricsConfig(resamples=10))
    assert comparison.partial and comparison.n_groups == 3
    assert comparison.notes == (
        "Partial comparison: 3 group(s) only in A (chat 2, code 1); 1 group(s) only in B (chat 1); they are left "
        "out, and the figures of both sides cover the 3 group(s) both hold.",
        "No paired group of math, code, safety: the averages are over chat only (partial).",
    )
    chat = {f.figure: f for f in comparison.figures}["chat.score"]
    assert (chat.a, chat.b) == (0.0, pytest.approx(1.0))  # ties lose in A; B's chosen beat its rejected everywhere
    assert "Note: Partial comparison: 3 group(s) only in A" in render_comparison(comparison)


def test_compare_rejects_groups_with_nothing_in_common(jsonl_writer):
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", str(i), [1] * 6) for i in range(2)])
    b = jsonl_writer("b.jsonl", [rmbench_record("chat", str(i), [1] * 6) for i in range(2, 3)])
    with pytest.raises(
        DataError, match=r"2 group\(s\) only in .*a.jsonl \(e.g. rm-bench/chat/0, rm-bench/chat/1\); 1 group"
    ):
        compare_files(a, b, MetricsConfig(resamples=10))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"resamples": -1}, "resamples"),
        ({"seed": -2}, "seed"),
        ({"confidence": 0}, "confidence"),
        ({"domain": "maths"}, "domain"),
        ({"benchmark": "rb3"}, "benchmark"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MetricsConfig(**kwargs)
