"""``rmserve serve --model NAME=PATH`` (several models in one server): what reaches ``serve_node``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rmserve.cli import app

runner = CliRunner()


@pytest.fixture
def nodes(monkeypatch):
    import rmserve.server.http.serve as serve_module

    calls: list = []
    monkeypatch.setattr(serve_module, "serve_node", lambda e, s, *, announce=print: calls.append((e, s)) or 0)
    monkeypatch.setattr(serve_module, "serve", lambda e, s, *, announce=print: calls.append(("single", e)) or 0)
    monkeypatch.setattr(serve_module, "configure_logging", lambda level: None)
    return calls


def test_each_model_gets_its_engine_config_with_its_memory_share(nodes, tmp_path):
    result = runner.invoke(app, ["serve", "--model", "a=org/a", "--model", "b=org/b,gpu_memory_utilization=0.5",
                                 "--model", "c=org/c", "--gpu-memory-utilization", "0.8", "--dtype", "float32",
                                 "--port", "9000"])
    assert result.exit_code == 0, result.output
    (configs, server_config), = nodes
    assert [(c.model, c.name, c.gpu_memory_utilization, c.dtype) for c in configs] == [
        ("org/a", "a", 0.15, "float32"), ("org/b", "b", 0.5, "float32"), ("org/c", "c", 0.15, "float32")]
    assert server_config.port == 9000 and server_config.served_model_name is None


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "m", "--model", "a=/x"], "give MODEL (m) or --model NAME=PATH, not both"),
    (["serve", "--model", "a"], "expected NAME=PATH"),
    (["serve", "--model", "a=/x", "--model", "a=/y"], "given more than once"),
    (["serve", "--model", "a=/x", "--served-model-name", "z"], "each model is named by its NAME"),
    (["serve", "--model", "a=/x,gpu_memory_utilization=0.7", "--model", "b=/y", "--gpu-memory-utilization", "0.6"],
     "the models' own fractions sum to 0.7"),
])
def test_bad_model_specs_are_refused_naming_the_problem(nodes, argv, message):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert nodes == []


def test_without_model_specs_the_single_model_server_runs(nodes):
    result = runner.invoke(app, ["serve", "m"])
    assert result.exit_code == 0, result.output
    assert nodes[0][0] == "single" and nodes[0][1].model == "m"
