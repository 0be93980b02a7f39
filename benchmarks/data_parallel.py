"""Data parallel on one machine: prompt tokens/s and prefix-cache hits with 1 or N vLLM ranks.

Scores synthetic groups (3 sequences: a shared 256-token prompt and a 40–119-token answer
each, seeded) on a :class:`~rmserve.server.engines.vllm_engine.VLLMEngine`, 16 groups in flight, after one
warm-up group and a prefix-cache reset. ``--scatter`` gives vLLM no rank (its own balancer
places every request), to show what a group split across ranks loses.

Usage (one configuration per process; an engine's start recompiles on the CPU build)::

    rmserve demo-model DIR --corpus …       # any one-label classifier folder will do
    python benchmarks/data_parallel.py DIR --data-parallel-size 1 --groups 400
    python benchmarks/data_parallel.py DIR --data-parallel-size 2 --groups 400
    python benchmarks/data_parallel.py DIR --data-parallel-size 2 --groups 400 --scatter

Prints one JSON line: ranks, engine start seconds, wall seconds, prompt tokens, tokens/s and
prompt tokens read from the prefix cache.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time

PROMPT_TOKENS = 256
IN_FLIGHT = 16


def make_groups(n: int, seed: int = 0) -> list[list[list[int]]]:
    """``n`` groups of 3 token-id lists sharing a 256-token prompt (ids 5–199)."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        prompt = [rng.randrange(5, 200) for _ in range(PROMPT_TOKENS)]
        groups.append([prompt + [rng.randrange(5, 200) for _ in range(rng.randrange(40, 120))] for _ in range(3)])
    return groups


async def measure(model: str, data_parallel_size: int, groups: list[list[list[int]]], scatter: bool) -> dict:
    """Start the engine, score ``groups`` (16 in flight) and return the figures."""
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(EngineConfig(
        model=model, dtype="float32", max_model_len=512, block_size=32, kv_cache_memory_bytes=1 << 30,
        enforce_eager=True, data_parallel_size=data_parallel_size,
    ))
    if scatter:
        engine.ranks.group = lambda tokens: contextlib.nullcontext(None)  # type: ignore[method-assign]
    started = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - started
    try:
        await engine.score_group(groups[0], "warm-up")
        await engine.reset_prefix_cache()
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int, group: list[list[int]]):
            async with slots:
                return await engine.score_group(group, f"g{i}")

        started = time.perf_counter()
        scores = await asyncio.gather(*(one(i, g) for i, g in enumerate(groups)))
        wall_s = time.perf_counter() - started
    finally:
        await engine.shutdown()
    tokens = sum(len(ids) for group in groups for ids in group)
    return {
        "data_parallel_size": data_parallel_size, "scatter": scatter, "groups": len(groups),
        "start_s": round(start_s, 1), "wall_s": round(wall_s, 2), "prompt_tokens": tokens,
        "tokens_per_s": round(tokens / wall_s), "cached_tokens": sum(s.num_cached_tokens for r in scores for s in r),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a one-label classifier folder (e.g. the demo model)")
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--scatter", action="store_true", help="let vLLM place each request (no rank per group)")
    args = parser.parse_args()
    result = asyncio.run(measure(args.model, args.data_parallel_size, make_groups(args.groups), args.scatter))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
