"""Checkpoint sweep on a Ray cluster: one replica vs two replicas of the same cluster.

Starts a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and a
second raylet, one CPU and one logical GPU each), then for 1 and 2 replicas: ``rmserve cluster
up`` (each replica pinned to its own core with ``--pin-cpus``; engine start not timed), one
``rmserve sweep --ray ADDRESS --cluster NAME`` over the checkpoints with a fresh score store
(timed: checkpoint loads and scoring), ``rmserve cluster down``. Checks that the two sweeps'
rewards agree within ``--atol`` and reads the groups each replica scored from ``sweep.json``.

Writes ``benchmarks/results/<date>-<machine>-ray-sweep.{json,md}``.

    for s in 1 2 3 4; do rmserve demo-model ckpts/step-${s}000 --corpus ../shared/data/rm-bench --seed $s; done
    python benchmarks/ray_sweep.py --checkpoints 'ckpts/step-*' --data ../shared/data/rm-bench --only chat
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from sweep_servers import exported_rewards  # noqa: E402 - benchmarks share helpers by path
from throughput import machine_info, versions  # noqa: E402

from rmserve.cli_common import engine_argv  # noqa: E402

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
ENGINE_OPTIONS = {"dtype": "float32", "block_size": 32, "kv_cache_memory_bytes": 1 << 30}
"""Engine options of every replica (``rmserve serve`` flags)."""
TOKEN = "benchmark-token"


def cli(*args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([*RMSERVE, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"rmserve {' '.join(args[:3])} … failed:\n{res.stderr[-3000:]}")
    return res


def one_sweep(address: str, n: int, folders: list[Path], args: argparse.Namespace, work: Path) -> dict:
    """Start ``n`` replicas, sweep, stop them; wall time, groups per replica, output folder."""
    root = Path(os.path.commonpath([str(f.parent) for f in folders]))
    token = work / "token"
    token.write_text(TOKEN)
    serve_args = shlex.join([*engine_argv(ENGINE_OPTIONS), "--admin-token-file", str(token),
                             "--checkpoint-root", str(root)])
    name = f"bench{n}"
    started = time.monotonic()
    cli("cluster", "up", name, str(folders[0]), "--ray", address, "--replicas", str(n), "--gpus-per-replica", "1",
        "--host", "127.0.0.1", "--pin-cpus", "--serve-args", serve_args, "--log-dir", str(work / "logs"))
    up_s = time.monotonic() - started
    out = work / f"out-{n}"
    sweep = ["sweep", "--ray", address, "--cluster", name, *[a for f in folders for a in ("--checkpoints", str(f))],
             "--bench", "rm-bench", "--data", args.data, "--out", str(out), "--store", str(work / f"store-{n}.sqlite"),
             "--admin-token-file", str(token), "--resamples", "10", "--quiet"]
    if args.only:
        sweep += ["--only", args.only]
    try:
        started = time.monotonic()
        cli(*sweep)
        wall_s = time.monotonic() - started
    finally:
        cli("cluster", "down", name, "--ray", address)
    document = json.loads((out / "sweep.json").read_text())
    return {"replicas": n, "wall_s": wall_s, "cluster_up_s": up_s,
            "groups_per_replica": document["groups_scored_per_server"], "groups": document["groups_scored"],
            "lost": document["servers_lost"], "out": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", required=True, help="glob of checkpoint folders (step in each name)")
    parser.add_argument("--data", required=True, help="RM-Bench data folder")
    parser.add_argument("--only", default="chat", help="RM-Bench domain(s) to score ('' for all)")
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--tag", default="ray-sweep")
    args = parser.parse_args()
    folders = sorted(Path(p).absolute() for p in glob.glob(args.checkpoints))
    if len(folders) < 2:
        raise SystemExit("--checkpoints: give at least two checkpoint folders")

    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    try:
        with tempfile.TemporaryDirectory(prefix="ray-sweep-") as tmp:
            runs = [one_sweep(cluster.address, n, folders, args, Path(tmp)) for n in (1, 2)]
            one, two = (exported_rewards(r["out"]) for r in runs)
            assert one.keys() == two.keys(), "the two sweeps scored different groups"
            worst = max(abs(a - b) for k in one for a, b in zip(one[k], two[k], strict=True))
    finally:
        cluster.shutdown()
    speedup = runs[0]["wall_s"] / runs[1]["wall_s"]
    for run in runs:
        run.pop("out")
    date = dt.date.today().isoformat()
    result = {
        "benchmark": "ray_sweep", "date": date, "machine": machine_info(), "versions": versions(),
        "checkpoints": [str(f) for f in folders], "data": args.data, "only": args.only,
        "engine_options": ENGINE_OPTIONS, "runs": runs, "speedup": speedup, "max_reward_difference": worst,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }
    stem = REPO_ROOT / "benchmarks" / "results" / f"{date}-cpu{os.cpu_count()}-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Sweep on a Ray cluster: one replica vs two ({date})", "",
        f"`{result['command']}`", "",
        f"{len(folders)} checkpoints, RM-Bench {args.only or 'all domains'}; a two-node Ray cluster on one machine "
        "(one CPU and one logical GPU per node), one replica per node, each pinned to its own core; engine start "
        "not timed. Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".", "",
        "| replicas | sweep wall s | groups scored | groups per replica | cluster up s |",
        "|---:|---:|---:|---|---:|",
    ]
    for run in runs:
        per = ", ".join(str(int(v)) for v in run["groups_per_replica"].values())
        lines.append(f"| {run['replicas']} | {run['wall_s']:.1f} | {run['groups']} | {per} | {run['cluster_up_s']:.0f} |")
    lines += ["", f"Speed-up with two replicas: **{speedup:.2f}×**. Largest reward difference between the two "
              f"sweeps: {worst:.2g} (atol {args.atol:g}).", ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    if worst > args.atol:
        raise SystemExit(f"rewards differ by {worst:.3g} > {args.atol:g}")


if __name__ == "__main__":
    main()
