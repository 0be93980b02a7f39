"""``--wait-retry-after-s``: every command that talks to a server caps the wait a ``Retry-After``
asks for (default 60 s, :data:`rmserve.client.config.DEFAULT_MAX_RETRY_AFTER_S`), and the value
given reaches the client.
"""

from __future__ import annotations

import time

import pytest
from aiohttp import web
from testkit.servers import ThreadedServer
from typer.testing import CliRunner

from rmserve.cli import app as cli_app
from rmserve.client.config import DEFAULT_MAX_RETRY_AFTER_S
from rmserve.schema import ErrorBody, ErrorDetail, ModelInfo, ModelList, encode

MODEL = ModelInfo(name="rm", max_model_len=512, dtype="float32", fingerprint="fp-rm", engine="stub")


class Captured(Exception):
    """Raised by a stand-in pipeline once it has the config (ends the command with exit 1)."""


def _capture(monkeypatch, module, name: str) -> list:
    seen: list = []

    def stand_in(config, **_):
        seen.append(config)
        raise Captured("captured")

    monkeypatch.setattr(module, name, stand_in)
    return seen


@pytest.fixture
def data(tmp_path):
    from testkit.servers import write_rmbench_data

    return write_rmbench_data(tmp_path / "rmbench.jsonl")


def test_eval_run_and_sweep_take_the_cap_and_default_to_60_s(monkeypatch, data, tmp_path):
    import rmserve.pipelines.evaluate as evaluate_module
    import rmserve.pipelines.launch as launch_module
    import rmserve.pipelines.sweep as sweep_module

    assert DEFAULT_MAX_RETRY_AFTER_S == 60.0
    runner = CliRunner()
    common = ["--bench", "rm-bench", "--data", str(data), "--out", str(tmp_path / "o"), "--quiet"]
    evals = _capture(monkeypatch, evaluate_module, "evaluate")
    for extra in ([], ["--wait-retry-after-s", "2.5"]):
        result = runner.invoke(cli_app, ["eval", "--server", "http://127.0.0.1:9", *common, *extra])
        assert result.exit_code == 1, result.output
    assert [c.max_retry_after_s for c in evals] == [60.0, 2.5]
    assert evals[1].client_settings()[2].max_retry_after_s == 2.5

    runs = _capture(monkeypatch, launch_module, "run")
    from testkit.records import fake_checkpoint

    model = fake_checkpoint(tmp_path / "model", b"w")  # run checks the folder's files before anything starts
    result = runner.invoke(cli_app, ["run", str(model), *common, "--wait-retry-after-s", "7"])
    assert result.exit_code == 1, result.output
    assert [c.evaluation.max_retry_after_s for c in runs] == [7.0]

    sweeps = _capture(monkeypatch, sweep_module, "sweep")
    (tmp_path / "ckpts" / "step-1").mkdir(parents=True)
    for extra in ([], ["--wait-retry-after-s", "0.5"]):
        result = runner.invoke(cli_app, [
            "sweep", "--server", "http://127.0.0.1:9", "--bench", "rm-bench", "--data", str(data),
            "--out", str(tmp_path / "s"), "--store", str(tmp_path / "s.sqlite"), "--checkpoints",
            str(tmp_path / "ckpts" / "step-*"), "--quiet", *extra,
        ])
        assert result.exit_code == 1, result.output
    assert [c.max_retry_after_s for c in sweeps] == [60.0, 0.5]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["eval", "--server", "http://127.0.0.1:9"],
         "Invalid value for '--wait-retry-after-s': must be a finite number of seconds > 0, got 0.0"),
        (["models", "list", "--server", "http://127.0.0.1:9"],
         "Invalid value for '--wait-retry-after-s': Retry.max_retry_after_s must be a finite number > 0, got 0.0"),
    ],
    ids=["eval", "models"],
)
def test_a_cap_that_is_not_a_positive_number_is_bad_input(command, message, data, tmp_path):
    extra = [] if command[0] == "models" else ["--bench", "rm-bench", "--data", str(data), "--out",
                                                 str(tmp_path / "o"), "--quiet"]
    result = CliRunner().invoke(cli_app, [*command, *extra, "--wait-retry-after-s", "0"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


class DaysThenModels:
    """``GET /v1/models``: first a 429 asking for a day (``Retry-After: 86400``), then the list."""

    def __init__(self) -> None:
        self.requests = 0

    def make_app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            self.requests += 1
            if self.requests == 1:
                body = encode(ErrorBody(ErrorDetail("overloaded", "busy", None)))
                return web.Response(body=body, status=429, content_type="application/json",
                                    headers={"Retry-After": "86400"})
            return web.Response(body=encode(ModelList(models=(MODEL,))), content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/models", models)
        return app


def test_models_list_waits_the_cap_not_the_servers_day():
    server_side = DaysThenModels()
    with ThreadedServer(server_side.make_app) as server:
        started = time.monotonic()
        result = CliRunner().invoke(cli_app, ["models", "list", "--server", server.url, "--wait-retry-after-s", "0.2"])
        elapsed_s = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == "rm\tfp-rm\tclassifier\t-\t-"
    assert server_side.requests == 2
    assert 0.2 <= elapsed_s < 10  # the 0.2 s cap, not 86,400 s
