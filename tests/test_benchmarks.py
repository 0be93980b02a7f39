"""The throughput benchmarks' own arithmetic, and the GPU benchmark run on CPU with a tiny model.

Hand-computed values: the trie bound (block-rounded longest common prefixes), the
length-sorted batch plan, and the forward-FLOP count of a tiny Llama; the slow test runs
``benchmarks/gpu_throughput.py`` end to end (two code groups, tiny config) and checks its
recorded rewards, token counts and MFU against each other.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_trie_bound_by_hand():
    throughput = _load("throughput")
    first = list(range(1, 11))  # 10 tokens
    shares_7 = first[:7] + [99, 98]  # common prefix 7 with `first`
    copy = list(first)  # common prefix 10, capped at len - 1 = 9
    group = [first, shares_7, copy]
    # block 4: 7 -> 4, 9 -> 8; block 1: 7 + 9; block 16: nothing whole.
    assert throughput.trie_bound_tokens(group, 4) == 12
    assert throughput.trie_bound_tokens(group, 1) == 16
    assert throughput.trie_bound_tokens(group, 16) == 0
    # The best earlier sequence counts, not only the first one.
    late = [5, 5, 5, 5, 5, 5]
    assert throughput.trie_bound_tokens([[1, 2], [5, 5, 5, 5, 5, 7], late], 2) == 0 + 4


def test_length_sorted_batches_by_hand():
    from rmserve.server.engine_hf import length_sorted_batches

    # Longest first (ties in input order): 1 (10), 3 (10), 2 (5), 0 (3), 4 (1).
    # [1, 3] pads to 2 × 10 = 20 ≤ 20; adding 2 would be 3 × 10 = 30. [2, 0, 4] is 3 × 5 = 15.
    assert length_sorted_batches([3, 10, 5, 10, 1], max_batch_tokens=20, max_batch_size=3) == [[1, 3], [2, 0, 4]]
    # The row limit cuts too; a sequence over the token budget gets its own batch.
    assert length_sorted_batches([3, 10, 5, 10, 1], max_batch_tokens=1000, max_batch_size=2) == [[1, 3], [2, 0], [4]]
    assert length_sorted_batches([50, 2], max_batch_tokens=20, max_batch_size=8) == [[0], [1]]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        length_sorted_batches([1], max_batch_tokens=0, max_batch_size=1)


@pytest.mark.slow
def test_length_sorted_rewards_equal_unpadded_forward():
    """Batched, padded scoring equals one unpadded forward per sequence (float32)."""
    import torch
    from rmserve.server.engine_hf import length_sorted_rewards

    gpu = _load("gpu_throughput")
    model = gpu.build_model("tiny", "float32", "cpu", pad_id=0, bos_id=1, eos_id=2, seed=3)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, 2000, (n,), generator=generator).tolist() for n in (7, 31, 2, 31, 15, 1)]
    got = length_sorted_rewards(
        model.model, model.score, sequences, pad_id=0, device=torch.device("cpu"), max_batch_tokens=64, max_batch_size=4
    )
    with torch.inference_mode():
        expected = [float(model(input_ids=torch.tensor([s])).logits.reshape(-1)[0]) for s in sequences]
    assert got == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_model_flops_by_hand():
    gpu = _load("gpu_throughput")
    model = gpu.build_model("tiny", "float32", "cpu", pad_id=0, bos_id=1, eos_id=2)
    h, kv_dim, mlp, layers = 128, 2 * 32, 352, 2
    per_layer = h * h + 2 * h * kv_dim + h * h + 3 * h * mlp + 2 * h  # q, k+v, o, gate/up/down, two norms
    non_embedding = layers * per_layer + h + h  # final norm, one-label score head
    lengths = [10, 20]
    expected = 2 * non_embedding * 30 + 2 * layers * h * (10**2 + 20**2)
    assert gpu.model_flops(model, lengths) == expected


@pytest.mark.slow
def test_gpu_throughput_runs_on_cpu_with_tiny_model(tmp_path: Path, rmbench_dir: Path):
    """Two code groups, tiny config, paths a, hf and (vLLM installed) c; rewards agree in float32."""
    gpu = _load("gpu_throughput")
    code = gpu.main([
        "--shape", "tiny", "--dtype", "float32", "--data", str(rmbench_dir), "--domains", "code",
        "--limit-groups", "2", "--paths", "a,hf,c", "--out", str(tmp_path), "--machine", "test",
    ])
    assert code == 0
    (result_file,) = tmp_path.glob("*-test-gpu.json")
    report = json.loads(result_file.read_text())
    rows = {row["path"]: row for row in report["rows"]}
    vllm_installed = importlib.util.find_spec("vllm") is not None
    assert set(rows) == ({"a", "hf", "c"} if vllm_installed else {"a", "hf"})
    assert report["domains"] == {"code": 2}
    assert all(row["groups"] == 2 and row["sequences"] == 12 for row in rows.values())
    assert len({row["prompt_tokens"] for row in rows.values()}) == 1
    for name, row in rows.items():
        if name != "a":
            assert row["max_abs_reward_diff_vs_a"] <= 1e-4
        assert row["tokens_per_s"] == pytest.approx(row["prompt_tokens"] / row["wall_s"])
        assert row["mfu"] == pytest.approx(report["model_flops"] / row["wall_s"] / (report["matmul_peak_tflops_per_s"] * 1e12))
    if vllm_installed:
        assert rows["c"]["prefix_cache_hit_tokens"] >= 0.9 * rows["c"]["trie_bound_tokens"] > 0
