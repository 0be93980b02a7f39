"""``rmserve metrics …`` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from testkit.metrics_data import RB2_REFERENCE_AVERAGE, RB2_REFERENCE_SUBSETS, random_rmbench_records, rmbench_record
from typer.testing import CliRunner

from rmserve.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["metrics", *map(str, args)])


def test_rewardbench2_reference_numbers(rb2_reference):
    result = run("rewardbench2", rb2_reference, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    got = {name: round(entry["score"], 4) for name, entry in data["subsets"].items()}
    assert got == RB2_REFERENCE_SUBSETS
    assert round(data["average"]["score"], 4) == RB2_REFERENCE_AVERAGE


def test_rm_bench_markdown_and_out(jsonl_writer, tmp_path):
    path = jsonl_writer("s.jsonl", random_rmbench_records({"chat": 20, "safety-refuse": 10}))
    result = run("rm-bench", path, "--out", tmp_path / "o", "--resamples", "50", "--seed", "3")
    assert result.exit_code == 0, result.stderr
    assert "| Accuracy (%) |" in result.stdout
    assert "Missing domain(s): math, code." in result.stdout
    assert {p.name for p in (tmp_path / "o").iterdir()} == {
        "results.json",
        "table.md",
        "heatmap-chat.png",
        "heatmap-safety.png",
    }
    assert json.loads((tmp_path / "o" / "results.json").read_text())["bootstrap"]["seed"] == 3


def test_rm_bench_domain_option(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps([{"id": 1, "score_chosen": [1, 2, 3], "score_rejected": [0, 0, 0]}]))
    result = run("rm-bench", path, "--domain", "math", "--json", "--resamples", "0")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["domains"]["math"]["score"] == 1.0


def test_compare_json(jsonl_writer):
    path = jsonl_writer("s.jsonl", random_rmbench_records({"code": 30}))
    result = run("compare", path, path, "--json", "--resamples", "50", "--bench", "rm-bench")
    assert result.exit_code == 0, result.stderr
    figures = json.loads(result.stdout)["figures"]
    assert figures["overall.score"]["difference"] == 0.0
    assert figures["overall.score"]["interval"] == [0.0, 0.0]


def bad_row_file(jsonl_writer, case: str):
    good = rmbench_record("chat", "1", [1] * 6)
    rows = {
        "responses": [
            good,
            {"benchmark": "rm-bench", "domain": "chat", "id": "2", "num_chosen": 3, "rewards": [1] * 5},
        ],
        "non_numeric": [
            good,
            {"benchmark": "rm-bench", "domain": "chat", "id": "2", "num_chosen": 3, "rewards": [1, 1, "a", 1, 1, 1]},
        ],
        "missing_id": [good, {"benchmark": "rm-bench", "domain": "chat", "num_chosen": 3, "rewards": [1] * 6}],
        "two_benchmarks": [good, {"id": "0", "subset": "Math", "num_correct": 1, "scores": [[1], [0], [0], [0]]}],
        "unknown_subset": [{"id": "0", "subset": "Reasoning", "num_correct": 1, "scores": [[1], [0], [0], [0]]}],
    }[case]
    return jsonl_writer(f"{case}.jsonl", rows)


@pytest.mark.parametrize(
    ("case", "command", "line", "field"),
    [
        ("responses", "rm-bench", 2, "rewards"),
        ("non_numeric", "rm-bench", 2, "rewards[2]"),
        ("missing_id", "rm-bench", 2, "id"),
        ("two_benchmarks", "rm-bench", 2, "benchmark"),
        ("unknown_subset", "rewardbench2", 1, "subset"),
    ],
)
def test_bad_input_exits_2_with_one_line(jsonl_writer, case, command, line, field):
    path = bad_row_file(jsonl_writer, case)
    result = run(command, path, "--resamples", "10")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {path}, line {line}")
    assert f"field '{field}'" in lines[0]
    assert "Traceback" not in result.output


def test_wrong_benchmark_for_command(rb2_reference):
    result = run("rm-bench", rb2_reference)
    assert result.exit_code == 2
    assert "field 'benchmark': holds rewardbench2 scores, but rm-bench scores were asked for" in result.stderr


def test_compare_mismatched_groups_exits_2(jsonl_writer):
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", "1", [1] * 6)])
    b = jsonl_writer("b.jsonl", [rmbench_record("chat", "2", [1] * 6)])
    result = run("compare", a, b)
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert "1 group(s) only in" in result.stderr


def test_bad_option_value_exits_2(jsonl_writer):
    path = jsonl_writer("s.jsonl", [rmbench_record("chat", "1", [1] * 6)])
    result = run("rm-bench", path, "--confidence", "1.5")
    assert result.exit_code == 2
    assert "Invalid value for '--confidence': must lie in (0, 1), got 1.5" in result.stderr
