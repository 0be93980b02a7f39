"""``rmserve sweep`` end to end on real engines: three demo checkpoints (same architecture,
different weight seeds) swapped into running `rmserve serve` processes, scored on real
RM-Bench groups, with the client killed, the server killed, and two servers at once.

The reference for every reward is a plain transformers forward pass of each checkpoint on
the server's own renderer's token ids (float32; vLLM's kernels differ by ~1e-7, two seeds by
~1e-1, so a prefix cache that kept the previous checkpoint's states would show). The data is
the first groups of each domain of the shared RM-Bench files (a subset keeps this under a few
minutes on 2 cores; the full 798-group sweep is measured by hand, see the README).

All tests start real engines (marked slow; they run in CI).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.sweep_inputs import demo_checkpoints, rmbench_subset, write_token

from rmserve.schema import ModelList, ScoreRecord

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
MAX_MODEL_LEN = 4096
SERVE_OPTIONS = [
    "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--block-size", "32",
    "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager",
]
STEPS = (100, 200, 300)
GROUPS_PER_DOMAIN = 6
DOMAINS = ("chat", "code", "safety-refuse", "safety-response")
N_GROUPS = GROUPS_PER_DOMAIN * len(DOMAINS)
TOKEN = "sweep-e2e-token"


@pytest.fixture(scope="module")
def sweep_env(tmp_path_factory, demo_model_dir, rmbench_dir):
    """(checkpoint root, checkpoint folders, data folder, token file, rewards reference)."""
    from rmserve.demo_model import DemoModelConfig
    from rmserve.fingerprint import TOKENIZER_FILES

    base = tmp_path_factory.mktemp("sweep")
    root = base / "run"
    configs = [DemoModelConfig(seed=seed, max_len=MAX_MODEL_LEN) for seed in range(1, len(STEPS) + 1)]
    folders = demo_checkpoints(root, rmbench_dir, STEPS, configs)
    for folder in folders:
        for name in TOKENIZER_FILES:  # one tokenizer for the whole run, as in real training
            if (demo_model_dir / name).is_file():
                shutil.copyfile(demo_model_dir / name, folder / name)
    data = rmbench_subset(rmbench_dir, base / "rm-bench", DOMAINS, GROUPS_PER_DOMAIN)
    token = write_token(base / "token", TOKEN)
    return root, folders, data, token, _reference(folders, data)


def _reference(folders, data) -> dict[tuple[int, str], list[float]]:
    """(step, group key) → rewards of a transformers forward pass, one sequence at a time."""
    import torch
    from rmserve.server.render.chat import Renderer
    from transformers import AutoModelForSequenceClassification

    from rmserve.datasets import load_rmbench

    groups = load_rmbench(data).groups
    renderer = Renderer.from_pretrained(str(folders[0]), max_model_len=MAX_MODEL_LEN)
    ids = {str(g.key): renderer.render_group(g.messages, g.responses, group_id=g.id).token_ids for g in groups}
    out = {}
    for step, folder in zip(STEPS, folders, strict=True):
        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            for key, seqs in ids.items():
                out[(step, key)] = [model(torch.tensor([list(s)])).logits[0, 0].item() for s in seqs]
    return out


def _server(model: Path, root: Path, token_file: Path, log: Path, *, port: int | None = None, cpu: int | None = None):
    port = port or free_loopback_port()
    argv = [*RMSERVE, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *SERVE_OPTIONS,
            "--admin-token-file", str(token_file), "--checkpoint-root", str(root)]
    if cpu is not None:  # one core for the whole server, one engine thread on it
        argv = ["taskset", "-c", str(cpu), *argv, "--cpu-threads-bind", str(cpu)]
    return ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=600, stop_grace_s=30)


def _sweep_cmd(urls, env, out: Path, store: Path, *extra: str) -> list[str]:
    root, _, data, token_file, _ = env
    servers = [a for url in urls for a in ("--server", url)]
    return [*RMSERVE, "sweep", *servers, "--checkpoints", str(root / "step-*"), "--bench", "rm-bench",
            "--data", str(data), "--out", str(out), "--store", str(store), "--admin-token-file", str(token_file),
            "--resamples", "200", "--quiet", *extra]


def _run_sweep(urls, env, out, store, *extra) -> subprocess.CompletedProcess:
    res = subprocess.run(_sweep_cmd(urls, env, out, store, *extra), capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def _metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``, from /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _wait_for_scored(url: str, n_groups: int, client: subprocess.Popen) -> None:
    """Return once the server at ``url`` has scored ``n_groups`` groups (its own counter, polled
    every 10 ms); fails if the sweep ``client`` ends first or 15 minutes pass."""
    deadline = time.monotonic() + 900
    while _metric(url, "rmserve_groups_total") < n_groups:
        assert client.poll() is None, client.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _swap_count(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        return msgspec.json.decode(resp.read(), type=ModelList).models[0].swap_count


def _stored_rows(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
            return db.execute("SELECT count(*) FROM scores").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _exports(out: Path) -> dict[tuple[int, str], list[float]]:
    rewards = {}
    for step in STEPS:
        path = out / "checkpoints" / f"step-{step}" / "rm-bench.scores.jsonl"
        records = [msgspec.json.decode(line, type=ScoreRecord) for line in path.read_bytes().splitlines() if line]
        assert len(records) == len({r.key for r in records}) == N_GROUPS
        rewards.update({(step, str(r.key)): list(r.rewards) for r in records})
    return rewards


def _assert_close(got, expected, atol: float) -> None:
    assert got.keys() == expected.keys()
    worst = max(abs(a - b) for k in got for a, b in zip(got[k], expected[k], strict=True))
    assert worst < atol, f"largest reward difference {worst:.3g} ≥ {atol}"


def _figures(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))


@pytest.fixture(scope="module")
def uninterrupted(sweep_env, tmp_path_factory):
    """One uninterrupted one-server sweep, then the same command again; returns (out, server counters)."""
    root, folders, _, token_file, _ = sweep_env
    base = tmp_path_factory.mktemp("sweep-one")
    with _server(folders[0], root, token_file, base / "server.log") as server:
        server.wait_ready()
        _run_sweep([server.url], sweep_env, base / "out", base / "store.sqlite")
        first = {
            "groups": _metric(server.url, "rmserve_groups_total"),
            "requests": _metric(server.url, "rmserve_requests_total", endpoint="/v1/score", status="200"),
            "swaps": _swap_count(server.url),
        }
        rerun = _run_sweep([server.url], sweep_env, base / "out-again", base / "store.sqlite")
        second = {
            "groups": _metric(server.url, "rmserve_groups_total"),
            "requests": _metric(server.url, "rmserve_requests_total", endpoint="/v1/score", status="200"),
            "swaps": _swap_count(server.url),
        }
    return base, first, second, rerun


def test_sweep_rewards_equal_each_checkpoint_alone_and_rerun_is_answered_from_the_store(sweep_env, uninterrupted):
    base, first, second, rerun = uninterrupted
    _assert_close(_exports(base / "out"), sweep_env[4], atol=1e-4)
    assert first == {"groups": 3 * N_GROUPS, "requests": 3 * N_GROUPS, "swaps": 3}
    assert second == first  # no scoring request, no checkpoint load
    again = json.loads((base / "out-again" / "sweep.json").read_text())
    assert (again["groups_scored"], again["groups_from_store"]) == (0, 3 * N_GROUPS)
    assert _figures(base / "out-again") == _figures(base / "out")
    rows = _figures(base / "out")
    assert [r["step"] for r in rows] == [str(s) for s in STEPS]
    summary = (base / "out" / "summary.md").read_text()
    assert "Best checkpoint: **step-" in summary and "Paired bootstrap" in summary


def test_client_killed_mid_sweep_resumes_without_scoring_a_group_twice(sweep_env, uninterrupted, tmp_path):
    root, folders, _, token_file, _ = sweep_env
    store = tmp_path / "store.sqlite"
    with _server(folders[0], root, token_file, tmp_path / "server.log") as server:
        server.wait_ready()
        client = subprocess.Popen(_sweep_cmd([server.url], sweep_env, tmp_path / "out", store, "--max-inflight-groups", "1"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        # The kill must land inside the second checkpoint. The store commits about once a second
        # and a quiet machine scores the last two checkpoints within one commit, so the stored rows
        # cannot tell where the sweep is. The server's counter can: once it has scored two groups
        # of the second checkpoint (one group in flight, so the client holds the first of them),
        # the server is stopped, the client's store gets time to commit what it holds, and only
        # then is the client killed.
        _wait_for_scored(server.url, N_GROUPS + 2, client)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            time.sleep(3)  # > the store's 1 s flush interval
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        client.stderr.close()
        killed_at = _stored_rows(store)
        assert N_GROUPS < killed_at < 3 * N_GROUPS
        _run_sweep([server.url], sweep_env, tmp_path / "out", store, "--max-inflight-groups", "4")
        # Every group reached the engine exactly once: groups the killed client had in flight
        # (answered by the server, never stored) were answered again from the result cache.
        assert _metric(server.url, "rmserve_groups_total") == 3 * N_GROUPS
    assert _stored_rows(store) == 3 * N_GROUPS
    _assert_close(_exports(tmp_path / "out"), _exports(uninterrupted[0] / "out"), atol=1e-5)
    assert [r["rm-bench:overall.score"] for r in _figures(tmp_path / "out")] == [
        r["rm-bench:overall.score"] for r in _figures(uninterrupted[0] / "out")]


def test_server_killed_mid_sweep_client_waits_and_finishes(sweep_env, uninterrupted, tmp_path):
    root, folders, _, token_file, _ = sweep_env
    store = tmp_path / "store.sqlite"
    port = free_loopback_port()
    first = _server(folders[0], root, token_file, tmp_path / "server-1.log", port=port)
    with first:
        first.wait_ready()
        client = subprocess.Popen(
            _sweep_cmd([first.url], sweep_env, tmp_path / "out", store, "--max-inflight-groups", "1", "--wait-ready-s", "900"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )
        _wait_for_scored(first.url, N_GROUPS + 1, client)  # inside the second checkpoint (see above)
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
    time.sleep(2)
    assert client.poll() is None, "the client must wait for the server, not give up"
    with _server(folders[0], root, token_file, tmp_path / "server-2.log", port=port) as second:
        second.wait_ready()
        _, stderr = client.communicate(timeout=1200)
        assert client.returncode == 0, stderr[-4000:]
        assert _swap_count(second.url) >= 1  # the restarted server was loaded with the current checkpoint again
    assert _stored_rows(store) == 3 * N_GROUPS
    _assert_close(_exports(tmp_path / "out"), _exports(uninterrupted[0] / "out"), atol=1e-5)


def test_two_pinned_servers_share_the_groups_fairly(sweep_env, uninterrupted, tmp_path):
    if len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None:
        pytest.fail("this test needs two CPUs and taskset")
    root, folders, _, token_file, _ = sweep_env
    a = _server(folders[0], root, token_file, tmp_path / "a.log", cpu=0)
    b = _server(folders[0], root, token_file, tmp_path / "b.log", cpu=1)
    with a, b:
        a.wait_ready()
        b.wait_ready()
        _run_sweep([a.url, b.url], sweep_env, tmp_path / "out", tmp_path / "store.sqlite", "--max-inflight-groups", "4")
        counts = [_metric(s.url, "rmserve_groups_total") for s in (a, b)]
    assert sum(counts) == 3 * N_GROUPS
    assert min(counts) >= 0.3 * 3 * N_GROUPS, counts
    _assert_close(_exports(tmp_path / "out"), _exports(uninterrupted[0] / "out"), atol=1e-5)
    per_server = json.loads((tmp_path / "out" / "sweep.json").read_text())["groups_scored_per_server"]
    assert sorted(per_server.values()) == sorted(counts)
