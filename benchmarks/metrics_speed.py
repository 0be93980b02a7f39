"""Speed of the metrics stage on synthetic rewards.

Measures (wall clock, median of ``--repeats`` runs after one warm-up):

* ``rmbench_1m``: :func:`rmserve.metrics.rmbench.rmbench_accuracy` on 1,000,000 RM-Bench
  groups spread over the five source domains (target < 2 s);
* ``rb2_1m``: :func:`rmserve.metrics.rewardbench2.rewardbench2_scores` on 1,000,000
  non-Ties RewardBench 2 groups (no target; for reference);
* ``bootstrap_rmbench_10k``: :func:`rmserve.metrics.bootstrap.rmbench_intervals`, 1,000
  resamples over 10,000 groups (target < 5 s);
* ``bootstrap_rb2_10k``: :func:`rmserve.metrics.bootstrap.rb2_intervals`, 1,000 resamples over
  10,000 groups incl. 100 Ties prompts (target < 5 s).

Writes ``benchmarks/results/metrics-speed-<YYYY-MM-DD>.json`` with the machine description.
Run: ``python benchmarks/metrics_speed.py [--repeats 5] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rmserve.metrics.bootstrap import BootstrapConfig, rb2_intervals, rmbench_intervals
from rmserve.metrics.rewardbench2 import rewardbench2_scores
from rmserve.metrics.rmbench import rmbench_accuracy

from rmserve.schema import RB2_SUBSETS, RMBENCH_DOMAINS


def machine_info() -> dict[str, object]:
    """The benchmark machine (see ``throughput.machine_info``) plus the Python and numpy versions."""
    from throughput import machine_info as base_machine_info  # this folder, on sys.path as a script

    return {**base_machine_info(), "python": platform.python_version(), "numpy": np.__version__}


def timed(call: Callable[[], object], repeats: int) -> dict[str, object]:
    """Run ``call`` once to warm up, then ``repeats`` times; wall-clock seconds."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"seconds": times, "median_s": statistics.median(times), "best_s": min(times)}


def rmbench_inputs(n_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(n_groups, 6))
    rewards[:, :3] += 0.5
    domains = np.array(RMBENCH_DOMAINS)[rng.integers(0, len(RMBENCH_DOMAINS), n_groups)]
    return rewards, domains


def rb2_inputs(n_groups: int, n_ties_prompts: int, seed: int):
    """Non-Ties groups of 4 completions plus ``n_ties_prompts`` ref/tied pairs of 12 completions."""
    rng = np.random.default_rng(seed)
    n_plain = n_groups - 2 * n_ties_prompts
    width = 12
    scores = np.full((n_groups, width), np.nan)
    scores[:n_plain, :4] = rng.normal(size=(n_plain, 4))
    scores[n_plain:, :] = rng.normal(size=(2 * n_ties_prompts, width))
    lengths = np.r_[np.full(n_plain, 4), np.full(2 * n_ties_prompts, width)]
    num_correct = np.r_[np.ones(n_plain, int), np.tile([1, 4], n_ties_prompts)]
    subsets = np.r_[np.array(RB2_SUBSETS[:5])[rng.integers(0, 5, n_plain)], np.full(2 * n_ties_prompts, "Ties")]
    ids = np.r_[
        np.arange(n_plain).astype(str),
        np.array([f"{kind}:{p}" for p in range(n_ties_prompts) for kind in ("ref", "tied")]),
    ]
    return scores, lengths, num_correct, subsets, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (default 5)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results", help="result folder")
    args = parser.parse_args()

    config = BootstrapConfig(resamples=1000, seed=0)
    rewards_1m, domains_1m = rmbench_inputs(1_000_000, seed=0)
    plain = rb2_inputs(1_000_000, 0, seed=1)
    rewards_10k, domains_10k = rmbench_inputs(10_000, seed=2)
    rb2_10k = rb2_inputs(10_000, 100, seed=3)

    cases = {
        "rmbench_1m": (
            {"groups": 1_000_000, "target_s": 2.0},
            lambda: rmbench_accuracy(rewards_1m, domains_1m),
        ),
        "rb2_1m": ({"groups": 1_000_000, "target_s": None}, lambda: rewardbench2_scores(*plain)),
        "bootstrap_rmbench_10k": (
            {"groups": 10_000, "resamples": 1000, "target_s": 5.0},
            lambda: rmbench_intervals(rewards_10k, domains_10k, config),
        ),
        "bootstrap_rb2_10k": (
            {"groups": 10_000, "ties_prompts": 100, "resamples": 1000, "target_s": 5.0},
            lambda: rb2_intervals(*rb2_10k, config),
        ),
    }
    results = {}
    for name, (meta, call) in cases.items():
        timing = timed(call, args.repeats)
        target = meta["target_s"]
        results[name] = {**meta, **timing, "meets_target": None if target is None else timing["median_s"] < target}
        print(f"{name:24s} median {timing['median_s']:.3f} s  best {timing['best_s']:.3f} s  target {target}")

    today = dt.date.today().isoformat()
    record = {"date": today, "repeats": args.repeats, "machine": machine_info(), "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"metrics-speed-{today}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
