"""Reward heads on the real engines: each head's rewards on tiny random-weight replicas equal an
independent transformers forward pass written here, on vLLM and on transformers.

Replicas (built once per session, ``tests/conftest.py``): ``demo_multi_label_dir``, a
``LlamaForSequenceClassification`` with 3 labels (the multi-label head); ``demo_policy_dir``, a
``LlamaForCausalLM`` served with ``--head lm-logit`` (the Llama-3.1-Nemotron-70B-Reward-HF way: the
logit of vocabulary id 0 at the last position). The independent computation is an unpadded
forward pass per sequence of the same folder: ``AutoModelForSequenceClassification(...).logits[0]``
taking the label or the weighted sum, and ``LlamaForCausalLM(...).logits[0, -1, token_id]``.

Tolerance: everything runs in float32 (``dtype="float32"``, fp32 checkpoints). vLLM's CPU kernels
and padded transformers batches sum in another order than an unpadded forward, so results differ
by float32 rounding (observed below 1e-6 on these 2-layer models, as in ``test_engine_parity.py``);
a weighted sum of three labels with weights of at most 2 grows that by at most 6×. ``ATOL = 1e-4``
leaves headroom while staying far below what a wrong head changes: another label, another token
id or one token less moves a reward by more than 1e-2 (checked below: the comparison has teeth).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from rmserve.server.config import EngineConfig
from testkit.gated import gated_forward

from rmserve.datasets import load_rmbench
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import RequestGroup, RewardHead

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

ATOL = 1e-4
WEIGHTS = (0.5, -1.25, 2.0)
NUM_GROUPS = 3
VLLM_OPTIONS = {"engine": "vllm", "dtype": "float32", "max_model_len": 4096, "block_size": 32,
                "kv_cache_memory_bytes": 1 << 30, "enforce_eager": True}
HF_OPTIONS = {"engine": "hf", "dtype": "float32", "max_model_len": 4096}


@pytest.fixture(scope="module")
def groups(rmbench_dir: Path) -> list[RequestGroup]:
    """Three RM-Bench groups (18 responses) spread over the file."""
    dataset = load_rmbench(rmbench_dir).groups
    chosen = dataset[:: len(dataset) // NUM_GROUPS][:NUM_GROUPS]
    return [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in chosen]


def _label_logits(folder: Path, sequences) -> list[list[float]]:
    """Per sequence, the labels' logits of an unpadded transformers forward pass."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [model(torch.tensor([list(ids)])).logits[0].tolist() for ids in sequences]


