"""The remote-code head end to end: ``rmserve run`` on the gated replica (a checkpoint that ships
its own reward model class, ArmoRM's shape) with ``--engine hf --trust-remote-code``, as a user
types it, on RM-Bench's chat domain.

Checked against an independent computation: the rewards of the score file equal the gated head
computed in ``tests/testkit/gated.py`` from the head's description (the folder's
decoder weights in transformers' own ``LlamaModel``, not the folder's code), on the token ids the
model's tokenizer and template give; every record keeps the objective rewards as extras and says
which head and engine scored it. Without ``--trust-remote-code`` the run stops before starting a
server, naming the flag.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from testkit.gated import gated_forward
from testkit.shared_data import shared_data_dir

from rmserve.schema import ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
RMBENCH = shared_data_dir() / "rm-bench"
ATOL = 1e-4  # as tests/server/test_heads_engines.py: float32 rounding of padded batches is below 1e-6


def _run(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [*RMSERVE, "run", str(model), "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat", "--out",
           str(out), "--quiet", "--engine", "hf", "--dtype", "float32", "--max-model-len", "4096", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1100)


def test_run_on_the_gated_replica_prints_the_table_and_keeps_the_objectives(demo_gated_dir, tmp_path):
    from rmserve.datasets import load_rmbench
    from rmserve.schema import RequestGroup
    from rmserve.server.render.chat import Renderer

    refused = _run(demo_gated_dir, tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--trust-remote-code" in refused.stderr and not (tmp_path / "refused" / "scores.jsonl").exists()

    out = tmp_path / "run"
    done = _run(demo_gated_dir, out, "--trust-remote-code")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Chat |" in done.stdout
    records = [msgspec.json.decode(line, type=ScoreRecord) for line in (out / "scores.jsonl").read_bytes().splitlines()]
    chat = [g for g in load_rmbench(RMBENCH).groups if g.key.domain == "chat"]
    assert len(records) == len(chat) > 0
    by_key = {r.key: r for r in records}
    renderer = Renderer.from_pretrained(demo_gated_dir, max_model_len=4096)
    sample = chat[:: max(1, len(chat) // 12)]  # a dozen groups spread over the domain
    rendered = renderer.render_groups([RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
                                       for g in sample])
    forward = iter(gated_forward(demo_gated_dir, [ids for tokens in rendered for ids in tokens.token_ids]))
    got, expected = [], []
    for group, tokens in zip(sample, rendered, strict=True):
        record = by_key[group.key]
        assert (record.scorer.engine, record.scorer.head.name) == ("hf", "remote-code")
        computed = [next(forward) for _ in tokens.token_ids]
        got += list(record.rewards)
        expected += [reward for reward, _ in computed]
        for k in range(4):  # conftest's DEMO_OBJECTIVES
            objective = [objectives[k] for _, objectives in computed]
            assert max(abs(a - b) for a, b in zip(record.extras[f"objective_{k}"], objective, strict=True)) <= ATOL
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    print(f"remote-code run: {len(records)} chat groups; {len(got)} rewards checked, max |diff| = {diff:.2e}")
    assert diff <= ATOL
