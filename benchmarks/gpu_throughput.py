"""GPU scoring throughput and MFU of rmserve's transformers engine against the reference harness.

On the device (one accelerator; transformers and torch, vLLM optional), with no download:

1. trains the demo tokenizer on the RM-Bench files (:mod:`rmserve.demo_model`) and
   renders RM-Bench groups (code domain by default) with rmserve's
   :class:`~rmserve.server.render.chat.Renderer`;
2. builds a random-init ``LlamaForSequenceClassification`` (one label) from a config shaped
   like Llama-3.1-8B (``--shape llama-8b``: 32 layers, hidden 4096, 32 heads, 8 KV heads,
   MLP 14336, vocab 128256) directly on the device, in ``--dtype`` (bfloat16), with SDPA
   attention;
3. scores every sequence two ways on the same weights and times them:

   * ``a`` — the reference-harness loop (:func:`throughput.score_reference`): each response
     index over the groups in order, right-padded batches of ``--batch-size``;
   * ``hf`` — rmserve's transformers engine scoring
     (:func:`rmserve.server.engines.hf_engine.length_sorted_rewards`): all sequences sorted by length
     and packed into batches of at most ``--max-batch-tokens`` padded tokens;

   and, when vLLM is installed, paths ``c`` and ``d`` of ``throughput.py`` on the same
   weights (saved to a temporary folder first);
4. measures the bf16 matmul peak of the device in the same process (median of timed
   ``n × n`` matmuls) and reports, per path, prompt tokens/s and MFU = model FLOP/s ÷ that
   peak.

Model FLOPs count real tokens only (padding is waste, not work): per sequence of length L,
``2·N·L + 2·n_layers·d_attn·L²`` where N is the number of non-embedding parameters and
``d_attn = heads × head_dim`` — the forward-pass count of Kaplan et al. 2020 ("Scaling Laws
for Neural Language Models", Table 1, C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn per token),
with the causal mask's average context folded in exactly (QKᵀ and AV over i keys for query i:
Σ 4·i·d_attn = 2·L²·d_attn per layer).

Run on the device from the repository root (finishes in about 3–5 minutes on an H200)::

    python benchmarks/gpu_throughput.py

and on CPU with a tiny model (what ``tests/test_benchmarks.py`` runs)::

    python benchmarks/gpu_throughput.py --shape tiny --dtype float32 --limit-groups 3

Results: ``<out>/<date>-<machine>-gpu[-<tag>].json`` and ``.md`` (also printed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import re
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def _import_rmserve() -> None:
    """Make ``rmserve`` importable from this checkout when it is not installed (the device).

    The checkout's ``rmserve/__init__.py`` maps the stage folders itself; it needs msgspec,
    orjson and numpy.
    """
    if importlib.util.find_spec("rmserve") is None:
        sys.path.insert(0, str(REPO_ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))


_import_rmserve()

import throughput  # noqa: E402  (this folder, after _import_rmserve)

SHAPES: dict[str, dict[str, Any]] = {
    "llama-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192,
    ),
    "tiny": dict(
        hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=2000, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position_embeddings=4096,
    ),
}
"""Model shapes: ``llama-8b`` follows the published Llama-3.1-8B config (context cut to 8192)."""


def build_tokenizer_dir(data: Path, work_dir: Path) -> Path:
    """A demo checkpoint folder whose tokenizer (trained on ``data``) and chat template are used.

    Its tiny weights are never used; only the tokenizer files are.
    """
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = work_dir / "tokenizer-source"
    build_demo_model(out, data, DemoModelConfig())
    return out


def build_model(shape: str, dtype: str, device: str, pad_id: int, bos_id: int, eos_id: int, seed: int = 0) -> Any:
    """A random-init one-label ``LlamaForSequenceClassification`` of ``shape``, built on ``device``.

    Weights are created directly on the device in ``dtype`` (no fp32 copy, no download).
    """
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        **SHAPES[shape], num_labels=1, pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id,
        tie_word_embeddings=False, architectures=["LlamaForSequenceClassification"],
    )
    config._attn_implementation = "sdpa"
    import transformers

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForSequenceClassification._from_config(config, **{dtype_key: torch_dtype})
    return model.to(device=device, dtype=torch_dtype).eval()


def model_flops(model: Any, lengths: list[int]) -> float:
    """Forward FLOPs of scoring sequences of ``lengths`` (real tokens only; see the module docstring)."""
    config = model.config
    embedding = model.get_input_embeddings().weight.numel()
    non_embedding = sum(p.numel() for p in model.parameters()) - embedding
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    d_attn = config.num_attention_heads * head_dim
    total = 0.0
    for length in lengths:
        total += 2.0 * non_embedding * length + 2.0 * config.num_hidden_layers * d_attn * length * length
    return total


def matmul_peak_flops(dtype: str, device: str, n: int, repeats: int = 20) -> float:
    """Measured matmul FLOP/s of the device: median over ``repeats`` timed ``n×n @ n×n`` products.

    One product is ``2·n³`` FLOPs. On CUDA the time is taken with CUDA events after warm-up.
    """
    import torch

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(times)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=throughput.DEFAULT_DATA, help="RM-Bench folder")
    parser.add_argument("--domains", default="code", help="comma-separated RM-Bench domains (default code)")
    parser.add_argument("--limit-groups", type=int, default=None, help="first N groups per domain (default all)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--paths", default="a,hf,c,d", help="subset of a,hf,c,d (c and d need vLLM; skipped without)")
    parser.add_argument("--batch-size", type=int, default=8, help="path a: sequences per padded batch (default 8)")
    parser.add_argument("--max-batch-tokens", type=int, default=65536, help="path hf: padded tokens per batch")
    parser.add_argument("--max-batch-size", type=int, default=256, help="path hf: sequences per batch")
    parser.add_argument("--block-size", type=int, default=None, help="vLLM block size (default 16 on GPU, 32 on CPU)")
    parser.add_argument("--matmul-n", type=int, default=None, help="matmul size of the peak measurement")
    parser.add_argument("--atol", type=float, default=None,
                        help="largest reward difference to path a (default 1e-4 in float32, 0.1 in bfloat16)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--machine", default=None, help="machine name in the file name (default from the device)")
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    args.path_list = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in args.path_list if p not in ("a", "hf", "c", "d")]
    if bad or not args.path_list:
        parser.error(f"--paths: {args.paths!r}: each must be one of a, hf, c, d")
    args.domain_list = [d.strip() for d in args.domains.split(",") if d.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    import torch
    from rmserve.server.engines.hf_engine import length_sorted_rewards
    from rmserve.server.render.chat import Renderer

    args = parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *(sys.argv if argv is None else ["gpu_throughput.py", *argv])])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu_name = torch.cuda.get_device_name(0) if device == "cuda" else None
    machine = args.machine or (
        re.sub(r"[^a-z0-9]+", "-", gpu_name.lower().removeprefix("nvidia ")).strip("-") if gpu_name else f"cpu{len(__import__('os').sched_getaffinity(0))}"
    )
    atol = args.atol if args.atol is not None else (1e-4 if args.dtype == "float32" else 0.1)
    has_vllm = importlib.util.find_spec("vllm") is not None
    skipped = [p for p in args.path_list if p in ("c", "d") and not has_vllm]
    paths = [p for p in args.path_list if p not in skipped]
    t_start = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="rmserve-gpu-throughput-") as tmp:
        work_dir = Path(tmp)
        tokenizer_dir = build_tokenizer_dir(args.data, work_dir)
        max_len = SHAPES[args.shape]["max_position_embeddings"]
        renderer = Renderer.from_pretrained(tokenizer_dir, max_model_len=max_len)
        groups = throughput.load_groups(args.data, args.domain_list, args.limit_groups)
        token_ids = [
            [list(ids) for ids in renderer.render_group(g.messages, g.responses, group_id=str(g.key)).token_ids]
            for g in groups
        ]
        (warm_ids,) = [
            [list(ids) for ids in renderer.render_group(w.messages, w.responses, group_id="warm").token_ids]
            for w in [throughput.warmup_group()]
        ]
        tok = renderer.tokenizer
        setup_s = time.perf_counter() - t_start
        print(f"{len(groups)} groups, {sum(len(s) for g in token_ids for s in g):,} tokens; setup {setup_s:.1f} s", flush=True)

        peak = matmul_peak_flops(args.dtype, device, args.matmul_n or (8192 if device == "cuda" else 1024))
        print(f"matmul peak ({args.dtype}, {device}): {peak / 1e12:.2f} TFLOP/s", flush=True)

        t0 = time.perf_counter()
        model = build_model(args.shape, args.dtype, device, tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
        _sync(device)
        build_s = time.perf_counter() - t0
        print(f"model ({args.shape}) built on {device} in {build_s:.1f} s", flush=True)
        lengths = [len(s) for g in token_ids for s in g]
        flops = model_flops(model, lengths)
        results: dict[str, throughput.PathResult] = {}
        if "a" in paths:
            rewards, wall_s, latencies = throughput.score_reference(
                model, token_ids, batch_size=args.batch_size, pad_id=tok.pad_token_id, device=device, warmup=warm_ids
            )
            results["a"] = throughput.PathResult(rewards, [[0] * len(g) for g in token_ids], wall_s, latencies, build_s)
            print(f"path a: {wall_s:.1f} s", flush=True)
        if "hf" in paths:
            kwargs = dict(pad_id=tok.pad_token_id, device=torch.device(device),
                          max_batch_tokens=args.max_batch_tokens, max_batch_size=args.max_batch_size)
            length_sorted_rewards(model.model, model.score, warm_ids, **kwargs)
            _sync(device)
            flat = [s for g in token_ids for s in g]
            t0 = time.perf_counter()
            values = length_sorted_rewards(model.model, model.score, flat, **kwargs)
            wall_s = time.perf_counter() - t0
            rewards, pos = [], 0
            for g in token_ids:
                rewards.append(values[pos : pos + len(g)])
                pos += len(g)
            # One length-sorted stream over all groups: a group is done when the stream is.
            results["hf"] = throughput.PathResult(rewards, [[0] * len(g) for g in token_ids], wall_s,
                                                  [wall_s] * len(token_ids), build_s)
            print(f"path hf: {wall_s:.1f} s", flush=True)
        peaks: dict[str, int] = {}
        vllm_paths = [p for p in paths if p in ("c", "d")]
        block_size = args.block_size or (16 if device == "cuda" else 32)
        if vllm_paths:
            checkpoint = work_dir / "model"
            model.save_pretrained(checkpoint)
            tok.save_pretrained(checkpoint)
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
            spec = {
                "model": str(checkpoint), "dtype": args.dtype, "max_model_len": max_len, "block_size": block_size,
                "kv_cache_memory_bytes": None if device == "cuda" else throughput.KV_CACHE_BYTES,
                "enforce_eager": device != "cuda", "batch_size": args.batch_size, "max_groups_in_flight": 32,
                "token_ids": token_ids, "warmup_token_ids": warm_ids, "work_dir": str(work_dir),
                "groups_json": throughput.msgspec.json.encode(list(groups)).decode(),
                "warmup_group_json": throughput.msgspec.json.encode(throughput.warmup_group()).decode(),
            }
            spec_path = work_dir / "spec.json"
            spec_path.write_text(json.dumps(spec))
            for name in vllm_paths:
                results[name], peaks[name] = throughput.run_path_in_child(name, spec_path, work_dir)
                print(f"path {name}: {results[name].wall_s:.1f} s", flush=True)

    bound = sum(throughput.trie_bound_tokens(g, block_size) for g in token_ids)
    rows = []
    for name, result in results.items():
        # a and hf run in this process: its peak RSS so far (vLLM paths: their process tree).
        rss = peaks.get(name, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        row = throughput.summarize(name, result, rss, token_ids, bound, results.get("a"))
        row["model_tflops_per_s"] = flops / result.wall_s / 1e12
        row["mfu"] = flops / result.wall_s / peak
        rows.append(row)
    failures = throughput.parity_failures(results, groups, atol)
    report = {
        "benchmark": "gpu_throughput",
        "date": dt.date.today().isoformat(),
        "command": command,
        "device": device,
        "gpu": gpu_name,
        "shape": args.shape,
        "model_config": SHAPES[args.shape],
        "dtype": args.dtype,
        "attention": "sdpa",
        "domains": {d: sum(g.domain == d for g in groups) for d in args.domain_list},
        "limit_groups": args.limit_groups,
        "batch_size": args.batch_size,
        "max_batch_tokens": args.max_batch_tokens,
        "max_batch_size": args.max_batch_size,
        "block_size": block_size,
        "skipped_paths": {p: "vllm is not installed" for p in skipped},
        "matmul_peak_tflops_per_s": peak / 1e12,
        "model_flops": flops,
        "model_build_s": build_s,
        "total_s": time.perf_counter() - t_start,
        "atol": atol,
        "parity_ok": not failures,
        "parity_failures": failures,
        "rows": rows,
        "machine": throughput.machine_info(),
        "versions": throughput.versions(),
    }
    text = gpu_markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{report['date']}-{machine}-gpu" + (f"-{args.tag}" if args.tag else "")
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.out / stem}.json and .md")
    if failures:
        print("REWARD PARITY FAILED:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


def gpu_markdown(report: dict[str, Any]) -> str:
    """The GPU results as Markdown: one row per path with tokens/s and MFU."""
    lines = [
        f"# GPU scoring throughput — {report['date']} — {report['gpu'] or report['device']}",
        "",
        f"Random-init `{report['shape']}` reward model ({report['dtype']}, {report['attention']}), "
        f"RM-Bench {report['domains']}; matmul peak {report['matmul_peak_tflops_per_s']:.3g} TFLOP/s (measured).",
        "",
        "| path | what | tokens | wall s | tok/s | groups/s | model TFLOP/s | MFU | p50 ms | max abs Δ vs a |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        diff = row.get("max_abs_reward_diff_vs_a")
        lines.append(
            f"| {row['path']} | {row['what']} | {row['prompt_tokens']:,} | {row['wall_s']:.2f} | {row['tokens_per_s']:,.0f} "
            f"| {row['groups_per_s']:.2f} | {row['model_tflops_per_s']:.3g} | {row['mfu']:.1%} "
            f"| {row['latency_p50_ms']:,.0f} | {'' if diff is None else f'{diff:.1e}'} |"
        )
    for path, why in report["skipped_paths"].items():
        lines.append(f"\nPath {path} skipped: {why}.")
    lines += [
        "",
        f"Parity: {'all paths within' if report['parity_ok'] else 'FAILED beyond'} atol {report['atol']:g} of path a.",
        f"Command: `{report['command']}`",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
