"""A judge's set-up (sampling, engine) in score files: shown with the figures, never mixed.

The records are written out by hand as a judge run writes them: two RewardBench 2 Factuality
groups judged by ranking (credit 1 and 0, so Factuality = 0.5), with the ``judge_sampling`` and
``judge_engine`` a vLLM judge records, or without them (a record written before rmserve recorded
them).
"""

from __future__ import annotations

import json

import msgspec
import pytest
from rmserve.metrics.comparison import compare_files
from rmserve.metrics.evaluation import MetricsConfig, evaluate_files
from rmserve.metrics.render_json import comparison_dict, result_dict
from rmserve.metrics.render_markdown import render_markdown
from rmserve.metrics.score_files import read_score_files
from testkit.metrics_data import write_jsonl
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError
from rmserve.judge_records import JudgeCall, JudgeGroupResult, JudgeParse
from rmserve.schema import JudgeEngineInfo, JudgeSampling, ScoreRecord

runner = CliRunner()

GREEDY = JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=2048)
VLLM = JudgeEngineInfo("vllm", "0.32.0", False, "vLLM batches its calls")


def ranked(id: str, verdict: str, *, sampling=GREEDY, engine=VLLM) -> ScoreRecord:
    """A ranking judge's score record of Factuality group ``id``, the correct answer shown at A."""
    call = JudgeCall(
        protocol="rb2-ranking", messages_sha256="0" * 64, responses=(0, 1, 2, 3), text=f"[[{verdict}]]",
        parse=JudgeParse("rb2-ranking-official", "ok", verdict=verdict, candidates=(verdict,)),
        prompt_tokens=80, completion_tokens=5, finish_reason="stop",
    )
    judge = JudgeGroupResult(
        benchmark="rewardbench2", domain="Factuality", id=id, protocol="rb2-ranking", compat="none", num_chosen=1,
        calls=(call,), credit=1.0 if verdict == "A" else 0.0, position=0, seed=0,
    )
    rewards = tuple(1.0 if "ABCD"[j] == verdict else 0.0 for j in range(4))
    return ScoreRecord(
        benchmark="rewardbench2", domain="Factuality", id=id, num_chosen=1, rewards=rewards, num_tokens=(20,) * 4,
        num_cached_tokens=(0,) * 4, model="judge-lm", fingerprint="feed", kind="judge", mode="ranking",
        judge=judge, judge_sampling=sampling, judge_engine=engine,
    )


def old(record: ScoreRecord) -> ScoreRecord:
    """The record as an rmserve that did not record the set-up wrote it."""
    return msgspec.structs.replace(record, judge_sampling=None, judge_engine=None)


def test_records_of_one_set_up_show_it_in_results_json_and_the_table(tmp_path):
    path = write_jsonl(tmp_path / "scores.jsonl", [ranked("0", "A"), ranked("1", "B")])
    evaluation = evaluate_files([path], MetricsConfig(resamples=0))
    assert evaluation.result.subset("Factuality").score == 0.5
    judge = result_dict(evaluation)["judge"]
    assert judge["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 2048}
    assert judge["engine"] == {
        "engine": "vllm", "version": "0.32.0", "batch_invariant": False, "batch_invariant_note": "vLLM batches its calls",
    }
    assert judge["n_unrecorded"] == 0
    table = render_markdown(evaluation)
    assert (
        "Judge set-up: sampling temperature 0, top_p 1, max_tokens 2,048; engine vllm 0.32.0, not batch-invariant "
        "(vLLM batches its calls).\n"
    ) in table
    assert "do not state the judge's sampling" not in table
    # The same through the command: results.json and table.md as written by `rmserve metrics --out`.
    out = tmp_path / "report"
    result = runner.invoke(app, ["metrics", "rewardbench2", str(path), "--out", str(out), "--resamples", "0"])
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "results.json").read_text())["judge"]["sampling"] == judge["sampling"]
    assert "Judge set-up: sampling temperature 0, top_p 1, max_tokens 2,048;" in (out / "table.md").read_text()


def test_two_score_files_differing_in_temperature_are_refused(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [ranked("0", "A")])
    b = write_jsonl(tmp_path / "b.jsonl", [ranked("1", "B", sampling=JudgeSampling(0.7, 1.0, 2048))])
    with pytest.raises(DataError) as caught:
        read_score_files([a, b])
    err = caught.value
    assert (err.field, err.value, err.limit, err.path, err.line) == ("judge_sampling.temperature", 0.7, 0.0, str(b), 1)
    assert err.reason.startswith(f"is 0.7 here but 0.0 in {a} line 1: a judge's figures depend on how it decoded")
    result = runner.invoke(app, ["metrics", "rewardbench2", str(a), str(b), "--resamples", "0"])
    assert result.exit_code == 2
    assert f"{b}, line 1, id '1', field 'judge_sampling.temperature': is 0.7 here but 0.0 in {a} line 1" in result.stderr


