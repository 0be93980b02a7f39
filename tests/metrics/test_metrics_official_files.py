"""Files as the official harnesses and interrupted writers leave them.

Python's ``json`` literals (``NaN``, ``Infinity``, ``-Infinity``, ``1e999``), a torn last line,
a UTF-8 byte-order mark, and the repeated Factuality ids of the published RewardBench 2
per-item files. Every expected figure is worked out by hand in the comments; a figure is
printed as a percentage with one decimal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError
from rmserve.metrics.score_files import read_score_files, scores_from_records
from rmserve.metrics.scores import RB2Scores, RMBenchScores
from rmserve.schema import ScoreRecord
from testkit.metrics_data import RB2_REFERENCE_AVERAGE, RB2_REFERENCE_SUBSETS

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, ["metrics", *map(str, args)])


def table_row(stdout: str, label: str) -> list[str]:
    """The cells of the first Markdown table row whose first cell is ``label``."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in:\n{stdout}")


# --- Python json literals ------------------------------------------------------------------


def official_rmbench_list_with_nan(tmp_path: Path) -> Path:
    """The official RM-Bench result list written with ``json.dump`` (``allow_nan=True``), one NaN."""
    rows = [
        {"id": "a", "domain": "chat", "score_chosen": [3.0, 2.0, 1.0], "score_rejected": [0.0, 0.0, 0.0]},
        {"id": "b", "domain": "chat", "score_chosen": [math.nan, 2.0, 1.0], "score_rejected": [1.5, 0.0, 3.0]},
        {"id": "c", "domain": "chat", "score_chosen": [0.0, 0.0, 0.0], "score_rejected": [1.0, 1.0, 1.0]},
    ]
    path = tmp_path / "chat_results.json"
    with path.open("w") as handle:
        json.dump(rows, handle, indent=2)
    assert "NaN" in path.read_text()  # what the harness writes, and what orjson refuses
    return path


# Win matrix W[i][j] = share of groups with chosen style i > rejected style j (NaN > x is False):
#   a wins all 9 cells; c wins none;
#   b: chosen NaN wins nothing; chosen 2 beats 1.5 and 0, not 3; chosen 1 beats 0 only.
#   W = [[1/3, 1/3, 1/3], [2/3, 2/3, 1/3], [1/3, 2/3, 1/3]]
#   hard (above the diagonal)  = mean(1/3, 1/3, 1/3) = 1/3
#   normal (diagonal)          = mean(1/3, 2/3, 1/3) = 4/9
#   easy (below the diagonal)  = mean(2/3, 1/3, 2/3) = 5/9
#   score = mean(hard, normal, easy) = 4/9
NAN_EXAMPLE = {"hard": 1 / 3, "normal": 4 / 9, "easy": 5 / 9, "score": 4 / 9}


def test_official_rmbench_list_with_nan_reads_and_nan_loses(tmp_path):
    scores = read_score_files([official_rmbench_list_with_nan(tmp_path)])
    assert isinstance(scores, RMBenchScores)
    assert scores.ids.tolist() == ["a", "b", "c"]
    assert math.isnan(scores.rewards[1, 0])
    assert scores.rewards[1, 1:].tolist() == [2.0, 1.0, 1.5, 0.0, 3.0]
    assert scores.warnings == ()


