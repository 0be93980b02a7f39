"""Fair share on one scoring server: a small eval's wall time while a big one runs.

User A scores every RM-Bench group of ``--data`` (798 with the four local domains) with
``--a-in-flight`` groups in flight (256, as ``rmserve eval --max-inflight-groups 256``); user B
scores ``--b-groups`` chat groups (50) with the client's default 32 in flight. Target: B's
wall time while A runs is at most 2× B's wall time on an idle server.

One server (a child process, ``--serve`` mode of this script) runs the whole benchmark: the
real vLLM engine on ``--model`` (e.g. the demo model: ``rmserve demo-model DIR --corpus
../shared/data/rm-bench``), or with ``--fake`` an in-process stand-in that serves
``--fake-tokens-per-s`` prompt tokens per second shared equally among the groups at it. A
request's user is taken from an ``X-Bench-User`` header (a stand-in for the authentication
middleware; never in the product). Its result cache is off (every group reaches the engine).
Between scenarios the benchmark changes the fair queue's engine cap through a route of the
bench server only (``POST /bench/queue``); "no fair share" is a cap far above anything in
flight, so every group goes to the engine on arrival, as without the queue, and the render
threads take decode and render jobs in arrival order, as without the render pool
(:mod:`rmserve.server.sharing.render_order`: there too the cap is set far above the threads). A cap
written ``64-rfifo`` keeps the engine's fair queue but runs the render threads in arrival
order, to show what the render pool's per-user order adds.

Every run of a user scores its groups with a run tag put before the prompt (:func:`fresh`), so
nothing of it is in the engine's prefix cache from an earlier run: each run costs what a first
eval costs (the sequences of a group still share their prompt). Order: a warm-up of
``--warmup-groups`` groups (compilation), then per scenario: B alone ``--idle-repeats`` times
(median), then A, and B once A has all its groups in flight (after ``--b-delay-s``). Reported per scenario: B's idle
and contended wall time and their ratio, A's wall time, and all tokens / A's wall time.
Both clients share the benchmark's event loop unless ``--client-processes`` runs A's client in a
process of its own (as two users on two machines would: A's client work then does not slow
B's client).

Results: ``<out>/<date>-<machine>-fair-share[-<tag>].json`` and ``.md``. Run from the
repository root::

    rmserve demo-model /tmp/demo-rm --corpus ../shared/data/rm-bench
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/fair_share.py --model /tmp/demo-rm \\
        --data ../shared/data/rm-bench --caps fifo,16,64
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_USER_HEADER = "X-Bench-User"
FIFO_CAP = 1_000_000
"""Engine cap that stands for "no fair share": far above any number of groups in flight."""


# --- the bench server (child process) ------------------------------------------------------


def _fake_engine_and_renderer(tokens_per_s: float):
    """A processor-sharing stand-in engine over the tests' fake renderer (character tokens)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from testkit.fakes import FakeEngine, FakeRenderer

    from rmserve.schema import ModelInfo

    class SharedRateEngine(FakeEngine):
        """Serves ``tokens_per_s`` prompt tokens per second, shared equally by the groups at it."""

        async def score_group(self, token_ids, request_id, *, answer_starts=None, priority=0):
            need = float(sum(len(ids) for ids in token_ids))
            self._active = getattr(self, "_active", 0) + 1
            try:
                while need > 0:
                    step = 0.01
                    await asyncio.sleep(step)
                    need -= tokens_per_s * step / self._active
            finally:
                self._active -= 1
            return await super().score_group(token_ids, request_id)

    model = ModelInfo(name="fake-rm", max_model_len=1_000_000, dtype="float32", fingerprint="fp-fake", engine="fake")
    return SharedRateEngine(model=model), FakeRenderer(max_model_len=1_000_000)


