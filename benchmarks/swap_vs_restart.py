"""Checkpoint swap in a running server vs a full server restart, with reward checks.

One ``rmserve serve`` (a child process, as ``rmserve run`` starts it, with an admin token
and a checkpoint root) serves demo checkpoints of one architecture and different weight
seeds. Measured, as wall time seen by the client:

1. ``swap`` — ``POST /v1/models/load`` to another same-shape checkpoint (in-place weight
   reload; the reply's ``swap_kind`` must be ``reload``), ``--swaps`` times, cycling the
   checkpoints;
2. ``fallback`` — ``POST /v1/models/load`` to a checkpoint of another shape (one more decoder
   layer), then back: the server restarts its engine in place (``swap_kind`` ``restart``);
   skipped with ``--no-restart-fallback``;
3. ``restart`` — stop the server process (SIGTERM, wait) and start a new ``rmserve serve`` on
   the next checkpoint until ``GET /health`` answers 200 and ``GET /v1/models`` lists it,
   ``--restarts`` times.

Correctness: after every swap and fallback the first ``--groups`` RM-Bench ``chat`` groups are
scored and compared with the rewards of a freshly started server on the same checkpoint
(the initial start and the full restarts provide them; a checkpoint no timed restart reached
gets an extra, untimed-in-the-statistics "reference" start). Rewards must agree within
``--atol`` (default 1e-5, float32) and the fingerprints must be equal; otherwise the run
exits with status 1 after writing the results.

Results: ``<out>/swap-vs-restart-<date>-<machine>[-<tag>].json`` and ``.md`` (medians,
min/max, the restart/swap ratio against the target of 3×, machine, versions, command line).
Run from the repository root::

    python benchmarks/swap_vs_restart.py                    # tiny demo shape, 3 checkpoints
    python benchmarks/swap_vs_restart.py --shape 4x512      # the throughput benchmark's shape
    python benchmarks/swap_vs_restart.py --checkpoints /ckpts/a /ckpts/b
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402  (this folder: machine_info, versions, KV_CACHE_BYTES)

DEFAULT_DATA = REPO_ROOT / ".." / "shared" / "data" / "rm-bench"
ADMIN_TOKEN = "swap-vs-restart-benchmark"
TARGET_RATIO = 3.0
"""The in-place swap should be at least this many times faster than a full restart (medians)."""

SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=352),
    "4x512": dict(layers=4, hidden=512, heads=8, kv_heads=4, intermediate=1408),
}
"""Demo-model shapes (``rmserve demo-model`` options): the default tiny one and the 4-layer
model of the throughput benchmark."""


@dataclass
class Event:
    """One timed transition. ``wall_s``: seconds as seen by the client."""

    kind: str
    """``start`` (the first server), ``swap``, ``fallback``, ``restart`` or ``reference``."""
    target: str
    wall_s: float
    source: str | None = None
    swap_kind: str | None = None
    fingerprint: str = ""
    rewards: list[list[float]] = field(default_factory=list)
    max_abs_diff_vs_fresh: float | None = None


# --- checkpoints ------------------------------------------------------------------------------


def build_checkpoints(root: Path, corpus: Path, shape: str, count: int, *,
                      with_other: bool = True) -> tuple[list[Path], Path | None]:
    """``count`` demo checkpoints of ``shape`` (seeds 0…count-1) and, when ``with_other``,
    one with an extra decoder layer (seed ``count``).

    Every checkpoint gets the tokenizer files of the first, so the same-shape ones load in
    place whatever the tokenizer trainer does. Returns (same-shape folders, other-shape
    folder or None).
    """
    from rmserve.demo_model import DemoModelConfig, build_demo_model
    from rmserve.fingerprint import TOKENIZER_FILES

    base = SHAPES[shape]
    folders = []
    for seed in range(count):
        folder = root / f"{shape}-seed{seed}"
        build_demo_model(folder, corpus, DemoModelConfig(seed=seed, **base))
        folders.append(folder)
    other = None
    if with_other:
        other = root / f"{shape}-plus1layer-seed{count}"
        build_demo_model(other, corpus, DemoModelConfig(seed=count, **dict(base, layers=base["layers"] + 1)))
    for folder in [*folders[1:], *([other] if other else [])]:
        for name in TOKENIZER_FILES:
            if (folders[0] / name).is_file():
                shutil.copyfile(folders[0] / name, folder / name)
    return folders, other


# --- the server and its endpoints ---------------------------------------------------------------


class Server:
    """The one ``rmserve serve`` child at a time, on a fresh loopback port per start."""

    def __init__(self, args: argparse.Namespace, roots: Sequence[Path], work_dir: Path) -> None:
        self.args = args
        self.roots = roots
        self.work_dir = work_dir
        self.token_file = work_dir / "admin-token"
        self.token_file.write_text(ADMIN_TOKEN + "\n")
        self.process = None
        self.url = ""

    def start(self, checkpoint: Path) -> None:
        """Start ``rmserve serve checkpoint`` and wait until it answers and lists the checkpoint."""
        from rmserve.pipelines.launch import ServeOptions, ServerProcess, free_loopback_port

        extra: list[str] = ["--admin-token-file", str(self.token_file)]
        for root in self.roots:
            extra += ["--checkpoint-root", str(root)]
        options = ServeOptions(
            model=str(checkpoint),
            engine_options={"engine": "vllm", "dtype": "float32", "block_size": 32,
                            "kv_cache_memory_bytes": throughput.KV_CACHE_BYTES, "enforce_eager": self.args.enforce_eager},
            extra_args=tuple(extra),
        )
        port = free_loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = ServerProcess(options.argv("127.0.0.1", port), url=self.url,
                                     log_path=self.work_dir / "server.log", startup_timeout_s=1800.0,
                                     stop_grace_s=30.0, poll_interval_s=0.1)
        self.process.start()
        self.process.wait_ready()
        (info,) = asyncio.run(self._models())
        if info.name != checkpoint.name:
            raise SystemExit(f"the new server lists {info.name!r}, expected {checkpoint.name!r}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    async def _models(self):
        from rmserve.client.client import RewardClient

        async with RewardClient(self.url) as client:
            return await client.models()

    def load(self, checkpoint: Path) -> tuple[float, str, str]:
        """``POST /v1/models/load``; returns (client wall seconds, swap_kind, fingerprint)."""
        return asyncio.run(self._load(checkpoint))

    async def _load(self, checkpoint: Path) -> tuple[float, str, str]:
        import aiohttp

        from rmserve.schema import LoadModelResponse, decode

        body = {"name": checkpoint.name, "path": str(checkpoint)}
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        timeout = aiohttp.ClientTimeout(total=1800.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            started = time.perf_counter()
            async with session.post(f"{self.url}/v1/models/load", json=body, headers=headers) as resp:
                data = await resp.read()
            wall_s = time.perf_counter() - started
        if resp.status != 200:
            raise SystemExit(f"POST /v1/models/load {checkpoint.name}: {resp.status} {data.decode(errors='replace')}")
        reply = decode(data, LoadModelResponse)
        (info,) = reply.models
        if info.name != checkpoint.name:
            raise SystemExit(f"after loading {checkpoint.name!r} the server reports {info.name!r}")
        return wall_s, reply.swap_kind, info.fingerprint

    def score(self, groups) -> tuple[str, list[list[float]]]:
        """(fingerprint, rewards per group) for ``groups``, one request."""
        return asyncio.run(self._score(groups))

    async def _score(self, groups) -> tuple[str, list[list[float]]]:
        from rmserve.client.client import RewardClient

        async with RewardClient(self.url) as client:
            reply = await client.score(groups)
        return reply.fingerprint, [[float(r) for r in result.rewards] for result in reply.results]


def next_restart_target(current: int, count: int, have_fresh: set[str], names: Sequence[str]) -> int:
    """Index of the checkpoint the next full restart starts: the first after ``current`` (in
    cycle order) that has no fresh-server rewards yet, else simply the next one."""
    order = [(current + k) % count for k in range(1, count)]
    return next((i for i in order if names[i] not in have_fresh), order[0])


# --- statistics and report ------------------------------------------------------------------------


def stats(values: Sequence[float]) -> dict[str, Any]:
    """n, median, min, max of a list of seconds (None when empty)."""
    if not values:
        return {"n": 0, "median_s": None, "min_s": None, "max_s": None}
    return {"n": len(values), "median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def max_abs_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """Largest |a - b| over all groups and responses (shapes must match)."""
    if [len(x) for x in a] != [len(x) for x in b]:
        return float("inf")
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown document."""
    s = report["summary"]

    def cell(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    lines = [
        f"# Checkpoint swap vs restart — {report['date']} — {report['machine_name']}",
        "",
        f"Shape `{report['shape']}`, {len(report['checkpoints'])} same-shape checkpoints, "
        f"{report['groups']} RM-Bench chat groups scored after every transition, float32, vLLM engine.",
        "",
        "| transition | what | n | median s | min s | max s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    titles = {
        "swap": "POST /v1/models/load, same shape (in-place reload)",
        "fallback": "POST /v1/models/load, other shape (engine restart inside the server)",
        "restart": "stop the server + start a new one until /health 200 and /v1/models lists it",
        "start": "first server start (cold)",
    }
    for kind in ("swap", "fallback", "restart", "start"):
        row = s[kind]
        lines.append(f"| {kind} | {titles[kind]} | {row['n']} | {cell(row['median_s'])} | {cell(row['min_s'])} "
                     f"| {cell(row['max_s'])} |")
    ratio = s["restart_over_swap"]
    lines += [
        "",
        f"Restart / swap (medians): **{'' if ratio is None else f'{ratio:.1f}×'}** "
        f"(target ≥ {TARGET_RATIO:g}×: {'holds' if s['target_holds'] else 'NOT MET'}).",
    ]
    if s["restart_over_fallback"] is not None:
        lines.append(f"Restart / in-server restart fallback (medians): {s['restart_over_fallback']:.2f}×.")
    lines += [
        "",
        f"Rewards after every swap/fallback vs a fresh server on the same checkpoint: max |Δ| "
        f"{report['max_abs_diff']:.1e} (atol {report['atol']:g}); fingerprints "
        f"{'equal' if report['fingerprints_equal'] else 'DIFFER'}; "
        f"{'PASS' if report['parity_ok'] else 'FAIL'}.",
        "",
        "| # | kind | from → to | swap_kind | wall s | max |Δ| vs fresh |",
        "| ---: | --- | --- | --- | ---: | ---: |",
    ]
    for i, e in enumerate(report["events"]):
        diff = e["max_abs_diff_vs_fresh"]
        lines.append(f"| {i} | {e['kind']} | {e['source'] or '—'} → {e['target']} | {e['swap_kind'] or ''} "
                     f"| {e['wall_s']:.2f} | {'' if diff is None else f'{diff:.1e}'} |")
    lines += [
        "",
        "Swap and fallback times are client wall times of the load request (drain, engine work, "
        "fingerprint). Restart times include stopping the old process (SIGTERM, engine shutdown) and "
        "the new process's Python and vLLM imports. `reference` starts only provide fresh rewards "
        "for checkpoints no timed restart reached; they are not in the statistics.",
        "",
        *throughput.provenance_lines(report),
    ]
    return "\n".join(lines) + "\n"


# --- the run ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", nargs="+", type=Path, default=None,
                        help="two or more same-shape checkpoint folders (default: build demo ones)")
    parser.add_argument("--other-shape", type=Path, default=None,
                        help="checkpoint of another shape for the restart fallback (default: built, or "
                             "none with --checkpoints)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="demo shape to build (default tiny)")
    parser.add_argument("--num-checkpoints", type=int, default=3, help="same-shape demo checkpoints to build, 2–9 (default 3)")
    parser.add_argument("--swaps", type=int, default=6, help="in-place swaps, ≥ 1 (default 6)")
    parser.add_argument("--restarts", type=int, default=2, help="full server restarts, ≥ 1 (default 2)")
    parser.add_argument("--no-restart-fallback", action="store_true", help="skip the other-shape loads")
    parser.add_argument("--groups", type=int, default=3, help="first N RM-Bench chat groups scored per check (default 3)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="RM-Bench folder (default ../shared/data/rm-bench)")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest reward difference to a fresh server (default 1e-5)")
    parser.add_argument("--enforce-eager", action="store_true", help=throughput.engine_help("enforce_eager", ""))
    parser.add_argument("--work-dir", type=Path, default=None, help="checkpoints and server log (default: a temp folder, removed)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="results folder")
    parser.add_argument("--machine", default=f"cpu{len(os.sched_getaffinity(0))}", help="machine name in the file name")
    parser.add_argument("--tag", default=None, help="suffix of the results file name")
    args = parser.parse_args(argv)
    if args.checkpoints is not None and len(args.checkpoints) < 2:
        parser.error("--checkpoints: give at least two folders")
    if not 2 <= args.num_checkpoints <= 9:
        parser.error(f"--num-checkpoints: {args.num_checkpoints} must be between 2 and 9")
    for name in ("swaps", "restarts", "groups"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)} must be ≥ 1")
    return args


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Build or take the checkpoints, run the three measurements, return the report."""
    from rmserve.datasets import load_benchmark

    groups = list(load_benchmark("rm-bench", args.data, ["chat"]).groups[: args.groups])
    if args.checkpoints is not None:
        checkpoints = [p.resolve() for p in args.checkpoints]
        other = args.other_shape.resolve() if args.other_shape else None
    else:
        print(f"building {args.num_checkpoints} demo checkpoints ({args.shape}) …", flush=True)
        checkpoints, other = build_checkpoints(work_dir / "checkpoints", args.data, args.shape, args.num_checkpoints,
                                               with_other=not args.no_restart_fallback)
    if args.no_restart_fallback:
        other = None
    names = [p.name for p in checkpoints] + ([other.name] if other else [])
    if len(set(names)) != len(names):
        raise SystemExit(f"checkpoint folder names must differ (they are the served names): {names}")
    roots = sorted({p.parent for p in [*checkpoints, *([other] if other else [])]})
    server = Server(args, roots, work_dir)
    events: list[Event] = []
    fresh: dict[str, tuple[str, list[list[float]]]] = {}

    def scored(event: Event) -> Event:
        event.fingerprint, event.rewards = server.score(groups)
        if event.kind in ("start", "restart", "reference"):
            fresh.setdefault(event.target, (event.fingerprint, event.rewards))
        events.append(event)
        print(f"{event.kind:9s} {event.source or '—'} → {event.target}: {event.wall_s:.2f} s"
              + (f" ({event.swap_kind})" if event.swap_kind else ""), flush=True)
        return event

    try:
        started = time.perf_counter()
        server.start(checkpoints[0])
        scored(Event("start", checkpoints[0].name, time.perf_counter() - started))
        current = 0
        for _ in range(args.swaps):
            nxt = (current + 1) % len(checkpoints)
            wall_s, kind, _ = server.load(checkpoints[nxt])
            if kind != "reload":
                raise SystemExit(f"loading {checkpoints[nxt].name} was a {kind}, not an in-place reload: "
                                 "the checkpoints differ in shape or tokenizer")
            scored(Event("swap", checkpoints[nxt].name, wall_s, source=checkpoints[current].name, swap_kind=kind))
            current = nxt
        if other is not None:
            for source, target in ((checkpoints[current], other), (other, checkpoints[current])):
                wall_s, kind, _ = server.load(target)
                if kind != "restart":
                    raise SystemExit(f"loading {target.name} was a {kind}, expected an engine restart")
                scored(Event("fallback", target.name, wall_s, source=source.name, swap_kind=kind))
        for _ in range(args.restarts):
            nxt = next_restart_target(current, len(checkpoints), {c.name for c in checkpoints if c.name in fresh},
                                      [c.name for c in checkpoints])
            started = time.perf_counter()
            server.stop()
            server.start(checkpoints[nxt])
            scored(Event("restart", checkpoints[nxt].name, time.perf_counter() - started,
                         source=checkpoints[current].name))
            current = nxt
        for target in [*checkpoints, *([other] if other else [])]:
            if target.name not in fresh and any(e.target == target.name for e in events):
                started = time.perf_counter()
                server.stop()
                server.start(target)
                scored(Event("reference", target.name, time.perf_counter() - started))
    finally:
        server.stop()

    diffs = []
    fingerprints_equal = True
    for event in events:
        if event.kind in ("swap", "fallback"):
            fingerprint, rewards = fresh[event.target]
            event.max_abs_diff_vs_fresh = max_abs_diff(event.rewards, rewards)
            diffs.append(event.max_abs_diff_vs_fresh)
            fingerprints_equal &= fingerprint == event.fingerprint
    times = {kind: [e.wall_s for e in events if e.kind == kind] for kind in ("swap", "fallback", "restart", "start")}
    summary = {kind: stats(values) for kind, values in times.items()}
    swap_median, restart_median = summary["swap"]["median_s"], summary["restart"]["median_s"]
    fallback_median = summary["fallback"]["median_s"]
    ratio = restart_median / swap_median if swap_median else None
    summary["restart_over_swap"] = ratio
    summary["restart_over_fallback"] = restart_median / fallback_median if fallback_median else None
    summary["target_ratio"] = TARGET_RATIO
    summary["target_holds"] = ratio is not None and ratio >= TARGET_RATIO
    max_diff = max(diffs) if diffs else 0.0
    return {
        "benchmark": "swap-vs-restart",
        "date": dt.date.today().isoformat(),
        "machine_name": args.machine,
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "shape": args.shape if args.checkpoints is None else "given",
        "checkpoints": [p.name for p in checkpoints],
        "other_shape_checkpoint": other.name if other else None,
        "groups": len(groups),
        "group_keys": [str(g.key) for g in groups],
        "atol": args.atol,
        "max_abs_diff": max_diff,
        "fingerprints_equal": fingerprints_equal,
        "parity_ok": max_diff <= args.atol and fingerprints_equal,
        "kv_cache_memory_bytes": throughput.KV_CACHE_BYTES,
        "enforce_eager": args.enforce_eager,
        "summary": summary,
        "events": [{k: v for k, v in e.__dict__.items() if k != "rewards"} for e in events],
        "machine": throughput.machine_info(),
        "versions": throughput.versions(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    keep = args.work_dir is not None
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="rmserve-swap-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = run(args, work_dir)
    except BaseException:
        print(f"failed; server log: {work_dir / 'server.log'}", file=sys.stderr)
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"swap-vs-restart-{report['date']}-{args.machine}" + (f"-{args.tag}" if args.tag else "")
    json_path, md_path = args.out / f"{stem}.json", args.out / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    print(f"wrote {json_path} and {md_path}")
    if not report["parity_ok"]:
        print(f"REWARD CHECK FAILED: max |Δ| {report['max_abs_diff']:.2e} > atol {args.atol:g} "
              f"or fingerprints differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