def test_official_rmbench_list_with_nan_through_the_cli(tmp_path):
    path = official_rmbench_list_with_nan(tmp_path)
    result = run("rm-bench", path, "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    chat = json.loads(result.stdout)["domains"]["chat"]
    assert {k: chat[k] for k in NAN_EXAMPLE} == pytest.approx(NAN_EXAMPLE, abs=1e-12)
    assert chat["n_nan_groups"] == 1

    result = run("rm-bench", path, "--resamples", "0")
    assert result.exit_code == 0, result.output
    # Chat | Math | Code | Safety | Easy | Normal | Hard | Avg
    assert table_row(result.stdout, "Accuracy (%)") == ["44.4", "—", "—", "—", "55.6", "44.4", "33.3", "44.4"]
    assert "Note: 1 group(s) have a missing (NaN) reward; their comparisons count as losses." in result.stdout


RB2_LITERALS = "\n".join(
    [
        # NaN never wins: credit 0.
        '{"id": "0", "subset": "Factuality", "num_correct": 1, "scores": [[NaN], [1.0], [2.0], [3.0]]}',
        # 1e999 overflows to +inf and beats every finite score (-Infinity is the lowest): credit 1.
        '{"id": "1", "subset": "Factuality", "num_correct": 1, "scores": [[1e999], [5.0], [-Infinity], [4.0]]}',
        # two completions tied at +inf, the chosen one among them: credit 1/2.
        '{"id": "2", "subset": "Factuality", "num_correct": 1, "scores": [[Infinity], [Infinity], [0.0], [1.0]]}',
        # plain win: credit 1.
        '{"id": "3", "subset": "Factuality", "num_correct": 1, "scores": [[2.0], [1.0], [0.0], [-1.0]]}',
    ]
)
# Factuality = (0 + 1 + 1/2 + 1) / 4 = 0.625; the only subset, so the average too.


def test_rewardbench2_items_with_python_json_literals(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(RB2_LITERALS + "\n")
    scores = read_score_files([path])
    assert isinstance(scores, RB2Scores)
    assert math.isnan(scores.scores[0, 0])
    assert scores.scores[1].tolist() == [math.inf, 5.0, -math.inf, 4.0]
    assert scores.scores[2, :2].tolist() == [math.inf, math.inf]

    result = run("rewardbench2", path, "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["subsets"]["Factuality"]["score"] == 0.625
    assert data["subsets"]["Factuality"]["n_nan_groups"] == 1
    assert data["average"]["score"] == 0.625


# Two score records written by Python's json (NaN, Infinity) and by hand (1e999):
#   g1 rewards [NaN, 1, 1 | 0, 0, 0]: chosen NaN loses all; chosen 1 beats every 0.
#   g2 rewards [1e999, -Infinity, 0 | 1, -1, 1]: +inf beats all; -inf loses all; 0 beats -1 only.
#   W = [[1/2, 1/2, 1/2], [1/2, 1/2, 1/2], [1/2, 1, 1/2]]
#   hard = mean(W01, W02, W12) = 1/2; normal = mean(W00, W11, W22) = 1/2;
#   easy = mean(W10, W20, W21) = mean(1/2, 1/2, 1) = 2/3
#   score = (1/2 + 1/2 + 2/3) / 3 = 5/9
SCORE_LINES = "\n".join(
    [
        json.dumps(
            {
                "benchmark": "rm-bench",
                "domain": "chat",
                "id": "g1",
                "num_chosen": 3,
                "rewards": [math.nan, 1, 1, 0, 0, 0],
            }
        ),
        '{"benchmark": "rm-bench", "domain": "chat", "id": "g2", "num_chosen": 3, '
        '"rewards": [1e999, -Infinity, 0, 1, -1, 1]}',
    ]
)


def test_score_records_with_python_json_literals(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(SCORE_LINES + "\n")
    result = run("rm-bench", path, "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    chat = json.loads(result.stdout)["domains"]["chat"]
    expected = {"hard": 1 / 2, "normal": 1 / 2, "easy": 2 / 3, "score": 5 / 9}
    assert {k: chat[k] for k in expected} == pytest.approx(expected, abs=1e-12)


def test_what_python_json_also_refuses_stays_an_error(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(SCORE_LINES.replace("1e999", "nan", 1) + "\n")  # lower-case nan is not JSON anywhere
    with pytest.raises(DataError, match=r"scores.jsonl, line 2: invalid JSON"):
        read_score_files([path])


# --- a torn last line ----------------------------------------------------------------------


def score_line(record_id: str, chosen: float, rejected: float) -> str:
    return json.dumps(
        {"benchmark": "rm-bench", "domain": "chat", "id": record_id, "num_chosen": 3,
         "rewards": [chosen] * 3 + [rejected] * 3}
    )


def killed_writer_file(tmp_path: Path) -> tuple[Path, int]:
    """Five complete lines and half a sixth, as a SIGKILL in the middle of a write leaves."""
    lines = [score_line(str(i), 1.0, 0.0) for i in range(4)] + [score_line("4", 0.0, 1.0)]
    sixth = score_line("5", 0.0, 1.0)
    half = sixth[: len(sixth) // 2]
    path = tmp_path / "scores.jsonl"
    path.write_text("\n".join(lines) + "\n" + half)
    return path, len(half.encode())


def test_torn_last_line_is_dropped_with_a_warning(tmp_path):
    path, torn_bytes = killed_writer_file(tmp_path)
    warning = (
        f"{path}: ignored a truncated last line (line 6, {torn_bytes} bytes, no newline and not valid JSON: "
        "an interrupted write); the figures cover the records before it"
    )
    scores = read_score_files([path])
    assert scores.ids.tolist() == ["0", "1", "2", "3", "4"]
    assert scores.warnings == (warning,)

    # Four of the five groups win every cell, one none: every figure is 4/5 (with the sixth, a
    # loss, it would be 4/6).
    result = run("rm-bench", path, "--resamples", "0")
    assert result.exit_code == 0, result.output
    assert table_row(result.stdout, "Accuracy (%)") == ["80.0", "—", "—", "—", "80.0", "80.0", "80.0", "80.0"]
    assert f"Warning: {warning}" in result.stdout
    assert "5 groups from" in result.stdout

    result = run("rm-bench", path, "--json", "--resamples", "0")
    assert json.loads(result.stdout)["warnings"] == [warning]


def test_corruption_before_the_last_line_stays_an_error(tmp_path):
    path, _ = killed_writer_file(tmp_path)
    lines = path.read_text().split("\n")
    lines[2] = lines[2][:20]  # line 3 cut short, more lines after it
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"scores.jsonl, line 3: invalid JSON"):
        read_score_files([path])
    result = run("rm-bench", path)
    assert result.exit_code == 2
    assert f"error: {path}, line 3: invalid JSON" in result.stderr


def test_an_undecodable_last_line_with_a_newline_is_not_a_torn_write(tmp_path):
    path, _ = killed_writer_file(tmp_path)
    path.write_text(path.read_text() + "\n")
    with pytest.raises(DataError, match=r"scores.jsonl, line 6: invalid JSON"):
        read_score_files([path])


def test_a_file_whose_only_line_is_torn_holds_no_records(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(score_line("0", 1.0, 0.0)[:40])
    with pytest.raises(DataError, match=r"scores.jsonl: holds no score records \(its only line is a truncated write\)"):
        read_score_files([path])


def test_torn_last_line_of_a_rewardbench2_items_file(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(RB2_LITERALS + "\n" + RB2_LITERALS.splitlines()[3].replace('"3"', '"4"')[:30])
    scores = read_score_files([path])
    assert scores.ids.tolist() == ["0", "1", "2", "3"]
    assert scores.warnings[0].startswith(f"{path}: ignored a truncated last line (line 5, 30 bytes,")


# --- a byte-order mark -----------------------------------------------------------------------


def test_byte_order_mark_on_score_files(tmp_path):
    jsonl = tmp_path / "scores.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + (SCORE_LINES + "\n").encode())
    assert read_score_files([jsonl]).ids.tolist() == ["g1", "g2"]

    listed = tmp_path / "chat_results.json"
    listed.write_bytes(b"\xef\xbb\xbf" + official_rmbench_list_with_nan(tmp_path).read_bytes())
    result = run("rm-bench", listed, "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    chat = json.loads(result.stdout)["domains"]["chat"]
    assert {k: chat[k] for k in NAN_EXAMPLE} == pytest.approx(NAN_EXAMPLE, abs=1e-12)


# --- published RewardBench 2 per-item files: Factuality ids 0-9 relabelled 30-39 ------------


def with_published_id_defect(source: Path, target: Path) -> Path:
    """Copy ``source`` relabelling its first ten Factuality ids to 30–39, as in the published files."""
    lines = source.read_text().splitlines()
    relabelled = 0
    for k, line in enumerate(lines):
        row = json.loads(line)
        if row.get("subset") == "Factuality" and relabelled < 10:
            assert row["id"] == str(relabelled)
            row["id"] = str(30 + relabelled)
            lines[k] = json.dumps(row)
            relabelled += 1
    assert relabelled == 10
    target.write_text("\n".join(lines) + "\n")
    return target


# Line numbers of ids 30-39 in the reference file: the metadata line is line 1, Factuality
# ids 0-39 are lines 2-41 in order, so the relabelled records stay on lines 2-11 and the
# originals of 30-39 are on lines 32-41.
DEFECT_KEYS = ", ".join(f"Factuality/{30 + k} (lines {2 + k} and {32 + k})" for k in range(10))


def test_published_per_item_file_with_repeated_ids_gives_the_reference_figures(rb2_reference, tmp_path):
    lines = rb2_reference.read_text().splitlines()
    assert [json.loads(lines[n])["id"] for n in (1, 31, 40)] == ["0", "30", "39"]  # the line map above
    path = with_published_id_defect(rb2_reference, tmp_path / "published.jsonl")
    warning = (
        f"{path}: 10 record(s) repeat the group key of an earlier record: {DEFECT_KEYS}. Every record is counted, "
        "as the official RewardBench 2 code does (its figures outside Ties do not use ids); 'metrics compare' "
        "pairs groups by key and refuses this file until the ids are unique."
    )
    result = run("rewardbench2", path, "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # The "ours" row of shared/data/reference-results/rewardbench2/README.md (upstream code on this file).
    assert {name: round(entry["score"], 4) for name, entry in data["subsets"].items()} == RB2_REFERENCE_SUBSETS
    assert round(data["average"]["score"], 4) == RB2_REFERENCE_AVERAGE
    assert data["subsets"]["Factuality"]["n_groups"] == 475
    assert data["warnings"] == [warning]

    result = run("rewardbench2", path, "--resamples", "0")
    assert result.exit_code == 0, result.output
    assert f"Warning: {warning}" in result.stdout


def test_compare_refuses_repeated_keys_and_says_why(rb2_reference, tmp_path):
    path = with_published_id_defect(rb2_reference, tmp_path / "published.jsonl")
    result = run("compare", rb2_reference, path, "--resamples", "10")
    assert result.exit_code == 2
    keys = ", ".join(f"rewardbench2/Factuality/{k}" for k in range(30, 35))
    assert result.stderr == (
        f"error: {path}, field 'id': 10 group key(s) appear more than once ({keys} and 5 more); a comparison "
        "pairs each group of A with the group of B that has the same key, so every key must be unique: correct "
        "the ids in the file (in the published RewardBench 2 per-item files the first ten Factuality ids, 30-39, "
        "should be 0-9) and compare again\n"
    )


def test_repeated_id_inside_ties_stays_an_error(tmp_path):
    rows = [
        {"id": "ref:1", "subset": "Ties", "num_correct": 1, "scores": [[2.0], [1.0]]},
        {"id": "tied:1", "subset": "Ties", "num_correct": 2, "scores": [[2.0], [2.0], [1.0]]},
        {"id": "ref:1", "subset": "Ties", "num_correct": 1, "scores": [[0.0], [1.0]]},
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = run("rewardbench2", path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {path}, line 3, id 'ref:1', field 'id': duplicate group key (rewardbench2, Ties, ref:1); "
        f"first seen at {path} line 1; Ties pairs its rows by prompt id, so each id may appear once\n"
    )


def test_repeated_ids_across_files_stay_an_error(tmp_path):
    first = tmp_path / "a.jsonl"
    first.write_text(RB2_LITERALS + "\n")
    second = tmp_path / "b.jsonl"
    second.write_text(RB2_LITERALS.splitlines()[3] + "\n")
    with pytest.raises(DataError, match=r"b.jsonl, line 1, id '3', field 'id': duplicate group key"):
        read_score_files([first, second])
    with pytest.raises(DataError, match=r"a.jsonl, field 'files': given twice"):
        read_score_files([first, first])


def test_repeated_ids_in_records_from_a_run_stay_an_error():
    # Records of an rmserve run come from a score file that holds each key once.
    record = ScoreRecord(benchmark="rewardbench2", domain="Math", id="7", num_chosen=1, rewards=(1.0, 0.0, 0.0, 0.0))
    with pytest.raises(DataError, match=r"<records>, line 2, id '7', field 'id': duplicate group key"):
        scores_from_records([record, record])


def test_compare_reports_a_torn_last_line(tmp_path):
    path, torn_bytes = killed_writer_file(tmp_path)
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(path.read_text().split("\n")[:5]) + "\n")
    result = run("compare", whole, path, "--resamples", "10")
    assert result.exit_code == 0, result.output
    assert f"Warning: {path}: ignored a truncated last line (line 6, {torn_bytes} bytes," in result.stdout
    # The same five groups on both sides: every difference is 0.
    assert table_row(result.stdout, "Avg")[:3] == ["80.0", "80.0", "+0.0"]
