"""Real engines on the demo model: vLLM = transformers engine = a plain transformers forward.

All three score the same token ids (rendered once by the engine's renderer) of real RM-Bench
groups. One vLLM engine serves the whole session (``vllm_engine`` in tests/conftest.py).

Tolerance: everything runs in float32. vLLM's CPU kernels (paged attention, its own GEMM
blocking) sum in a different order than PyTorch's SDPA/matmul, so results differ by float32
rounding (~1e-7 relative per operation, observed below 1e-6 on this 2-layer model).
``PARITY_ATOL = 1e-4`` leaves headroom for other CPUs while staying far below what a real
defect changes: rewards of one group differ by ~1e-2 … 1e-1, and pooling one token too early
(or a second BOS) moves a reward by ~1e-1 (``test_tolerance_is_meaningful``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import pytest
import pytest_asyncio
from testkit.cancelling import cancel_in_flight
from rmserve.server.config import EngineConfig

from rmserve.datasets import load_rmbench
from rmserve.schema import RequestGroup

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PARITY_ATOL = 1e-4
NUM_PARITY_GROUPS = 50


@pytest.fixture(scope="module")
def rmbench_groups(rmbench_dir: Path) -> list[RequestGroup]:
    dataset = load_rmbench(rmbench_dir)
    return [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in dataset.groups]


@pytest.fixture(scope="module")
def parity_groups(rmbench_groups: list[RequestGroup]) -> list[RequestGroup]:
    """Every 16th group: 50 groups spread over all four domains, in file order."""
    step = len(rmbench_groups) // NUM_PARITY_GROUPS
    chosen = rmbench_groups[::step][:NUM_PARITY_GROUPS]
    assert {g.id.split("/")[1] for g in chosen} == {"chat", "code", "safety-refuse", "safety-response"}
    return chosen


@pytest.fixture(scope="module")
def reference_model(demo_model_dir: Path):
    import torch
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()


def _direct_rewards(model, sequences) -> list[float]:
    """Unbatched ``model(input_ids).logits``: transformers' own last-token pooling, no padding."""
    import torch

    with torch.inference_mode():
        return [float(model(torch.tensor([list(ids)])).logits[0, 0]) for ids in sequences]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def hf_engine(demo_model_dir: Path):
    from rmserve.server.engines.hf_engine import HFEngine

    engine = HFEngine(EngineConfig(model=str(demo_model_dir), engine="hf", dtype="float32", max_model_len=4096))
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_vllm_hf_and_direct_forward_agree_on_rmbench_groups(vllm_engine, hf_engine, reference_model, parity_groups):
    rendered = vllm_engine.renderer.render_groups(parity_groups)
    started = time.perf_counter()
    vllm_scores = await asyncio.gather(
        *(vllm_engine.score_group(g.token_ids, f"parity-{i}") for i, g in enumerate(rendered))
    )
    vllm_s = time.perf_counter() - started
    hf_scores = [await hf_engine.score_group(g.token_ids, f"hf-{i}") for i, g in enumerate(rendered)]

    vllm_rewards = [s.reward for group in vllm_scores for s in group]
    hf_rewards = [s.reward for group in hf_scores for s in group]
    direct = [r for g in rendered for r in _direct_rewards(reference_model, g.token_ids)]
    assert len(vllm_rewards) == len(hf_rewards) == len(direct) == 6 * NUM_PARITY_GROUPS

    vllm_diff = max(abs(a - b) for a, b in zip(vllm_rewards, direct, strict=True))
    hf_diff = max(abs(a - b) for a, b in zip(hf_rewards, direct, strict=True))
    print(f"parity over {len(direct)} sequences: max |vLLM - direct| = {vllm_diff:.2e}, "
          f"max |HF - direct| = {hf_diff:.2e}, vLLM scoring {vllm_s:.2f} s, "
          f"vLLM start {vllm_engine.start_time_s:.1f} s")
    assert vllm_diff <= PARITY_ATOL
    assert hf_diff <= PARITY_ATOL
    assert all(s.num_cached_tokens == 0 for group in hf_scores for s in group)
    # the comparison has teeth: rewards spread far wider than the tolerance
    spread = max(direct) - min(direct)
    assert spread > 1000 * PARITY_ATOL


async def test_tolerance_is_meaningful(vllm_engine, reference_model, parity_groups):
    """Defects the parity test must catch move rewards by far more than PARITY_ATOL."""
    (group,) = vllm_engine.renderer.render_groups(parity_groups[:1])
    exact = _direct_rewards(reference_model, group.token_ids)
    one_token_early = _direct_rewards(reference_model, [ids[:-1] for ids in group.token_ids])
    double_bos = _direct_rewards(reference_model, [[ids[0], *ids] for ids in group.token_ids])
    assert min(abs(a - b) for a, b in zip(exact, one_token_early, strict=True)) > 10 * PARITY_ATOL
    assert min(abs(a - b) for a, b in zip(exact, double_bos, strict=True)) > 10 * PARITY_ATOL


