"""How much of a DPO policy's prompt log-prob work the prefix cache saves, in tokens.

Scores RM-Bench groups with :class:`rmserve.server.engines.vllm_engine.VLLMLogprobEngine` on both of its
paths, one group at a time, and counts per path the tokens computed and read from the
prefix cache, the sequences resubmitted and the answer rows borrowed from a sibling
(:class:`~rmserve.server.engines.vllm_engine.LogprobCounters`), next to the trie bound: per group, for
each sequence after the first, the longest common prefix with an earlier sequence of the
group, capped at length − 1 and rounded down to whole blocks (what any block-granular
prefix cache could skip; ``throughput.trie_bound_tokens``). It also reports the largest
difference between the two paths' answer log-probs (they must agree within ``--atol``;
the run exits with status 1 otherwise). Token counts only: no timings (they depend on the
machine's load).

Groups are rendered as a DPO policy sees them: ``apply_chat_template(messages + [answer])``
tokenized without special tokens; the answer starts after the longest common prefix with
the tokenized ``apply_chat_template(messages, add_generation_prompt=True)``.

Results: ``<out>/<date>-<machine>-dpo-prefix-cache.json`` and ``.md``. Run from the
repository root::

    rmserve demo-model /tmp/policy --head causal --seed 1 --corpus ../shared/data/rm-bench
    python benchmarks/dpo_prefix_cache.py --model /tmp/policy --every 4
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from throughput import DEFAULT_DATA, machine_info, provenance_lines, trie_bound_tokens, versions

from rmserve.schema import Group
from rmserve.server.render.chat import common_prefix_len

KV_CACHE_BYTES = 1 << 30
"""KV-cache size of the engine (1 GiB: far more than one group needs, so nothing is evicted mid-group)."""


def render_dpo_group(tokenizer: Any, group: Group) -> tuple[list[list[int]], list[int]]:
    """(token ids per response, answer start per response) of one group, as described above."""
    messages = [{"role": m.role, "content": m.content} for m in group.messages]
    prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    token_ids, starts = [], []
    for response in group.responses:
        text = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": response}], tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        token_ids.append(ids)
        starts.append(max(1, common_prefix_len((ids, prompt_ids))))
    return token_ids, starts


def spread(groups: Sequence[Group], every: int) -> list[Group]:
    """Every ``every``-th group in dataset order (all four domains stay represented)."""
    return list(groups[::every])


async def run_path(engine: Any, rendered: list[tuple[list[list[int]], list[int]]], read_cache: bool) -> dict[str, Any]:
    """Score every group on one path; the answer log-probs and the counters it added."""
    engine.read_prefix_cache = read_cache
    assert await engine.reset_prefix_cache()
    before = engine.counters()
    answers = []
    for i, (token_ids, starts) in enumerate(rendered):
        out = await engine.answer_logprobs(token_ids, starts, f"{'cache' if read_cache else 'plain'}-{i}")
        answers.append([list(a.logprobs) for a in out])
    after = engine.counters()
    counts = {
        name: getattr(after, name) - getattr(before, name)
        for name in ("sequences", "submitted_tokens", "cached_tokens", "resubmitted_sequences",
                     "resubmitted_tokens", "borrowed_rows")
    }
    counts["computed_tokens"] = counts["submitted_tokens"] - counts["cached_tokens"]
    return {"counts": counts, "answers": answers}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from rmserve.datasets import load_rmbench
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_engine import VLLMLogprobEngine

    groups = spread(load_rmbench(args.data).groups, args.every)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rendered = [render_dpo_group(tokenizer, g) for g in groups]
    total_tokens = sum(len(ids) for token_ids, _ in rendered for ids in token_ids)
    answer_tokens = sum(len(ids) - a for token_ids, starts in rendered for ids, a in zip(token_ids, starts))
    trie = sum(trie_bound_tokens(token_ids, args.block_size) for token_ids, _ in rendered)
    config = EngineConfig(
        model=args.model, kind="dpo", ref_free="sum", dtype="float32", max_model_len=args.max_model_len,
        block_size=args.block_size, kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=True,
    )
    engine = VLLMLogprobEngine(config, args.model)
    await engine.start()
    try:
        cache = await run_path(engine, rendered, True)
        plain = await run_path(engine, rendered, False)
    finally:
        await engine.shutdown()
    worst, where = 0.0, None
    for i, (a_group, b_group) in enumerate(zip(cache["answers"], plain["answers"], strict=True)):
        for j, (a, b) in enumerate(zip(a_group, b_group, strict=True)):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                if abs(x - y) > worst:
                    worst, where = abs(x - y), f"{groups[i].key} response {j}"
    domains: dict[str, int] = {}
    for g in groups:
        domains[g.domain] = domains.get(g.domain, 0) + 1
    return {
        "groups": len(groups), "every": args.every, "domains": domains, "block_size": args.block_size,
        "sequences": sum(len(t) for t, _ in rendered), "total_tokens": total_tokens,
        "answer_tokens": answer_tokens, "trie_bound_tokens": trie,
        "paths": {"cache": cache["counts"], "plain": plain["counts"]},
        "max_abs_diff_cache_vs_plain": worst, "worst": where, "atol": args.atol,
    }


def markdown(report: dict[str, Any]) -> str:
    r = report["results"]
    total = r["total_tokens"]

    def pct(n: int) -> str:
        return f"{100 * n / total:.1f} %"

    lines = [
        f"# DPO prompt log-probs and the prefix cache — {report['date']} — {report['machine_tag']}",
        "",
        (f"All {r['groups']} RM-Bench groups (" if r["every"] == 1 else
         f"{r['groups']} RM-Bench groups (every {r['every']}th of the 798: ")
        + ", ".join(f"{d} {n}" for d, n in r["domains"].items())
        + f"), {r['sequences']} sequences, {total:,} tokens ({r['answer_tokens']:,} answer tokens); "
        f"block size {r['block_size']}; demo causal LM, float32, one group at a time.",
        "",
        "| path | computed tokens | cached tokens | resubmitted sequences | resubmitted tokens | borrowed rows |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, title in (("plain", "a: plain (skip reading the cache)"), ("cache", "b: cache-reading")):
        c = r["paths"][name]
        lines.append(
            f"| {title} | {c['computed_tokens']:,} ({pct(c['computed_tokens'])}) | {c['cached_tokens']:,} "
            f"({pct(c['cached_tokens'])}) | {c['resubmitted_sequences']} of {c['sequences']} "
            f"({100 * c['resubmitted_sequences'] / c['sequences']:.1f} %) | {c['resubmitted_tokens']:,} | "
            f"{c['borrowed_rows']:,} |"
        )
    cache = r["paths"]["cache"]
    saved = r["paths"]["plain"]["computed_tokens"] - cache["computed_tokens"]
    lines += [
        "",
        f"Trie bound (block {r['block_size']}): {r['trie_bound_tokens']:,} tokens ({pct(r['trie_bound_tokens'])}); "
        f"first-pass cache hits of b reach {100 * cache['cached_tokens'] / max(1, r['trie_bound_tokens']):.1f} % of it "
        "(over 100 %: hits on blocks of earlier groups, which the bound does not count); "
        f"b computes {saved:,} tokens fewer than a ({100 * saved / total:.1f} % of all tokens, "
        "resubmissions included).",
        "A resubmission is a plain request over the sequence's prefix up to its last answer row that neither "
        "its first request nor a sibling computed; borrowed rows come from a sibling that computed them over "
        "identical preceding tokens.",
        f"Answer log-probs, b vs a: max |Δ| {r['max_abs_diff_cache_vs_plain']:.1e} (atol {r['atol']:g}; "
        f"worst {r['worst']}): {'PASS' if r['max_abs_diff_cache_vs_plain'] <= r['atol'] else 'FAIL'}.",
        "",
        *provenance_lines(report),
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="causal LM folder (rmserve demo-model --head causal)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="RM-Bench folder")
    parser.add_argument("--every", type=int, default=1, help="take every Nth group (1 = all 798)")
    parser.add_argument("--block-size", type=int, default=32, help="KV-cache block size (CPU build: multiple of 32)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed |b - a| per answer log-prob")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--machine", default="cpu2", help="machine tag in the file names")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every: {args.every} must be ≥ 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(measure(args))
    date = dt.date.today().isoformat()
    report = {
        "date": date, "machine_tag": args.machine, "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine_info(), "versions": versions(), "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{date}-{args.machine}-dpo-prefix-cache"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0 if results["max_abs_diff_cache_vs_plain"] <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())
