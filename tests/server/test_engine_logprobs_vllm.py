"""The vLLM log-prob engine (a DPO policy or reference) = a transformers forward pass.

One :class:`~rmserve.server.engines.vllm_engine.VLLMLogprobEngine` over the demo policy serves this
module (eager, block 32, 1 GiB KV cache). Real RM-Bench groups (two per domain: chat, code,
safety-refuse, safety-response) are rendered as a DPO policy sees them
(``dpo_prefix_cache.render_dpo_group``: template text tokenized without special tokens, the
answer after the generation prompt) and each answer token's log-prob is compared with
``log_softmax(model(ids).logits)[t - 1, ids[t]]`` of an unbatched transformers forward.

Tolerance: float32 throughout; vLLM's CPU kernels sum in another order than PyTorch's, so
values differ by float32 rounding (observed ≤ 1e-6 here). ``ATOL = 1e-4`` leaves headroom for
other CPUs and stays far below what a defect moves: a log-prob read one position off, or a
row of another model, differs by more than 1 (``test_tolerance_is_meaningful``); the
uninitialised rows of cached positions hold unrelated numbers.

The row-selection logic (which prompt log-probs vLLM computed, which may be borrowed from a
sibling sequence) is also checked by hand on fake outputs (``model`` tests, no engine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from testkit.cancelling import cancel_in_flight
from rmserve.server.config import EngineConfig

from rmserve.datasets import load_rmbench

DEMO_MAX_MODEL_LEN = 4096
"""The demo models' max length (``demo_policy_dir`` and ``demo_reference_dir`` are built with it)."""
VLLM_TEST_BLOCK_SIZE = 32
"""KV-cache block size: vLLM's CPU attention needs a multiple of 32."""
VLLM_TEST_KV_CACHE_BYTES = 1 << 30
"""KV-cache size of the test engine (1 GiB)."""

ATOL = 1e-4
GROUPS_PER_DOMAIN = (0, 7)
"""Which groups of each domain (index within the domain, file order) the engine tests score."""


@pytest.fixture(scope="module")
def dpo_groups(rmbench_dir: Path, demo_policy_dir: Path) -> list[tuple[list[list[int]], list[int]]]:
    """(token ids, answer starts) of two groups per domain, rendered with the demo tokenizer."""
    from dpo_prefix_cache import render_dpo_group
    from transformers import AutoTokenizer

    by_domain: dict[str, list] = {}
    for group in load_rmbench(rmbench_dir).groups:
        by_domain.setdefault(group.domain, []).append(group)
    assert set(by_domain) == {"chat", "code", "safety-refuse", "safety-response"}
    tokenizer = AutoTokenizer.from_pretrained(str(demo_policy_dir))
    return [render_dpo_group(tokenizer, by_domain[d][i]) for d in sorted(by_domain) for i in GROUPS_PER_DOMAIN]


def _forward_logprobs(folder: Path, groups) -> list[list[list[float]]]:
    """``[group][sequence][answer token]`` log-probs from one unbatched transformers forward each."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for token_ids, starts in groups:
            rows = []
            for ids, start in zip(token_ids, starts, strict=True):
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
                positions = torch.arange(start - 1, len(ids) - 1)
                rows.append(logprobs[positions, torch.tensor(ids[start:])].tolist())
            out.append(rows)
    return out


@pytest.fixture(scope="module")
def policy_logprobs(demo_policy_dir, dpo_groups):
    return _forward_logprobs(demo_policy_dir, dpo_groups)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def logprob_engine(demo_policy_dir: Path):
    from rmserve.server.engines.vllm_engine import VLLMLogprobEngine

    config = EngineConfig(
        model=str(demo_policy_dir), kind="dpo", ref_free="sum", dtype="float32", max_model_len=DEMO_MAX_MODEL_LEN,
        block_size=VLLM_TEST_BLOCK_SIZE, kv_cache_memory_bytes=VLLM_TEST_KV_CACHE_BYTES, enforce_eager=True,
    )
    engine = VLLMLogprobEngine(config, str(demo_policy_dir))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


async def _score(engine, groups, *, read_cache: bool, tag: str):
    engine.read_prefix_cache = read_cache
    assert await engine.reset_prefix_cache()
    return [await engine.answer_logprobs(ids, starts, f"{tag}-{i}") for i, (ids, starts) in enumerate(groups)]


def _max_diff(answers, expected) -> float:
    worst = 0.0
    for group, exp_group in zip(answers, expected, strict=True):
        for answer, exp in zip(group, exp_group, strict=True):
            values = answer.logprobs if hasattr(answer, "logprobs") else answer
            assert len(values) == len(exp)
            worst = max([worst, *(abs(a - b) for a, b in zip(values, exp, strict=True))])
    return worst


# --- engine tests --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_info_serves_one_token_less_than_the_engine_length(logprob_engine, demo_policy_dir):
    from rmserve.fingerprint import model_fingerprint

    info = logprob_engine.info()
    assert info.max_model_len == 4096 - 1  # the generate runner keeps room for its one token
    assert info.name == demo_policy_dir.name and info.engine == "vllm" and info.dtype == "float32"
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(str(demo_policy_dir)).chat_template
    assert info.fingerprint == model_fingerprint(str(demo_policy_dir), template, "float32")


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_registered_and_implements_the_protocols(logprob_engine):
    import importlib

    from rmserve.server.engines import protocol
    from rmserve.server.engines.registry import LOGPROB_ENGINES

    module, _, attr = LOGPROB_ENGINES["vllm"].partition(":")
    assert type(logprob_engine) is getattr(importlib.import_module(module), attr)
    for capability in (protocol.LogprobEngine, protocol.SupportsWeightReload, protocol.SupportsRestart,
                       protocol.SupportsPrefixCacheStats):
        assert isinstance(logprob_engine, capability), capability.__name__


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_plain_path_equals_transformers(logprob_engine, dpo_groups, policy_logprobs):
    answers = await _score(logprob_engine, dpo_groups, read_cache=False, tag="plain")
    diff = _max_diff(answers, policy_logprobs)
    print(f"plain path: max |vLLM - transformers| = {diff:.1e} over "
          f"{sum(len(a.logprobs) for g in answers for a in g)} answer tokens")
    assert diff <= ATOL
    assert all(a.num_cached_tokens == 0 for group in answers for a in group)


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_cache_path_reads_the_cache_and_equals_transformers(logprob_engine, dpo_groups, policy_logprobs):
    before = logprob_engine.counters()
    stats_before = logprob_engine.prefix_cache_stats()
    answers = await _score(logprob_engine, dpo_groups, read_cache=True, tag="cache")
    after = logprob_engine.counters()
    diff = _max_diff(answers, policy_logprobs)
    cached = after.cached_tokens - before.cached_tokens
    print(f"cache path: max |vLLM - transformers| = {diff:.1e}; cached {cached} tokens, "
          f"borrowed {after.borrowed_rows - before.borrowed_rows} rows, "
          f"resubmitted {after.resubmitted_sequences - before.resubmitted_sequences} sequences")
    assert diff <= ATOL
    assert cached > 0
    assert sum(a.num_cached_tokens for group in answers for a in group) > 0
    # every group shares its prompt: some sequence of each read cached blocks
    block = logprob_engine.config.block_size
    for (token_ids, starts), group in zip(dpo_groups, answers, strict=True):
        if starts[0] > block:
            assert max(a.num_cached_tokens for a in group) >= block
    stats = logprob_engine.prefix_cache_stats()
    assert stats.hit_tokens - stats_before.hit_tokens == cached
    submitted = sum(len(ids) for token_ids, _ in dpo_groups for ids in token_ids)
    resubmitted = after.resubmitted_tokens - before.resubmitted_tokens
    assert stats.query_tokens - stats_before.query_tokens == submitted + resubmitted


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_cached_answer_rows_come_from_a_plain_request_over_the_prefix(logprob_engine, dpo_groups,
                                                                            policy_logprobs):
    """The same sequence twice: the second request finds answer blocks cached that no sibling
    computed, so the prefix up to its last cached token is sent again without reading the cache."""
    token_ids, starts = dpo_groups[2]  # a code group: long prompt and answers
    ids, start = token_ids[1], starts[1]
    block = logprob_engine.config.block_size
    assert len(ids) - start > 2 * block
    logprob_engine.read_prefix_cache = True
    assert await logprob_engine.reset_prefix_cache()
    (first,) = await logprob_engine.answer_logprobs([ids], [start], "twice-1")
    before = logprob_engine.counters()
    (second,) = await logprob_engine.answer_logprobs([ids], [start], "twice-2")
    after = logprob_engine.counters()
    cached = (len(ids) - 1) // block * block  # everything but the last token, in whole blocks
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == cached
    assert after.resubmitted_sequences - before.resubmitted_sequences == 1
    # rows start … cached were not computed: the plain request covers tokens 0 … cached
    assert after.resubmitted_tokens - before.resubmitted_tokens == cached + 1 < len(ids)
    assert after.borrowed_rows == before.borrowed_rows
    expected = policy_logprobs[2][1]
    assert _max_diff([[first], [second]], [[expected], [expected]]) <= ATOL


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_cancelling_a_group_aborts_its_engine_requests(logprob_engine, dpo_groups, policy_logprobs):
    import asyncio

    heavy = max(range(len(dpo_groups)), key=lambda i: sum(len(ids) for ids in dpo_groups[i][0]))
    token_ids, starts = dpo_groups[heavy]
    logprob_engine.read_prefix_cache = True
    assert await logprob_engine.reset_prefix_cache()
    assert logprob_engine.num_unfinished_requests() == 0
    task = asyncio.create_task(logprob_engine.answer_logprobs(token_ids, starts, "cancel-me"))
    await cancel_in_flight(logprob_engine, task)
    # the engine still serves, and correctly
    answers = await logprob_engine.answer_logprobs(*dpo_groups[0], "after-cancel")
    assert _max_diff([answers], policy_logprobs[:1]) <= ATOL


def test_tolerance_is_meaningful(dpo_groups, policy_logprobs, demo_policy_dir, demo_reference_dir):
    """A row one position off, or another model's rows, move log-probs far beyond ATOL."""
    shifted = [[seq[1:] + [0.0] for seq in group] for group in policy_logprobs]
    assert _max_diff(policy_logprobs, shifted) > 1.0
    other = _forward_logprobs(demo_reference_dir, dpo_groups[:1])
    assert _max_diff(policy_logprobs[:1], other) > 1.0


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_bad_answer_starts_are_refused(logprob_engine, dpo_groups):
    from rmserve.errors import InvalidRequest

    token_ids, starts = dpo_groups[0]
    with pytest.raises(InvalidRequest, match=r"answer_starts\[1\] is 0") as raised:
        await logprob_engine.answer_logprobs(token_ids[:2], [starts[0], 0], "bad-start")
    assert raised.value.field == "answer_starts[1]"
    too_far = len(token_ids[0]) + 1
    with pytest.raises(InvalidRequest, match=f"1…{len(token_ids[0])}"):
        await logprob_engine.answer_logprobs(token_ids[:1], [too_far], "bad-start-2")
    (empty,) = await logprob_engine.answer_logprobs(token_ids[:1], [len(token_ids[0])], "no-answer")
    assert empty.logprobs == ()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_reload_weights_serves_the_other_models_logprobs(logprob_engine, dpo_groups, policy_logprobs,
                                                              demo_policy_dir, demo_reference_dir):
    groups = dpo_groups[:2]
    reference = _forward_logprobs(demo_reference_dir, groups)
    old = logprob_engine.info().fingerprint
    logprob_engine.read_prefix_cache = True
    try:
        info = (await logprob_engine.reload_weights(demo_reference_dir)).info
        assert info.fingerprint != old
        answers = [await logprob_engine.answer_logprobs(ids, s, f"reloaded-{i}") for i, (ids, s) in enumerate(groups)]
        assert _max_diff(answers, reference) <= ATOL
        assert _max_diff(answers, policy_logprobs[:2]) > 1.0
    finally:
        info = (await logprob_engine.reload_weights(demo_policy_dir)).info
    assert info.fingerprint == old
    answers = [await logprob_engine.answer_logprobs(ids, s, f"restored-{i}") for i, (ids, s) in enumerate(groups)]
    assert _max_diff(answers, policy_logprobs[:2]) <= ATOL


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_a_classifier_checkpoint_is_refused_before_the_engine_starts(demo_model_dir, demo_policy_dir):
    from rmserve.server.engines.vllm_engine import VLLMLogprobEngine

    from rmserve.errors import EngineNotReady, ServerFault

    config = EngineConfig(model=str(demo_policy_dir), kind="dpo", ref_model=str(demo_model_dir), dtype="float32")
    engine = VLLMLogprobEngine(config, str(demo_model_dir))
    message = (f"ref_model: {str(demo_model_dir)!r} has architectures ['LlamaForSequenceClassification']; kind dpo "
               "needs a causal LM with an LM head (*ForCausalLM or *LMHeadModel); it is a reward classifier: serve it "
               "with --kind classifier, or give a DPO-trained causal LM")
    with pytest.raises(ServerFault, match=f"^{re.escape(message)}$"):
        await engine.start()
    with pytest.raises(EngineNotReady):
        engine.info()


