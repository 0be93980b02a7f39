"""``serve_app`` (listener first, engine loaded in the background, signals) and ``rmserve serve``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import aiohttp
import orjson
import pytest
from testkit.app_client import wait_until
from testkit.fakes import FakeEngine, FakeRenderer
from rmserve.server.http import serve as serve_module
from rmserve.server.http.app import DEFAULT_MAX_BODY_BYTES, ServerConfig
from rmserve.server.config import EngineConfig
from typer.testing import CliRunner

from rmserve.cli import app as cli_app

VALID = {"groups": [{"id": "g0", "prompt": "hi", "responses": ["yo", "ya"]}]}


def line_starting(lines: list[str], prefix: str) -> str | None:
    return next((line for line in lines if line.startswith(prefix)), None)


async def test_serve_app_listens_before_the_engine_is_ready_and_stops_cleanly():
    engine = FakeEngine(start_gate=asyncio.Event(), score_gate=asyncio.Event())
    lines: list[str] = []
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_module.serve_app(ServerConfig(port=0), engine, FakeRenderer(), announce=lines.append, stop=stop)
    )
    await wait_until(lambda: line_starting(lines, "listening on ") is not None)
    url = line_starting(lines, "listening on ").split()[2]
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    async with aiohttp.ClientSession(url) as session:
        async with session.get("/health") as resp:
            assert resp.status == 503
        engine.start_gate.set()
        await wait_until(lambda: line_starting(lines, "ready: ") is not None)
        assert line_starting(lines, "ready: ") == f"ready: {url} serving fake-rm"
        async with session.get("/health") as resp:
            assert resp.status == 200

        # a client that goes away cancels its engine calls (the runner uses handler_cancellation)
        request = asyncio.create_task(session.post("/v1/score", json=VALID))
        await wait_until(lambda: len(engine.calls) == 1)
        request.cancel()
        await wait_until(lambda: len(engine.cancelled) == 1)
        assert engine.cancelled == [engine.calls[0][0]]

        engine.score_gate.set()
        async with session.post("/v1/score", json=VALID) as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["results"][0]["rewards"] == [4.55, 4.41]
    stop.set()
    assert await server == 0
    assert engine.shutdown_calls == 1
    assert lines[-1] == "stopping"


async def test_serve_app_stops_on_sigterm():
    engine = FakeEngine()
    lines: list[str] = []
    server = asyncio.create_task(serve_module.serve_app(ServerConfig(port=0), engine, FakeRenderer(),
                                                        announce=lines.append))
    await wait_until(lambda: line_starting(lines, "ready: ") is not None)
    os.kill(os.getpid(), signal.SIGTERM)  # serve_app's handler is installed before it announces
    assert await server == 0
    assert engine.shutdown_calls == 1


async def test_serve_app_returns_1_when_the_engine_fails_to_load():
    engine = FakeEngine(start_error=RuntimeError("no weights"))
    lines: list[str] = []
    assert await serve_module.serve_app(ServerConfig(port=0), engine, FakeRenderer(), announce=lines.append) == 1
    assert lines[-1] == "engine failed to start: no weights"
    assert engine.shutdown_calls == 1


async def test_serve_app_returns_2_when_the_engine_refuses_an_option():
    from rmserve.errors import ServerFault

    refusal = ServerFault("judge_system_prompt: the template refuses a system turn", field="judge_system_prompt")
    engine = FakeEngine(start_error=refusal)
    lines: list[str] = []
    assert await serve_module.serve_app(ServerConfig(port=0), engine, FakeRenderer(), announce=lines.append) == 2
    assert lines[-1] == "engine failed to start: judge_system_prompt: the template refuses a system turn"


async def test_serve_app_returns_2_when_the_port_is_taken():
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        port = blocker.getsockname()[1]
        engine = FakeEngine()
        lines: list[str] = []
        assert await serve_module.serve_app(ServerConfig(port=port), engine, FakeRenderer(), announce=lines.append) == 2
    finally:
        blocker.close()
    assert len(lines) == 1 and lines[0].startswith(f"cannot listen on http://127.0.0.1:{port}: ")
    assert (engine.started, engine.shutdown_calls) == (False, 0)  # refused before any engine started


class _PortProbingEngine(FakeEngine):
    """A fake engine whose start tries to bind the server's port, as an engine's own sockets could."""

    port: int = 0
    bind_error: int | None = None

    async def start(self):
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", self.port))
        except OSError as exc:
            self.bind_error = exc.errno
        finally:
            probe.close()
        return await super().start()


async def test_serve_app_holds_its_port_before_the_engine_starts():
    import errno

    from rmserve.pipelines.launch import free_loopback_port

    engine = _PortProbingEngine()
    engine.port = free_loopback_port()
    lines: list[str] = []
    stop = asyncio.Event()
    server = asyncio.create_task(serve_module.serve_app(ServerConfig(port=engine.port), engine, FakeRenderer(),
                                                        announce=lines.append, stop=stop))
    await wait_until(lambda: line_starting(lines, "ready: ") is not None)
    stop.set()
    assert await server == 0
    assert engine.bind_error == errno.EADDRINUSE  # the port was the server's while the engine loaded
    assert lines[0] == f"listening on http://127.0.0.1:{engine.port} (loading the model; /health answers 503 until ready)"


async def test_renderer_factory_is_called_after_the_engine_started():
    engine = FakeEngine()
    seen = []

    def factory(loaded):
        seen.append((loaded.info.name, engine.started))
        return FakeRenderer(max_model_len=loaded.info.max_model_len)

    lines: list[str] = []
    stop = asyncio.Event()
    server = asyncio.create_task(serve_module.serve_app(
        ServerConfig(port=0), engine, renderer_factory=factory, announce=lines.append, stop=stop))
    await wait_until(lambda: line_starting(lines, "ready: ") is not None)
    stop.set()
    assert await server == 0
    assert seen == [("fake-rm", True)]


# --- rmserve serve ----------------------------------------------------------------------------


@pytest.fixture
def captured(monkeypatch):
    calls = []

    def fake_serve(engine_config, server_config, *, announce=print):
        calls.append((engine_config, server_config))
        return 0

    monkeypatch.setattr(serve_module, "serve", fake_serve)
    return calls


def test_cli_serve_builds_both_configs(captured, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ bos_token }}")
    result = CliRunner().invoke(cli_app, [
        "serve", "some/model", "--engine", "hf", "--dtype", "float32", "--max-model-len", "512",
        "--block-size", "32", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "2",
        "--chat-template", str(template), "--served-model-name", "rm", "--enforce-eager",
        "--host", "0.0.0.0", "--insecure-no-auth", "--port", "9001", "--max-body-bytes", "4096",
        "--max-inflight-groups", "8",
    ])
    assert result.exit_code == 0, result.output
    assert captured == [(
        EngineConfig(model="some/model", engine="hf", dtype="float32", max_model_len=512, block_size=32,
                     gpu_memory_utilization=0.5, tensor_parallel_size=2, chat_template=template,
                     served_model_name="rm", enforce_eager=True),
        ServerConfig(host="0.0.0.0", port=9001, max_body_bytes=4096, max_inflight_groups=8, served_model_name="rm",
                     insecure_no_auth=True),
    )]


def test_cli_serve_defaults(captured):
    result = CliRunner().invoke(cli_app, ["serve", "m"])
    assert result.exit_code == 0, result.output
    engine_config, server_config = captured[0]
    assert engine_config == EngineConfig(model="m")
    assert server_config == ServerConfig()
    assert (server_config.host, server_config.port, server_config.max_body_bytes) == (
        "127.0.0.1", 8000, DEFAULT_MAX_BODY_BYTES,
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--port", "70000"], "port"),
        (["--engine", "tgi"], "'tgi' is not one of 'vllm', 'hf'"),
        (["--block-size", "24"], "Invalid value for '--block-size': 24 must be a power of 2 between 8 and 256"),
        (["--max-body-bytes", "10"], "Invalid value for '--max-body-bytes': 10; it must be at least 1024"),
    ],
)
def test_cli_serve_rejects_bad_values(captured, args, fragment):
    result = CliRunner().invoke(cli_app, ["serve", "m", *args])
    assert result.exit_code == 2
    assert fragment in result.output
    assert captured == []


def test_cli_serve_exit_code_follows_serve(monkeypatch):
    monkeypatch.setattr(serve_module, "serve", lambda e, s, *, announce=print: 1)
    assert CliRunner().invoke(cli_app, ["serve", "m"]).exit_code == 1


def test_cli_serve_swap_options(captured, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("  tok-123\n")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("RMSERVE_ADMIN_TOKEN", "from-env")
    args = ["serve", "m", "--checkpoint-root", str(a), "--checkpoint-root", str(b), "--wait-swap-s", "2.5",
            "--wait-drain-s", "42"]
    result = CliRunner().invoke(cli_app, [*args, "--admin-token-file", str(token_file)])
    assert result.exit_code == 0, result.output
    assert captured[-1][1] == ServerConfig(admin_token="tok-123", checkpoint_roots=(str(a), str(b)), swap_wait_s=2.5,
                                           swap_drain_timeout_s=42.0)
    result = CliRunner().invoke(cli_app, args)  # no file: the environment variable
    assert result.exit_code == 0, result.output
    assert captured[-1][1].admin_token == "from-env"
    monkeypatch.delenv("RMSERVE_ADMIN_TOKEN")
    token_file.write_text("\n")
    result = CliRunner().invoke(cli_app, [*args, "--admin-token-file", str(token_file)])
    assert result.exit_code == 2 and "is empty" in result.output


class _ShutdownFails(FakeEngine):
    async def shutdown(self) -> None:
        await super().shutdown()
        raise RuntimeError("the engine process did not exit")


@pytest.mark.parametrize("engine_class", [FakeEngine, _ShutdownFails])
async def test_a_clean_stop_logs_one_clean_line_and_a_failed_shutdown_an_error(engine_class, caplog):
    engine = engine_class()
    lines: list[str] = []
    stop = asyncio.Event()
    caplog.set_level("INFO", logger="rmserve.server")
    server = asyncio.create_task(serve_module.serve_app(ServerConfig(port=0), engine, FakeRenderer(),
                                                        announce=lines.append, stop=stop))
    await wait_until(lambda: line_starting(lines, "ready: ") is not None)
    stop.set()
    code = await server
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "rmserve.server"]
    clean = [m for level, m in messages if m.startswith("server stopped cleanly after ")]
    if engine_class is FakeEngine:
        assert code == 0
        assert len(clean) == 1 and clean[0].endswith(" s)"), messages
        assert not [m for level, m in messages if level == "ERROR"]
    else:
        assert code == 1
        assert clean == []
        assert ("ERROR", "engine shutdown failed") in messages
        assert any(level == "ERROR" and "did not shut down cleanly" in m for level, m in messages), messages
