"""Heads end to end, ``rmserve run`` as a user types it on RM-Bench's chat domain: the remote-code
head on the gated replica (a checkpoint that ships its own reward model class, ArmoRM's shape)
with ``--engine hf --trust-remote-code``, and on vLLM the multi-label head (a 3-label replica,
``--label-weights``) and the lm-logit head (a causal LM, ``--head lm-logit``, the
Llama-3.1-Nemotron-70B-Reward-HF way). The multi-label and lm-logit rewards of a dozen groups
equal an unpadded transformers forward pass (the weighted sum of the labels' logits; the LM
head's logit of id 0 at the last position).

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
from testkit.chat_runs import chat_run_sample
from testkit.gated import gated_forward
from testkit.shared_data import shared_data_dir

from rmserve.schema import ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
RMBENCH = shared_data_dir() / "rm-bench"
ATOL = 1e-4  # as tests/server/test_heads_engines.py: float32 rounding of padded batches is below 1e-6


VLLM_FLAGS = ("--engine", "vllm", "--block-size", "32", "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager",
              "--resamples", "0")


def _run(model: Path, out: Path, *extra: str, engine: tuple[str, ...] = ("--engine", "hf")) -> subprocess.CompletedProcess:
    cmd = [*RMSERVE, "run", str(model), "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat", "--out",
           str(out), "--quiet", *engine, "--dtype", "float32", "--max-model-len", "4096", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1100)


def _last_logits(model, sequences) -> list[list[float]]:
    """Per sequence, one at a time (no padding): a classifier's labels' logits (transformers pools
    the last token itself) or a causal LM's logits of ids 0 and 1 at the last position."""
    import torch

    causal = model.config.architectures[0].endswith("ForCausalLM")
    with torch.inference_mode():
        logits = [model(torch.tensor([list(ids)])).logits[0] for ids in sequences]
    return [(row[-1, :2] if causal else row).tolist() for row in logits]


@pytest.mark.parametrize("head", ["multi-label", "lm-logit"])
def test_run_on_a_vllm_head_prints_the_table_and_equals_transformers(head, demo_multi_label_dir, demo_policy_dir,
                                                                     tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from rmserve.server.render.chat import Renderer

    weights = (0.5, -1.25, 2.0)
    if head == "multi-label":
        folder, flags = demo_multi_label_dir, ("--label-weights", ",".join(map(str, weights)))
        title = "head multi-label (weights 0.5, -1.25, 2)"
    else:
        folder, flags, title = demo_policy_dir, ("--head", "lm-logit"), "head lm-logit (token id 0)"
    out = tmp_path / "run"
    done = _run(folder, out, *flags, engine=VLLM_FLAGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Chat |" in done.stdout and f"Scores: classifier, {title};" in done.stdout, done.stdout[:600]
    by_key, sample, sequences = chat_run_sample(out, RMBENCH, Renderer.from_pretrained(folder, max_model_len=4096))
    loader = AutoModelForSequenceClassification if head == "multi-label" else AutoModelForCausalLM
    logits = _last_logits(loader.from_pretrained(str(folder), dtype=torch.float32).eval(), sequences)
    if head == "multi-label":
        expected = [sum(w * v for w, v in zip(weights, row, strict=True)) for row in logits]
        wrong = [row[2] for row in logits]  # one label alone
    else:
        expected, wrong = [row[0] for row in logits], [row[1] for row in logits]  # id 0; id 1
    got = [r for g in sample for r in by_key[g.key].rewards]
    assert all(by_key[g.key].scorer.head.name == head and by_key[g.key].scorer.engine == "vllm" for g in sample)
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    print(f"{head} run: {len(by_key)} chat groups, {len(got)} rewards checked, max |diff| = {diff:.2e}")
    assert diff <= ATOL
    assert max(abs(a - b) for a, b in zip(got, wrong, strict=True)) > 100 * ATOL  # the wrong reading would fail


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
