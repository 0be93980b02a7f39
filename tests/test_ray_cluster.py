"""rmserve on a real two-node Ray cluster on this machine: ``cluster up|status|down``,
``eval --ray``, and a ``sweep --ray`` that loses a node mid-sweep.

The cluster is Ray's own multi-node cluster on one host (``ray.cluster_utils.Cluster``: a head
and a second raylet, each declaring one logical GPU), so placement is Ray's: one replica per
node. Each replica serves the demo RM on vLLM's CPU build, pinned to its own core, on
127.0.0.1. The rewards are checked against a transformers forward pass of each checkpoint
(``test_sweep_end_to_end._reference``) and the sweep's figures against a one-server sweep of
the same checkpoints. Ray's processes are stopped by the cluster object at the end (it holds
their ids); nothing else on the machine is touched.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import pytest
from test_sweep_end_to_end import (  # noqa: F401 - sweep_env is a fixture
    N_GROUPS,
    SERVE_OPTIONS,
    STEPS,
    _assert_close,
    _exports,
    _figures,
    _metric,
    sweep_env,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
NAME = "rmtest"


@pytest.fixture(scope="module")
def two_nodes():
    """(cluster, worker node): a head and one more node, one CPU and one logical GPU each.

    Ray comes with the [ray] extra, which the engine venv of scripts/test.sh installs: without
    it this fails (it is not skipped)."""
    from ray.cluster_utils import Cluster

    # Ray's memory monitor kills workers once the machine's memory (every process's, not only
    # Ray's) passes 95 %: on a shared test machine that would be another job's doing. Off here.
    saved = os.environ.get("RAY_memory_monitor_refresh_ms")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    worker = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_memory_monitor_refresh_ms", None)
        else:
            os.environ["RAY_memory_monitor_refresh_ms"] = saved


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    res = subprocess.run([*RMSERVE, *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"rmserve {' '.join(args)}:\n{res.stderr[-4000:]}"
    return res


def _status(address: str) -> list[dict]:
    return json.loads(_cli("cluster", "status", NAME, "--ray", address, "--json").stdout)


def _fingerprint(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as reply:
        return json.loads(reply.read())["models"][0]["fingerprint"]


def _answered(url: str) -> float:
    """Groups a server answered: by its engine or from its result cache."""
    return _metric(url, "rmserve_groups_total") + _metric(url, "rmserve_result_cache_hits_total")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_replicas_on_two_nodes_eval_and_a_sweep_that_loses_a_node(sweep_env, two_nodes, tmp_path):  # noqa: F811
    cluster, worker = two_nodes
    address = cluster.address
    root, folders, data, token_file, reference = sweep_env
    serve_args = shlex.join([*SERVE_OPTIONS, "--admin-token-file", str(token_file), "--checkpoint-root", str(root)])

    # cluster up: two replicas of the first checkpoint, one per node (each node has one GPU).
    _cli("cluster", "up", NAME, str(folders[0]), "--ray", address, "--replicas", "2", "--gpus-per-replica", "1",
         "--host", "127.0.0.1", "--pin-cpus", "--serve-args", serve_args, "--log-dir", str(tmp_path / "logs"))
    rows = _status(address)
    assert [r["index"] for r in rows] == [0, 1]
    assert {r["node_id"] for r in rows} == {cluster.head_node.node_id, worker.node_id}
    assert all(r["state"] == "ready" and r["gpu_ids"] == ["0"] and r["fingerprint"] for r in rows)
    assert rows[0]["fingerprint"] == rows[1]["fingerprint"]
    lost, kept = sorted(rows, key=lambda r: r["node_id"] != worker.node_id)  # lost: the one on the worker node

    # A replica Ray cannot place (both GPUs taken) and one whose server refuses its model are
    # reported, each in one line (the refusal with its reason), and left out; the command fails.
    broken = tmp_path / "broken-model"
    broken.mkdir()
    res = subprocess.run([*RMSERVE, "cluster", "up", "extra", str(folders[0]), "--ray", address,
                          "--wait-placement-s", "5", "--host", "127.0.0.1"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "replica extra/0: Ray could not place it within 5 s (no node has 1 CPU and 1 GPU free" in res.stderr
    res = subprocess.run([*RMSERVE, "cluster", "up", "refused", str(broken), "--ray", address, "--gpus-per-replica",
                          "0", "--cpus-per-replica", "0", "--host", "127.0.0.1", "--log-dir", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1
    assert re.search(r"replica refused/0 on \S+ did not start: the server refused to start", res.stderr), res.stderr
    assert "config.json" in res.stderr  # the reason, from the server's log
    assert [r["name"] for r in json.loads(_cli("cluster", "status", "--ray", address, "--json").stdout)] == [NAME] * 2

    # eval --ray --cluster: the groups spread over both replicas; rewards of the first checkpoint.
    res = _cli("eval", "--ray", address, "--cluster", NAME, "--bench", "rm-bench", "--data", str(data),
               "--out", str(tmp_path / "eval"), "--resamples", "50", "--quiet")
    shares = [_metric(r["url"], "rmserve_groups_total") for r in rows]
    assert sum(shares) == N_GROUPS and min(shares) >= 1, shares
    assert "groups scored per server" in res.stderr
    from rmserve.client.score_file import read_scores

    got = {str(r.key): list(r.rewards) for r in read_scores(tmp_path / "eval" / "scores.jsonl").records}
    want = {k: v for (step, k), v in reference.items() if step == STEPS[0]}
    _assert_close(got, want, atol=1e-4)

    # sweep --ray --cluster; the worker node is removed once its replica has scored a group (one
    # group in flight per replica, so the replica is mid-checkpoint when its node goes).
    before = {r["url"]: _answered(r["url"]) for r in rows}
    store = tmp_path / "store.sqlite"
    sweep = subprocess.Popen(
        [*RMSERVE, "sweep", "--ray", address, "--cluster", NAME, "--checkpoints", str(root / "step-*"),
         "--bench", "rm-bench", "--data", str(data), "--out", str(tmp_path / "out"), "--store", str(store),
         "--admin-token-file", str(token_file), "--resamples", "200", "--quiet", "--max-inflight-groups", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 900
    while _answered(lost["url"]) < before[lost["url"]] + 1:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cluster.remove_node(worker, allow_graceful=False)
    out, err = sweep.communicate(timeout=1200)
    assert sweep.returncode == 0, err[-4000:]
    # The set is left as the sweep found it: the survivor serves the first checkpoint again
    # (loaded back, unless the checkpoint it scored last was that one).
    assert _fingerprint(kept["url"]) == kept["fingerprint"], err[-3000:]
    document = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert document["spread"] == "checkpoints" and document["scoring_wall_s"] > 0
    (sentence,) = document["servers_lost"]
    assert sentence.startswith(f"{lost['url']} was lost during step-")
    per_server = document["groups_scored_per_server"]
    assert sum(per_server.values()) == 3 * N_GROUPS  # every group once
    # The survivor's own counters: it answered exactly what the sweep stored from it, no group
    # twice (the groups of the first checkpoint it scored in the eval above come from its result
    # cache, the others from its engine).
    assert _answered(kept["url"]) - before[kept["url"]] == per_server[kept["url"]]
    assert per_server[lost["url"]] >= 1
    _assert_close(_exports(tmp_path / "out"), {k: v for k, v in reference.items()}, atol=1e-4)
    # The lost replica's server stopped with its actor, and its engine's processes with it (they
    # share the server's process group, whose id is the server's pid: group reaper).
    deadline = time.monotonic() + 120
    while _group_alive(lost["pid"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(lost["pid"])

    # The same checkpoints swept on one server (the survivor): the same figures.
    _cli("sweep", "--server", kept["url"], "--checkpoints", str(root / "step-*"), "--bench", "rm-bench",
         "--data", str(data), "--out", str(tmp_path / "one"), "--store", str(tmp_path / "one.sqlite"),
         "--admin-token-file", str(token_file), "--resamples", "200", "--quiet")
    assert _figures(tmp_path / "out") == _figures(tmp_path / "one")

    # cluster down: the survivor's server stops and no replica is left.
    _cli("cluster", "down", NAME, "--ray", address)
    deadline = time.monotonic() + 60
    while _group_alive(kept["pid"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_alive(kept["pid"])
    res = subprocess.run([*RMSERVE, "cluster", "status", NAME, "--ray", address], capture_output=True, text=True)
    assert res.returncode != 0 and f"no replica set named '{NAME}'" in res.stderr


def test_a_ray_address_where_nothing_listens_fails_in_seconds():
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    res = subprocess.run([*RMSERVE, "cluster", "status", "--ray", f"127.0.0.1:{port}"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and time.monotonic() - started < 60
    assert f"cannot join the Ray cluster at '127.0.0.1:{port}': nothing answers there" in res.stderr