def _token_logits(folder: Path, sequences, token_ids) -> list[list[float]]:
    """Per sequence, ``LlamaForCausalLM(ids).logits[0, -1, t]`` for each ``t`` of ``token_ids``."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [model(torch.tensor([list(ids)])).logits[0, -1, list(token_ids)].tolist() for ids in sequences]


async def _scores(engine, rendered) -> list:
    per_group = await asyncio.gather(*(engine.score_group(g.token_ids, f"heads-{i}") for i, g in enumerate(rendered)))
    return [score for group in per_group for score in group]


def _expected_attention(engine_name: str) -> str:
    import torch

    if engine_name == "hf":
        return "sdpa"  # transformers' default for Llama with torch ≥ 2.1 (config._attn_implementation)
    return "CPU_ATTN" if not torch.cuda.is_available() else pytest.skip("the GPU backend depends on the device")


async def _start(config: EngineConfig):
    from rmserve.server.engines.registry import build_engine

    engine = build_engine(config)
    await engine.start()
    return engine


def _check_info(engine, folder: Path, head: RewardHead, engine_name: str) -> None:
    info = engine.info()
    template = engine.renderer.chat_template
    assert (info.head, info.engine, info.attention) == (head, engine_name, _expected_attention(engine_name))
    assert info.fingerprint == model_fingerprint(folder, template, "float32", head)
    assert info.fingerprint != model_fingerprint(folder, template, "float32")  # the head is covered


def _report(what: str, got: list[float], expected: list[float]) -> float:
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    print(f"{what}: {len(got)} rewards, range [{min(expected):.4f}, {max(expected):.4f}], max |diff| = {diff:.2e}")
    return diff


async def test_multi_label_rewards_equal_a_transformers_forward(demo_multi_label_dir, groups):
    folder = demo_multi_label_dir
    vllm = await _start(EngineConfig(model=str(folder), label_weights=",".join(map(str, WEIGHTS)), **VLLM_OPTIONS))
    try:
        _check_info(vllm, folder, RewardHead("multi-label", label_weights=WEIGHTS), "vllm")
        rendered = vllm.renderer.render_groups(groups)
        sequences = [ids for g in rendered for ids in g.token_ids]
        vllm_scores = await _scores(vllm, rendered)
    finally:
        await vllm.shutdown()
    logits = _label_logits(folder, sequences)
    assert all(len(row) == 3 for row in logits)
    weighted = [math.fsum(w * v for w, v in zip(WEIGHTS, row, strict=True)) for row in logits]
    assert _report("vLLM multi-label, weighted sum", [s.reward for s in vllm_scores], weighted) <= ATOL
    assert sum(s.num_cached_tokens for s in vllm_scores) > 0  # the group's prompt is still shared

    for settings, expected in (({"label_index": 1}, [row[1] for row in logits]), ({"label_weights": "0.5,-1.25,2"}, weighted)):
        hf = await _start(EngineConfig(model=str(folder), **settings, **HF_OPTIONS))
        try:
            head = RewardHead("multi-label", label_index=1) if "label_index" in settings else (
                RewardHead("multi-label", label_weights=WEIGHTS))
            _check_info(hf, folder, head, "hf")
            assert hf.renderer.render_groups(groups) == rendered  # the same token ids on both engines
            hf_rewards = [s.reward for s in await _scores(hf, rendered)]
        finally:
            await hf.shutdown()
        assert _report(f"transformers multi-label, {settings}", hf_rewards, expected) <= ATOL
    # teeth: another label, or one label instead of the sum, is far off
    assert min(abs(row[1] - row[0]) for row in logits) > 100 * ATOL
    assert min(abs(w - row[1]) for w, row in zip(weighted, logits, strict=True)) > 100 * ATOL


async def test_lm_logit_rewards_equal_the_causal_lm_logit_of_token_0(demo_policy_dir, groups):
    folder = demo_policy_dir
    head = RewardHead("lm-logit", token_id=0)
    vllm = await _start(EngineConfig(model=str(folder), head="lm-logit", **VLLM_OPTIONS))
    try:
        _check_info(vllm, folder, head, "vllm")
        rendered = vllm.renderer.render_groups(groups)
        sequences = [ids for g in rendered for ids in g.token_ids]
        vllm_scores = await _scores(vllm, rendered)
    finally:
        await vllm.shutdown()
    logits = _token_logits(folder, sequences, (0, 5))
    expected = [row[0] for row in logits]
    assert _report("vLLM lm-logit (token id 0)", [s.reward for s in vllm_scores], expected) <= ATOL
    assert sum(s.num_cached_tokens for s in vllm_scores) > 0

    hf = await _start(EngineConfig(model=str(folder), head="lm-logit", **HF_OPTIONS))
    try:
        _check_info(hf, folder, head, "hf")
        hf_rewards = [s.reward for s in await _scores(hf, rendered)]
    finally:
        await hf.shutdown()
    assert _report("transformers lm-logit (token id 0)", hf_rewards, expected) <= ATOL
    # teeth: another token's logit, or the logit one position early, is far off
    assert min(abs(row[0] - row[1]) for row in logits) > 100 * ATOL
    early = [row[0] for row in _token_logits(folder, [ids[:-1] for ids in sequences[:6]], (0,))]
    assert min(abs(a - b) for a, b in zip(early, expected[:6], strict=True)) > 100 * ATOL


async def test_remote_code_rewards_equal_the_gated_head_computed_here(demo_gated_dir, groups):
    """The remote-code head runs the checkpoint's own class (auto_map, ``--trust-remote-code``)
    on the transformers engine, batched and right-padded; its rewards and objective extras equal
    the head computed here from the description, unpadded. Without the flag the start is refused
    naming it; on vLLM it is refused naming ``--engine hf``."""
    from rmserve.errors import ServerFault
    from rmserve.server.engines.registry import build_engine

    folder = demo_gated_dir
    head = RewardHead("remote-code")
    for options, words in (({}, "--trust-remote-code"), ({"trust_remote_code": True, **VLLM_OPTIONS}, "--engine hf")):
        options = {**HF_OPTIONS, **options}
        with pytest.raises(ServerFault) as refused:
            await build_engine(EngineConfig(model=str(folder), **options)).start()
        assert words in str(refused.value), refused.value
    hf = await _start(EngineConfig(model=str(folder), trust_remote_code=True, hf_batch_size=4, **HF_OPTIONS))
    try:
        _check_info(hf, folder, head, "hf")
        template = hf.renderer.chat_template
        rendered = hf.renderer.render_groups(groups)
        sequences = [ids for g in rendered for ids in g.token_ids]
        scores = await _scores(hf, rendered)
    finally:
        await hf.shutdown()
    expected = gated_forward(folder, sequences)
    assert _report("transformers remote-code (gated)", [s.reward for s in scores], [e for e, _ in expected]) <= ATOL
    for score, (_, objectives) in zip(scores, expected, strict=True):
        assert sorted(score.extras) == [f"objective_{k}" for k in range(4)]  # conftest's DEMO_OBJECTIVES
        assert max(abs(score.extras[f"objective_{k}"] - v) for k, v in enumerate(objectives)) <= ATOL
    # teeth: reading one objective alone, or the plain mean of the objectives, would be off by far more than ATOL
    assert max(abs(e - r[0]) for e, r in expected) > 100 * ATOL
    assert max(abs(e - sum(r) / len(r)) for e, r in expected) > 100 * ATOL
    # the code is in the fingerprint: an edited modeling file is another model
    code = folder / "modeling_gated_rm.py"
    before = model_fingerprint(folder, template, "float32", head)
    original = code.read_text()
    try:
        code.write_text(original + "\n# edited\n")
        assert model_fingerprint(folder, template, "float32", head) != before
    finally:
        code.write_text(original)

