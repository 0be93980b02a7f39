"""Where the time goes while `rmserve serve` scores under load: py-spy on every process.

Starts `rmserve serve MODEL`, drives it with `rmserve eval` on one RM-Bench domain, and
records py-spy samples for ``--duration-s`` seconds from the HTTP server process (rmserve's
own code: aiohttp, JSON, chat-template rendering, tokenization), vLLM's engine-core process
(scheduler) and its worker process (the model). Per process it reports the CPU time used in
the window (from /proc) and the hottest frames; for the worker, the share of samples in each
model operator (attention, matmul, …) of the compiled graph.

Writes ``benchmarks/results/profile-<date>-<machine>.json`` and ``.md``. Needs ``py-spy``
(``pip install py-spy``) and permission to ptrace the children (root, or
``kernel.yama.ptrace_scope=0``).

    python benchmarks/profile_server.py --model /tmp/rm-4x512 --domain code
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from throughput import machine_info, versions  # noqa: E402 - benchmarks share helpers by path

from rmserve.pipelines.launch import ServeOptions, ServerProcess, free_loopback_port  # noqa: E402

RMSERVE = [sys.executable, "-m", "rmserve.cli"]
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def children(pid: int) -> list[int]:
    """All descendants of ``pid``."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            kids = (task / "children").read_text().split()
            out += [int(k) for k in kids]
            todo += [int(k) for k in kids]
    return out


def process_name(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def _operator_at(file: str, line: int) -> str:
    """The ``torch.ops`` operator called at ``file:line`` of a compiled graph.

    py-spy shortens paths, so a bare file name is looked up in the compile caches (vLLM's
    under ``~/.cache/vllm``, inductor's under the temp folder).
    """
    path = Path(file)
    if not path.is_file():
        roots = [Path.home() / ".cache" / "vllm", *Path(tempfile.gettempdir()).glob("torchinductor_*")]
        found = next((p for root in roots if root.is_dir() for p in root.rglob(path.name)), None)
        if found is None:
            return f"{path.name}:{line}"
        path = found
    source = path.read_text().splitlines()[line - 1]
    op = re.search(r"torch\.ops\.([\w.]+)", source)
    return op.group(1) if op else source.strip()[:60]


def summarize(raw: Path, top: int = 8) -> dict:
    """Samples, the hottest leaf frames and, for compiled graphs, the operator called per sample."""
    leaves: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    total = 0
    graph_lines: dict[str, str] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        leaves[re.sub(r"0x[0-9a-f]+", "0x…", frames[-1])[:100]] += n
        for i, frame in enumerate(frames):
            if frame.startswith("OpOverload") and i:
                caller = frames[i - 1]
                match = re.search(r"\(([^():]+\.py):(\d+)\)", caller)
                if match:
                    key = f"{match.group(1)}:{match.group(2)}"
                    if key not in graph_lines:
                        graph_lines[key] = _operator_at(match.group(1), int(match.group(2)))
                    ops[graph_lines[key]] += n
                break
    return {
        "samples": total,
        "top_frames": [(frame, n / total) for frame, n in leaves.most_common(top)] if total else [],
        "operators": [(op, n / max(sum(ops.values()), 1)) for op, n in ops.most_common(top)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", default=str(REPO_ROOT.parent / "shared" / "data" / "rm-bench"))
    parser.add_argument("--domain", default="code")
    parser.add_argument("--duration-s", type=int, default=40)
    parser.add_argument("--rate", type=int, default=20, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--machine", default=f"cpu{len(os.sched_getaffinity(0))}")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    with tempfile.TemporaryDirectory(prefix="rmserve-profile-") as tmp:
        work = Path(tmp)
        port = free_loopback_port()
        options = ServeOptions(model=args.model, engine_options={"dtype": "float32", "kv_cache_memory_bytes": 1 << 30})
        argv = options.argv("127.0.0.1", port)
        with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=work / "server.log",
                           startup_timeout_s=1800, stop_grace_s=30) as server:
            server.wait_ready()
            server_pid = server.process.pid
            roles = {server_pid: "http server (rmserve)"}
            for pid in children(server_pid):
                name = process_name(pid)
                if "EngineCore" in name:
                    roles[pid] = "vLLM engine core (scheduler)"
                elif "Worker" in name:
                    roles[pid] = "vLLM worker (model)"
            load = subprocess.Popen(
                [*RMSERVE, "eval", "--server", server.url, "--bench", "rm-bench", "--data", args.data, "--only",
                 args.domain, "--out", str(work / "eval"), "--quiet", "--resamples", "0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            time.sleep(8)  # past the first requests
            before = {pid: cpu_seconds(pid) for pid in roles}
            spies = {
                pid: subprocess.Popen(
                    [py_spy, "record", "--pid", str(pid), "--duration", str(args.duration_s), "--rate", str(args.rate),
                     "--format", "raw", "-o", str(work / f"{pid}.txt"), "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                for pid in roles
            }
            started = time.monotonic()
            for spy in spies.values():
                spy.wait()
            window_s = time.monotonic() - started
            used = {pid: cpu_seconds(pid) - before[pid] for pid in roles}
            still_loading = load.poll() is None
            load.kill()
            load.wait()
        processes = []
        for pid, role in roles.items():
            raw = work / f"{pid}.txt"
            summary = summarize(raw) if raw.exists() else {"samples": 0, "top_frames": [], "operators": []}
            processes.append({"role": role, "cpu_s": used[pid], "cpu_share_of_machine": used[pid] / (window_s * len(os.sched_getaffinity(0))), **summary})
    report = {
        "benchmark": "profile_server",
        "date": dt.date.today().isoformat(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "window_s": window_s,
        "load_still_running_at_end": still_loading,
        "processes": processes,
        "machine": machine_info(),
        "versions": versions(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"profile-{report['date']}-{args.machine}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [f"# Server profile under load ({report['date']}, {args.machine})", "",
          f"`rmserve eval --only {args.domain}` against `rmserve serve {args.model}`; py-spy at {args.rate} Hz for "
          f"{window_s:.0f} s; CPU time from /proc over the same window.", "",
          "| process | CPU s | share of all CPUs | py-spy samples |", "|---|---:|---:|---:|"]
    md += [f"| {p['role']} | {p['cpu_s']:.1f} | {100 * p['cpu_share_of_machine']:.1f} % | {p['samples']} |" for p in processes]
    for p in processes:
        if p["operators"]:
            md += ["", f"Model operators in the {p['role']} (share of samples inside the compiled graph):", ""]
            md += [f"- `{op}` {100 * share:.1f} %" for op, share in p["operators"]]
        md += ["", f"Hottest frames, {p['role']}:", ""]
        md += [f"- {100 * share:.1f} % `{frame}`" for frame, share in p["top_frames"][:5]]
    md += ["", f"Command: `{report['command']}`"]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
