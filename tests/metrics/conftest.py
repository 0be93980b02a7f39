"""Fixtures for the metrics tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from testkit.metrics_data import RB2_REFERENCE, write_jsonl


@pytest.fixture
def rb2_reference(shared_data: Path) -> Path:
    """The per-item RewardBench 2 scores of Skywork-Reward-V2-Llama-3.1-8B.

    ``shared_data`` comes from ``tests/conftest.py``. Fails the test (not a skip) when the file
    is missing: the tests that pin the official figures must not pass without it.
    """
    path = shared_data / RB2_REFERENCE
    if not path.is_file():
        pytest.fail(f"shared reference file {path} is missing")
    return path


@pytest.fixture
def jsonl_writer(tmp_path: Path) -> Callable[[str, Sequence[Any]], Path]:
    """``write(name, rows)`` → a JSONL file in ``tmp_path``."""

    def write(name: str, rows: Sequence[Any]) -> Path:
        return write_jsonl(tmp_path / name, rows)

    return write