async def test_scored_ids_start_with_exactly_one_bos(vllm_engine, demo_model_dir, parity_groups):
    bos = vllm_engine.renderer.bos_token_id
    config_bos = json.loads((demo_model_dir / "config.json").read_text())["bos_token_id"]
    assert bos == config_bos == 1
    for group in vllm_engine.renderer.render_groups(parity_groups):
        for ids in group.token_ids:
            assert ids[0] == bos and ids[1] != bos
            assert ids.count(bos) == 1


async def test_group_members_share_prompt_blocks(vllm_engine, reference_model, rmbench_groups):
    block = vllm_engine.config.block_size
    rendered = vllm_engine.renderer.render_groups(rmbench_groups)
    group = next(g for g in rendered if g.prompt_tokens > 3 * block and len(g.token_ids) == 6)
    assert await vllm_engine.reset_prefix_cache()
    before = vllm_engine.prefix_cache_stats()

    scores = await vllm_engine.score_group(group.token_ids, "prefix-cache")

    cached = [s.num_cached_tokens for s in scores]
    full_prompt_blocks = group.prompt_tokens // block * block
    assert cached[0] == 0
    for j in range(1, 6):
        assert cached[j] >= full_prompt_blocks > 2 * block, cached
        assert cached[j] % block == 0 and cached[j] < len(group.token_ids[j])
    after = vllm_engine.prefix_cache_stats()
    assert after.hit_tokens - before.hit_tokens == sum(cached)
    assert after.query_tokens - before.query_tokens == sum(group.num_tokens)
    # rewards computed over cached prompt blocks equal a full forward pass
    direct = _direct_rewards(reference_model, group.token_ids)
    assert max(abs(s.reward - d) for s, d in zip(scores, direct, strict=True)) <= PARITY_ATOL


async def test_cancelling_a_group_aborts_its_engine_requests(vllm_engine, reference_model, rmbench_groups):
    rendered = vllm_engine.renderer.render_groups(rmbench_groups)
    heavy = max(rendered, key=lambda g: sum(g.num_tokens))
    assert await vllm_engine.reset_prefix_cache()
    assert vllm_engine.num_unfinished_requests() == 0

    task = asyncio.create_task(vllm_engine.score_group(heavy.token_ids, "cancel-me"))
    await cancel_in_flight(vllm_engine, task)

    # the engine still serves, and correctly
    small = rendered[0]
    scores = await vllm_engine.score_group(small.token_ids, "after-cancel")
    direct = _direct_rewards(reference_model, small.token_ids)
    assert max(abs(s.reward - d) for s, d in zip(scores, direct, strict=True)) <= PARITY_ATOL


async def test_reload_weights_swaps_checkpoint_and_back(vllm_engine, demo_model_dir, reference_model, parity_groups, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    # a second checkpoint: same shapes, perturbed weights, same tokenizer files
    other = tmp_path / "checkpoint-2"
    model = AutoModelForSequenceClassification.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir / name, other / name)

    (group,) = vllm_engine.renderer.render_groups(parity_groups[1:2])
    original = await vllm_engine.score_group(group.token_ids, "reload-before")  # fills the prefix cache
    old_fingerprint = vllm_engine.info().fingerprint

    info = (await vllm_engine.reload_weights(other)).info
    swapped = await vllm_engine.score_group(group.token_ids, "reload-after")
    expected = _direct_rewards(model, group.token_ids)
    assert info.fingerprint != old_fingerprint
    assert max(abs(s.reward - e) for s, e in zip(swapped, expected, strict=True)) <= PARITY_ATOL
    assert max(abs(s.reward - o.reward) for s, o in zip(swapped, original, strict=True)) > 100 * PARITY_ATOL

    info = (await vllm_engine.reload_weights(demo_model_dir)).info
    restored = await vllm_engine.score_group(group.token_ids, "reload-restored")
    assert info.fingerprint == old_fingerprint
    assert max(abs(s.reward - o.reward) for s, o in zip(restored, original, strict=True)) <= PARITY_ATOL


@pytest.mark.parametrize("kind", ["vllm", "hf"])
async def test_models_without_exactly_one_label_are_refused(kind, demo_model_dir, tmp_path):
    from rmserve.server.engines.registry import build_engine

    from rmserve.errors import ServerFault

    two_labels = tmp_path / "two-labels"
    shutil.copytree(demo_model_dir, two_labels)
    config = json.loads((two_labels / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    config["label2id"] = {"bad": 0, "good": 1}
    (two_labels / "config.json").write_text(json.dumps(config))

    engine = build_engine(EngineConfig(model=str(two_labels), engine=kind, dtype="float32", max_model_len=4096))
    message = (f"{str(two_labels)!r} has 2 labels (num_labels/id2label: 0 bad, 1 good); rmserve reads one reward from "
               "them: give --label-index I (0 ≤ I < 2) for one label, or --label-weights w1,...,w2 for their weighted sum")
    with pytest.raises(ServerFault, match=f"^{re.escape(message)}$"):
        await engine.start()
