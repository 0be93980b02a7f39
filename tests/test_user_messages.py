"""The words a user reads: ``--only`` names and typos, the wrong benchmark for the data, a
missing field, parts excluded by ``--only`` in the summary, and ``metrics compare`` notes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.datasets import load_benchmark, select_parts
from rmserve.errors import DataError
from testkit.metrics_data import rmbench_record, write_jsonl
from testkit.servers import write_rmbench_data

runner = CliRunner()

RMBENCH_NAMES = "chat, math, code, safety (safety-refuse and safety-response), safety-refuse, safety-response"
RB2_NAMES = "Factuality, Precise IF, Math, Safety, Focus, Ties"


# --- --only -------------------------------------------------------------------------------


def test_only_takes_the_table_names_in_any_case():
    assert select_parts(["rm-bench"], ["Safety"]) == {"rm-bench": ("safety-refuse", "safety-response")}
    assert select_parts(["rm-bench"], ["CODE", "chat"]) == {"rm-bench": ("chat", "code")}
    assert select_parts(["rewardbench2"], ["precise if", "ties"]) == {"rewardbench2": ("Precise IF", "Ties")}
    assert select_parts(["rewardbench2"], ["Precise_IF"]) == {"rewardbench2": ("Precise IF",)}
    # Several benchmarks: each keeps the names that are its own.
    assert select_parts(["rm-bench", "rewardbench2"], ["math", "Focus", "chat"]) == {
        "rm-bench": ("chat", "math"), "rewardbench2": ("Math", "Focus"),
    }


def test_safety_loads_both_safety_domains(tmp_path):
    rows = [
        {"id": 1, "domain": d, "prompt": "p", "chosen": ["a", "b", "c"], "rejected": ["d", "e", "f"]}
        for d in ("chat", "safety-refuse", "safety-response")
    ]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    dataset = load_benchmark("rm-bench", str(data), ["safety"])
    assert sorted(g.domain for g in dataset.groups) == ["safety-refuse", "safety-response"]
    assert dataset.excluded == ("chat", "math", "code")
    assert dataset.missing == ()


def test_an_only_typo_is_blamed_on_only_with_the_valid_names(tmp_path):
    result = runner.invoke(app, [
        "eval", "--server", "http://127.0.0.1:1", "--bench", "rm-bench", "--data", str(tmp_path),
        "--out", str(tmp_path / "out"), "--only", "chatt",
    ])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--only': 'chatt' is not an RM-Bench domain; did you mean 'chat'? "
        f"Valid names (any case): {RMBENCH_NAMES}"
    )
    assert "--data" not in result.stderr


def test_an_only_name_far_from_every_name_gets_no_suggestion():
    with pytest.raises(ValueError) as caught:
        select_parts(["rewardbench2"], ["zzz"])
    assert str(caught.value) == f"'zzz' is not a RewardBench 2 subset. Valid names (any case): {RB2_NAMES}"


def test_sweep_only_that_selects_nothing_from_one_benchmark(tmp_path):
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    result = runner.invoke(app, [
        "sweep", "--server", "http://127.0.0.1:1", "--bench", "rm-bench,rewardbench2",
        "--data", "rm-bench=x", "--data", "rewardbench2=y", "--out", str(tmp_path / "out"),
        "--store", str(tmp_path / "s.sqlite"), "--only", "chat", str(checkpoint),
    ])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--only': 'chat' selects no RewardBench 2 subset; add one of "
        f"{RB2_NAMES}, or leave rewardbench2 out of the run"
    )


def test_eval_only_chat_says_the_other_domains_were_excluded(scoring_server, tmp_path):
    url, _ = scoring_server
    data = write_rmbench_data(tmp_path / "d.jsonl")  # chat and code groups
    result = runner.invoke(app, [
        "eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--out", str(tmp_path / "out"),
        "--only", "Chat", "--resamples", "10", "-q",
    ])
    assert result.exit_code == 0, result.output
    assert (
        "Note: Excluded by --only: math, code, safety. Easy, Normal, Hard and Avg are means over chat only "
        "(partial)."
    ) in result.stdout
    assert "Missing" not in result.stdout and "not in the data" not in result.output


def test_a_missing_domain_is_still_called_missing_next_to_an_excluded_one(scoring_server, tmp_path):
    url, _ = scoring_server
    data = write_rmbench_data(tmp_path / "d.jsonl")  # chat and code groups; no math
    result = runner.invoke(app, [
        "eval", "--server", url, "--bench", "rm-bench", "--data", str(data), "--out", str(tmp_path / "out"),
        "--only", "chat", "--only", "math", "--resamples", "10", "-q",
    ])
    assert result.exit_code == 0, result.output
    assert (
        "Note: Excluded by --only: code, safety. Missing domain(s): math. Easy, Normal, Hard and Avg are means "
        "over chat only (partial)."
    ) in result.stdout
    assert f"note: not in the data ({data}): math" in result.stderr


# --- data messages ------------------------------------------------------------------------


def _rmbench_release(folder: Path) -> Path:
    folder.mkdir()
    for domain in ("chat", "code", "safety-refuse", "safety-response"):
        (folder / f"{domain}_filtered.json").write_text(json.dumps(
            [{"id": 1, "prompt": "p", "chosen": ["a", "b", "c"], "rejected": ["d", "e", "f"], "subset": "x"}]
        ))
    return folder


def test_rm_bench_data_given_as_rewardbench2_says_what_the_folder_holds(tmp_path):
    folder = _rmbench_release(tmp_path / "rmb")
    with pytest.raises(DataError) as caught:
        load_benchmark("rewardbench2", str(folder))
    assert str(caught.value) == (
        f"{folder}: no RewardBench 2 data: the folder holds 4 RM-Bench release files (chat_filtered.json, "
        "code_filtered.json, safety-refuse_filtered.json, safety-response_filtered.json), but no parquet or "
        "JSONL files; use --bench rm-bench"
    )
    result = runner.invoke(app, [
        "eval", "--server", "http://127.0.0.1:1", "--bench", "rewardbench2", "--data", str(folder),
        "--out", str(tmp_path / "out"),
    ])
    assert result.exit_code == 2
    assert "Invalid value for '--data'" in result.stderr and "use --bench rm-bench" in result.stderr


def test_an_rm_bench_file_given_as_rewardbench2(tmp_path):
    path = _rmbench_release(tmp_path / "rmb") / "chat_filtered.json"
    with pytest.raises(DataError) as caught:
        load_benchmark("rewardbench2", str(path))
    assert str(caught.value) == (
        f"{path}, record 0, id '1', field 'num_correct': an RM-Bench record (no num_correct; a domain or a "
        "<domain>_filtered.json file), not RewardBench 2; use --bench rm-bench"
    )


def test_rewardbench2_data_given_as_rm_bench(tmp_path):
    folder = tmp_path / "rb2"
    folder.mkdir()
    row = {"id": "1", "prompt": "p", "chosen": ["a"], "rejected": ["b", "c", "d"], "num_correct": 1,
           "num_incorrect": 3, "total_completions": 4, "subset": "Focus"}
    write_jsonl(folder / "test.jsonl", [row])
    with pytest.raises(DataError) as caught:
        load_benchmark("rm-bench", str(folder))
    assert str(caught.value) == (
        f"{folder}: no RM-Bench data: the folder holds 1 JSONL file, but neither total_dataset.json nor "
        "<domain>_filtered.json files; RewardBench 2 data? use --bench rewardbench2"
    )
    with pytest.raises(DataError) as caught:
        load_benchmark("rm-bench", str(folder / "test.jsonl"))
    assert str(caught.value) == (
        f"{folder / 'test.jsonl'}, record 0, id '1', field 'subset': a RewardBench 2 record (subset 'Focus', "
        "num_correct), not RM-Bench; use --bench rewardbench2"
    )


def test_a_missing_field_is_called_missing(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": 7, "domain": "chat", "prompt": "p", "chosen": ["a", "b", "c"]}])
    with pytest.raises(DataError) as caught:
        load_benchmark("rm-bench", str(data))
    assert str(caught.value) == f"{data}, record 0, id '7', field 'rejected': missing (must be a list of 3 strings)"


# --- metrics compare ----------------------------------------------------------------------


def _scores(path: Path, fingerprint: str, shift: float) -> Path:
    records = [
        msgspec.structs.replace(
            rmbench_record("chat", str(i), [1 + shift, 2, 3, 1, 2, 3]), fingerprint=fingerprint, model="m"
        )
        for i in range(4)
    ]
    return write_jsonl(path, records)


def test_compare_of_a_run_with_itself_says_it_is_the_same_model(tmp_path):
    a = _scores(tmp_path / "a.jsonl", "fp-1", 0.0)
    result = runner.invoke(app, ["metrics", "compare", str(a), str(a), "--resamples", "10"])
    assert result.exit_code == 0, result.output
    assert (
        "Note: A and B are the same model (same fingerprint fp-1): differences are only scoring noise, 0 when "
        "scoring is deterministic."
    ) in result.stdout
    assert "Note: A and B hold identical scores for every group: every difference is 0." in result.stdout


def test_compare_of_two_models_has_no_such_note(tmp_path):
    a = _scores(tmp_path / "a.jsonl", "fp-1", 0.0)
    b = _scores(tmp_path / "b.jsonl", "fp-2", 5.0)
    result = runner.invoke(app, ["metrics", "compare", str(a), str(b), "--resamples", "10", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    # the files hold chat groups only: that note, and no same-model note (two fingerprints)
    assert document["notes"] == ["No paired group of math, code, safety: the averages are over chat only (partial)."]
    assert document["partial"] is False


def test_compare_names_what_one_side_lacks(tmp_path):
    a = _scores(tmp_path / "a.jsonl", "fp-1", 0.0)
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    b = write_jsonl(tmp_path / "b.jsonl", [r | {"fingerprint": "fp-2"} for r in rows[:3]])
    result = runner.invoke(app, ["metrics", "compare", str(a), str(b), "--resamples", "10", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["partial"] is True and document["n_groups"] == 3
    assert document["notes"] == [
        "Partial comparison: 1 group(s) only in A (chat 1); they are left out, and the figures of both sides "
        "cover the 3 group(s) both hold.",
        "No paired group of math, code, safety: the averages are over chat only (partial).",
        "A and B hold identical scores for every group: every difference is 0.",
    ]


def test_an_only_selection_the_data_lacks_is_blamed_on_only(tmp_path):
    rows = [
        {"id": 1, "domain": d, "prompt": "p", "chosen": ["a", "b", "c"], "rejected": ["d", "e", "f"]}
        for d in ("chat", "code")
    ]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError) as info:
        load_benchmark("rm-bench", str(data), ["math"])
    assert info.value.field == "domains"  # the loader's argument; the CLI names it --only
    assert str(info.value).endswith(f"selects math, which the data ({data}) does not hold; it holds chat, code")
