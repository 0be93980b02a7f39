"""Sweep figures from hand-built records: per-checkpoint rows, the best checkpoint, the margin."""

from __future__ import annotations

import csv
import json

import pytest
from rmserve.metrics.sweep import SweepPoint, write_sweep

from rmserve.schema import ScoreRecord


def chat_records(n_groups: int, wins: set[int]) -> list[ScoreRecord]:
    """RM-Bench chat groups: in a won group every chosen reward beats every rejected one
    (all 9 comparisons won, so hard = normal = easy = 1); in a lost one none does."""
    out = []
    for i in range(n_groups):
        chosen, rejected = (2.0, 2.1, 2.2), (0.0, 0.1, 0.2)
        rewards = chosen + rejected if i in wins else rejected + chosen
        out.append(ScoreRecord(benchmark="rm-bench", domain="chat", id=str(i), num_chosen=3, rewards=rewards,
                               model="m", fingerprint="f"))
    return out


def test_rows_best_checkpoint_and_paired_margin(tmp_path):
    # Step 10 wins groups 0-5 (0.6), step 20 groups 0-7 (0.8), step 30 groups 0-6 (0.7).
    wins = {10: set(range(6)), 20: set(range(8)), 30: set(range(7))}
    points = [SweepPoint(step=s, name=f"step-{s}", path=f"/ckpt/step-{s}", fingerprint=f"fp{s}", model="m",
                         records={"rm-bench": chat_records(10, w)}) for s, w in wins.items()]
    paths, summary, _ = write_sweep(points, ["rm-bench"], tmp_path, resamples=200, seed=1)
    rows = list(csv.DictReader((tmp_path / "sweep.csv").read_text().splitlines()))
    assert [float(r["rm-bench:chat.score"]) for r in rows] == pytest.approx([0.6, 0.8, 0.7])
    assert [float(r["rm-bench:chat.hard"]) for r in rows] == pytest.approx([0.6, 0.8, 0.7])
    low, high = float(rows[1]["rm-bench:chat.score:low"]), float(rows[1]["rm-bench:chat.score:high"])
    assert low <= 0.8 <= high
    best = json.loads((tmp_path / "sweep.json").read_text())["best"]["rm-bench"]
    assert (best["checkpoint"], best["runner_up"]) == ("step-20", "step-30")
    # Per group, step 20 − step 30 is 1 on group 7 and 0 elsewhere: the difference is 0.1 and
    # no resample can make it negative.
    assert best["difference"] == pytest.approx(0.1)
    assert best["interval"][0] >= 0.0 and best["interval"][1] <= 1.0
    assert "Best checkpoint: **step-20**" in summary and "runner-up step-30" in summary
    assert {p.name for p in paths} >= {"sweep.csv", "sweep.json", "summary.md", "rm-bench_overall-score.png"}


def test_single_checkpoint_has_no_runner_up(tmp_path):
    point = SweepPoint(step=1, name="step-1", path="/c", fingerprint="f", model="m",
                       records={"rm-bench": chat_records(4, {0, 1})})
    _, summary, _ = write_sweep([point], ["rm-bench"], tmp_path, resamples=10)
    assert "no other checkpoint to compare" in summary
    with pytest.raises(ValueError, match="resamples"):
        write_sweep([point], ["rm-bench"], tmp_path, resamples=0)
