"""DPO rewards recomputed from the extras (``--dpo-reward``), and the kind of score recorded in
every output. The expected rewards of the two-group example are written out by hand from the
formulas of ``rewardbench/dpo.py`` (avg = policy_logp / answer_tokens, sum = policy_logp,
norm = -policy_logp_norm, reference = policy_logp - ref_logp)."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from rmserve.metrics.dpo import dpo_rewards
from rmserve.metrics.score_files import read_score_files, scores_from_records
from rmserve.client.score_file import read_scores
from rmserve.metrics.evaluation import MetricsConfig, evaluate_files, evaluate_records
from rmserve.metrics.render_json import result_dict
from rmserve.metrics.render_markdown import render_markdown
from testkit.metrics_data import rmbench_record
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError
from rmserve.schema import ResponseError, encode

# Group chat/1 and group code/2: 3 chosen then 3 rejected responses each.
POLICY_LOGP = ([-10, -12, -30, -8, -20, -40], [-6, -9, -16, -3, -12, -21])
ANSWER_TOKENS = ([5, 4, 10, 2, 10, 8], [3, 3, 4, 1, 6, 7])
POLICY_LOGP_NORM = ([3, 4, 5, 6, 2, 1], [2.5, 1.5, 0.5, 3.5, 4.5, 0.25])
REF_LOGP = ([-11, -15, -28, -10, -18, -45], [-7, -8, -20, -4, -10, -20])

EXPECTED = {
    "avg": [[-2, -3, -3, -4, -2, -5], [-2, -3, -4, -3, -2, -3]],
    "sum": [[-10, -12, -30, -8, -20, -40], [-6, -9, -16, -3, -12, -21]],
    "norm": [[-3, -4, -5, -6, -2, -1], [-2.5, -1.5, -0.5, -3.5, -4.5, -0.25]],
    "reference": [[1, 3, -2, 2, -2, 5], [1, -1, 4, 1, -2, -1]],
}
"""Each reward of the two groups, computed by hand."""

KIND = {"kind": "dpo", "mode": "reference", "ref_model": "ref-1b", "compat": "none"}


def _dpo_records(*, mode: str = "reference", ref_logp=REF_LOGP, rewards=None):
    records = []
    for g, (domain, record_id) in enumerate((("chat", "1"), ("code", "2"))):
        extras = {
            "policy_logp": tuple(POLICY_LOGP[g]),
            "ref_logp": tuple(ref_logp[g]) if ref_logp is not None else (None,) * 6,
            "policy_logp_norm": tuple(POLICY_LOGP_NORM[g]),
            "answer_tokens": tuple(ANSWER_TOKENS[g]),
        }
        base = rmbench_record(domain, record_id, rewards[g] if rewards else EXPECTED[mode][g])
        records.append(
            msgspec.structs.replace(
                base, model="policy-1b", fingerprint=f"fp-{mode}", extras=extras, kind="dpo", mode=mode,
                ref_model="ref-1b" if mode == "reference" else None,
            )
        )
    return records


def _write(path, records):
    path.write_bytes(b"".join(encode(r) + b"\n" for r in records))
    return path


@pytest.mark.parametrize("reward", ["avg", "sum", "norm", "reference"])
def test_each_reward_is_recomputed_from_the_extras(reward):
    scores = scores_from_records(_dpo_records(), dpo_reward=reward)
    np.testing.assert_array_equal(scores.rewards, np.array(EXPECTED[reward], dtype=float))
    assert scores.reward == f"dpo:{reward}"


def test_without_dpo_reward_the_rewards_are_the_scored_ones():
    scored = [[0.5] * 6, [0.25] * 6]
    scores = scores_from_records(_dpo_records(rewards=scored))
    np.testing.assert_array_equal(scores.rewards, np.array(scored))
    assert scores.reward == "rewards"


def test_array_function_rules():
    parts = {
        "policy_logp": np.array([[-4.0, np.nan, -3.0]]),
        "answer_tokens": np.array([[2.0, 5.0, 0.0]]),
    }
    # NaN part -> NaN; 0 answer tokens -> NaN (0/0 in the official mean), not -inf.
    np.testing.assert_array_equal(dpo_rewards("avg", parts), np.array([[-2.0, np.nan, np.nan]]))
    with pytest.raises(ValueError, match=r"extras.ref_logp: needed for the DPO reward 'reference'"):
        dpo_rewards("reference", parts)
    with pytest.raises(ValueError, match="dpo_reward must be one of avg, sum, norm, reference, got 'mean'"):
        dpo_rewards("mean", parts)


def test_a_response_without_a_reward_keeps_none():
    records = _dpo_records()
    first = records[0]
    extras = {name: (None, *values[1:]) for name, values in first.extras.items()}
    records[0] = msgspec.structs.replace(
        first, rewards=(None, *first.rewards[1:]), extras=extras,
        errors=(ResponseError("sequence_too_long", "too long"),) + (None,) * 5,
    )
    rewards = scores_from_records(records, dpo_reward="sum").rewards
    assert np.isnan(rewards[0, 0])
    np.testing.assert_array_equal(rewards[0, 1:], np.array(EXPECTED["sum"][0][1:], dtype=float))


def test_a_record_without_extras_is_an_error_naming_the_field(tmp_path):
    path = _write(tmp_path / "classifier.jsonl", [rmbench_record("chat", "1", [1, 2, 3, 0, 0, 0])])
    with pytest.raises(DataError) as info:
        read_score_files([path], dpo_reward="avg")
    assert info.value.field == "extras.policy_logp"
    assert "this record (classifier) has none" in str(info.value)
    assert f"{path}" in str(info.value) and "line 1" in str(info.value)


def test_a_reference_free_file_has_no_reference_reward(tmp_path):
    path = _write(tmp_path / "avg.jsonl", _dpo_records(mode="avg", ref_logp=None))
    np.testing.assert_array_equal(read_score_files([path], dpo_reward="norm").rewards, np.array(EXPECTED["norm"], dtype=float))
    with pytest.raises(DataError) as info:
        read_score_files([path], dpo_reward="reference")
    assert info.value.field == "extras.ref_logp[0]"
    assert "without a reference model (dpo (mode avg, compat none))" in str(info.value)


def test_official_result_files_have_no_extras(jsonl_writer):
    path = jsonl_writer("chat.json", [{"id": 1, "score_chosen": [1, 2, 3], "score_rejected": [0, 0, 0]}])
    with pytest.raises(DataError, match="has no DPO extras: --dpo-reward sum needs rmserve score records"):
        read_score_files([path], dpo_reward="sum")
    with pytest.raises(DataError, match="unknown DPO reward 'mean'"):
        read_score_files([path], dpo_reward="mean")
    with pytest.raises(ValueError, match="dpo_reward must be one of"):
        MetricsConfig(dpo_reward="mean")


def test_files_of_two_kinds_of_score_are_refused(tmp_path):
    a = _write(tmp_path / "a.jsonl", _dpo_records()[:1])
    b = _write(tmp_path / "b.jsonl", _dpo_records(mode="avg", ref_logp=None)[1:])
    with pytest.raises(DataError) as info:
        read_score_files([a, b])
    assert info.value.field == "mode"
    assert f"than those of {a} line 1 (dpo (mode reference, reference 'ref-1b', compat none))" in str(info.value)


def test_outputs_record_the_kind_and_the_reward():
    evaluation = evaluate_records(_dpo_records(), MetricsConfig(resamples=0, dpo_reward="avg"), source="s.jsonl")
    data = result_dict(evaluation)
    assert data["score_kind"] == KIND
    assert data["reward"] == {"name": "dpo:avg", "formula": "policy_logp / answer_tokens"}
    # avg, chat/1: chosen (-2, -3, -3) vs rejected (-4, -2, -5): each chosen beats the first and
    # third rejected only.
    assert data["domains"]["chat"]["matrix"] == [[1.0, 0.0, 1.0]] * 3
    lines = render_markdown(evaluation).splitlines()
    assert lines[0] == "## RM-Bench: DPO reward avg"
    assert lines[2] == (
        "2 groups from s.jsonl. Scores: dpo (mode reference, reference 'ref-1b', compat none); "
        "DPO reward avg = policy_logp / answer_tokens, recomputed from the extras."
    )
    scored = evaluate_records(_dpo_records(), MetricsConfig(resamples=0), source="s.jsonl")
    # as scored (reference), chat/1: chosen (1, 3, -2) vs rejected (2, -2, 5).
    assert result_dict(scored)["domains"]["chat"]["matrix"] == [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert result_dict(scored)["reward"] == {"name": "rewards", "formula": None}
    assert render_markdown(scored).splitlines()[0] == "## RM-Bench"


def test_classifier_and_official_files_say_what_they_are(jsonl_writer, tmp_path):
    classifier = _write(tmp_path / "c.jsonl", [rmbench_record("chat", "1", [1, 2, 3, 0, 0, 0])])
    evaluation = evaluate_records(read_scores(classifier).records, MetricsConfig(resamples=0), source=str(classifier))
    assert result_dict(evaluation)["score_kind"] == {"kind": "classifier", "mode": None, "ref_model": None, "compat": "none"}
    assert "Scores: classifier; rewards as scored." in render_markdown(evaluation)
    official = jsonl_writer("chat.json", [{"id": 1, "score_chosen": [1, 2, 3], "score_rejected": [0, 0, 0]}])
    evaluation = evaluate_files([official], MetricsConfig(resamples=0))
    assert result_dict(evaluation)["score_kind"] is None
    assert "Scores: kind not recorded in the files; rewards as scored." in render_markdown(evaluation)


def test_cli_dpo_reward_writes_it_into_results_and_table(tmp_path):
    path = _write(tmp_path / "scores.jsonl", _dpo_records())
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["metrics", "rm-bench", str(path), "--dpo-reward", "sum", "--resamples", "0", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["reward"] == {"name": "dpo:sum", "formula": "policy_logp"}
    assert data["score_kind"] == KIND
    # sum, code/2: chosen (-6, -9, -16) vs rejected (-3, -12, -21).
    assert data["domains"]["code"]["matrix"] == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
    table = (out / "table.md").read_text()
    assert table.startswith("## RM-Bench: DPO reward sum\n")
    assert "DPO reward sum = policy_logp, recomputed from the extras." in table

    bad = CliRunner().invoke(app, ["metrics", "rm-bench", str(path), "--dpo-reward", "mean"])
    assert bad.exit_code == 2
    assert "Invalid value for '--dpo-reward': 'mean' is not one of 'avg', 'sum', 'norm', 'reference'." in bad.output


def test_compare_with_a_dpo_reward_records_it_and_both_kinds(tmp_path):
    a = _write(tmp_path / "a.jsonl", _dpo_records())
    b = _write(tmp_path / "b.jsonl", _dpo_records(mode="avg", ref_logp=None))
    result = CliRunner().invoke(app, ["metrics", "compare", str(a), str(b), "--dpo-reward", "norm", "--resamples", "5",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["reward"] == {"name": "dpo:norm", "formula": "-policy_logp_norm"}
    assert data["score_kind_a"] == KIND
    assert data["score_kind_b"] == {"kind": "dpo", "mode": "avg", "ref_model": None, "compat": "none"}
    # Both files hold the same policy_logp_norm: the same figures, a difference of exactly 0.
    assert {f["difference"] for f in data["figures"].values()} == {0.0}
    text = CliRunner().invoke(app, ["metrics", "compare", str(a), str(b), "--dpo-reward", "norm", "--resamples", "5"])
    assert f"B: {b} (dpo (mode avg, compat none))  " in text.output
    assert "Reward: DPO reward norm = -policy_logp_norm, recomputed from the extras." in text.output
