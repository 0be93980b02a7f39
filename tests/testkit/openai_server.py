"""vLLM's own OpenAI-compatible API server in a child process, for tests of remote judges.

:func:`vllm_openai_server` starts ``python -m vllm.entrypoints.openai.api_server`` (the
``vllm`` console script of the CPU build does not run, the module does) over a local model
folder, waits until ``GET /v1/models`` answers, yields the base URL (``http://127.0.0.1:PORT/v1``)
and stops the server and every process it started (its engine core) on leaving.

CPU-build settings used (the ones rmserve's own engine uses, see ``rmserve.server.engines.vllm_engine``):
block size 32 (the CPU attention needs a multiple of 32), eager mode, float32,
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; 1 unless the caller's environment sets it) and
the CPU thread binding to every CPU of this process (``VLLM_CPU_OMP_THREADS_BIND``) unless set.
``--enable-prompt-tokens-details`` makes the server report
``usage.prompt_tokens_details.cached_tokens`` (prefix-cache hits), which it omits by default.
Start time: about 25–30 s on 2 idle cores, over 150 s when the machine is busy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from testkit.processes import exited, wait_exited

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""The module run as the server (``python -m``)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_argv(model_dir: Path, port: int, *, served_model_name: str, max_model_len: int, max_num_seqs: int = 32,
                extra: Sequence[str] = ()) -> list[str]:
    """The command line of the API server (this interpreter, the module, the CPU-build flags)."""
    return [
        sys.executable, "-m", SERVER_MODULE,
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(max_model_len),
        "--dtype", "float32",
        "--block-size", "32",
        "--enforce-eager",
        "--enable-prefix-caching",
        "--max-num-seqs", str(max_num_seqs),
        "--disable-uvicorn-access-log",
        "--enable-prompt-tokens-details",
        *extra,
    ]


def _group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (Linux ``/proc``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _models_ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def vllm_openai_server(
    model_dir: Path,
    *,
    served_model_name: str = "judge",
    max_model_len: int = 4096,
    max_num_seqs: int = 32,
    start_timeout_s: float = 420.0,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
) -> Iterator[str]:
    """Run vLLM's API server over ``model_dir``; yield its base URL ending in ``/v1``.

    ``max_model_len`` and ``max_num_seqs`` go to the server as its flags; ``extra_args`` are
    appended to its command line.

    The server runs in its own session (process group); on leaving, SIGTERM goes to the group,
    then SIGKILL after 30 s, and the context asserts that no process of the group is left.
    The server's output goes to ``log_path`` (kept), or without one to a temporary log; the
    log's last 4,000 characters are in the error when it fails to start.

    After the start, ``vllm_openai_server.last_start_s`` holds the seconds it took (from spawn
    to the first ``/v1/models`` answer) and ``vllm_openai_server.last_pid`` the server's process id.

    Raises:
        RuntimeError: the server exited or did not answer within ``start_timeout_s`` seconds.
    """
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not env.get("VLLM_CPU_OMP_THREADS_BIND"):
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    argv = server_argv(model_dir, port, served_model_name=served_model_name, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, extra=extra_args)
    with contextlib.ExitStack() as scratch:
        if log_path is None:
            log_path = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="vllm-api-"))) / "server.log"
        with open(log_path, "wb") as log:
            began = time.monotonic()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while not _models_ready(base_url):
                if proc.poll() is not None or time.monotonic() - began > start_timeout_s:
                    tail = log_path.read_text(errors="replace")[-4000:]
                    why = f"exited with {proc.returncode}" if proc.poll() is not None else f"did not answer in {start_timeout_s:.0f} s"
                    raise RuntimeError(f"vLLM API server {' '.join(argv)} {why}; log tail:\n{tail}")
                time.sleep(0.5)
            vllm_openai_server.last_start_s = time.monotonic() - began
            vllm_openai_server.last_pid = proc.pid
            yield base_url
        finally:
            _stop_group(proc)


vllm_openai_server.last_start_s = None
vllm_openai_server.last_pid = None


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after 30 s, reap the server
    and assert that the group is gone."""
    pgid = proc.pid
    members = _group_pids(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for pid in members:
        wait_exited(pid, 10)
    left = _group_pids(pgid)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in members:
        wait_exited(pid, 10)
    still = [pid for pid in members if not exited(pid)]
    assert not still, f"vLLM API server processes {still} outlived the stop"
    assert not left, f"vLLM API server processes {left} needed SIGKILL after SIGTERM and 30 s"
