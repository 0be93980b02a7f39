"""The remote-code head (a checkpoint's own reward model class) on RM-Bench groups, two ways, in one run.

* **a** — one conversation per forward pass, the way ArmoRM-Llama3-8B-v0.1's card scores and
  allenai/reward-bench's ``LegacyArmoRMPipeline`` (``rewardbench/models/armorm.py``) did: the
  model's own class through ``trust_remote_code``, the reward read from ``output.score``; every
  response of every group in data order, batch size 1, no padding. (The current
  ``ArmoRMPipeline`` there tokenizes a batch of rendered texts with right padding and cuts each to
  2,048 tokens; that path is not measured here.)
* **b** — rmserve's transformers engine (:class:`rmserve.server.engines.hf_engine.HFEngine`,
  ``--trust-remote-code``), in-process: ``--groups-in-flight`` groups at a time through
  ``score_group`` (as the client keeps them in flight), their sequences in right-padded batches
  of up to ``--hf-batch-size`` taken across the groups waiting, the oldest sequence and those of
  the nearest lengths (the model's own forward reads the end of each sequence from the
  attention mask).

Both score the same token ids (rendered once with rmserve's renderer, the model's chat
template). Reported: sequences/s and prompt tokens/s over the scoring (model load and a
one-group warm-up excluded), and the largest reward difference between a and b (float32).
Target (recorded, not asserted): b ≥ 1.5× a.

Usage::

    rmserve demo-model /tmp/gated-rm --head gated --corpus ../shared/data/rm-bench
    python benchmarks/remote_head.py --model /tmp/gated-rm --domains chat --tag gated-chat
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import machine_info, versions  # noqa: E402

from rmserve.datasets import load_rmbench  # noqa: E402

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "rm-bench"


def one_at_a_time(model_path: str, sequences: list[list[int]]) -> tuple[list[float], float]:
    """Path a: the rewards and the scoring seconds (model load excluded, one warm-up forward)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_path, trust_remote_code=True,
                                                               dtype=torch.float32).eval()
    with torch.inference_mode():
        model(torch.tensor([sequences[0]]))
        start = time.perf_counter()
        rewards = [float(model(torch.tensor([ids])).score.float().item()) for ids in sequences]
    return rewards, time.perf_counter() - start


async def rmserve_way(
    model_path: str, groups: list[list[list[int]]], batch: int, in_flight: int,
) -> tuple[list[float], float, int]:
    """Path b: the rewards (group order), the scoring seconds (engine start excluded, one
    warm-up group) and the forward passes it ran."""
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.hf_engine import HFEngine

    engine = HFEngine(EngineConfig(model=model_path, engine="hf", dtype="float32", trust_remote_code=True,
                                   hf_batch_size=batch, max_model_len=4096))
    await engine.start()
    slots = asyncio.Semaphore(in_flight)

    async def one(i: int, ids: list[list[int]]) -> list[float]:
        async with slots:
            return [s.reward for s in await engine.score_group(ids, f"g{i}")]

    try:
        await engine.score_group(groups[0], "warm-up")
        warm = engine.forward_passes
        start = time.perf_counter()
        rewards = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(groups)))
        elapsed = time.perf_counter() - start
        passes = engine.forward_passes - warm
    finally:
        await engine.shutdown()
    return [r for group in rewards for r in group], elapsed, passes


def run_rmserve_way(*args: Any) -> tuple[list[float], float, int]:
    """:func:`rmserve_way` on an event loop of its own."""
    return asyncio.run(rmserve_way(*args))


def in_child(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh (spawned) process: each path gets a process whose threads no other
    path's torch work has touched (a thread pool that torch used in the main thread slows torch in
    every other thread of the process: measured 2x on 2 cores, OpenMP)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a checkpoint with its own reward model class (auto_map)")
    parser.add_argument("--data", type=Path, default=DATA, help="RM-Bench release folder")
    parser.add_argument("--domains", default="chat", help="comma-separated RM-Bench domains (default chat)")
    parser.add_argument("--hf-batch-size", type=int, default=8, help="path b: most sequences per forward pass")
    parser.add_argument("--groups-in-flight", type=int, default=32, help="path b: groups submitted at a time")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--machine", default="cpu2")
    parser.add_argument("--tag", default="remote-head")
    args = parser.parse_args(argv)

    from rmserve.schema import RequestGroup
    from rmserve.server.render.chat import Renderer

    domains = set(args.domains.split(","))
    data = [g for g in load_rmbench(args.data).groups if g.key.domain in domains]
    renderer = Renderer.from_pretrained(args.model, max_model_len=4096)
    rendered = renderer.render_groups([RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages)
                                       for g in data])
    groups = [[list(ids) for ids in r.token_ids] for r in rendered]
    sequences = [ids for group in groups for ids in group]
    tokens = sum(len(ids) for ids in sequences)
    print(f"{len(groups)} groups, {len(sequences)} sequences, {tokens:,} tokens", file=sys.stderr)
    a_rewards, a_s = in_child(one_at_a_time, args.model, sequences)
    print(f"a: {len(sequences) / a_s:.1f} sequences/s", file=sys.stderr)
    b_rewards, b_s, passes = in_child(run_rmserve_way, args.model, groups, args.hf_batch_size, args.groups_in_flight)
    print(f"b: {len(sequences) / b_s:.1f} sequences/s", file=sys.stderr)
    diff = max(abs(x - y) for x, y in zip(a_rewards, b_rewards, strict=True))
    ratio = a_s / b_s
    result = {
        "date": dt.date.today().isoformat(), "model": args.model, "domains": sorted(domains), "groups": len(groups),
        "sequences": len(sequences), "tokens": tokens, "hf_batch_size": args.hf_batch_size,
        "groups_in_flight": args.groups_in_flight, "b_forward_passes": passes,
        "a": {"what": "one conversation per forward, the model's own class (ArmoRM's card; reward-bench LegacyArmoRMPipeline)", "seconds": a_s,
              "sequences_per_s": len(sequences) / a_s, "tokens_per_s": tokens / a_s},
        "b": {"what": f"rmserve transformers engine, --trust-remote-code, {args.groups_in_flight} groups in flight, "
                      f"cross-group batches of up to {args.hf_batch_size} ({passes} forward passes)", "seconds": b_s,
              "sequences_per_s": len(sequences) / b_s, "tokens_per_s": tokens / b_s},
        "b_over_a": ratio, "target": 1.5, "holds": ratio >= 1.5, "max_abs_diff": diff,
        "machine": machine_info(), "versions": versions(),
        "command": "python benchmarks/remote_head.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{result['date']}-{args.machine}-remote-head-{args.tag}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(
        f"# Remote-code head — {result['date']} — {args.machine}\n\n"
        f"Model `{args.model}` (float32), RM-Bench {', '.join(sorted(domains))}: {len(groups)} groups, "
        f"{len(sequences)} sequences, {tokens:,} prompt tokens.\n\n"
        "| path | what | seconds | sequences/s | tokens/s |\n| --- | --- | ---: | ---: | ---: |\n"
        + "".join(f"| {p} | {result[p]['what']} | {result[p]['seconds']:.2f} | {result[p]['sequences_per_s']:.1f} | "
                  f"{result[p]['tokens_per_s']:,.0f} |\n" for p in ("a", "b"))
        + f"\nb/a: {ratio:.2f} (target ≥ 1.5: {'met' if ratio >= 1.5 else 'NOT met'}); largest reward difference "
        f"{diff:.1e}.\n\nCommand: `{result['command']}`\n"
    )
    print(f"b/a {ratio:.2f}; max |diff| {diff:.1e}; wrote {args.out / stem}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
