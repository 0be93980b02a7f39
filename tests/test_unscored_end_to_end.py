"""Groups that cannot be scored, on the real vLLM CPU engine and the demo model, as a user runs
them: the run finishes (exit 3), every other group is scored, the unscored ones are recorded
with their reason, and the table equals the metrics stage's figures on the same score file.

- Example A: responses over the server's ``--max-model-len`` (a two-record folder, then the
  shared RM-Bench chat data served with ``--max-model-len 512``).
- Example B: a checkpoint whose score head gives non-finite rewards (the demo model's head
  scaled to ±3e38).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from rmserve.schema import ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
ENGINE = ["--dtype", "float32", "--block-size", "32", "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]


def _run(model: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [*RMSERVE, "run", str(model), "--bench", "rm-bench", "--data", str(data), "--out", str(out),
           "--quiet", "--resamples", "0", *ENGINE, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1500)


def _records(path: Path) -> list[ScoreRecord]:
    return [msgspec.json.decode(line, type=ScoreRecord) for line in path.read_bytes().splitlines() if line.strip()]


def _metrics_json(scores: Path) -> dict:
    res = subprocess.run([*RMSERVE, "metrics", "rm-bench", str(scores), "--json", "--resamples", "0"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _figures(results: dict) -> dict:
    return {name: results["domains"]["chat"][name] for name in ("score", "hard", "normal", "easy", "n_groups", "n_nan_groups")}


def test_example_a_two_records_one_over_the_length_limit(demo_model_dir, rmbench_dir, tmp_path):
    short = ["A short answer.", "A short answer, in plain words.", "**A short answer.**"]
    rows = [
        {"id": 1, "prompt": "What is two plus two?", "chosen": short, "rejected": ["Five.", "It is five.", "**Five.**"],
         "subset": "chat"},
        {"id": 2, "prompt": "Say something long.", "chosen": ["word " * 2600, *short[1:]],  # about 2,600 tokens, over 512
         "rejected": ["No.", "I will not.", "**No.**"], "subset": "chat"},
    ]
    data = tmp_path / "data"
    data.mkdir()
    (data / "chat_filtered.json").write_text(json.dumps(rows))
    out = tmp_path / "out"
    res = _run(demo_model_dir, data, out, "--max-model-len", "512")
    assert res.returncode == 3, res.stderr[-3000:]
    records = {r.id: r for r in _records(out / "scores.jsonl")}
    short, long = records[str(rows[0]["id"])], records[str(rows[1]["id"])]
    assert short.errors is None and all(isinstance(x, float) for x in short.rewards)
    assert long.rewards[0] is None and all(isinstance(x, float) for x in long.rewards[1:])
    assert long.errors[0].type == "sequence_too_long" and long.errors[0].message.endswith("over max_model_len=512")
    assert long.errors[1:] == (None,) * 5
    assert (f"note: 1 of 2 groups not scored (1 over the length limit of 512 tokens): counted as losses, as the "
            f"official code counts them; see {out / 'scores.jsonl'}; to score those over the length limit, raise the "
            "server's --max-model-len or pass --truncation") in res.stderr
    # The long group's chosen[0] loses its three comparisons: the matrix row 0 counts it as 0.
    table = json.loads((out / "results.json").read_text())
    assert _figures(table) == _figures(_metrics_json(out / "scores.jsonl"))
    assert table["domains"]["chat"]["n_nan_groups"] == 1


def test_example_a_shared_chat_data_at_512_tokens(demo_model_dir, rmbench_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(rmbench_dir / "chat_filtered.json", data / "chat_filtered.json")
    out = tmp_path / "out"
    res = _run(demo_model_dir, data, out, "--max-model-len", "512")
    assert res.returncode == 3, res.stderr[-3000:]
    records = _records(out / "scores.jsonl")
    assert len(records) == 129
    unscored = [r for r in records if r.errors]
    assert unscored and len(unscored) < 129
    for record in records:  # every response is either scored or over the limit, never both or neither
        for reward, error, n in zip(record.rewards, record.errors or (None,) * 6, record.num_tokens, strict=True):
            assert (reward is None) == (error is not None) == (n > 512)
    assert f"note: {len(unscored)} of 129 groups not scored ({len(unscored)} over the length limit of 512 tokens)" \
        in res.stderr
    table = json.loads((out / "results.json").read_text())
    assert _figures(table) == _figures(_metrics_json(out / "scores.jsonl"))
    assert table["domains"]["chat"]["n_nan_groups"] == len(unscored)


def test_example_b_a_head_that_gives_non_finite_rewards(demo_model_dir, rmbench_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "overflow-rm"
    shutil.copytree(demo_model_dir, model)
    weights = load_file(model / "model.safetensors")
    weights["score.weight"] = (np.sign(weights["score.weight"]) * np.float32(3e38)).astype(np.float32)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(rmbench_dir / "chat_filtered.json", data / "chat_filtered.json")
    out = tmp_path / "out"
    res = _run(model, data, out)
    assert res.returncode == 3, res.stderr[-3000:]
    records = _records(out / "scores.jsonl")
    assert len(records) == 129  # the run finished: every group recorded
    bad = [(r, j) for r in records for j, e in enumerate(r.errors or ()) if e is not None]
    assert bad and all(e.type == "non_finite_reward" for r, j in bad for e in [r.errors[j]])
    assert all(r.rewards[j] is None for r, j in bad)
    n_bad_groups = len({r.id for r, _ in bad})
    assert f"note: {n_bad_groups} of 129 groups not scored ({n_bad_groups} non-finite reward)" in res.stderr
    table = json.loads((out / "results.json").read_text())
    assert _figures(table) == _figures(_metrics_json(out / "scores.jsonl"))
