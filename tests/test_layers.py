"""The import layers of the package, read from the source (no module is imported).

Three floors:

* **ground**: ``rmserve`` itself (``rmserve/__init__.py``), ``rmserve.schema``,
  ``rmserve.errors``, ``rmserve.datasets``, ``rmserve.fingerprint``, ``rmserve.judge_records``.
  Imports only the ground.
* **stages**: ``rmserve.server``, ``rmserve.client``, ``rmserve.metrics``. Each imports the
  ground and itself, never another stage, and never the top floor.
* **top**: ``rmserve.pipelines``, ``rmserve.cluster`` (replicas on Ray), the CLI
  (``rmserve.cli*``), ``rmserve.demo_model`` and its ``rmserve.demo_families``. May import
  anything.

Every ``import``/``from … import`` statement counts, wherever it stands (module level, inside a
function, under ``if TYPE_CHECKING:``); relative imports are resolved against the importing
module's package. A string literal of the form ``"rmserve.x.y:Name"`` counts too: that is how
engines are named for lazy loading (``server/engines/registry.py``).

Heavy engines: among the stages only ``server/engines/vllm_compat.py`` imports ``vllm`` (the vLLM engines reach it
through that module); the ground, the client
and the metrics import none of ``vllm``, ``torch``, ``transformers`` or ``tokenizers``.

Files are found through ``[tool.setuptools.package-dir]`` in ``pyproject.toml``, so a new stage
folder is walked as soon as it is installed; a module that fits no floor fails the test until it
is given one here.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

GROUND = frozenset(
    {"rmserve", "rmserve.schema", "rmserve.errors", "rmserve.datasets", "rmserve.fingerprint", "rmserve.judge_records"}
)
"""Modules of the ground floor."""

STAGES = ("rmserve.server", "rmserve.client", "rmserve.metrics")
"""Stage packages: each may import only the ground and itself."""

TOP = ("rmserve.pipelines", "rmserve.cluster", "rmserve.demo_model", "rmserve.demo_families", "rmserve.cli")
"""Prefixes of the top floor (``rmserve.cli`` also covers ``rmserve.cli_eval`` and the like)."""

VLLM_IMPORTERS = frozenset({"rmserve.server.engines.vllm_compat"})
"""The only stage modules allowed to import ``vllm``; a new vLLM-backed engine is added here."""

HEAVY = ("vllm", "torch", "transformers", "tokenizers")
"""Engine-side libraries that the ground, the client and the metrics never import."""

_ENGINE_REF = re.compile(r"^(rmserve(?:\.\w+)+):\w+$")
"""``"module:attr"`` references used for lazy loading."""


@dataclass(frozen=True)
class Edge:
    """One import found in the source: ``importer`` names ``target`` at ``path:line``."""

    importer: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target}"


def package_modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Module name → source file, for every ``.py`` file of every package in ``package-dir``.

    Raises:
        AssertionError: ``pyproject.toml`` maps no packages (nothing would be checked).
    """
    config = tomllib.loads((root / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    assert package_dir, "pyproject.toml [tool.setuptools.package-dir] is empty"
    data_files = {  # shipped as files, never imported as modules (the demo's remote-code model file)
        path.resolve()
        for package, patterns in config["tool"]["setuptools"].get("package-data", {}).items()
        for pattern in patterns
        for path in (root / package_dir.get(package, package.replace(".", "/"))).glob(pattern)
    }
    modules: dict[str, Path] = {}
    for package, folder in package_dir.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            if path.resolve() in data_files:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            modules.setdefault(name, path)
    return modules


def _resolve_from(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <module> import …`` (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"relative import beyond the top package in {importer} (level {node.level})")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(
    importer: str, source: str, path: str, known: frozenset[str], is_package: bool = False
) -> Iterator[Edge]:
    """Every module named by the imports in ``source`` (see the module docstring for what counts).

    ``from pkg import name`` yields ``pkg.name`` when that is a module in ``known``, else ``pkg``.
    """
    tree = ast.parse(source, filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(importer, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve_from(importer, is_package, node)
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                yield Edge(importer, candidate if candidate in known else module, path, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _ENGINE_REF.match(node.value)
            if match:
                yield Edge(importer, match.group(1), path, node.lineno)


def floor(module: str) -> str | None:
    """``"ground"``, the stage package name, ``"top"``, or None for a module outside the layers."""
    if module in GROUND:
        return "ground"
    for stage in STAGES:
        if module == stage or module.startswith(stage + "."):
            return stage
    for prefix in TOP:
        if module == prefix or module.startswith(prefix + ".") or module.startswith(prefix + "_"):
            return "top"
    return None


def layer_violations(edges: list[Edge]) -> list[str]:
    """The edges that break the layer rules, as readable lines (empty when all is well)."""
    bad = []
    for edge in edges:
        root = edge.target.split(".")[0]
        source = floor(edge.importer)
        if source is None:
            bad.append(f"{edge.path}: module {edge.importer} belongs to no floor (add it to tests/test_layers.py)")
            continue
        if root in HEAVY and source != "top":
            if root == "vllm" and edge.importer in VLLM_IMPORTERS:
                continue
            if root != "vllm" and source == "rmserve.server":
                continue  # the server's transformers engine and renderer
            if root == "vllm":
                bad.append(f"{edge}: among the stages only {', '.join(sorted(VLLM_IMPORTERS))} imports vllm")
            else:
                bad.append(f"{edge}: {root} is imported only by the server stage and the top floor")
            continue
        if root != "rmserve":
            continue
        target = floor(edge.target)
        if target is None:
            bad.append(f"{edge}: the target belongs to no floor")
        elif source == "top" or target == "ground" or target == source:
            continue
        elif source == "ground":
            bad.append(f"{edge}: the ground imports only the ground")
        elif target == "top":
            bad.append(f"{edge}: a stage never imports the pipelines, the CLI or the demo model")
        else:
            bad.append(f"{edge}: stage {source} never imports stage {target}")
    return bad


def _edges() -> list[Edge]:
    modules = package_modules()
    known = frozenset(modules)
    edges: list[Edge] = []
    for name, path in modules.items():
        rel = str(path.relative_to(REPO_ROOT))
        edges += imports_of(name, path.read_text(), rel, known, is_package=path.name == "__init__.py")
    return edges


def test_every_floor_and_stage_has_modules():
    modules = package_modules()
    # The walk covers the ground, every stage, the pipelines and the CLI (not an empty glob).
    for name in [*sorted(GROUND), *STAGES, "rmserve.pipelines.evaluate", "rmserve.cli", "rmserve.demo_model"]:
        assert name in modules, name
    assert {"rmserve.server.engines.vllm_engine", "rmserve.server.engines.vllm_compat"} <= set(modules)
    assert all(floor(name) is not None for name in modules), sorted(n for n in modules if floor(n) is None)


def test_no_import_crosses_a_layer():
    edges = _edges()
    # Sanity: the walk sees real imports, including one inside a function (engine_hf's transformers).
    assert any(e.importer == "rmserve.server.engines.vllm_compat" and e.target.startswith("vllm") for e in edges)
    assert any(e.importer == "rmserve.pipelines.evaluate" and floor(e.target) == "rmserve.client" for e in edges)
    assert layer_violations(edges) == []


def test_only_the_listed_engine_modules_import_vllm():
    importers = {e.importer for e in _edges() if e.target.split(".")[0] == "vllm" and floor(e.importer) != "top"}
    assert importers == VLLM_IMPORTERS


KNOWN = frozenset(
    {"rmserve.server", "rmserve.server.http.app", "rmserve.client.client", "rmserve.metrics.report", "rmserve.pipelines.evaluate"}
)
"""Module names the synthetic sources below may name."""


@pytest.mark.parametrize(
    ("importer", "is_package", "source", "expected"),
    [
        (
            "rmserve.client.score_store",
            False,
            "from rmserve.server.http import app\n",
            "x.py:1: rmserve.client.score_store imports rmserve.server.http.app:"
            " stage rmserve.client never imports stage rmserve.server",
        ),
        (
            "rmserve.metrics.report",
            False,
            "def f():\n    from ..client import client\n",
            "x.py:2: rmserve.metrics.report imports rmserve.client.client:"
            " stage rmserve.metrics never imports stage rmserve.client",
        ),
        (
            "rmserve.server",
            True,
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rmserve.metrics.report\n",
            "x.py:3: rmserve.server imports rmserve.metrics.report:"
            " stage rmserve.server never imports stage rmserve.metrics",
        ),
        (
            "rmserve.schema",
            False,
            "from rmserve.server.http.app import create_app\n",
            "x.py:1: rmserve.schema imports rmserve.server.http.app:"
            " the ground imports only the ground",
        ),
        (
            "rmserve.fingerprint",
            False,
            "from .pipelines import evaluate\n",
            "x.py:1: rmserve.fingerprint imports rmserve.pipelines.evaluate:"
            " the ground imports only the ground",
        ),
        (
            "rmserve.server.http.app",
            False,
            "import rmserve.cli_server\n",
            "x.py:1: rmserve.server.http.app imports rmserve.cli_server:"
            " a stage never imports the pipelines, the CLI or the demo model",
        ),
        (
            "rmserve.client.client",
            False,
            "ENGINES = {'x': 'rmserve.demo_model:build_demo_model'}\n",
            "x.py:1: rmserve.client.client imports rmserve.demo_model:"
            " a stage never imports the pipelines, the CLI or the demo model",
        ),
        (
            "rmserve.server.render.chat",
            False,
            "import vllm.config\n",
            "x.py:1: rmserve.server.render.chat imports vllm.config:"
            " among the stages only rmserve.server.engines.vllm_compat imports vllm",
        ),
        (
            "rmserve.metrics.report",
            False,
            "def f():\n    import torch\n",
            "x.py:2: rmserve.metrics.report imports torch:"
            " torch is imported only by the server stage and the top floor",
        ),
        (
            "rmserve.tools",
            False,
            "import json\n",
            "x.py:"
            " module rmserve.tools belongs to no floor (add it to tests/test_layers.py)",
        ),
    ],
)
def test_checker_reports_a_bad_import(importer, is_package, source, expected):
    assert layer_violations(list(imports_of(importer, source, "x.py", KNOWN, is_package))) == [expected]


@pytest.mark.parametrize(
    ("importer", "source"),
    [
        ("rmserve.pipelines.evaluate", "from rmserve.server.http.app import create_app\nimport torch\n"),
        ("rmserve.cli_sweep", "from .metrics import report\n"),
        ("rmserve.server.http.app", "from . import engine\nfrom rmserve.errors import RMServeError\n"),
        ("rmserve.server.engines.vllm_compat", "import vllm\n"),
        ("rmserve.server.engines.hf_engine", "import torch\n"),
        ("rmserve.datasets", "from rmserve.schema import ScoreRecord\nimport numpy\n"),
    ],
)
def test_checker_accepts_allowed_imports(importer, source):
    assert layer_violations(list(imports_of(importer, source, "x.py", KNOWN))) == []


SERVER_WITHOUT_ENGINES = [
    "rmserve.server.http.app",
    "rmserve.server.http.routes",
    "rmserve.server.http.serve",
    "rmserve.server.swaps.swap",
    "rmserve.server.engines.batching",
    "rmserve.server.engines.registry",
]
"""Server modules that the fast lane runs over the fakes: they load no engine library on import."""


def test_server_app_imports_no_engine_library():
    code = (
        "import importlib, json, sys\n"
        f"for name in {SERVER_WITHOUT_ENGINES!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []
