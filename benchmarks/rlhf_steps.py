"""RLHF-shaped reward load: GRPO steps of P prompts × G completions, sent the way trainers send them.

Every step's B = P·G samples are scored before the next step starts (a trainer waits for its
rewards), and the same samples go through each path:

* **a** — OpenRLHF's reward server way (``openrlhf/cli/serve_rm.py``, ``RewardModelProxy``):
  transformers ``AutoModelForSequenceClassification``, each request's queries tokenized without
  special tokens (cut at ``--max-len``, as its ``--max_len``; the samples are chosen to fit, and
  a cut stops the run) and run as one left-padded batch (its ``--batch_size`` default: the
  request's size); OpenRLHF's trainer sends one sample per request by default, and the server's
  handler computes in its event loop, so requests are served one after another. Run in this
  process with no HTTP in between (a floor on its time).
* **b** — vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
  the pooling runner over the same folder), ``POST /classify`` one sample per request with
  ``use_activation: false`` (raw reward; the field newer vLLM reads, where verl's reward loop
  sends ``activation: false``, which the CPU build ignores), many in flight, as verl sends them.
* **c** — ``rmserve serve --policy-template rm``, ``POST /get_reward`` one sample per request
  (OpenRLHF's default), the same number in flight as b.
* **d** — ``rmserve serve``, rmserve's TRL reward function
  (:class:`rmserve.client.trl_reward.RMServeReward`) called once per step: samples grouped by
  prompt, so a prompt's G completions share its prefix-cache blocks.
* **e** — d again while ``rmserve eval`` scores RM-Bench (``--data``) on the same server, as two
  users of one users file (made with :func:`rmserve.server.sharing.auth.add_user`, the code of
  ``rmserve users add``): ``trainer`` (``--trainer-weight``, default 3) sends the steps with its
  token, ``eval`` (``--eval-weight``, default 1) runs ``rmserve eval --token-file
  --priority`` ``--eval-priority`` (default ``interactive``, as the trainer routes send: the share
  between them is then the weights'; ``batch`` with ``--interactive-boost B`` > 1 on the server
  gives the trainer B times its weight's share while both have work). Its timed steps take
  turns: *solo* ones with the evaluation paused (SIGSTOP, its groups at the server drained)
  and *contended* ones with it running (its groups at the server again); an evaluation that
  ends before the last step does stops the run with an error. Its prompts start with
  ``(training) `` (:func:`apart_from_eval`): the evaluation scores the same RM-Bench prompts
  in the same order, and would otherwise put a step's tokens in the prefix cache before it.

The servers of b to e run the same engine settings (float32, eager mode, block size 32, prefix
caching, ``--max-num-seqs``, a KV cache of ``--kv-cache-gib`` GiB, max model length
``--max-len``); the report states them.

Samples: RM-Bench groups in data order (one user turn; the rendered length ≤ the model's max length); a
prompt's 8 completions are its 6 responses and the first half of its first chosen and first
rejected one (other counts take the first G of those). When the steps need more prompts than the
data holds they start again from the first, every completion marked `` [r]`` for round r, so no
sample repeats (nothing is answered from a result cache).

Paths a to d run interleaved: all their servers are up at once (an idle one uses about 1 % of
a core), each scores the warm-up step, then every step goes through every path before the
next step starts, the paths' order rotated by one each step. A slow stretch of a shared
machine then falls on all paths alike, not on whichever ran then (sequential runs of one path
on this 2-core machine differed by up to 25 %). Path e runs after them, alone; its solo and
contended steps take turns on its one server, for the same reason.

Reported per path: samples/s over its timed steps (the sum of its step times: engine start
and the warm-up step excluded), step latency p50/p99 (a step's first sample sent to its last
reward), parity (each path's rewards against path a's, the largest absolute difference), CPU
time per sample of the client, the server's own process and its engine (:func:`process_cpu_s`), and
for b, c and d the tokens their engine served from its prefix cache over the timed steps
(the server's own counters) beside the most a prefix cache could serve within a step
(:func:`shareable_tokens`): whether grouping by prompt (d) saves engine work over one sample
per request (c) shows there.

Targets (recorded, not asserted): c ≥ 2× a and ≥ 1.0× b; d ≥ 1.2× c; e's contended step p99
≤ 1.5× its solo step p99.

Usage::

    python benchmarks/rlhf_steps.py --model /tmp/demo-rm --steps 20 --prompts 64 --completions 8 \
        --paths a,b,c,d,e --tag grpo
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from throughput import machine_info, percentile_ms, versions  # noqa: E402

from rmserve.datasets import load_rmbench  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "rm-bench"


# --- samples ----------------------------------------------------------------------------------


def make_steps(model: str, data: Path, *, steps: int, prompts: int, completions: int, max_len: int,
               warmup: bool = True) -> tuple[list[list[dict[str, Any]]], int]:
    """The steps' samples (a warm-up step first when ``warmup``), each sample a dict with
    ``prompt``, ``completion`` (texts) and ``text`` (the RM's chat template rendered, as the
    policy would send it when both templates are the same), and the number of data groups
    left out as over ``max_len`` tokens.

    Raises:
        SystemExit: ``completions`` is not between 1 and 8, or no data group fits.
    """
    from transformers import AutoTokenizer

    if not 1 <= completions <= 8:
        raise SystemExit(f"--completions {completions}: must be between 1 and 8")
    tokenizer = AutoTokenizer.from_pretrained(model)
    groups = [g for g in load_rmbench(data).groups]
    rows: list[tuple[str, list[str]]] = []
    skipped = 0
    for group in groups:
        if len(group.messages) != 1:
            skipped += 1
            continue
        prompt = group.messages[-1].content
        chosen, rejected = group.responses[:group.num_chosen], group.responses[group.num_chosen:]
        answers = [*chosen, *rejected, chosen[0][: len(chosen[0]) // 2], rejected[0][: len(rejected[0]) // 2]]
        answers = answers[:completions]
        longest = max(len(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": a + " [99]"}], tokenize=True,
            return_dict=False))  # the token ids (transformers 5 returns a BatchEncoding by default)
            for a in answers)
        if longest > max_len:
            skipped += 1
            continue
        rows.append((prompt, answers))
    if not rows:
        raise SystemExit(f"{data}: no RM-Bench group of one user turn fits in --max-len {max_len} tokens "
                         f"({skipped} left out)")
    out: list[list[dict[str, Any]]] = []
    n_steps = steps + (1 if warmup else 0)
    prefix_len: dict[str, int] = {}
    for s in range(n_steps):
        step = []
        for j in range(prompts):
            k = s * prompts + j
            prompt, answers = rows[k % len(rows)]
            mark = f" [{k // len(rows)}]" if k >= len(rows) else ""
            for answer in answers:
                completion = answer + mark
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False)
                if prompt not in prefix_len:
                    prefix_len[prompt] = len(tokenizer.apply_chat_template(
                        [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True,
                        return_dict=False))
                ids = array("I", tokenizer(text, add_special_tokens=False)["input_ids"])
                step.append({"prompt": prompt, "completion": completion, "text": text, "ids": ids,
                             "prompt_tokens": prefix_len[prompt]})
        out.append(step)
    return out, skipped


# --- paths ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Runner:
    """One path, ready to score steps: ``run_step(step)`` returns the step's rewards in sample
    order; ``prefix_cache()``, when the path has a server that counts its prefix cache, reads
    its cumulative counters (:func:`prefix_counters`)."""

    run_step: Callable[[list[dict[str, Any]]], list[float]]
    prefix_cache: Callable[[], dict[str, int]] | None = None
    server_pid: int | None = None


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system, from ``/proc``) used so far by process ``pid`` itself and by
    all its live descendants together; a process that ended in between counts 0. Linux only.

    Returns:
        ``(own_s, descendants_s)``.
    """
    def one(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: stat fields 14 and 15

    def children(p: int) -> list[int]:
        kids: list[int] = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                kids += [int(k) for k in (task / "children").read_text().split()]
        return kids

    descendants, todo = 0.0, children(pid)
    while todo:
        kid = todo.pop()
        descendants += one(kid)
        todo += children(kid)
    return one(pid), descendants


@contextlib.contextmanager
def open_openrlhf(model: str, *, max_len: int, request_size: int = 1) -> Iterator[Runner]:
    """Path a: OpenRLHF's ``RewardModelProxy.get_reward`` per request of ``request_size`` samples,
    each cut at ``max_len`` tokens as its server cuts them.

    Raises (from its ``run_step``):
        SystemExit: a sample was cut (the samples were chosen to fit: its reward would not be
            the other paths').
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rm = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch.float32).eval()
    rm.config.pad_token_id = tokenizer.pad_token_id

    def score(texts: list[str]) -> list[float]:
        full = tokenizer(texts, add_special_tokens=False)["input_ids"]
        if max(map(len, full)) > max_len:
            raise SystemExit(f"path a: a sample is {max(map(len, full))} tokens, over --max-len {max_len}")
        batch = tokenizer(texts, return_tensors="pt", add_special_tokens=False, padding=True, truncation=True,
                          max_length=max_len)
        with torch.inference_mode():
            logits = rm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return logits[:, 0].tolist()

    def run_step(step: list[dict[str, Any]]) -> list[float]:
        rewards: list[float] = []
        for i in range(0, len(step), request_size):
            rewards += score([s["text"] for s in step[i:i + request_size]])
        return rewards

    yield Runner(run_step)


IDLE_CORES = 0.05
"""A server is idle once its processes use under this many cores (:func:`wait_idle`)."""


def wait_idle(pid: int, *, window_s: float = 0.1, cap_s: float = 5.0) -> float:
    """Wait until process ``pid`` and its descendants use under :data:`IDLE_CORES` cores over
    ``window_s`` seconds, at most ``cap_s`` seconds; returns the seconds waited.

    A vLLM engine keeps a core busy for about a second after its last request: the worker's
    shared-memory reader polls before it parks (``SpinCondition.busy_loop_s`` in
    ``vllm/distributed/device_communicators/shm_broadcast.py``, 1 s). Measured here on the
    demo model: 0.97–1.01 CPU s in the 3 s after each step, on vLLM's own server and on
    rmserve's alike. A path started during that second shares the cores with it."""
    began = time.perf_counter()
    while time.perf_counter() - began < cap_s:
        before = sum(process_cpu_s(pid))
        time.sleep(window_s)
        if sum(process_cpu_s(pid)) - before < IDLE_CORES * window_s:
            break
    return time.perf_counter() - began


def interleaved_steps(runners: dict[str, Runner], steps: list[list[dict[str, Any]]],
                      on_step: Callable[[int, str, float], None] | None = None) -> dict[str, dict[str, Any]]:
    """Score ``steps`` (``steps[0]`` the warm-up) through every runner, step by step: each path
    first scores the warm-up, then step ``i`` goes through every path before step ``i + 1``,
    the paths' order rotated by one each step (step 0: a, b, c …; step 1: b, c, …, a), so a
    slow stretch of the machine falls on all paths alike rather than on the one that ran then.
    After each step of a path with a server, the next path waits until that server is idle
    (:func:`wait_idle`, not timed): otherwise the path after a vLLM-backed one would share the
    cores with its engine's idle polling for its first second, and the path after path a
    would not.

    Returns:
        Per path: ``wall_s`` (the sum of its step times, seconds), ``step_s`` (each step's),
        ``rewards`` (in sample order), ``cpu_s``: CPU seconds spent during its timed steps by
        this process (``client``: the path's client, or path a's model) and, for a runner with
        a server, by the server's own process (``server``: HTTP, rendering, tokenization) and
        its descendants (``engine``: vLLM's engine core and worker); and, for a runner with counters,
        ``prefix_cache``: the change of its ``queries`` and ``hits`` over its timed steps.
    """
    names = list(runners)
    for name in names:
        runners[name].run_step(steps[0])
        if runners[name].server_pid:
            wait_idle(runners[name].server_pid)
    before = {n: r.prefix_cache() for n, r in runners.items() if r.prefix_cache}
    results: dict[str, dict[str, Any]] = {
        n: {"wall_s": 0.0, "step_s": [], "rewards": [],
            "cpu_s": {"client": 0.0, **({"server": 0.0, "engine": 0.0} if runners[n].server_pid else {})}}
        for n in names}
    for i, step in enumerate(steps[1:]):
        for name in names[i % len(names):] + names[:i % len(names)]:
            pid = runners[name].server_pid
            server0 = process_cpu_s(pid) if pid else None
            c0, t0 = time.process_time(), time.perf_counter()
            rewards = runners[name].run_step(step)
            took = time.perf_counter() - t0
            cpu = results[name]["cpu_s"]
            cpu["client"] += time.process_time() - c0
            if server0 is not None:
                server1 = process_cpu_s(pid)
                cpu["server"] += server1[0] - server0[0]
                cpu["engine"] += server1[1] - server0[1]
                results[name]["settle_s"] = results[name].get("settle_s", 0.0) + wait_idle(pid)
            results[name]["rewards"] += rewards
            results[name]["step_s"].append(took)
            results[name]["wall_s"] += took
            if on_step:
                on_step(i, name, took)
    for name, counts in before.items():
        after = runners[name].prefix_cache()
        results[name]["prefix_cache"] = {k: after[k] - counts[k] for k in ("queries", "hits")}
    return results


RMSERVE_PREFIX = ("rmserve_engine_prefix_cache_queries_total", "rmserve_engine_prefix_cache_hits_total")
VLLM_PREFIX = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def prefix_counters(metrics_url: str, names: tuple[str, str]):
    """A reader of a server's cumulative prefix-cache token counters from its Prometheus text
    (``names``: the queries and the hits series, summed over their labels); returns a
    callable giving ``{"queries": int, "hits": int}``.

    Raises:
        SystemExit: the page lacks a series (the engine does not count its prefix cache).
    """
    def read() -> dict[str, int]:
        async def fetch() -> str:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                async with session.get(metrics_url) as reply:
                    if reply.status != 200:
                        raise SystemExit(f"{metrics_url}: {reply.status} {await reply.text()}")
                    return await reply.text()

        text = asyncio.run(fetch())
        out = {}
        for key, name in zip(("queries", "hits"), names, strict=True):
            total = series_sum(text, name)
            if total is None:
                raise SystemExit(f"{metrics_url}: no {name} series")
            out[key] = int(total)
        return out

    return read


def series_sum(text: str, name: str) -> float | None:
    """The sum of every sample of series ``name`` (any labels) in Prometheus text ``text``;
    None when it has none. ``name_other`` series and comment lines are not read."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{")]
    return sum(values) if values else None


def shareable_tokens(steps: list[list[dict[str, Any]]], block_size: int) -> dict[str, int]:
    """Tokens of the timed steps (``steps[1:]``; ``steps[0]`` is the warm-up) and the most a
    prefix cache of ``block_size``-token blocks can serve them, samples taken in order: each
    sample's longest run of leading full blocks seen before (every full block of an earlier
    sample counts, its last one too), at most ``len - 1`` tokens (the last token is always
    computed). Within a step this is :func:`throughput.trie_bound_tokens` of the step's token
    ids, computed here by block hashes so that it also runs across all steps.

    Returns:
        ``tokens``; ``shareable``: blocks seen before in the sample's own step (a GRPO step's
        prompts are new to the reward model, so this is what grouping by prompt can save),
        ``prompt_shareable`` of them within a repeated prompt's rendered turn (the chat
        template up to the assistant's turn), the rest completions that share a start (this
        load's two halved answers); ``shareable_across_steps``: blocks seen before anywhere,
        the warm-up included (the steps start again from the first prompt when the data runs
        out), which only a cache holding every earlier step could serve.
    """
    out = {"tokens": 0, "shareable": 0, "prompt_shareable": 0, "shareable_across_steps": 0}
    ever: set[int] = set()
    for index, step in enumerate(steps):
        in_step: set[int] = set()
        prompts: set[str] = set()
        for sample in step:
            ids = sample["ids"]
            chain, hit, hit_ever, matching, matching_ever = 0, 0, 0, True, True
            servable = (len(ids) - 1) // block_size  # blocks a hit may cover: the last token is computed
            for b in range(len(ids) // block_size):  # every full block is cached once computed
                chain = hash((chain, tuple(ids[b * block_size:(b + 1) * block_size])))
                if b < servable:
                    matching = matching and chain in in_step
                    matching_ever = matching_ever and chain in ever
                    hit += block_size if matching else 0
                    hit_ever += block_size if matching_ever else 0
                in_step.add(chain)
                ever.add(chain)
            if index > 0:
                out["tokens"] += len(ids)
                out["shareable"] += hit
                out["shareable_across_steps"] += hit_ever
                if sample["prompt"] in prompts:
                    out["prompt_shareable"] += min(hit, sample["prompt_tokens"] // block_size * block_size)
            prompts.add(sample["prompt"])
    return out


async def _post_all(url: str, bodies: list[dict[str, Any]], inflight: int, read) -> list[float]:
    """POST each body (``inflight`` at a time); ``read(reply)`` gives the reward. Any HTTP error raises."""
    gate = asyncio.Semaphore(inflight)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(body: dict[str, Any]) -> float:
            async with gate, session.post(url, json=body) as reply:
                if reply.status != 200:
                    raise SystemExit(f"{url}: {reply.status} {await reply.text()}")
                return read(await reply.json())

        return list(await asyncio.gather(*(one(b) for b in bodies)))


@contextlib.contextmanager
def open_vllm_classify(model: str, *, inflight: int, work: Path, engine: dict[str, Any]) -> Iterator[Runner]:
    """Path b: vLLM's API server, ``POST /classify`` one raw-valued sample per request, with
    the engine settings ``engine`` (:func:`engine_settings`); its log ``work/server-b.log``."""
    from testkit.openai_server import vllm_openai_server

    extra = ("--kv-cache-memory-bytes", str(engine["kv_cache_memory_bytes"]))
    with vllm_openai_server(Path(model), served_model_name="rm", max_model_len=engine["max_model_len"],
                            max_num_seqs=engine["max_num_seqs"], start_timeout_s=1200.0, extra_args=extra,
                            log_path=work / "server-b.log") as base:
        url = base.removesuffix("/v1") + "/classify"

        def run_step(step: list[dict[str, Any]]) -> list[float]:
            bodies = [{"model": "rm", "input": s["text"], "use_activation": False, "add_special_tokens": False}
                      for s in step]
            return asyncio.run(_post_all(url, bodies, inflight, lambda r: float(r["data"][0]["probs"][0])))

        yield Runner(run_step, prefix_counters(base.removesuffix("/v1") + "/metrics", VLLM_PREFIX),
                     vllm_openai_server.last_pid)


def engine_settings(*, max_len: int, max_num_seqs: int, kv_cache_gib: float) -> dict[str, Any]:
    """The engine settings of every server (b to e), as ``EngineConfig`` fields (vLLM's own
    server gets the same as flags). On the CPU build the KV cache is ``VLLM_CPU_KVCACHE_SPACE``
    GiB, which :func:`main` sets to ``kv_cache_gib`` for every server (it overrides
    ``kv_cache_memory_bytes`` there)."""
    return {"dtype": "float32", "enforce_eager": True, "block_size": 32, "enable_prefix_caching": True,
            "max_num_seqs": max_num_seqs, "kv_cache_memory_bytes": int(kv_cache_gib * (1 << 30)),
            "max_model_len": max_len}


@contextlib.contextmanager
def rmserve_server(model: str, work: Path, name: str, engine: dict[str, Any], *extra: str):
    """``rmserve serve MODEL`` with the engine settings ``engine`` in a child process, its log
    ``work/NAME.log``; yields its URL and process id."""
    from rmserve.pipelines.launch import ServeOptions, ServerProcess, free_loopback_port

    options = ServeOptions(model=model, engine_options=engine, extra_args=("--result-cache-groups", "0", *extra))
    port = free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    with ServerProcess(options.argv("127.0.0.1", port), url=url, log_path=work / f"{name}.log", name=name,
                       startup_timeout_s=1800.0, stop_grace_s=30.0) as server:
        server.wait_ready()
        yield url, server.process.pid


@contextlib.contextmanager
def open_get_reward(model: str, *, inflight: int, work: Path, engine: dict[str, Any]) -> Iterator[Runner]:
    """Path c: rmserve ``POST /get_reward``, one sample per request (OpenRLHF's default)."""
    with rmserve_server(model, work, "server-c", engine, "--policy-template", "rm") as (url, pid):
        def run_step(step: list[dict[str, Any]]) -> list[float]:
            bodies = [{"query": [s["text"]], "prompts": [s["prompt"]]} for s in step]
            return asyncio.run(_post_all(f"{url}/get_reward", bodies, inflight, lambda r: float(r["rewards"][0])))

        yield Runner(run_step, prefix_counters(f"{url}/metrics", RMSERVE_PREFIX), pid)


@contextlib.contextmanager
def open_trl(model: str, *, work: Path, engine: dict[str, Any]) -> Iterator[Runner]:
    """Path d: rmserve's TRL reward function, one call per step."""
    from rmserve.client.trl_reward import RMServeReward

    with rmserve_server(model, work, "server-d", engine) as (url, pid):
        reward = RMServeReward(server=url)
        try:
            yield Runner(_trl_step(reward), prefix_counters(f"{url}/metrics", RMSERVE_PREFIX), pid)
        finally:
            reward.close()


def _trl_step(reward):
    def run_step(step: list[dict[str, Any]]) -> list[float]:
        values = reward([s["prompt"] for s in step], [s["completion"] for s in step])
        if any(v is None for v in values):
            raise SystemExit("a sample was not scored")
        return [float(v) for v in values]

    return run_step


EVAL_APART = "(training) "
"""What :func:`apart_from_eval` puts before each prompt of path e's steps."""


def apart_from_eval(steps: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Path e's steps: each sample's prompt starts with :data:`EVAL_APART`.

    The evaluation beside path e scores RM-Bench in data order, the order the steps take their
    prompts from, with the same chat template, so without a mark a step could find its
    prompt's and 3 chosen and 3 rejected completions' tokens already in the prefix cache,
    computed by the evaluation moments before (a new-user trial of 2 steps of 4 × 8 saw a solo
    step take 63 ms against 344–588 ms on path d). Marked at the start of the user turn, a
    step shares no full block with the evaluation past the template's first tokens (the demo
    model's template writes 2 before the user text), and its completions still share their
    prompt within the step as d's do. The rewards are then not path a's: e has no parity
    figure. Only the prompt and the completion are kept (all path e sends): the other fields
    (``text``, ``ids``, ``prompt_tokens``) describe the unmarked prompt and would be wrong."""
    return [[{"prompt": EVAL_APART + sample["prompt"], "completion": sample["completion"]} for sample in step]
            for step in steps]


def make_users(work: Path, *, trainer_weight: float, eval_weight: float) -> tuple[Path, str, Path]:
    """A fresh users file in ``work`` with users ``trainer`` and ``eval`` (the project's own
    :func:`~rmserve.server.sharing.auth.add_user`, as ``rmserve users add``); returns (the file,
    the trainer's token, a file holding the eval's token, mode 0600)."""
    from rmserve.server.sharing.auth import add_user

    users = work / "users-e.jsonl"
    users.unlink(missing_ok=True)
    trainer_token, _ = add_user(users, "trainer", weight=trainer_weight)
    eval_token, _ = add_user(users, "eval", weight=eval_weight)
    token_file = work / "eval-e.token"
    token_file.unlink(missing_ok=True)
    token_file.touch(mode=0o600)
    token_file.write_text(eval_token + "\n")
    return users, trainer_token, token_file


async def _queued_groups(url: str, token: str) -> int:
    """The groups the token's user has queued or in flight at the server (``GET /v1/queue``)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(f"{url}/v1/queue", headers={"Authorization": f"Bearer {token}"}) as reply:
            if reply.status != 200:
                raise SystemExit(f"{url}/v1/queue: {reply.status} {await reply.text()}")
            body = await reply.json()
    return sum(u["queued_groups"] + u["inflight_groups"] for u in body["users"])


def path_with_eval(model: str, steps: list[list[dict[str, Any]]], *, work: Path, engine: dict[str, Any], data: Path,
                   trainer_weight: float, eval_weight: float, eval_priority: str = "interactive",
                   interactive_boost: float = 1.0, scheduling_policy: str = "fcfs",
                   wait_eval_s: float = 600.0) -> dict[str, Any]:
    """Path e: d's steps as user ``trainer`` while ``rmserve eval`` scores ``data`` as user
    ``eval`` on the same server (:func:`make_users`), solo and contended steps taking turns.

    The timed steps alternate: an odd one (1st, 3rd, …) runs *solo*: the evaluation's process
    is stopped (SIGSTOP) and the step starts once the server has none of the eval user's groups
    queued or in flight; an even one runs *contended*: the evaluation is continued (SIGCONT)
    and the step starts once the server has its groups again. Both kinds then ran on the one
    server, at interleaved times, so their ratio does not measure a drift of the machine.

    Returns:
        ``wall_s``, ``step_s`` and ``samples`` of the contended steps (as :func:`interleaved_steps`),
        ``solo``: the same for the solo steps, ``rewards``: every timed step's, in step order,
        and ``eval_running_throughout`` (True: the evaluation had not ended by the last step).

    Raises:
        SystemExit: the evaluation ended before it had work at the server, or before the last
            step did (its exit code and the tail of its log are in the message), or its groups
            did not drain or come back within ``wait_eval_s`` seconds.
    """
    from rmserve.client.trl_reward import RMServeReward

    users, trainer_token, eval_token_file = make_users(work, trainer_weight=trainer_weight, eval_weight=eval_weight)
    eval_token = eval_token_file.read_text().strip()
    eval_log = work / "eval-e.log"

    def eval_failure(evaluation: subprocess.Popen, when: str) -> SystemExit:
        tail = eval_log.read_text(errors="replace")[-2000:]
        return SystemExit(f"path e: the evaluation ended (exit code {evaluation.returncode}) {when}, so the steps "
                          f"were not all timed beside it; make it longer (more data) or the steps fewer. "
                          f"Its log ({eval_log}) ends:\n{tail}")

    def wait_for(url: str, evaluation: subprocess.Popen, has_work: bool, when: str) -> None:
        began = time.monotonic()
        while (asyncio.run(_queued_groups(url, eval_token)) > 0) != has_work:
            if evaluation.poll() is not None:
                raise eval_failure(evaluation, when)
            if time.monotonic() - began > wait_eval_s:
                raise SystemExit(f"path e: the evaluation's groups did not {'arrive' if has_work else 'drain'} "
                                 f"within {wait_eval_s:.0f} s ({eval_log})")
            time.sleep(0.1)

    with rmserve_server(model, work, "server-e", engine, "--users-file", str(users),
                        "--fair-share-interactive-boost", str(interactive_boost),
                        "--scheduling-policy", scheduling_policy) as (url, _pid):
        reward = RMServeReward(server=url, token=trainer_token)
        evaluation = None
        try:
            run_step = _trl_step(reward)
            run_step(steps[0])
            shutil.rmtree(work / "eval-e", ignore_errors=True)  # a fresh evaluation, not a resumed one
            with open(eval_log, "wb") as log:
                evaluation = subprocess.Popen(
                    [sys.executable, "-m", "rmserve.cli", "eval", "--server", url, "--token-file", str(eval_token_file),
                     "--bench", "rm-bench", "--data", str(data), "--out", str(work / "eval-e"), "--overwrite",
                     "--no-store", "--resamples", "0", "--priority", eval_priority],
                    stdout=subprocess.DEVNULL, stderr=log)
            wait_for(url, evaluation, has_work=True, when="before it sent work")
            timed = {True: {"wall_s": 0.0, "step_s": [], "samples": 0},
                     False: {"wall_s": 0.0, "step_s": [], "samples": 0}}
            rewards_in_order: list[float] = []
            for i, step in enumerate(steps[1:]):
                contended = i % 2 == 1
                evaluation.send_signal(signal.SIGCONT if contended else signal.SIGSTOP)
                wait_for(url, evaluation, has_work=contended,
                         when="before the last training step" if contended else "while paused")
                t0 = time.perf_counter()
                rewards = run_step(step)
                took = time.perf_counter() - t0
                kind = timed[contended]
                rewards_in_order += rewards
                kind["step_s"].append(took)
                kind["wall_s"] += took
                kind["samples"] += len(step)
            evaluation.send_signal(signal.SIGCONT)
            if evaluation.poll() is not None:
                raise eval_failure(evaluation, "before the last training step")
            return {**timed[True], "rewards": rewards_in_order, "solo": timed[False], "eval_running_throughout": True}
        finally:
            reward.close()
            if evaluation is not None and evaluation.poll() is None:
                evaluation.send_signal(signal.SIGCONT)  # a stopped process would not act on SIGTERM
                evaluation.terminate()
                evaluation.wait(60)


# --- report -----------------------------------------------------------------------------------


TITLES = {
    "a": "OpenRLHF's server way: transformers, one sample per request, served one after another (in-process, no HTTP)",
    "b": "vLLM's API server: POST /classify, one sample per request, raw values",
    "c": "rmserve: POST /get_reward (OpenRLHF's shape), one sample per request",
    "d": "rmserve: TRL reward function, one call per step, grouped by prompt",
    "e": "d while rmserve eval scores RM-Bench on the same server (users trainer and eval)",
}
SOLO_TITLE = "e's solo steps: the same server, the evaluation paused (taking turns with e's steps)"


def summarize(name: str, result: dict[str, Any], n_samples: int, reference: list[float] | None) -> dict[str, Any]:
    """One report row: samples/s, step p50/p99 (ms), largest difference from path a's rewards,
    CPU ms a sample; for path e also its solo steps' samples/s and step p50/p99
    (``solo_*``). ``n_samples``: the timed steps' samples, unless ``result`` has ``samples``."""
    n_samples = result.get("samples", n_samples)
    row = {
        "path": name,
        "what": TITLES[name],
        "samples": n_samples,
        "wall_s": round(result["wall_s"], 2),
        "samples_per_s": round(n_samples / result["wall_s"], 2),
        "step_p50_ms": round(percentile_ms(result["step_s"], 50)),
        "step_p99_ms": round(percentile_ms(result["step_s"], 99)),
        "max_abs_diff_vs_a": None,
        "step_s": [round(x, 4) for x in result["step_s"]],
    }
    if reference is not None:
        row["max_abs_diff_vs_a"] = max(abs(x - y) for x, y in zip(result["rewards"], reference, strict=True))
    if "prefix_cache" in result:
        hits, queries = result["prefix_cache"]["hits"], result["prefix_cache"]["queries"]
        row["prefix_cache_hits"] = hits
        row["prefix_cache_queries"] = queries
        row["prefix_cache_hit_share"] = round(hits / queries, 4) if queries else None
    if "cpu_s" in result:
        row["cpu_ms_per_sample"] = {k: round(1000 * v / n_samples, 3) for k, v in result["cpu_s"].items()}
    if "settle_s" in result:
        row["idle_wait_s"] = round(result["settle_s"], 2)
    if "solo" in result:
        solo = result["solo"]
        row["solo_samples"] = solo["samples"]
        row["solo_wall_s"] = round(solo["wall_s"], 2)
        row["solo_samples_per_s"] = round(solo["samples"] / solo["wall_s"], 2)
        row["solo_step_p50_ms"] = round(percentile_ms(solo["step_s"], 50))
        row["solo_step_p99_ms"] = round(percentile_ms(solo["step_s"], 99))
    if "eval_running_throughout" in result:
        row["eval_running_throughout"] = result["eval_running_throughout"]
    return row


def targets(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets as measured ratios (only for the paths that ran)."""
    def rate(p: str) -> float:
        return rows[p]["samples_per_s"]

    checks = []
    for what, num, den, floor in (
        ("c/a samples/s ≥ 2.0", "c", "a", 2.0), ("c/b samples/s ≥ 1.0", "c", "b", 1.0),
        ("d/c samples/s ≥ 1.2", "d", "c", 1.2),
    ):
        if num not in rows or den not in rows:
            continue
        ratio = rate(num) / rate(den)
        check = {"target": what, "measured": round(ratio, 3), "holds": ratio >= floor}
        # the same ratio step by step (paths a-d ran each step back to back)
        steps_num, steps_den = rows[num].get("step_s"), rows[den].get("step_s")
        if steps_num and steps_den and len(steps_num) == len(steps_den):
            paired = sorted(d / n for n, d in zip(steps_num, steps_den, strict=True))  # samples/s ratio = time ratio inverted
            check["per_step_median"] = round(float(np.median(paired)), 3)
            check["per_step_quartiles"] = [round(float(q), 3) for q in np.percentile(paired, [25, 75])]
        checks.append(check)
    if "e" in rows and rows["e"].get("solo_step_p99_ms"):
        ratio = rows["e"]["step_p99_ms"] / rows["e"]["solo_step_p99_ms"]
        checks.append({"target": "e contended/solo step p99 ≤ 1.5", "measured": round(ratio, 3), "holds": ratio <= 1.5})
    return checks


def markdown(report: dict[str, Any]) -> str:
    """The record's Markdown: set-up, the path table, the prefix-cache bound, the targets,
    provenance. Path e's set-up is described only when it ran."""
    cfg = report["config"]
    ran_e = "e" in report["rows"]
    shared = [p for p in report["rows"] if p != "e"]
    path_e = (f" Path e: users `trainer` (weight {cfg['trainer_weight']}) and `eval` (weight "
              f"{cfg['eval_weight']}) of one users file, the trainer `interactive`, the eval "
              f"`{cfg.get('eval_priority', 'interactive')}` (server --fair-share-interactive-boost "
              f"{cfg.get('interactive_boost', 1.0)}, --scheduling-policy {cfg.get('scheduling_policy', 'fcfs')}); "
              f"path d without a users file. Path e's timed steps took turns: the 1st, 3rd, … solo (the "
              f"evaluation's process stopped and its groups at the server drained), the 2nd, 4th, … contended "
              f"(the evaluation running, its groups at the server); row e is the contended steps, row "
              f"\"e solo\" the others. Path e's prompts start with `{EVAL_APART.strip()}`, so that no step finds "
              f"its tokens in the prefix cache from the evaluation, which scores the same prompts (e's rewards "
              f"are then not a's: no parity figure).") if ran_e else ""
    lines = [
        f"# RLHF-shaped reward load — {report['date']} — {report['machine']}",
        "",
        f"Reward model `{cfg['model']}` (float32); {cfg['steps']} steps of {cfg['prompts']} prompts × "
        f"{cfg['completions']} completions ({cfg['prompts'] * cfg['completions']} samples a step); one warm-up "
        f"step before each path's timing. "
        + (f"Paths {', '.join(shared)} ran interleaved: every step through each of them before the next step, "
           f"their order rotated each step{'; e ran after them, alone' if ran_e else ''}. "
           f"{cfg['inflight']} requests in flight for b and c. " if shared else "Path e alone. ")
        + f"RM-Bench prompts from {cfg['data']} "
        f"({report['skipped_groups']} groups left out: over {cfg['max_len']} tokens or more than one turn); a "
        f"prompt's completions are its responses, then the first halves of its first chosen and first rejected "
        f"response.",
        "",
        f"Engine of every server (b to e): {_engine_text(cfg['engine'])}; path a: transformers, float32, cut at "
        f"{cfg['max_len']} tokens.{path_e}",
        "",
        "*scoring s*: the sum of a path's step times (a step: its first sample sent to its last reward); "
        "samples/s = samples / scoring s."
        + (f" With {cfg['steps']} steps the step p99 is about the slowest step." if cfg["steps"] < 20 else ""),
        "",
        "| path | what | samples | scoring s | samples/s | step p50 ms | step p99 ms | max abs diff vs a "
        "| prefix-cache hits |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["rows"].values():
        diff = "" if row["max_abs_diff_vs_a"] is None else f"{row['max_abs_diff_vs_a']:.1e}"
        hits = (f"{row['prefix_cache_hits']:,} ({row['prefix_cache_hit_share']:.1%})"
                if row.get("prefix_cache_hit_share") is not None else "")
        lines.append(f"| {row['path']} | {row['what']} | {row['samples']:,} | {row['wall_s']} | "
                     f"{row['samples_per_s']:,} | {row['step_p50_ms']:,} | {row['step_p99_ms']:,} | {diff} | {hits} |")
        if "solo_samples" in row:
            lines.append(f"| e solo | {SOLO_TITLE} | {row['solo_samples']:,} | {row['solo_wall_s']} | "
                         f"{row['solo_samples_per_s']:,} | {row['solo_step_p50_ms']:,} | {row['solo_step_p99_ms']:,} "
                         f"| | |")
    cpu_rows = [r for r in report["rows"].values() if r.get("cpu_ms_per_sample")]
    if cpu_rows:
        lines += ["", "CPU time per sample over the timed steps, ms (from `/proc`): *client* is this process while "
                  "the path ran (path a: its model too), *server* the server's own process (HTTP, rendering, "
                  "tokenization, the engine's client side), *engine* its descendants (vLLM's engine core and worker). On a "
                  "machine with few cores, every CPU millisecond of one comes out of another's.", "",
                  "| path | client | server | engine | total |", "| --- | ---: | ---: | ---: | ---: |"]
        for row in cpu_rows:
            cpu = row["cpu_ms_per_sample"]
            cells = [f"{cpu[k]:.2f}" if k in cpu else "" for k in ("client", "server", "engine")]
            lines.append(f"| {row['path']} | {' | '.join(cells)} | {sum(cpu.values()):.2f} |")
    share = report.get("shareable_tokens")
    if share:
        across = share.get("shareable_across_steps", share["shareable"])
        lines += ["", f"Prefix-cache hits: tokens of the timed steps served from the engine's prefix cache, over all "
                  f"tokens looked up (the servers' own counters: rmserve's `rmserve_engine_prefix_cache_*`, vLLM's "
                  f"`vllm:prefix_cache_*`{'; not counted for e, whose server also scores the evaluation' if ran_e else ''}"
                  f"). The timed steps hold {share['tokens']:,} tokens. Within a step (a GRPO step's prompts are "
                  f"new) a prefix cache can serve at most {share['shareable']:,} "
                  f"({share['shareable'] / share['tokens']:.1%}): each sample's leading full blocks already in its "
                  f"step, {share['prompt_shareable']:,} of them a prompt's turn repeated, the rest completions that "
                  f"start alike (a halved response and the whole one)."
                  + (f" A cache holding every earlier step could serve {across:,}: the steps reuse the data's prompts "
                     f"once it runs out." if across > share["shareable"] else "")]
    if report["targets"]:
        lines += ["", "Targets (benchmarks/README.md, set for a GPU serving engine; on a small CPU machine see the "
                  "README for what they measure). *per step*: the ratio of each step's samples/s, the paths "
                  "having run that step back to back: its median and quartiles.", "",
                  "| target | measured | holds | per step: median (quartiles) |", "| --- | ---: | --- | --- |"]
        lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['holds'] else 'NO'} | "
                  + (f"{t['per_step_median']} ({t['per_step_quartiles'][0]}–{t['per_step_quartiles'][1]})"
                     if "per_step_median" in t else "") + " |" for t in report["targets"]]
    lines += [
        "",
        f"Command: `{report['command']}`",
        f"Machine: {_machine_text(report['machine_info'])}; load average at start {report['load_start']}, "
        f"at end {report['load_end']}.",
        f"Versions: {', '.join(f'{k} {v}' for k, v in report['versions'].items() if v is not None)}",
    ]
    return "\n".join(lines) + "\n"


def _engine_text(engine: dict[str, Any]) -> str:
    return (f"vLLM, {engine['dtype']}, {'eager' if engine['enforce_eager'] else 'compiled'}, block size "
            f"{engine['block_size']}, prefix caching {'on' if engine['enable_prefix_caching'] else 'off'}, "
            f"max_num_seqs {engine['max_num_seqs']}, KV cache {engine['kv_cache_memory_bytes'] / (1 << 30):g} GiB "
            f"(VLLM_CPU_KVCACHE_SPACE on the CPU build), max_model_len {engine['max_model_len']}")


def _machine_text(info: dict[str, Any]) -> str:
    return f"{info['cpu_model']}, {info['usable_cpus']} usable CPUs, {info['memory_gib']} GiB"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Paths: " + "; ".join(f"{k}: {v}" for k, v in TITLES.items()) + ". The report (Markdown and JSON) "
        "goes to --out; the module docstring says how each path is sent and what is reported.")
    parser.add_argument("--model", required=True, help="sequence-classifier reward model folder")
    parser.add_argument("--data", type=Path, default=DATA, help="RM-Bench release folder")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (one warm-up step comes first)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts a step")
    parser.add_argument("--completions", type=int, default=8, help="completions a prompt (1 to 8)")
    parser.add_argument("--inflight", type=int, default=64, help="requests in flight for paths b and c")
    parser.add_argument("--max-len", type=int, default=4096,
                        help="max model length of every server and path a's cut (longer groups left out)")
    parser.add_argument("--max-num-seqs", type=int, default=32, help="vLLM's max_num_seqs for every server")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache of every server, GiB")
    parser.add_argument("--trainer-weight", type=float, default=3.0, help="path e: the trainer user's weight")
    parser.add_argument("--eval-weight", type=float, default=1.0, help="path e: the eval user's weight")
    parser.add_argument("--eval-priority", choices=("interactive", "batch"), default="interactive",
                        help="path e: rmserve eval --priority")
    parser.add_argument("--interactive-boost", type=float, default=1.0,
                        help="path e: the server's --fair-share-interactive-boost")
    parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
                        help="path e: the server's --scheduling-policy (priority: vLLM runs interactive requests first)")
    parser.add_argument("--paths", default="a,b,c,d,e", help="comma-separated, of a,b,c,d,e")
    parser.add_argument("--work", type=Path, default=Path("/tmp/rlhf-steps"),
                        help="folder for the servers' logs, users file and the evaluation's output")
    parser.add_argument("--machine", default="cpu2", help="machine label in the report's name")
    parser.add_argument("--tag", default=None, help="suffix of the report's name")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder the report is written to")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"--data {args.data}: no such folder; give the RM-Bench release folder "
                         f"(the default is ../shared/data/rm-bench beside the checkout)")
    # SIGTERM unwinds like Ctrl-C, so every server started here is stopped (vLLM's own server
    # runs in a session of its own and would outlive a plain kill of this process).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.work.mkdir(parents=True, exist_ok=True)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(TITLES))
    if unknown:
        raise SystemExit(f"--paths: unknown {unknown}; known: {sorted(TITLES)}")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{args.kv_cache_gib:g}"  # every server's KV cache on the CPU build
    engine = engine_settings(max_len=args.max_len, max_num_seqs=args.max_num_seqs, kv_cache_gib=args.kv_cache_gib)
    load_start = os.getloadavg()
    machine = machine_info()  # its load average is the start's
    steps, skipped = make_steps(args.model, args.data, steps=args.steps, prompts=args.prompts,
                                completions=args.completions, max_len=args.max_len)
    n_samples = sum(len(s) for s in steps[1:])
    results: dict[str, dict[str, Any]] = {}
    shared = [p for p in paths if p != "e"]
    with contextlib.ExitStack() as stack:
        runners: dict[str, Runner] = {}
        for name in shared:
            print(f"path {name}: {TITLES[name]} …", file=sys.stderr, flush=True)
            if name == "a":
                runner = open_openrlhf(args.model, max_len=args.max_len)
            elif name == "b":
                runner = open_vllm_classify(args.model, inflight=args.inflight, work=args.work, engine=engine)
            elif name == "c":
                runner = open_get_reward(args.model, inflight=args.inflight, work=args.work, engine=engine)
            else:
                runner = open_trl(args.model, work=args.work, engine=engine)
            runners[name] = stack.enter_context(runner)

        def progress(i: int, name: str, took: float) -> None:
            print(f"step {i + 1}/{args.steps} path {name}: {len(steps[i + 1]) / took:.1f} samples/s",
                  file=sys.stderr, flush=True)

        if runners:
            results.update(interleaved_steps(runners, steps, progress))
    if "e" in paths:
        print(f"path e: {TITLES['e']} …", file=sys.stderr, flush=True)
        results["e"] = path_with_eval(args.model, apart_from_eval(steps), work=args.work, engine=engine, data=args.data,
                                      trainer_weight=args.trainer_weight, eval_weight=args.eval_weight,
                                      eval_priority=args.eval_priority, interactive_boost=args.interactive_boost,
                                      scheduling_policy=args.scheduling_policy)
    for name, result in results.items():
        print(f"path {name}: {result.get('samples', n_samples) / result['wall_s']:.1f} samples/s", file=sys.stderr,
              flush=True)
    results = {name: results[name] for name in paths}
    reference = results["a"]["rewards"] if "a" in results else None
    # e's prompts are marked (apart_from_eval), so its rewards are not a's
    rows = {name: summarize(name, r, n_samples, reference if name not in ("a", "e") else None)
            for name, r in results.items()}
    report = {
        "date": dt.date.today().isoformat(),
        "machine": args.machine,
        "config": {"model": args.model, "data": str(args.data), "steps": args.steps, "prompts": args.prompts,
                   "completions": args.completions, "inflight": args.inflight, "max_len": args.max_len,
                   "engine": engine, "trainer_weight": args.trainer_weight, "eval_weight": args.eval_weight,
                   "eval_priority": args.eval_priority, "interactive_boost": args.interactive_boost,
                   "scheduling_policy": args.scheduling_policy},
        "skipped_groups": skipped,
        "shareable_tokens": shareable_tokens(steps, engine["block_size"]),
        "rows": rows,
        "targets": targets(rows),
        "command": " ".join(["python", "benchmarks/rlhf_steps.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine_info": machine,
        "versions": versions(),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }
    stem = f"{report['date']}-{args.machine}-rlhf-steps{'-' + args.tag if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
