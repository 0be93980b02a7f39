"""What one client process costs per group: the ceiling of a driver that feeds many replicas.

Serves a fake engine (no model: ``tests/testkit/fakes.py``, rewards computed from token ids)
from a separate process, then runs ``rmserve eval`` against it with a fresh score store, and
reads the eval process's own CPU time (user + system, from ``os.wait4``). CPU ms per group is
what a driver spends on each group's request, reply, record and store row; 1000 / that is the
most groups per second one driver core can take, whatever the replicas behind it.

    python benchmarks/driver_overhead.py --data ../shared/data/rm-bench
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from throughput import machine_info, versions  # noqa: E402 - benchmarks share helpers by path

SERVER = """
import sys, time
sys.path.insert(0, {testkit!r})
from testkit import fakes
from testkit.servers import ThreadedServer
from rmserve.server.http.app import ServerConfig, create_app
with ThreadedServer(lambda: create_app(ServerConfig(port=0, result_cache_groups=0), fakes.FakeEngine(),
                                       fakes.FakeRenderer(max_model_len=1_000_000))) as server:
    print(server.url, flush=True)
    while True:
        time.sleep(3600)
"""


def one_eval(url: str, args: argparse.Namespace, only: str | None) -> dict:
    """One ``rmserve eval`` on its own core with a fresh store: groups, wall s, its CPU s."""
    with tempfile.TemporaryDirectory(prefix="driver-") as tmp:
        argv = ["taskset", "-c", "0", sys.executable, "-m", "rmserve.cli", "eval", "--server", url,
                "--bench", "rm-bench", "--data", args.data, "--out", f"{tmp}/out", "--store", f"{tmp}/store.sqlite",
                "--resamples", "1", "--quiet", "--max-inflight-groups", str(args.max_inflight_groups),
                "--groups-per-request", str(args.groups_per_request), *(["--only", only] if only else [])]
        started = time.monotonic()
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(client.pid, 0)
        wall_s = time.monotonic() - started
        if os.waitstatus_to_exitcode(status) not in (0, 3):
            raise SystemExit(client.stderr.read()[-3000:])
        groups = sum(1 for _ in open(f"{tmp}/out/scores.jsonl"))
    return {"only": only, "groups": groups, "wall_s": wall_s, "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="RM-Bench data folder")
    parser.add_argument("--max-inflight-groups", type=int, default=32)
    parser.add_argument("--groups-per-request", type=int, default=1)
    parser.add_argument("--tag", default="driver-overhead")
    args = parser.parse_args()
    server = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-c", SERVER.format(testkit=str(REPO_ROOT / "tests"))],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        url = server.stdout.readline().strip()
        runs = [one_eval(url, args, only) for only in ("chat", None)]
    finally:
        server.kill()
    small, full = runs
    marginal_ms = 1000 * (full["cpu_s"] - small["cpu_s"]) / (full["groups"] - small["groups"])
    result = {
        "benchmark": "driver_overhead", "date": dt.date.today().isoformat(), "machine": machine_info(),
        "versions": versions(), "runs": runs, "client_cpu_ms_per_group_marginal": marginal_ms,
        "max_inflight_groups": args.max_inflight_groups, "groups_per_request": args.groups_per_request,
        "command": " ".join(sys.argv),
    }
    stem = REPO_ROOT / "benchmarks" / "results" / f"{result['date']}-cpu{os.cpu_count()}-{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    text = "\n".join([
        f"# One client process per group ({result['date']})", "", f"`{result['command']}`", "",
        f"`rmserve eval` of RM-Bench against a fake engine in another process (each on its own core), "
        f"{args.max_inflight_groups} groups in flight, {args.groups_per_request} per request, a fresh score store; "
        "the client's own CPU time (user + system):", "",
        "| groups | wall s | client CPU s |", "|---:|---:|---:|",
        *(f"| {r['groups']} | {r['wall_s']:.1f} | {r['cpu_s']:.2f} |" for r in runs), "",
        f"Marginal cost: **{marginal_ms:.2f} ms of client CPU per group** (the difference of the two runs over "
        f"the difference of their groups: start-up and data load cancel out, figures mostly), so one driver core takes "
        f"at most about {1000 / marginal_ms:,.0f} groups/s.", "",
    ])
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
