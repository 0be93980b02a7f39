"""Where the shared benchmark files are: ``<repo>/../shared/data`` (read-only, never copied in).

One place builds that path. A missing folder or file fails the calling test (or the collection
of the module that asked at import time) with the full path; it never skips, because a data test
that is skipped when its data is absent cannot fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository checkout (the folder holding ``pyproject.toml``)."""


def shared_data_dir() -> Path:
    """``<repo>/../shared/data``, resolved.

    Raises:
        pytest.fail.Exception: the folder is missing (the message names it).
    """
    path = (REPO_ROOT / ".." / "shared" / "data").resolve()
    if not path.is_dir():
        pytest.fail(f"shared data folder {path} is missing (expected next to the repository)", pytrace=False)
    return path


def shared_file(*parts: str | Path) -> Path:
    """A file under :func:`shared_data_dir`, e.g. ``shared_file(RB2_REFERENCE)``.

    Raises:
        pytest.fail.Exception: the folder or the file is missing (the message names the path).
    """
    path = shared_data_dir().joinpath(*parts)
    if not path.is_file():
        pytest.fail(f"shared data file {path} is missing", pytrace=False)
    return path
