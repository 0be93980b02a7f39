"""Helpers shared by the metrics tests (reference files and their official figures, small score-file writers)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rmserve.schema import RMBENCH_STYLES, ScoreRecord, encode

RB2_REFERENCE = Path("reference-results", "rewardbench2", "Skywork__Skywork-Reward-V2-Llama-3.1-8B.jsonl")
"""Per-item RewardBench 2 scores of one real RM, relative to the shared data folder."""

RB2_REFERENCE_SUBSETS = {
    "Factuality": 0.8463,
    "Precise IF": 0.6562,
    "Math": 0.7760,
    "Safety": 0.9667,
    "Focus": 0.9838,
    "Ties": 0.8124,
}
"""RewardBench 2 subset scores (fractions, 4 places) of :data:`RB2_REFERENCE`: the "ours" row of
``reference-results/rewardbench2/README.md``, recomputed by the upstream code from that very file."""

RB2_REFERENCE_AVERAGE = 0.8402
"""The unweighted mean of the six subset scores of :data:`RB2_REFERENCE` (same README row)."""

RMBENCH_REFERENCE = Path("reference-results", "rm-bench")
"""Published RM-Bench result files, relative to the shared data folder."""


def rmbench_record(domain: str, record_id: str, rewards: Sequence[float | None]) -> ScoreRecord:
    """A rm-bench ScoreRecord with 6 rewards (3 chosen, 3 rejected)."""
    return ScoreRecord(
        benchmark="rm-bench",
        domain=domain,
        id=record_id,
        num_chosen=3,
        rewards=tuple(rewards),
        styles=RMBENCH_STYLES + RMBENCH_STYLES,
    )


def random_rmbench_records(counts: dict[str, int], seed: int = 0, shift: float = 0.8) -> list[ScoreRecord]:
    """Random RM-Bench records: chosen rewards ``shift`` above rejected on average."""
    rng = np.random.default_rng(seed)
    records = []
    for domain, n in counts.items():
        base = rng.normal(size=(n, 1))
        chosen = base + rng.normal(shift, 1.0, size=(n, 3))
        rejected = base + rng.normal(0.0, 1.0, size=(n, 3))
        rewards = np.hstack([chosen, rejected])
        records += [rmbench_record(domain, str(i), rewards[i].tolist()) for i in range(n)]
    return records


def write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    """Write records (msgspec Structs or dicts) one JSON object per line."""
    lines = [encode(r).decode() if not isinstance(r, dict) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_reference_rows(path: Path) -> list[dict[str, Any]]:
    """The item records of a RewardBench 2 per-item file, parsed with the stdlib json module."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "_record" not in r]
