"""The server package's own structure: no import cycle, vllm in one module only (``engines/vllm_compat.py``).

The import graph is read from the source (``ast``), imports inside functions included, so
nothing is imported and no engine dependency is needed. Imports under ``if TYPE_CHECKING:``
never run, so they are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVER_DIR = Path(__file__).resolve().parents[2] / "server"
PACKAGE = "rmserve.server"


def _imports(path: Path) -> set[str]:
    """Every module name an ``import`` / ``from … import`` in ``path`` names (names under a
    package counted as possible submodules: ``from rmserve.server import swap`` → ``…swap``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def server_graph() -> dict[str, set[str]]:
    """Module of ``server/`` → the modules of ``server/`` it imports (anywhere in its body)."""
    modules = {
        ".".join((PACKAGE, *p.relative_to(SERVER_DIR).with_suffix("").parts)): p
        for p in SERVER_DIR.rglob("*.py")
        if p.stem != "__init__"
    }
    return {name: _imports(path) & set(modules) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, …, a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_sees_a_cycle_and_its_absence():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_are_read_from_functions_but_not_from_type_checking_blocks(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from rmserve.server.swaps import swap\n"
        "if TYPE_CHECKING:\n"
        "    from rmserve.server.swaps.state import EngineState\n"
        "def f():\n"
        "    import rmserve.server.http.routes\n"
    )
    assert _imports(source) == {"typing", "typing.TYPE_CHECKING", "rmserve.server.swaps", "rmserve.server.swaps.swap",
                                "rmserve.server.http.routes"}


def test_server_modules_import_each_other_without_a_cycle():
    graph = server_graph()
    # the split by concern is what the graph is read from; a missing module would hide edges
    assert {"swaps.state", "http.middleware", "kinds.scoring", "swaps.swap", "http.routes", "http.app",
            "engines.lifecycle"} <= {name.removeprefix(f"{PACKAGE}.") for name in graph}
    assert find_cycle(graph) is None


def test_routes_and_factory_sit_on_top():
    graph = server_graph()
    s = PACKAGE
    assert f"{s}.http.routes" in graph[f"{s}.http.app"]
    for lower in ("swaps.state", "http.middleware", "kinds.scoring", "swaps.swap", "engines.protocol", "config"):
        assert f"{s}.http.routes" not in graph[f"{s}.{lower}"] and f"{s}.http.app" not in graph[f"{s}.{lower}"]


def test_only_the_vllm_compatibility_module_imports_vllm():
    importers = sorted(p.relative_to(SERVER_DIR).as_posix() for p in SERVER_DIR.rglob("*.py") if any(
        name == "vllm" or name.startswith("vllm.") for name in _imports(p)))
    assert importers == ["engines/vllm_compat.py"]


def _subpackage_edges(graph: dict[str, set[str]], part: str) -> dict[str, set[str]]:
    """Module of ``server/<part>/`` → the other subpackages' modules it imports."""
    prefix = f"{PACKAGE}.{part}."
    return {
        name.removeprefix(f"{PACKAGE}."): {dep.removeprefix(f"{PACKAGE}.") for dep in deps if not dep.startswith(prefix)}
        for name, deps in graph.items()
        if name.startswith(prefix)
    }


def test_engines_never_import_the_http_surface_or_sharing():
    bad = {
        name: sorted(dep for dep in deps if dep.startswith(("http.", "sharing.", "kinds.scoring")))
        for name, deps in _subpackage_edges(server_graph(), "engines").items()
    }
    assert {name: deps for name, deps in bad.items() if deps} == {}


def test_kinds_see_engines_only_through_the_protocol():
    bad = {
        name: sorted(dep for dep in deps if dep.startswith("engines.") and dep != "engines.protocol")
        for name, deps in _subpackage_edges(server_graph(), "kinds").items()
    }
    assert {name: deps for name, deps in bad.items() if deps} == {}


def test_every_model_kind_has_one_kind_module():
    """The kind registry names one ``server/kinds/<kind>.py`` class per ``ModelKind``, and only
    the scoring path and the registry know of kinds in general (no kind module imports another
    but the classifier, whose scoring the DPO and length kinds reuse)."""
    import re
    import typing

    source = (SERVER_DIR / "kinds" / "base.py").read_text()
    registry = dict(re.findall(r'^\s+"(\w+)": "rmserve\.server\.kinds\.(\w+):\w+Kind",$', source, re.M))
    schema = (SERVER_DIR.parent / "rmserve" / "schema.py").read_text()
    (literal,) = re.findall(r"^ModelKind = (Literal\[.*\])$", schema, re.M)
    kinds = typing.get_args(eval(literal, {"Literal": typing.Literal}))
    assert sorted(registry) == sorted(kinds) == ["classifier", "dpo", "judge", "length"]
    assert all(registry[k] == k for k in kinds)
    graph = server_graph()
    for kind in kinds:
        others = {dep for dep in graph[f"{PACKAGE}.kinds.{kind}"]
                  if dep.removeprefix(f"{PACKAGE}.kinds.") in set(kinds) - {"classifier"}}
        assert others == set(), kind
