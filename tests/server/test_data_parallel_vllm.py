"""Data parallel on the CPU build: two vLLM engine cores (``data_parallel_size=2``), one CPU
each, and every sequence of a group on the rank rmserve chose for it.

Prefix caches are per rank, so where a group ran shows in its cache hits: scored three times
in a row, the group goes to rank 0, rank 1, rank 0 (:class:`~rmserve.server.engines.parallel.RankBalancer`
alternates between idle ranks). The second time it meets a cold cache like the first; the
third time every sequence reads the shared prompt from rank 0's cache. The engine runs vLLM's
``priority`` scheduling policy, and the groups carry priorities 0 and 1.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow

BLOCK = 32
PROMPT = [5 + (i * 7) % 190 for i in range(4 * BLOCK)]  # 128 shared tokens: 4 whole blocks
GROUP = [PROMPT + [11, 12, 13], PROMPT + [21, 22], PROMPT + [31, 32, 33, 34]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two CPUs")
async def test_two_ranks_each_group_on_one_rank(demo_model_dir):
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        EngineConfig(
            model=str(demo_model_dir), dtype="float32", max_model_len=512, block_size=BLOCK,
            kv_cache_memory_bytes=1 << 30, enforce_eager=True, data_parallel_size=2, scheduling_policy="priority",
        )
    )
    await engine.start()
    try:
        runs = []
        for k in range(3):
            runs.append(await engine.score_group(GROUP, f"dp-{k}", priority=k % 2))
    finally:
        await engine.shutdown()
    rewards = [[s.reward for s in run] for run in runs]
    hits = [[s.num_cached_tokens for s in run] for run in runs]
    assert rewards[1] == pytest.approx(rewards[0], abs=1e-5)  # the same weights on both ranks
    assert rewards[2] == pytest.approx(rewards[0], abs=1e-5)
    assert sum(hits[1]) == sum(hits[0])  # rank 1 was as cold as rank 0 was at first
    assert hits[2] == [4 * BLOCK] * 3  # rank 0 again: the whole shared prompt from its cache
