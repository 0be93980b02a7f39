"""A real ``rmserve serve`` as a subprocess on the demo model: the CPU Docker image's exact
command line serves and stops cleanly on SIGTERM, and an engine that dies while serving is
still reported loudly.

Both tests start a real vLLM engine (marked slow; they run in CI).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.dockerfiles import DOCKER_DIR, image_command
from testkit.processes import wait_exited

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]



def _group() -> dict:
    """A request with one group never sent before (the server answers a repeated group from its result cache)."""
    return {"groups": [{"id": "g", "prompt": f"[{uuid.uuid4().hex}] What is a reward model?",
                        "responses": ["A scorer.", "A fish."]}]}

EAGER_SMALL = ["--dtype", "float32", "--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
               "--enforce-eager"]
CLEAN_LINE = "INFO rmserve.server: server stopped cleanly after "


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _rmserve() -> str:
    """This environment's ``rmserve`` console script (the image's ``rmserve`` on its PATH)."""
    script = Path(sys.executable).parent / "rmserve"
    assert script.exists(), f"no rmserve console script next to {sys.executable}; pip install -e ."
    return str(script)


def _children(pid: int) -> dict[int, str]:
    """pid → command line of the live processes whose parent is ``pid`` (Linux /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out[int(entry.name)] = cmdline
    return out


def test_cpu_image_command_serves_the_demo_model_and_stops_cleanly(demo_model_dir, tmp_path, monkeypatch):
    """docker/Dockerfile.cpu's ENTRYPOINT, run as ``docker run IMAGE MODEL --host … --port …`` would.

    Outside Docker: the model folder, ``--host 127.0.0.1`` (not 0.0.0.0: a shared machine) and a
    free ``--port`` (the last --port wins, as in ``docker run … --port``) are the only words added
    to the image's command line. The image's ENV applies, except ``VLLM_CPU_KVCACHE_SPACE``,
    which keeps the test environment's (1 GiB) on a shared runner.
    """
    image = image_command(DOCKER_DIR / "Dockerfile.cpu")
    for key, value in image.env.items():
        if key != "VLLM_CPU_KVCACHE_SPACE" or "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            monkeypatch.setenv(key, value)
    port = free_loopback_port()
    argv = image.argv(str(demo_model_dir), "--host", "127.0.0.1", "--port", str(port))
    assert argv[:2] == ["rmserve", "serve"]
    log = tmp_path / "server.log"
    server = ServerProcess([_rmserve(), *argv[1:]], url=f"http://127.0.0.1:{port}", log_path=log,
                           startup_timeout_s=1200, stop_grace_s=60)
    with server:
        server.wait_ready()
        status, reply = _post(f"{server.url}/v1/score", _group())
        assert status == 200, reply
        (result,) = reply["results"]
        assert len(result["rewards"]) == 2 and all(isinstance(r, float) for r in result["rewards"])
        started = time.monotonic()
        code = server.stop()  # SIGTERM to the server process, as `docker stop` sends it
    assert code == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "leaked" not in text, text[-3000:]
    assert "EngineDeadError" not in text, text[-3000:]
    clean = [line for line in text.splitlines() if CLEAN_LINE in line]
    assert len(clean) == 1, text[-3000:]
    assert time.monotonic() - started < 60


def test_an_engine_that_dies_while_serving_is_logged_loudly(demo_model_dir, tmp_path):
    port = free_loopback_port()
    log = tmp_path / "server.log"
    argv = [_rmserve(), "serve", str(demo_model_dir), "--host", "127.0.0.1", "--port", str(port), *EAGER_SMALL]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=900,
                       stop_grace_s=60) as server:
        server.wait_ready()
        assert _post(f"{server.url}/v1/score", _group())[0] == 200  # the output handler runs
        cores = [pid for pid, cmd in _children(server.process.pid).items() if "EngineCore" in cmd]
        assert len(cores) == 1, _children(server.process.pid)
        os.kill(cores[0], signal.SIGKILL)
        assert wait_exited(cores[0], 30)
        deadline = time.monotonic() + 60
        while True:  # vLLM notices the death from a monitor thread; until then a request may hang
            status, reply = _post(f"{server.url}/v1/score", _group())
            if status != 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status >= 500, reply
        code = server.stop()
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "Traceback" in text and "EngineDeadError" in text, text[-3000:]
    assert CLEAN_LINE not in text
    assert "ERROR rmserve.server: server stopped after " in text
    assert "the engine did not shut down cleanly" in text