@pytest.mark.parametrize(("changed", "field", "value", "first"), [
    (dict(sampling=JudgeSampling(0.0, 0.95, 2048)), "judge_sampling.top_p", 0.95, 1.0),
    (dict(sampling=JudgeSampling(0.0, 1.0, 512)), "judge_sampling.max_tokens", 512, 2048),
    (dict(engine=JudgeEngineInfo("vllm", "0.33.1", False, "vLLM batches its calls")), "judge_engine.version",
     "0.33.1", "0.32.0"),
    (dict(engine=JudgeEngineInfo("hf", "5.19.0", True, "one call at a time")), "judge_engine.engine", "hf", "vllm"),
    (dict(engine=JudgeEngineInfo("vllm", "0.32.0", True, "batch-invariant mode")), "judge_engine.batch_invariant",
     True, False),
])
def test_every_set_up_field_is_compared_within_one_file(tmp_path, changed, field, value, first):
    path = write_jsonl(tmp_path / "scores.jsonl", [ranked("0", "A"), ranked("1", "B", **changed)])
    with pytest.raises(DataError) as caught:
        read_score_files([path])
    assert (caught.value.field, caught.value.value, caught.value.limit, caught.value.line) == (field, value, first, 2)


def test_the_explanation_alone_may_differ(tmp_path):
    reworded = JudgeEngineInfo("vllm", "0.32.0", False, "worded otherwise")
    path = write_jsonl(tmp_path / "scores.jsonl", [ranked("0", "A"), ranked("1", "B", engine=reworded)])
    assert read_score_files([path]).judge_setup.engine == VLLM  # the first record's


def test_old_records_read_as_unknown(tmp_path):
    path = write_jsonl(tmp_path / "old.jsonl", [old(ranked("0", "A")), old(ranked("1", "B"))])
    raw = path.read_text()
    assert "judge_sampling" not in raw and "judge_engine" not in raw
    evaluation = evaluate_files([path], MetricsConfig(resamples=0))
    assert evaluation.result.subset("Factuality").score == 0.5
    judge = result_dict(evaluation)["judge"]
    assert (judge["sampling"], judge["engine"], judge["n_unrecorded"]) == (None, None, 2)
    table = render_markdown(evaluation)
    assert "Judge set-up: sampling not recorded; engine not recorded.\n" in table
    assert (
        "Note: The score records do not state the judge's sampling or engine (written before rmserve recorded "
        "them): that part of the judge's set-up is unknown."
    ) in table


def test_old_and_new_records_mix_with_a_note(tmp_path):
    a = write_jsonl(tmp_path / "old.jsonl", [old(ranked("0", "A"))])
    b = write_jsonl(tmp_path / "new.jsonl", [ranked("1", "B")])
    evaluation = evaluate_files([a, b], MetricsConfig(resamples=0))
    data = result_dict(evaluation)
    assert data["judge"]["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 2048}
    assert data["judge"]["n_unrecorded"] == 1
    assert (
        "1 of 2 score records do not state the judge's sampling or engine (written before rmserve recorded them): "
        "their set-up is unknown; the set-up shown is the other records' only."
    ) in data["notes"]
    assert "vLLM batches its calls) (1 of 2 records state no set-up: unknown).\n" in render_markdown(evaluation)


def test_a_comparison_of_judges_of_different_temperature_says_which_fields_differ(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [ranked("0", "A"), ranked("1", "B")])
    hot = JudgeSampling(0.7, 1.0, 2048)
    b = write_jsonl(tmp_path / "b.jsonl", [ranked("0", "A", sampling=hot), ranked("1", "A", sampling=hot)])
    comparison = compare_files(a, b, MetricsConfig(resamples=20))
    assert comparison_dict(comparison)["notes"][-1] == (
        f"A ({a}) and B ({b}) were judged under different set-ups (judge_sampling.temperature 0.0 in A, 0.7 in B): "
        "the differences B − A measure these settings as well as the judges."
    )
    assert {f.figure: f.difference for f in comparison.figures}["Factuality"] == 0.5
    result = runner.invoke(app, ["metrics", "compare", str(a), str(b), "--resamples", "20"])
    assert result.exit_code == 0, result.stderr
    assert "judge_sampling.temperature 0.0 in A, 0.7 in B" in result.stdout


def test_a_comparison_with_an_unrecorded_side_says_so(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [old(ranked("0", "A")), old(ranked("1", "B"))])
    other_model = [msgspec.structs.replace(ranked(id, "A"), fingerprint="beef") for id in ("0", "1")]
    b = write_jsonl(tmp_path / "b.jsonl", other_model)
    comparison = compare_files(a, b, MetricsConfig(resamples=20))
    assert comparison_dict(comparison)["notes"] == [
        "No paired group of Precise IF, Math, Safety, Focus, Ties: the averages are over "
        "Factuality only (partial).",
        "2 of 2 score records of A do not state the judge's sampling or engine (written before rmserve recorded "
        "them): the comparison cannot show that both sides were judged under one set-up.",
    ]
    assert {f.figure: f.difference for f in comparison.figures}["Factuality"] == 0.5
