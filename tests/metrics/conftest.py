"""Fixtures for the metrics tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from testkit.metrics_data import RB2_REFERENCE, write_jsonl
from testkit.shared_data import shared_file


@pytest.fixture
def rb2_reference() -> Path:
    """The per-item RewardBench 2 scores of Skywork-Reward-V2-Llama-3.1-8B.

    Fails the test, naming the path, when the shared file is missing (never a skip).
    """
    return shared_file(RB2_REFERENCE)


@pytest.fixture
def jsonl_writer(tmp_path: Path) -> Callable[[str, Sequence[Any]], Path]:
    """``write(name, rows)`` → a JSONL file in ``tmp_path``."""

    def write(name: str, rows: Sequence[Any]) -> Path:
        return write_jsonl(tmp_path / name, rows)

    return write
