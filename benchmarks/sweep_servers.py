"""Checkpoint sweep on one server vs two: wall time, groups per server, identical results.

Each server is a `rmserve serve` process pinned to its own CPU (``taskset -c N`` for the
whole process tree and ``--cpu-threads-bind N``: one engine thread), so one server and two
servers get the same per-server compute. For each server count the script starts the servers
on the first checkpoint, runs ``rmserve sweep`` with a fresh score store (engine start not
timed; checkpoint loads and scoring are), reads each server's ``rmserve_groups_total`` and
checks that every checkpoint's rewards equal the one-server sweep's within ``--atol``.

Writes ``benchmarks/results/sweep-servers-<date>-<machine>.json`` and ``.md``.

    python benchmarks/sweep_servers.py --checkpoints 'ckpts/step-*' --data ../shared/data/rm-bench
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
import urllib.request
from pathlib import Path

import msgspec

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from throughput import machine_info, versions  # noqa: E402 - benchmarks share helpers by path

from rmserve.cli_common import engine_argv  # noqa: E402
from rmserve.pipelines.launch import ServerProcess, free_loopback_port  # noqa: E402
from rmserve.schema import ScoreRecord  # noqa: E402

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
SERVE_ENGINE_OPTIONS = {"dtype": "float32", "block_size": 32, "kv_cache_memory_bytes": 1 << 30}
"""Engine options of every server (``rmserve serve`` flags via :func:`rmserve.cli_common.engine_argv`)."""
TOKEN = "benchmark-token"


def groups_total(url: str) -> float:
    """``rmserve_groups_total`` of a server (groups its engine scored)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("rmserve_groups_total "):
                return float(line.split()[1])
    return 0.0


def exported_rewards(out: Path) -> dict[tuple[str, str], list[float]]:
    """(checkpoint, group key) → rewards, from the sweep's per-checkpoint exports."""
    rewards = {}
    for path in sorted(out.glob("checkpoints/*/*.scores.jsonl")):
        for line in path.read_bytes().splitlines():
            if line:
                record = msgspec.json.decode(line, type=ScoreRecord)
                rewards[(path.parent.name, str(record.key))] = list(record.rewards)
    return rewards


def run_sweep(n_servers: int, args: argparse.Namespace, folders: list[Path], work: Path) -> dict:
    """Start ``n_servers`` pinned servers, sweep, stop them; return timings and counts."""
    root = Path(os.path.commonpath([str(f.resolve().parent) for f in folders]))
    token_file = work / "token"
    token_file.write_text(TOKEN)
    servers = []
    for cpu in range(n_servers):
        port = free_loopback_port()
        argv = ["taskset", "-c", str(cpu), *RMSERVE, "serve", str(folders[0]), "--host", "127.0.0.1",
                "--port", str(port), *engine_argv({**SERVE_ENGINE_OPTIONS, "cpu_threads_bind": str(cpu)}),
                "--admin-token-file", str(token_file), "--checkpoint-root", str(root)]
        servers.append(ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=work / f"server-{n_servers}-{cpu}.log",
                                     startup_timeout_s=1800, stop_grace_s=30))
    out = work / f"out-{n_servers}"
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        command = [*RMSERVE, "sweep", *[a for s in servers for a in ("--server", s.url)],
                   *[str(f) for f in folders], "--bench", "rm-bench", "--data", args.data, "--out", str(out),
                   "--store", str(work / f"store-{n_servers}.sqlite"), "--admin-token-file", str(token_file),
                   "--max-inflight-groups", str(args.max_inflight_groups), "--resamples", "100", "--quiet"]
        if args.only:
            command += ["--only", args.only]
        started = time.perf_counter()
        subprocess.run(command, check=True, timeout=24 * 3600)
        wall_s = time.perf_counter() - started
        counts = {s.url: groups_total(s.url) for s in servers}
    finally:
        for server in servers:
            server.stop()
    return {"servers": n_servers, "wall_s": wall_s, "groups_per_server": list(counts.values()), "out": out}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options (``argv``: the command line after the script; None = ``sys.argv``).
    ``--max-inflight-groups`` is spelled as on ``rmserve sweep``, which it is passed to."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", required=True, help="glob of checkpoint folders (same architecture)")
    parser.add_argument("--data", default=str(REPO_ROOT.parent / "shared" / "data" / "rm-bench"))
    parser.add_argument("--only", default=None, help="one RM-Bench domain (default: all)")
    parser.add_argument("--max-inflight-groups", type=int, default=8,
                        help="groups outstanding per server, passed to rmserve sweep (default 8)")
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--machine", default=f"cpu{len(os.sched_getaffinity(0))}")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    folders = sorted(Path(p) for p in glob.glob(args.checkpoints) if Path(p).is_dir())
    if not folders:
        raise SystemExit(f"--checkpoints {args.checkpoints!r} matches no folder")
    with tempfile.TemporaryDirectory(prefix="rmserve-sweep-servers-") as tmp:
        work = Path(tmp)
        one = run_sweep(1, args, folders, work)
        two = run_sweep(2, args, folders, work)
        a, b = exported_rewards(one.pop("out")), exported_rewards(two.pop("out"))
    if a.keys() != b.keys():
        raise SystemExit("the one-server and two-server sweeps stored different groups")
    worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))
    total = int(sum(two["groups_per_server"]))
    report = {
        "benchmark": "sweep_servers",
        "date": dt.date.today().isoformat(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "checkpoints": [str(f) for f in folders],
        "groups_scored": total,
        "one_server": one,
        "two_servers": two,
        "speedup": one["wall_s"] / two["wall_s"],
        "smallest_share": min(two["groups_per_server"]) / total if total else None,
        "max_reward_difference": worst,
        "results_equal": worst <= args.atol,
        "machine": machine_info(),
        "versions": versions(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"sweep-servers-{report['date']}-{args.machine}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Sweep on one vs two servers ({report['date']}, {args.machine})",
        "",
        f"{len(folders)} checkpoints, {total} groups scored per sweep; each server pinned to one CPU with one engine thread.",
        "",
        "| servers | wall time (s) | groups per server |",
        "|---:|---:|---|",
        f"| 1 | {one['wall_s']:.1f} | {', '.join(f'{g:.0f}' for g in one['groups_per_server'])} |",
        f"| 2 | {two['wall_s']:.1f} | {', '.join(f'{g:.0f}' for g in two['groups_per_server'])} |",
        "",
        f"Speed-up {report['speedup']:.2f}×; smallest share {100 * report['smallest_share']:.1f} %; largest reward "
        f"difference between the two sweeps {worst:.2g} ({'equal' if report['results_equal'] else 'NOT equal'} within {args.atol:g}).",
        "",
        f"Command: `{report['command']}`",
    ]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    if not report["results_equal"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