def serve(args: argparse.Namespace) -> None:
    """``--serve``: the scoring app with a header-named user and ``POST /bench/queue``."""
    from aiohttp import web

    from rmserve.server.http.app import ServerConfig, create_app
    from rmserve.server.sharing.fair_queue import QUEUE_KEY
    from rmserve.server.sharing.render_order import pool_of
    from rmserve.server.sharing.users import USER_KEY, User

    users = {name: User(name) for name in ("A", "B", "warmup")}

    @web.middleware
    async def bench_user(request: web.Request, handler):
        name = request.headers.get(BENCH_USER_HEADER)
        if name is not None:
            request[USER_KEY] = users[name]
        return await handler(request)

    config = ServerConfig(port=args.port, result_cache_groups=0, max_body_bytes=64 * 1024 * 1024)
    if args.fake:
        engine, renderer = _fake_engine_and_renderer(args.fake_tokens_per_s)
        app = create_app(config, engine, renderer)
    else:
        from rmserve.server.engines.registry import build_engine
        from rmserve.server.config import EngineConfig
        from rmserve.server.http.serve import engine_renderer

        engine = build_engine(EngineConfig(model=args.model, dtype="float32", kv_cache_memory_bytes=1 << 30))
        app = create_app(config, engine, renderer_factory=engine_renderer)
    app.middlewares.append(bench_user)

    defaults: dict[str, int | None] = {}

    async def set_queue(request: web.Request) -> web.Response:
        body = await request.json()
        queue = request.app[QUEUE_KEY]
        if "window" not in defaults:  # the window the server chose from the engine's step budget
            defaults["window"] = queue.window_tokens
        window = body.get("window_tokens")  # None: the server's default; 0: none
        queue.set_window_tokens(None if body["concurrency"] == FIFO_CAP or window == 0
                                else defaults["window"] if window is None else int(window))
        queue.concurrency = int(body["concurrency"])
        queue.quantum_tokens = int(body.get("quantum_tokens", queue.quantum_tokens))
        queue.interactive_boost = float(body.get("interactive_boost", queue.interactive_boost))
        renders = pool_of(request.app).queue  # the render threads' per-user order
        renders.concurrency = config.render_threads if body.get("render_fair", True) else FIFO_CAP
        renders.interactive_boost = queue.interactive_boost
        return web.json_response({"concurrency": queue.concurrency, "quantum_tokens": queue.quantum_tokens,
                                  "window_tokens": queue.window_tokens,
                                  "interactive_boost": queue.interactive_boost,
                                  "render_slots": renders.concurrency})

    app.router.add_post("/bench/queue", set_queue)
    web.run_app(app, host="127.0.0.1", port=args.port, handler_cancellation=True, access_log=None, print=None)


# --- the clients ---------------------------------------------------------------------------


def fresh(groups, run: str):
    """``groups`` with ``[run]`` put before the first message, so no block of them is in the
    engine's prefix cache from an earlier run (every run scores like a first eval), while
    the sequences of a group still share their prompt. Keys change with ``run`` too."""
    import msgspec

    out = []
    for g in groups:
        first = msgspec.structs.replace(g.messages[0], content=f"[{run}] {g.messages[0].content}")
        out.append(msgspec.structs.replace(g, id=f"{run}-{g.id}", messages=(first, *g.messages[1:])))
    return out


async def run_user(url: str, user: str, groups, in_flight: int, priority: str = "batch") -> tuple[float, int]:
    """Score ``groups`` as ``user``; returns (wall seconds, prompt tokens scored)."""
    import aiohttp

    from rmserve.client.client import RewardClient
    from rmserve.client.config import Concurrency

    headers = {BENCH_USER_HEADER: user, "X-RMServe-Priority": priority}
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=3600)) as session:
        client = RewardClient(url, session=session, concurrency=Concurrency(max_groups_in_flight=in_flight))
        tokens = 0
        started = time.perf_counter()
        async for record in client.score_stream(groups):
            tokens += sum(record.num_tokens)
        return time.perf_counter() - started, tokens


def run_user_in_process(url: str, user: str, groups, in_flight: int, priority: str = "batch") -> tuple[float, int]:
    """:func:`run_user` on a new event loop (run in a worker process by ``--client-processes``)."""
    return asyncio.run(run_user(url, user, groups, in_flight, priority))


async def set_cap(url: str, cap: int, quantum: int | None, boost: float = 1.0, render_fair: bool = True,
                  window_tokens: int | None = None) -> int | None:
    """Set the server's queue for a scenario; returns the engine token window in force (None: none)."""
    import aiohttp

    body: dict[str, float] = {"concurrency": cap, "interactive_boost": boost,
                              "render_fair": render_fair and cap != FIFO_CAP}
    if quantum is not None:
        body["quantum_tokens"] = quantum
    if window_tokens is not None:
        body["window_tokens"] = window_tokens
    async with aiohttp.ClientSession() as session, session.post(f"{url}/bench/queue", json=body) as resp:
        resp.raise_for_status()
        return (await resp.json())["window_tokens"]


