"""Rewards read from the extras (``--reward-extra NAME``): one objective of a multi-objective
head (the remote-code head keeps ArmoRM-style objectives as ``objective_0``, ``objective_1``, …)
gives the figures of that objective alone.

The independent computation: the same groups written again with that objective as their
``rewards`` give, through the ordinary path, the same results; one matrix is also worked by hand.
"""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from testkit.metrics_data import random_rmbench_records, rmbench_record
from typer.testing import CliRunner

from rmserve.cli import app
from rmserve.errors import DataError
from rmserve.metrics.evaluation import MetricsConfig, evaluate_records
from rmserve.metrics.render_json import result_dict
from rmserve.metrics.render_markdown import render_markdown
from rmserve.metrics.score_files import read_score_files, scores_from_records
from rmserve.schema import encode

# chat/1: the gated reward, and two objectives (3 chosen then 3 rejected)
GATED = (0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
OBJECTIVE_0 = (1.0, 2.0, 3.0, 2.5, 0.5, 4.0)
OBJECTIVE_1 = (-1.0, -2.0, -3.0, -4.0, -0.5, -5.0)


def _gated_record(domain="chat", record_id="1", rewards=GATED, objectives=(OBJECTIVE_0, OBJECTIVE_1)):
    extras = {f"objective_{k}": tuple(values) for k, values in enumerate(objectives)}
    return msgspec.structs.replace(rmbench_record(domain, record_id, rewards), extras=extras)


def test_the_figures_of_one_objective_are_those_of_records_scored_with_it():
    records = random_rmbench_records({"chat": 20, "code": 12, "math": 9}, seed=5)
    rng = np.random.default_rng(7)
    objective = [tuple(rng.normal(size=6).tolist()) for _ in records]
    with_extras = [msgspec.structs.replace(r, extras={"objective_3": o, "objective_0": r.rewards})
                   for r, o in zip(records, objective, strict=True)]
    rescored = [msgspec.structs.replace(r, rewards=o) for r, o in zip(records, objective, strict=True)]
    config = MetricsConfig(resamples=50, seed=3)
    from_extras = result_dict(evaluate_records(with_extras, MetricsConfig(resamples=50, seed=3, reward_extra="objective_3")))
    plain = result_dict(evaluate_records(rescored, config))
    assert from_extras["reward"] == {"name": "extra:objective_3", "formula": "extras.objective_3"}
    assert plain["reward"] == {"name": "rewards", "formula": None}
    assert {k: v for k, v in from_extras.items() if k != "reward"} == {k: v for k, v in plain.items() if k != "reward"}


def test_one_objective_by_hand():
    scores = scores_from_records([_gated_record()], reward_extra="objective_0")
    np.testing.assert_array_equal(scores.rewards, np.array([OBJECTIVE_0]))
    assert scores.reward == "extra:objective_0"
    evaluation = evaluate_records([_gated_record()], MetricsConfig(resamples=0, reward_extra="objective_0"),
                                  source="s.jsonl")
    # objective_0, chat/1: chosen (1, 2, 3) vs rejected (2.5, 0.5, 4): matrix[i][j] = chosen i > rejected j
    assert result_dict(evaluation)["domains"]["chat"]["matrix"] == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    lines = render_markdown(evaluation).splitlines()
    assert lines[0] == "## RM-Bench: objective_0"
    assert lines[2] == ("1 group from s.jsonl. Scores: classifier; rewards from the extras objective_0 of each response "
                        "(--reward-extra).")


def test_the_header_names_the_head_the_records_name():
    from rmserve.schema import RewardHead, Scorer

    def scored(record, head):
        return msgspec.structs.replace(record, scorer=Scorer(engine="hf", attention="sdpa", head=head))

    remote = [scored(_gated_record(), RewardHead("remote-code"))]
    evaluation = evaluate_records(remote, MetricsConfig(resamples=0), source="s.jsonl")
    assert render_markdown(evaluation).splitlines()[2] == (
        "1 group from s.jsonl. Scores: classifier, head remote-code; rewards as scored.")
    plain = [scored(_gated_record(), RewardHead("classifier"))]  # the plain head is not named
    assert "Scores: classifier; rewards" in render_markdown(evaluate_records(plain, MetricsConfig(resamples=0)))
    two = [scored(_gated_record(record_id="1"), RewardHead("multi-label", label_index=2)),
           scored(_gated_record(record_id="2"), RewardHead("multi-label", label_weights=(0.5, 1.0)))]
    assert "Scores: classifier, heads multi-label (label 2), multi-label (weights 0.5, 1); rewards" in render_markdown(
        evaluate_records(two, MetricsConfig(resamples=0)))


def test_a_response_without_a_reward_keeps_none():
    record = msgspec.structs.replace(_gated_record(), rewards=(None,) + GATED[1:],
                                     extras={"objective_0": (None,) + OBJECTIVE_0[1:]})
    rewards = scores_from_records([record], reward_extra="objective_0").rewards
    assert np.isnan(rewards[0, 0]) and rewards[0, 1:].tolist() == list(OBJECTIVE_0[1:])


@pytest.mark.parametrize(
    ("record", "field", "words"),
    [
        (rmbench_record("chat", "1", GATED), "extras.objective_1", "this record (classifier) has none"),
        (_gated_record(objectives=(OBJECTIVE_0,)), "extras.objective_1", "has only objective_0"),
        (msgspec.structs.replace(_gated_record(), extras={"objective_1": ("x",) * 6}), "extras.objective_1[0]",
         "must be a number or null, got 'x'"),
        (msgspec.structs.replace(_gated_record(), extras={"objective_1": (None,) * 6}), "extras.objective_1[0]",
         "null for a response that has a reward"),
        (msgspec.structs.replace(_gated_record(), extras={"objective_1": (1.0,) * 5}), "extras.objective_1",
         "holds 5 values for 6 responses"),
    ],
)
def test_a_record_it_cannot_be_read_from_is_an_error_naming_the_field(tmp_path, record, field, words):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(encode(record) + b"\n")
    with pytest.raises(DataError) as info:
        read_score_files([path], reward_extra="objective_1")
    assert info.value.field == field
    assert words in str(info.value) and f"{path}" in str(info.value) and "line 1" in str(info.value)


def test_official_files_and_the_dpo_reward_are_refused(jsonl_writer):
    official = jsonl_writer("chat.json", [{"id": 1, "score_chosen": [1, 2, 3], "score_rejected": [0, 0, 0]}])
    with pytest.raises(DataError, match="has no extras: --reward-extra objective_0 needs rmserve score records"):
        read_score_files([official], reward_extra="objective_0")
    with pytest.raises(DataError, match="both name the reward the figures use; give one"):
        read_score_files([official], reward_extra="objective_0", dpo_reward="sum")
    with pytest.raises(ValueError, match="dpo_reward / reward_extra: give one"):
        MetricsConfig(reward_extra="objective_0", dpo_reward="sum")


def test_cli_reward_extra_writes_it_into_results_and_table(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(encode(_gated_record()) + b"\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["metrics", "rm-bench", str(path), "--reward-extra", "objective_1",
                                      "--resamples", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["reward"] == {"name": "extra:objective_1", "formula": "extras.objective_1"}
    # objective_1, chat/1: chosen (-1, -2, -3) vs rejected (-4, -0.5, -5)
    assert data["domains"]["chat"]["matrix"] == [[1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]
    assert (out / "table.md").read_text().startswith("## RM-Bench: objective_1\n")
    bad = CliRunner().invoke(app, ["metrics", "rm-bench", str(path), "--reward-extra", "objective_9"])
    assert bad.exit_code != 0 and "extras.objective_9" in bad.output