# --- the row logic on fake outputs (no engine) -----------------------------------------------


@dataclass
class _Logprob:
    logprob: float


def _rows(ids, values, *, garbage_until=0, layout="full"):
    """A fake ``prompt_logprobs``: entry t = {ids[t]: values[t]}; entries 1…garbage_until hold a
    wrong token (uninitialised rows); layout ``computed`` drops them instead (v2 runner)."""
    entries = [None]
    for t in range(1, len(ids)):
        entries.append({ids[t] + 1000 if t <= garbage_until else ids[t]: _Logprob(values[t])})
    if layout == "computed":
        return [None, *entries[garbage_until + 1:]]
    return entries


@pytest.mark.model
def test_computed_rows_reads_both_layouts():
    from rmserve.server.engines.vllm_engine import computed_rows

    ids = list(range(10, 20))
    values = [float(-t) for t in range(10)]
    full = _rows(ids, values, garbage_until=4)
    assert computed_rows(full, ids, 4, first=2) == {t: float(-t) for t in range(5, 10)}
    assert computed_rows(full, ids, 4, first=7) == {7: -7.0, 8: -8.0, 9: -9.0}
    computed = _rows(ids, values, garbage_until=4, layout="computed")
    assert len(computed) == 10 - 4
    assert computed_rows(computed, ids, 4, first=1) == {t: float(-t) for t in range(5, 10)}
    assert computed_rows(_rows(ids, values), ids, 0, first=1) == {t: float(-t) for t in range(1, 10)}


