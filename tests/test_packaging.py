"""`pip install .` with no extras gives working client and metrics without torch or vllm."""

from __future__ import annotations

import json
import re
import subprocess
import venv

import pytest
from testkit.metrics_data import RB2_REFERENCE, RB2_REFERENCE_AVERAGE, RB2_REFERENCE_SUBSETS
from testkit.shared_data import REPO_ROOT as REPO
from testkit.shared_data import shared_file


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plain_install_has_metrics_and_client_without_torch(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(REPO)], check=True, cwd=tmp_path, timeout=800
    )
    probe = (
        "import importlib.util, sys\n"
        "import rmserve.client, rmserve.metrics, rmserve.cli\n"
        "print(importlib.util.find_spec('torch') is None, importlib.util.find_spec('vllm') is None,"
        " 'torch' in sys.modules)\n"
    )
    out = subprocess.run([str(py), "-c", probe], check=True, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True", "False"]
    res = subprocess.run(
        [str(env_dir / "bin" / "rmserve"), "metrics", "rewardbench2", str(shared_file(RB2_REFERENCE)), "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    # Figures from the reference README (computed by the official code from the same scores).
    result = json.loads(res.stdout)
    assert {name: round(entry["score"], 4) for name, entry in result["subsets"].items()} == RB2_REFERENCE_SUBSETS
    assert round(result["average"]["score"], 4) == RB2_REFERENCE_AVERAGE


PACKAGE_FOLDERS = ("rmserve", "server", "client", "metrics")
"""The source folders pyproject.toml maps to packages (copied, with pyproject.toml and README.md,
to build the wheel away from the checkout)."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_holds_exactly_the_status_page_files_as_data_and_builds_without_warnings(tmp_path):
    import shutil
    import sys
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(wheels), str(src)],
        capture_output=True, text=True, timeout=500,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    log = done.stdout + done.stderr
    # Python warnings of the build backend (e.g. setuptools' "_Warning: Package
    # 'rmserve.server.static' is absent from the `packages` configuration"); pip's own
    # "WARNING:" lines about the index set-up of the machine are not the project's.
    warnings = [line for line in log.splitlines() if re.search(r"\w*Warning\b", line)]
    assert warnings == []
    (wheel,) = wheels.glob("rmserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = sorted(n for n in names if n.startswith("rmserve/") and not n.endswith(".py"))
    assert data == sorted(f"rmserve/server/static/{p.name}" for p in (REPO / "server" / "static").iterdir())