async def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 900.0) -> float:
    import aiohttp

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() - started < timeout_s:
            if proc.poll() is not None:
                raise SystemExit(f"the bench server exited with status {proc.returncode}")
            try:
                async with session.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return time.perf_counter() - started
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1.0)
    raise SystemExit(f"the bench server was not ready after {timeout_s:.0f} s")


async def scenario(url: str, index: int, spec: tuple[int, float, bool], args: argparse.Namespace, a_groups, b_groups
                   ) -> dict[str, Any]:
    """Scenario ``index`` (its run tags, all of one length, are ``s<index>-…``): B alone, then A and B."""
    cap, boost, render_fair = spec
    tag = f"s{index:02d}"
    load_before = os.getloadavg()[0]
    window = await set_cap(url, cap, args.quantum_tokens, boost, render_fair, args.window_tokens)
    idle = [(await run_user(url, "B", fresh(b_groups, f"{tag}-b{i}"), args.b_in_flight, "interactive"))[0]
            for i in range(args.idle_repeats)]
    a_fresh = fresh(a_groups, f"{tag}-aa")
    if args.client_processes is not None:  # A's client in its own process: it does not share B's event loop
        a_task = asyncio.get_running_loop().run_in_executor(
            args.client_processes, run_user_in_process, url, "A", a_fresh, args.a_in_flight)
    else:
        a_task = asyncio.create_task(run_user(url, "A", a_fresh, args.a_in_flight))
    await asyncio.sleep(args.b_delay_s)
    b_wall, b_tokens = await run_user(url, "B", fresh(b_groups, f"{tag}-bc"), args.b_in_flight, "interactive")
    a_wall, a_tokens = await a_task
    b_idle = statistics.median(idle)
    row = {
        "scenario": "no fair share" if cap == FIFO_CAP
        else f"fair share, cap {cap}" + (f", interactive boost {boost:g}" if boost != 1 else "")
        + ("" if render_fair else ", render threads in arrival order")
        + (f", window {window:,} tokens" if cap != FIFO_CAP and window else ""),
        "engine_concurrency_groups": None if cap == FIFO_CAP else cap,
        "interactive_boost": None if cap == FIFO_CAP else boost,
        "render_fair": cap != FIFO_CAP and render_fair,
        "engine_window_tokens": window,
        "b_idle_s": round(b_idle, 2),
        "b_idle_runs_s": [round(x, 2) for x in idle],
        "b_contended_s": round(b_wall, 2),
        "b_ratio": round(b_wall / b_idle, 2),
        "a_wall_s": round(a_wall, 2),
        "tokens_per_s_during_a": round((a_tokens + b_tokens) / a_wall),
        "a_tokens": a_tokens,
        "b_tokens": b_tokens,
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }
    print(json.dumps(row), flush=True)
    return row


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from rmserve.datasets import load_rmbench

    a_groups = list(load_rmbench(args.data).groups)
    b_groups = [g for g in a_groups if g.domain == "chat"][: args.b_groups]
    if len(b_groups) < args.b_groups:
        raise SystemExit(f"--b-groups: only {len(b_groups)} chat groups in {args.data}")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, __file__, "--serve", "--port", str(port)]
    cmd += ["--fake", "--fake-tokens-per-s", str(args.fake_tokens_per_s)] if args.fake else ["--model", args.model]
    log = open(Path(args.out) / "fair_share_server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    if args.client_processes:
        import concurrent.futures
        import multiprocessing

        args.client_processes = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        args.client_processes.submit(int).result()  # started before any timing
    else:
        args.client_processes = None
    try:
        ready_s = await wait_ready(url, proc)
        print(f"server ready after {ready_s:.0f} s", flush=True)
        await set_cap(url, FIFO_CAP, None)
        warm_s, warm_tokens = await run_user(url, "warmup", fresh(a_groups[: args.warmup_groups], "warm"), 64)
        print(f"warm-up: {args.warmup_groups} groups, {warm_tokens} tokens in {warm_s:.1f} s", flush=True)
        rows = []
        for index, spec in enumerate(args.caps):
            rows.append(await scenario(url, index, spec, args, a_groups, b_groups))
    finally:
        if args.client_processes is not None:
            args.client_processes.shutdown()
        args.client_processes = args.client_processes is not None  # as recorded with the results
        proc.terminate()
        proc.wait(120)
        log.close()
    return {"warmup_s": round(warm_s, 2), "warmup_tokens": warm_tokens, "a_groups": len(a_groups),
            "b_groups": len(b_groups), "rows": rows, "server_ready_s": round(ready_s, 1)}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Fair share: {result['a_groups']} RM-Bench groups for A ({result['args']['a_in_flight']} in flight), "
        f"{result['b_groups']} chat groups for B ({result['args']['b_in_flight']} in flight)",
        "",
        f"Engine: {result['engine']}. Machine: {result['machine']}. Date: {result['date']}.",
        f"Warm-up: {result['args']['warmup_groups']} groups, {result['warmup_s']} s. Every run's groups carry a "
        "run tag before the prompt (nothing is served from an earlier run's prefix cache).",
        f"Command: `{result['command']}`",
        "Clients: " + ("A's in a process of its own, B's in the benchmark's process."
                       if result["args"].get("client_processes") else "A's and B's share the benchmark's event loop."),
        "",
        "| scenario | B idle (s) | B while A runs (s) | ratio (target ≤ 2) | A wall (s) | tokens/s during A | load before → after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['scenario']} | {row['b_idle_s']} | {row['b_contended_s']} | {row['b_ratio']} | "
            f"{row['a_wall_s']} | {row['tokens_per_s_during_a']:,} | "
            + (" → ".join(map(str, row["load_average_1min"])) if "load_average_1min" in row else "n/a") + " |"
        )
    return "\n".join(lines) + "\n"


def parse_cap(text: str) -> tuple[int, float, bool]:
    """One ``--caps`` entry → (engine cap, interactive boost, render threads in per-user order).

    ``fifo`` → no fair share at all; ``64`` → cap 64; ``64b2`` → with interactive boost 2;
    ``64-rfifo`` / ``64b2-rfifo`` → the same with the render threads in arrival order.

    Raises:
        ValueError: any other form (naming it).
    """
    text = text.strip()
    if text == "fifo":
        return FIFO_CAP, 1.0, False
    spec, dash, render = text.partition("-")
    cap, _, boost = spec.partition("b")
    if (dash and render != "rfifo") or not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"{text!r} is not 'fifo', CAP, CAPbBOOST or either with '-rfifo' (e.g. 64, 64b2, 64-rfifo)")
    return int(cap), float(boost or 1), not dash


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help="reward-model folder (e.g. the demo model)")
    parser.add_argument("--fake", action="store_true", help="a stand-in engine instead of vLLM")
    parser.add_argument("--fake-tokens-per-s", type=float, default=60_000.0)
    parser.add_argument("--data", default="../shared/data/rm-bench")
    parser.add_argument("--a-in-flight", type=int, default=256)
    parser.add_argument("--b-groups", type=int, default=50)
    parser.add_argument("--b-in-flight", type=int, default=32)
    parser.add_argument("--b-delay-s", type=float, default=3.0, help="seconds between A's start and B's")
    parser.add_argument("--warmup-groups", type=int, default=64)
    parser.add_argument("--idle-repeats", type=int, default=3)
    parser.add_argument("--caps", default="fifo,64",
                        help="comma list of engine caps, each optionally with an interactive boost (64b2) and "
                             "'-rfifo' for render threads in arrival order (64-rfifo); 'fifo' = no fair share at all")
    parser.add_argument("--quantum-tokens", type=int, default=None)
    parser.add_argument("--window-tokens", type=int, default=None,
                        help="engine token window of the fair-share scenarios (0: none; default: the server's, "
                        "8 steps of the engine's max_num_batched_tokens)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tag", default="")
    parser.add_argument("--client-processes", action="store_true",
                        help="run A's client in a process of its own (default: A's and B's clients share one event loop)")
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    if not args.fake and not args.model:
        parser.error("--model DIR or --fake is needed")
    try:
        args.caps = [parse_cap(c) for c in args.caps.split(",")]
    except ValueError as exc:
        parser.error(f"--caps: {exc}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(bench(args))
    from throughput import machine_info  # noqa: PLC0415 (sibling benchmark module)

    machine = machine_info()
    result.update(
        args={k: v for k, v in vars(args).items() if k not in ("serve", "port")},
        engine=("fake (processor sharing, %d tokens/s)" % args.fake_tokens_per_s) if args.fake
        else f"vLLM CPU, {Path(args.model).name}, float32, 1 GiB KV cache",
        machine=f"{machine.get('cpu_count')} CPUs, {machine.get('cpu_model', '')}".strip(", "),
        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join([Path(sys.executable).name, *sys.argv]),
    )
    stem = f"{dt.date.today().isoformat()}-cpu{os.cpu_count()}-fair-share" + (f"-{args.tag}" if args.tag else "")
    Path(args.out, stem + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out, stem + ".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