@pytest.mark.model
def test_computed_rows_refuses_rows_it_cannot_place():
    from rmserve.server.engines.vllm_engine import computed_rows

    from rmserve.errors import EngineError

    ids = list(range(10, 20))
    values = [0.0] * 10
    with pytest.raises(EngineError, match="7 prompt log-prob rows for a 10-token sequence with 2 cached"):
        computed_rows(_rows(ids, values)[:7], ids, 2, first=1)
    # a row the cache count says was computed must hold its token
    with pytest.raises(EngineError, match="row 3 does not hold the prompt token 13"):
        computed_rows(_rows(ids, values, garbage_until=3), ids, 2, first=1)


@pytest.mark.model
def test_assemble_borrows_only_rows_computed_over_identical_tokens():
    from rmserve.server.engines.vllm_engine import PromptRows, assemble_answers

    a = [1, 5, 6, 7, 8, 9, 10]
    b = [1, 5, 6, 7, 8, 9, 11]  # same as a up to token 5
    c = [1, 5, 6, 7, 2, 2, 2]  # same as a up to token 3
    starts = [3, 3, 3]
    rows = [
        PromptRows({t: 10.0 + t for t in range(3, 7)}, 0),  # a computed everything
        PromptRows({6: 26.0}, 5),  # b read 5 cached tokens: rows 3…5 missing
        PromptRows({5: 35.0, 6: 36.0}, 4),  # c read 4: rows 3, 4 missing
    ]
    answers, borrowed = assemble_answers([a, b, c], starts, rows)
    assert answers[0] == [13.0, 14.0, 15.0, 16.0]
    assert answers[1] == [13.0, 14.0, 15.0, 26.0]  # rows 3…5 from a (tokens 0…5 equal)
    # row 3 from a (tokens 0…3 equal); row 4 (token 2 after 1, 5, 6, 7) was computed by nobody
    assert answers[2] == [13.0, None, 35.0, 36.0]
    assert borrowed == 3 + 1

    # a donor's row must be one it computed (not one it read from the cache itself)
    rows[0] = PromptRows({t: 10.0 + t for t in range(5, 7)}, 4)
    answers, borrowed = assemble_answers([a, b], starts[:2], rows[:2])
    assert answers == [[None, None, 15.0, 16.0], [None, None, 15.0, 26.0]] and borrowed == 1
    # an untrusted (preempted) request lends nothing
    answers, borrowed = assemble_answers(
        [a, b], starts[:2], [PromptRows({}, 0, trusted=False), PromptRows({6: 26.0}, 5)]
    )
    assert answers == [[None, None, None, None], [None, None, None, 26.0]] and borrowed == 0
