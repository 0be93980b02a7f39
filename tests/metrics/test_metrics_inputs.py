"""Score-file readers: the three formats, concatenation and every rejected input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from testkit.metrics_data import rmbench_record
from rmserve.metrics.score_files import read_score_files, scores_from_records
from rmserve.metrics.scores import RB2Scores, RMBenchScores

from rmserve.errors import DataError
from rmserve.schema import ScoreRecord


def rb2_item(subset: str, item_id: str, scores: list[float], num_correct: int = 1) -> dict:
    return {
        "id": item_id,
        "subset": subset,
        "num_correct": num_correct,
        "scores": [[s] for s in scores],
        "results": None,
    }


def rb2_record(subset: str, item_id: str, rewards: list[float | None], num_chosen: int = 1) -> ScoreRecord:
    return ScoreRecord(
        benchmark="rewardbench2", domain=subset, id=item_id, num_chosen=num_chosen, rewards=tuple(rewards)
    )


def official(item_id, chosen, rejected, **extra) -> dict:
    return {"id": item_id, "prompt": "p", "score_chosen": chosen, "score_rejected": rejected, **extra}


# --- formats ----------------------------------------------------------------------------


def test_score_records_jsonl(jsonl_writer):
    path = jsonl_writer(
        "scores.jsonl",
        [rmbench_record("chat", "1", [1, 2, 3, 4, 5, 6]), rmbench_record("code", "1", [1, None, 3, 4, 5, 6])],
    )
    s = read_score_files([path])
    assert isinstance(s, RMBenchScores)
    assert s.rewards.shape == (2, 6)
    assert math.isnan(s.rewards[1, 1])
    assert s.domains.tolist() == ["chat", "code"]
    assert s.keys().tolist() == ["rm-bench/chat/1", "rm-bench/code/1"]
    assert s.files == (str(path),)
    assert not s.rewards.flags.writeable


def test_rb2_score_records_pad_ties(jsonl_writer):
    path = jsonl_writer(
        "rb2.jsonl",
        [rb2_record("Math", "0", [1, 2, 3, 4]), rb2_record("Ties", "tied:3", [1, 2, 3, 4, 5, 6], num_chosen=2)],
    )
    s = read_score_files([path])
    assert isinstance(s, RB2Scores)
    assert s.scores.shape == (2, 6)
    assert s.lengths.tolist() == [4, 6]
    assert s.num_correct.tolist() == [1, 2]
    assert np.isnan(s.scores[0, 4:]).all()


def test_official_rmbench_list_with_domains(tmp_path):
    path = tmp_path / "total_results.json"
    path.write_text(
        json.dumps(
            [
                official(1, [1, 2, 3], [0, 0, 0], domain="chat"),
                official(1, [3, 2, 1], [4, 4, 4], domain="safety-refuse"),
            ],
            indent=4,
        )
    )
    s = read_score_files([path])
    assert s.domains.tolist() == ["chat", "safety-refuse"]
    assert s.ids.tolist() == ["1", "1"]
    assert s.rewards[1].tolist() == [3, 2, 1, 4, 4, 4]


def test_official_rmbench_domain_from_file_name_or_option(tmp_path):
    chat = tmp_path / "chat_filtered_results.json"
    chat.write_text(json.dumps([official(7, [1, 2, 3], [0, 0, 0])]))
    refuse = tmp_path / "safety-refuse.json"
    refuse.write_text(json.dumps([official(7, [1, 2, 3], [0, 0, 0])]))
    s = read_score_files([chat, refuse])
    assert s.domains.tolist() == ["chat", "safety-refuse"]
    odd = tmp_path / "results.json"
    odd.write_text(json.dumps([official(7, [1, 2, 3], [0, 0, 0])]))
    assert read_score_files([odd], domain="code").domains.tolist() == ["code"]
    with pytest.raises(DataError, match=r"results.json, line 1, id '7', field 'domain': missing"):
        read_score_files([odd])


def test_rb2_items_with_metadata_line(jsonl_writer):
    path = jsonl_writer(
        "items.jsonl",
        [
            {"_record": "metadata", "model": "m"},
            rb2_item("Focus", "0", [3, 1, 2, 0]),
            rb2_item("Focus", "1", [0, 1, 2, 3]),
        ],
    )
    s = read_score_files([path])
    assert s.subsets.tolist() == ["Focus", "Focus"]
    assert s.scores.tolist() == [[3, 1, 2, 0], [0, 1, 2, 3]]


def test_several_files_concatenate(jsonl_writer):
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", "1", [1] * 6)])
    b = jsonl_writer("b.jsonl", [rmbench_record("chat", "2", [1] * 6)])
    s = read_score_files([a, b])
    assert s.ids.tolist() == ["1", "2"]
    assert s.files == (str(a), str(b))


def test_records_in_memory_match_file(jsonl_writer):
    records = [rmbench_record("code", str(i), [i, 1, 2, 3, 4, 5]) for i in range(4)]
    from_file = read_score_files([jsonl_writer("s.jsonl", records)])
    in_memory = scores_from_records(records)
    np.testing.assert_array_equal(from_file.rewards, in_memory.rewards)
    assert in_memory.files == ("<records>",)


# --- rejected input ---------------------------------------------------------------------


def error_of(paths, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        read_score_files(paths, **kwargs)
    return str(info.value)


def test_wrong_number_of_responses(jsonl_writer):
    path = jsonl_writer("s.jsonl", [rmbench_record("chat", "1", [1] * 6), rmbench_record("chat", "2", [1] * 5)])
    assert (
        error_of([path])
        == f"{path}, line 2, id '2', field 'rewards': must hold 6 rewards (3 chosen, 3 rejected), got 5"
    )


def test_wrong_number_of_scores_in_rb2_item(jsonl_writer):
    path = jsonl_writer("i.jsonl", [rb2_item("Math", "0", [1, 2, 3])])
    assert "line 1, id '0', field 'scores': must hold 4 scores" in error_of([path])


def test_wrong_number_of_official_scores_reports_record_line(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([official(1, [1, 2, 3], [0, 0, 0]), official(2, [1, 2], [0, 0, 0])], indent=2))
    lines = path.read_text().splitlines()
    start = [k for k, line in enumerate(lines, start=1) if line == "  {"][1]
    assert error_of([path]) == (
        f"{path}, line {start}, id '2', field 'score_chosen': "
        "must hold 3 scores (concise, detailed plain, detailed markdown), got 2"
    )


def test_non_numeric_score(jsonl_writer):
    bad = {"benchmark": "rm-bench", "domain": "chat", "id": "1", "num_chosen": 3, "rewards": [1, 2, "x", 4, 5, 6]}
    path = jsonl_writer("s.jsonl", [bad])
    message = error_of([path])
    assert message.startswith(f"{path}, line 1, field 'rewards[2]': Expected `float | null`, got `str`")
    item = rb2_item("Math", "0", [1, 2, 3, 4])
    item["scores"][3] = ["high"]
    path = jsonl_writer("i.jsonl", [item])
    assert "line 1, field 'scores[3]" in error_of([path])


def test_missing_id(jsonl_writer):
    item = rb2_item("Math", "0", [1, 2, 3, 4])
    del item["id"]
    path = jsonl_writer("i.jsonl", [rb2_item("Math", "1", [1, 2, 3, 4]), item])
    assert error_of([path]) == f"{path}, line 2, field 'id': missing"
    empty = jsonl_writer("e.jsonl", [rmbench_record("chat", "", [1] * 6)])
    assert error_of([empty]) == f"{empty}, line 1, field 'id': missing or empty"


def test_two_benchmarks_in_one_file(jsonl_writer):
    path = jsonl_writer("s.jsonl", [rmbench_record("chat", "1", [1] * 6), rb2_record("Math", "1", [1, 2, 3, 4])])
    assert error_of([path]) == (
        f"{path}, line 2, field 'benchmark': two benchmarks in one file: this record is rewardbench2, "
        "earlier ones are rm-bench"
    )
    mixed = jsonl_writer("m.jsonl", [rb2_item("Math", "0", [1, 2, 3, 4]), official(1, [1, 2, 3], [0, 0, 0])])
    assert "line 2, field 'benchmark': two benchmarks in one file" in error_of([mixed])


def test_files_of_different_benchmarks(jsonl_writer):
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", "1", [1] * 6)])
    b = jsonl_writer("b.jsonl", [rb2_record("Math", "1", [1, 2, 3, 4])])
    assert f"{b}, line 1, field 'benchmark': holds rewardbench2 scores, but {a} holds rm-bench" in error_of([a, b])
    assert "but rm-bench scores were asked for" in error_of([b], benchmark="rm-bench")


def test_unknown_subset_and_domain(jsonl_writer):
    path = jsonl_writer("i.jsonl", [rb2_item("Chat Hard", "0", [1, 2, 3, 4])])
    assert error_of([path]).startswith(
        f"{path}, line 1, id '0', field 'subset': unknown RewardBench 2 subset 'Chat Hard'"
    )
    path = jsonl_writer("s.jsonl", [rmbench_record("safety", "0", [1] * 6)])
    assert "field 'domain': unknown RM-Bench domain 'safety'" in error_of([path])


def test_duplicate_key_across_files(jsonl_writer):
    a = jsonl_writer("a.jsonl", [rmbench_record("chat", "1", [1] * 6), rmbench_record("code", "1", [1] * 6)])
    b = jsonl_writer("b.jsonl", [rmbench_record("chat", "1", [2] * 6)])
    assert error_of([a, b]) == (
        f"{b}, line 1, id '1', field 'id': duplicate group key (rm-bench, chat, 1); first seen at {a} line 1"
    )


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        (
            {"benchmark": "rm-bench", "domain": "chat", "id": "1", "num_chosen": 2, "rewards": [1] * 6},
            "num_chosen",
            "must be 3",
        ),
        (
            {
                "benchmark": "rm-bench",
                "domain": "chat",
                "id": "1",
                "num_chosen": 3,
                "rewards": [1] * 6,
                "styles": ["detailed_plain", "concise", "detailed_markdown"] * 2,
            },
            "styles",
            "must be",
        ),
        (
            {"benchmark": "rewardbench2", "domain": "Ties", "id": "7", "num_chosen": 1, "rewards": [1, 0]},
            "id",
            "ref:<n>",
        ),
        (
            {"benchmark": "rewardbench2", "domain": "Ties", "id": "ref:7", "num_chosen": 2, "rewards": [1, 0]},
            "num_chosen",
            "[1, 1]",
        ),
        (
            {"benchmark": "rewardbench2", "domain": "Math", "id": "7", "num_chosen": 2, "rewards": [1, 0, 0, 0]},
            "num_chosen",
            "outside the Ties",
        ),
        (
            {"benchmark": "rm-bench-v2", "domain": "chat", "id": "1", "num_chosen": 3, "rewards": [1] * 6},
            "benchmark",
            "unknown",
        ),
    ],
)
def test_field_rules(jsonl_writer, row, field, message):
    text = error_of([jsonl_writer("s.jsonl", [row])])
    assert f"field '{field}'" in text and message in text


def test_structural_problems(tmp_path, jsonl_writer):
    assert "no such file" in error_of([tmp_path / "absent.jsonl"])
    broken = tmp_path / "broken.jsonl"
    good = '{"benchmark": "rm-bench", "domain": "chat", "id": "1", "num_chosen": 3, "rewards": [1, 1, 1, 1, 1, 1]}'
    broken.write_text(good + "\n{not json\n")
    assert f"{broken}, line 2: invalid JSON" in error_of([broken])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no score records" in error_of([empty])
    late_meta = jsonl_writer("late.jsonl", [rb2_item("Math", "0", [1, 2, 3, 4]), {"_record": "metadata"}])
    assert "line 2, field '_record': a metadata record may only be the first line" in error_of([late_meta])
    unknown = jsonl_writer("u.jsonl", [{"id": "1", "score": 3}])
    assert "line 1: unrecognised score record" in error_of([unknown])
    assert "field 'domain'" in error_of([late_meta], domain="nope")


def test_in_memory_records_are_validated():
    with pytest.raises(DataError, match=r"<records>, line 2, id '1', field 'rewards'"):
        scores_from_records([rmbench_record("chat", "0", [1] * 6), rmbench_record("chat", "1", [1] * 3)])
    with pytest.raises(DataError, match="two benchmarks in one run"):
        scores_from_records([rmbench_record("chat", "0", [1] * 6), rb2_record("Math", "0", [1, 2, 3, 4])])


def test_json_list_line_numbers_survive_strings_with_brackets(tmp_path):
    path = tmp_path / "code.json"
    rows = [official(1, [1, 2, 3], [0, 0, 0], note='tricky "[{,}]" text'), official(2, [1, 2, 3], [0, 0])]
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    assert error_of([path]).startswith(f"{path}, line 3, id '2', field 'score_rejected'")


def test_reader_does_not_touch_files(jsonl_writer):
    path: Path = jsonl_writer("s.jsonl", [rmbench_record("chat", "1", [1] * 6)])
    before = path.read_bytes()
    read_score_files([path])
    assert path.read_bytes() == before


def test_record_order_changes_no_figure_and_no_interval(tmp_path):
    """A score file in completion order gives the same figures and intervals as one in data order."""
    import random

    from rmserve.metrics.evaluation import MetricsConfig, evaluate_files
    from rmserve.metrics.render_json import result_dict

    from rmserve.schema import ScoreRecord, encode

    rng = random.Random(7)
    records = [
        ScoreRecord(benchmark="rm-bench", domain=d, id=str(i), num_chosen=3, rewards=tuple(rng.gauss(0, 1) for _ in range(6)))
        for d in ("chat", "code") for i in range(40)
    ]
    shuffled = records[:]
    rng.shuffle(shuffled)
    paths = []
    for name, recs in (("ordered.jsonl", records), ("shuffled.jsonl", shuffled)):
        path = tmp_path / name
        path.write_bytes(b"".join(encode(r) + b"\n" for r in recs))
        paths.append(path)
    config = MetricsConfig(resamples=200, seed=3, benchmark="rm-bench")
    a, b = (result_dict(evaluate_files([p], config)) for p in paths)
    a.pop("files"), b.pop("files")
    assert a == b
