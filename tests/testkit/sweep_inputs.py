"""Inputs of the end-to-end sweep tests: demo checkpoints under one root, an RM-Bench subset."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def demo_checkpoints(root: Path, rmbench_dir: Path, steps: Sequence[int], configs: Sequence[Any]) -> list[Path]:
    """Build one demo model per step, ``root/step-<step>``, from the matching
    :class:`rmserve.demo_model.DemoModelConfig` (its vocabulary from the RM-Bench files in
    ``rmbench_dir``); the folders, in step order."""
    from rmserve.demo_model import build_demo_model

    folders = []
    for step, config in zip(steps, configs, strict=True):
        folder = root / f"step-{step}"
        build_demo_model(folder, rmbench_dir, config)
        folders.append(folder)
    return folders


def rmbench_subset(rmbench_dir: Path, data: Path, domains: Sequence[str], per_domain: int) -> Path:
    """Write the first ``per_domain`` groups of each of ``domains``' ``<domain>_filtered.json``
    in ``rmbench_dir`` to the same file name in ``data`` (created; it must not exist); ``data``."""
    data.mkdir()
    for domain in domains:
        rows = json.loads((rmbench_dir / f"{domain}_filtered.json").read_text())[:per_domain]
        (data / f"{domain}_filtered.json").write_text(json.dumps(rows))
    return data


def write_token(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``; ``path``."""
    path.write_text(token)
    return path
