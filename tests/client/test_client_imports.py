"""The client stage imports without torch or vllm (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

MODULES = [
    "rmserve.client.client",
    "rmserve.client.config",
    "rmserve.client.errors",
    "rmserve.client.records",
    "rmserve.client.score_file",
    "rmserve.client.trl_reward",
    "rmserve.pipelines.evaluate",
    "rmserve.pipelines.launch",
    "rmserve.cli_eval",
    "rmserve.cli",
    # imported lazily by evaluate():
    "rmserve.datasets",
    "rmserve.metrics.evaluation",
    "rmserve.metrics.outputs",
]


def test_client_imports_pull_in_no_torch_or_vllm():
    code = (
        "import importlib, json, sys\n"
        f"for name in {MODULES!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'transformers', 'trl'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []
