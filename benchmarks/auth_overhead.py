"""What tokens cost: scoring throughput with a users file against without, and a flood of bad tokens.

``rmserve serve`` child processes on the same model, all with ``--result-cache-groups 0``
(every group is engine work): **A** without a users file, **B** with one (a scorer ``bench``
without limits, and a scorer ``expired`` whose token expired in 2020). Only one server runs at
a time (two idle vLLM CPU engines bound to the same cores disturb each other). Measured:

1. **Overhead.** ``--rounds`` rounds; each takes the next ``--groups-per-round`` RM-Bench groups
   and scores them on a fresh A and a fresh B in turn (A first in even rounds, B first in odd
   ones, so drift in the machine's load falls on both; each server is warmed up on 8 other
   groups first), through
   :meth:`rmserve.client.RewardClient.score_stream` with ``--max-inflight-groups`` groups in flight,
   B with ``bench``'s token. Throughput is prompt tokens/s (Σ ``num_tokens`` / wall time).
   Reported: tokens/s of each, the ratio B/A over all rounds (Σ tokens / Σ wall), and the
   median of the per-round ratios. Target: B/A ≥ 0.97.
2. **Bad tokens.** ``--bad`` ``POST /v1/score`` requests to B, in turn with a wrong token (random),
   ``expired``'s token, and a malformed header (``Basic`` without a password, ``Bearer`` alone, ``Bearer`` with
   two words, a token without a scheme), ``--bad-concurrency`` at a time, while ``bench`` scores
   one more round of groups at the same time. Target: every bad request gets 401, none reaches
   the engine (``rmserve_groups_total`` grows by exactly the groups ``bench`` scored;
   ``rmserve_auth_rejections_total`` grows by ``--bad``), and every one of ``bench``'s groups is
   scored.

Results: ``<out>/auth-overhead-<date>-<machine>[-<tag>].json`` and ``.md``. Run from the
repository root, on a model built with ``rmserve demo-model DIR --corpus ../shared/data/rm-bench``::

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/auth_overhead.py --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput  # noqa: E402  (this folder: load_groups, machine_info, versions, provenance_lines)

DEFAULT_DATA = REPO_ROOT / ".." / "shared" / "data" / "rm-bench"
TARGET_RATIO = 0.97
"""Tokens/s with a users file over tokens/s without, at least."""

MALFORMED_HEADERS: tuple[str, ...] = ("Basic YmVuY2g=", "Bearer", "Bearer two words", "no-scheme-token")


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(session, url: str, token: str | None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(f"{url}/metrics", headers=headers) as resp:
        if resp.status != 200:
            raise SystemExit(f"GET {url}/metrics answered {resp.status}")
        return parse_metrics(await resp.text())


async def score_round(url: str, token: str | None, groups, max_in_flight: int) -> dict[str, float]:
    """Score ``groups`` on ``url``: wall seconds, prompt tokens and groups scored."""
    from rmserve.client import Concurrency, RewardClient

    concurrency = Concurrency(max_groups_in_flight=max_in_flight, groups_per_request=1)
    tokens = scored = 0
    async with RewardClient(url, concurrency=concurrency, token=token) as client:
        t0 = time.perf_counter()
        async for record in client.score_stream(groups):
            tokens += sum(record.num_tokens)
            scored += 1
        wall_s = time.perf_counter() - t0
    return {"wall_s": wall_s, "tokens": tokens, "groups": scored, "tokens_per_s": tokens / wall_s}


def bad_header(i: int, expired_token: str) -> tuple[str, dict[str, str]]:
    """(kind, headers) of bad request ``i``: wrong, expired and malformed in turn."""
    kind = ("wrong", "expired", "malformed")[i % 3]
    if kind == "wrong":
        return kind, {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
    if kind == "expired":
        return kind, {"Authorization": f"Bearer {expired_token}"}
    return kind, {"Authorization": MALFORMED_HEADERS[(i // 3) % len(MALFORMED_HEADERS)]}


async def bad_token_flood(url: str, tokens: dict[str, str], groups, args) -> dict[str, Any]:
    """Send ``args.bad`` bad requests while ``bench`` scores ``groups``; metrics before and after."""
    import aiohttp

    from rmserve.client.records import request_group
    from rmserve.schema import ScoreRequest, encode

    body = encode(ScoreRequest(groups=(request_group(groups[0]),)))
    statuses: dict[str, dict[int, int]] = {"wrong": {}, "expired": {}, "malformed": {}}
    async with aiohttp.ClientSession() as session:
        before = await scrape(session, url, tokens["bench"])
        gate = asyncio.Semaphore(args.bad_concurrency)

        async def one(i: int) -> None:
            kind, headers = bad_header(i, tokens["expired"])
            async with gate:
                async with session.post(f"{url}/v1/score", data=body,
                                        headers={**headers, "Content-Type": "application/json"}) as resp:
                    await resp.read()
                    statuses[kind][resp.status] = statuses[kind].get(resp.status, 0) + 1

        t0 = time.perf_counter()
        flood = asyncio.gather(*(one(i) for i in range(args.bad)))
        valid = score_round(url, tokens["bench"], groups, args.max_inflight_groups)
        _, good = await asyncio.gather(flood, valid)
        wall_s = time.perf_counter() - t0
        after = await scrape(session, url, tokens["bench"])

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    return {
        "bad_requests": args.bad,
        "statuses": {kind: {str(k): v for k, v in sorted(s.items())} for kind, s in statuses.items()},
        "all_401": all(set(s) == {401} for s in statuses.values()),
        "rejections_by_reason": {
            reason: delta("rmserve_auth_rejections_total", reason=reason)
            for reason in ("missing", "malformed", "unknown", "expired", "forbidden")
        },
        "score_401_delta": delta("rmserve_requests_total", endpoint="/v1/score", status="401"),
        "engine_groups_delta": delta("rmserve_groups_total"),
        "valid_groups_sent": len(groups),
        "valid_groups_scored": good["groups"],
        "valid_tokens_per_s_during_flood": good["tokens_per_s"],
        "wall_s": wall_s,
    }


def auth_cost_us(users_file: Path, token: str, calls: int = 20_000) -> dict[str, float]:
    """In-process cost of what the auth middleware adds per request, microseconds: the token
    check against every line of ``users_file`` (:meth:`UserRegistry.authenticate`), the role
    check and the per-user request counter (median of 5 repeats of ``calls`` calls each)."""
    from rmserve.server.sharing.auth import UserRegistry, check_role, read_users_file
    from rmserve.server.http.observability import ServerMetrics

    registry = UserRegistry(read_users_file(users_file))
    metrics = ServerMetrics()
    header = f"Bearer {token}"
    repeats = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            user = registry.authenticate(header, now_s=0.0)
            check_role(user, "POST", "/v1/score")
            metrics.observe_user_request(user.name, "/v1/score", 200)
        repeats.append((time.perf_counter() - t0) / calls * 1e6)
    return {"users_in_file": len(registry.users), "us_per_request": statistics.median(repeats)}


def make_users(folder: Path) -> dict[str, str]:
    from rmserve.server.sharing.auth import add_user

    path = folder / "users.jsonl"
    tokens = {}
    tokens["bench"], _ = add_user(path, "bench")
    tokens["expired"], _ = add_user(path, "expired", expires=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    return tokens


def markdown(report: dict[str, Any]) -> str:
    o, b = report["overhead"], report["bad_tokens"]
    lines = [
        f"# Auth overhead and bad tokens — {report['date']} ({report['machine_tag']})",
        "",
        f"Model: `{report['model']}` ({report['engine']}); {o['rounds']} rounds × {o['groups_per_round']} RM-Bench "
        f"groups, {report['max_in_flight']} groups in flight, result cache off on both servers.",
        "",
        "| server | prompt tokens | wall s | tokens/s |",
        "| --- | ---: | ---: | ---: |",
        f"| A: no users file | {o['A']['tokens']:,} | {o['A']['wall_s']:.2f} | {o['A']['tokens_per_s']:,.0f} |",
        f"| B: {'no users file (control run)' if report['control'] else 'users file, bearer token'} | {o['B']['tokens']:,} | {o['B']['wall_s']:.2f} | {o['B']['tokens_per_s']:,.0f} |",
        "",
        f"B/A over all rounds: **{o['ratio_total']:.3f}** (target ≥ {TARGET_RATIO}); median of the per-round "
        f"ratios {o['ratio_median']:.3f} (per round: {', '.join(f'{r:.3f}' for r in o['ratio_per_round'])}). "
        f"Target {'met' if o['ratio_total'] >= TARGET_RATIO else 'NOT met'}.",
        "",
        f"Auth work per request in process (token check against {report['auth_cost']['users_in_file']} users, role "
        f"check, per-user counter): {report['auth_cost']['us_per_request']:.1f} µs, i.e. "
        f"{100 * report['auth_cost']['fraction_of_one_core_at_B_rate']:.3f} % of one core at B's request rate "
        "(one group per request).",
        "",
        *([] if b is None else [
            f"Bad tokens: {b['bad_requests']} requests (wrong / expired / malformed in turn, {report['bad_concurrency']} "
            f"at a time) while `bench` scored {b['valid_groups_sent']} groups: statuses {json.dumps(b['statuses'])}; "
            f"all 401: **{b['all_401']}**. `rmserve_auth_rejections_total` grew by "
            f"{json.dumps({k: int(v) for k, v in b['rejections_by_reason'].items() if v})}, "
            f"`rmserve_requests_total{{/v1/score,401}}` by {b['score_401_delta']:.0f}, `rmserve_groups_total` by "
            f"{b['engine_groups_delta']:.0f} (= the {b['valid_groups_scored']} groups `bench` scored: none of the bad "
            f"requests reached the engine). `bench` scored at {b['valid_tokens_per_s_during_flood']:,.0f} tokens/s "
            "during the flood.",
        ]),
        "",
        *throughput.provenance_lines(report),
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Model folder (e.g. from rmserve demo-model).")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="RM-Bench release folder.")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--groups-per-round", type=int, default=100)
    p.add_argument("--max-inflight-groups", type=int, default=32,
                   help="groups in flight per scoring round, as rmserve eval's option of that name (default 32)")
    p.add_argument("--bad", type=int, default=1000)
    p.add_argument("--bad-concurrency", type=int, default=50)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    p.add_argument("--machine-tag", default="cpu2")
    p.add_argument("--tag", default=None)
    p.add_argument("--control", action="store_true",
                   help="Control run: B without a users file too (both servers alike; the ratio shows the noise).")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from rmserve.pipelines.launch import ServeOptions, ServerProcess, free_loopback_port

    args = parse_args(argv)
    groups = throughput.load_groups(args.data, None, None)
    needed = (args.rounds + 1) * args.groups_per_round
    if len(groups) < needed:
        raise SystemExit(f"--rounds/--groups-per-round need {needed} groups; the data holds {len(groups)}")
    rng_order = list(range(len(groups)))
    # spread every round over the domains: take groups in a fixed interleaved order
    step = len(groups) // needed
    picked = [groups[i] for i in rng_order[::step][:needed]]
    rounds = [picked[r * args.groups_per_round:(r + 1) * args.groups_per_round] for r in range(args.rounds + 1)]
    flood_groups = rounds.pop()
    machine = throughput.machine_info()

    with tempfile.TemporaryDirectory(prefix="rmserve-auth-bench-") as tmp:
        work = Path(tmp)
        tokens = make_users(work)
        b_extra = () if args.control else ("--users-file", str(work / "users.jsonl"))
        extra_of = {"A": (), "B": b_extra}
        token_of = {"A": None, "B": None if args.control else tokens["bench"]}
        cost = auth_cost_us(work / "users.jsonl", tokens["bench"])

        def server(name: str) -> ServerProcess:
            options = ServeOptions(model=args.model, engine_options={"dtype": args.dtype},
                                   extra_args=("--result-cache-groups", "0", *extra_of[name]))
            port = free_loopback_port()
            return ServerProcess(options.argv("127.0.0.1", port), url=f"http://127.0.0.1:{port}",
                                 log_path=work / name / "server.log", startup_timeout_s=1800.0,
                                 stop_grace_s=30.0, name=f"server {name}", quiet=True)

        # One server process at a time: two idle engines bound to the same CPUs disturb each
        # other (a control run with two identical servers side by side differed by up to 2x).
        per_round: list[dict[str, dict[str, float]]] = []
        for r, batch in enumerate(rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            row = {}
            for name in order:
                with server(name) as process:
                    process.wait_ready()
                    asyncio.run(score_round(process.url, token_of[name], flood_groups[:8], args.max_inflight_groups))
                    row[name] = asyncio.run(score_round(process.url, token_of[name], batch, args.max_inflight_groups))
                if row[name]["groups"] != len(batch):
                    raise SystemExit(f"server {name} scored {row[name]['groups']} of {len(batch)} groups")
            per_round.append(row)
            print(f"round {r + 1}/{len(rounds)}: A {row['A']['tokens_per_s']:,.0f} tok/s, "
                  f"B {row['B']['tokens_per_s']:,.0f} tok/s", file=sys.stderr)
        flood = None
        if not args.control:
            with server("B") as process:
                process.wait_ready()
                flood = asyncio.run(bad_token_flood(process.url, tokens, flood_groups, args))

    totals = {
        name: {
            "tokens": sum(row[name]["tokens"] for row in per_round),
            "wall_s": sum(row[name]["wall_s"] for row in per_round),
        }
        for name in ("A", "B")
    }
    for name in totals:
        totals[name]["tokens_per_s"] = totals[name]["tokens"] / totals[name]["wall_s"]
    ratios = [row["B"]["tokens_per_s"] / row["A"]["tokens_per_s"] for row in per_round]
    report = {
        "date": dt.date.today().isoformat(),
        "machine_tag": args.machine_tag,
        "model": args.model,
        "engine": "vllm (rmserve serve child processes)",
        "max_in_flight": args.max_inflight_groups,  # the recorded field keeps its name
        "bad_concurrency": args.bad_concurrency,
        "overhead": {
            "rounds": args.rounds,
            "groups_per_round": args.groups_per_round,
            "A": totals["A"],
            "B": totals["B"],
            "ratio_total": totals["B"]["tokens_per_s"] / totals["A"]["tokens_per_s"],
            "ratio_median": statistics.median(ratios),
            "ratio_per_round": ratios,
            "per_round": per_round,
            "target": TARGET_RATIO,
        },
        "bad_tokens": flood,
        "control": args.control,
        "auth_cost": {
            **cost,
            "fraction_of_one_core_at_B_rate": cost["us_per_request"] * 1e-6 * (
                len(rounds) * args.groups_per_round / totals["B"]["wall_s"]
            ),
        },
        "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/auth_overhead.py", *(argv or sys.argv[1:])]),
        "machine": machine,
        "versions": throughput.versions(),
        "env": {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE",) if k in os.environ},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"auth-overhead-{report['date']}-{args.machine_tag}" + (f"-{args.tag}" if args.tag else "")
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    if flood is None:
        return 0
    ok = report["overhead"]["ratio_total"] >= TARGET_RATIO and flood["all_401"] and (
        flood["engine_groups_delta"] == flood["valid_groups_scored"] == len(flood_groups)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
