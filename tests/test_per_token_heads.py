"""The per-token heads on the real vLLM CPU engine — ``token-value`` (``Qwen2ForRewardModel``,
Qwen2.5-Math-RM-72B's shape) and ``reward-token`` (``InternLM2ForRewardModel``,
internlm2-7b-reward's) —: vLLM's own implementations of the architectures, their per-token
``token_classify`` output read at the last row (for ``reward-token``, at the reward token rmserve
appends).

The InternLM2 replica is ``rmserve demo-model --head internlm2-rm``: the demo's causal Llama
converted to InternLM2's weight layout, a random ``v_head``, and a configuration file of its own
(so it is served with ``--trust-remote-code``); its rewards equal ``tests/testkit/internlm2.py``
(the tensors unpacked back into transformers' ``LlamaModel``, the token appended, ``v_head``).

The replica is ``rmserve demo-model --head qwen2-rm`` (family qwen2: a Qwen2 decoder and an MLP
value head at every token, random weights, ``modeling_qwen2_rm.py`` beside them for
transformers). The rewards equal the head computed in ``tests/testkit/token_value.py`` from its
description (transformers' own ``Qwen2Model`` and the score tensors), within 1e-4 as
``tests/server/test_heads_engines.py`` argues (float32 rounding observed below 1e-6); the value
one position early is far off (the comparison has teeth). The requests read the prefix cache
(vLLM's per-token output then holds the computed positions only; the last row is the last
token's): a group's responses share its prompt, as a one-label classifier's do.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from testkit.chat_runs import chat_run_sample
from testkit.shared_data import shared_data_dir
from testkit.internlm2 import internlm2_reward_forward
from testkit.token_value import token_value_forward

from rmserve.datasets import load_rmbench
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import RequestGroup, RewardHead

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ATOL = 1e-4
RMBENCH = shared_data_dir() / "rm-bench"
VLLM_OPTIONS = {"engine": "vllm", "dtype": "float32", "max_model_len": 4096, "block_size": 32,
                "kv_cache_memory_bytes": 1 << 30, "enforce_eager": True}
RMSERVE = [sys.executable, "-m", "rmserve.cli"]


def group_trie_bound(token_ids, block):
    """Tokens a block-granular prefix cache can skip in one group: for each sequence after the
    first, its longest common prefix with an earlier one, at most its length less one (the last
    token is always computed), in whole blocks."""
    total = 0
    for j, ids in enumerate(token_ids[1:], start=1):
        common = max(next((k for k, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))
                     for other in token_ids[:j])
        total += min(common, len(ids) - 1) // block * block
    return total


@pytest.fixture(scope="module")
def replica(family_replica):
    return family_replica("qwen2", "qwen2-rm")


def test_the_engine_reads_the_last_tokens_value_and_hf_is_refused(replica):
    from rmserve.errors import ServerFault
    from rmserve.server.config import EngineConfig
    from rmserve.server.engines.registry import build_engine

    chat = [g for g in load_rmbench(RMBENCH).groups if g.key.domain == "chat"][:3]
    groups = [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in chat]

    async def score():
        engine = build_engine(EngineConfig(model=str(replica), **VLLM_OPTIONS))
        await engine.start()
        try:
            info = engine.info()
            rendered = engine.renderer.render_groups(groups)
            per_group = await asyncio.gather(*(engine.score_group(g.token_ids, f"tv-{i}") for i, g in enumerate(rendered)))
            return info, engine.renderer.chat_template, rendered, [s for group in per_group for s in group]
        finally:
            await engine.shutdown()

    info, template, rendered, scores = asyncio.run(score())
    assert (info.head, info.engine) == (RewardHead("token-value"), "vllm")
    assert info.fingerprint == model_fingerprint(replica, template, "float32", RewardHead("token-value"))
    sequences = [ids for g in rendered for ids in g.token_ids]
    expected = token_value_forward(replica, sequences)
    diff = max(abs(s.reward - e) for s, e in zip(scores, expected, strict=True))
    print(f"token-value on vLLM: {len(scores)} rewards, max |diff| = {diff:.2e}")
    assert diff <= ATOL
    # The prefix cache is read (the last row needs none of the cached positions): each group's
    # responses share its prompt in whole 32-token blocks, as a one-label classifier's do.
    hits, bound = sum(s.num_cached_tokens for s in scores), sum(group_trie_bound(g.token_ids, 32) for g in rendered)
    print(f"token-value prefix-cache hits: {hits} tokens, per-group trie bound {bound}")
    assert bound > 0 and hits >= 0.9 * bound
    assert all(s.num_cached_tokens % 32 == 0 and s.num_cached_tokens < len(ids)
               for s, ids in zip(scores, sequences, strict=True))
    early = token_value_forward(replica, [ids[:-1] for ids in sequences[:6]])
    assert min(abs(a - b) for a, b in zip(early, expected[:6], strict=True)) > 100 * ATOL

    with pytest.raises(ServerFault, match="--engine vllm"):
        asyncio.run(build_engine(EngineConfig(model=str(replica), engine="hf", dtype="float32")).start())


def test_run_prints_the_table_naming_the_head(replica, tmp_path):
    from rmserve.server.render.chat import Renderer

    out = tmp_path / "run"
    done = subprocess.run(
        [*RMSERVE, "run", str(replica), "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat", "--out", str(out),
         "--quiet", "--resamples", "0", "--dtype", "float32", "--max-model-len", "4096", "--block-size", "32",
         "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"],
        capture_output=True, text=True, timeout=1100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Chat |" in done.stdout and "Scores: classifier, head token-value;" in done.stdout
    by_key, sample, sequences = chat_run_sample(out, RMBENCH, Renderer.from_pretrained(replica, max_model_len=4096))
    expected = iter(token_value_forward(replica, sequences))
    diff = 0.0
    for group in sample:
        record = by_key[group.key]
        assert record.scorer.head == RewardHead("token-value")
        diff = max(diff, *(abs(r - next(expected)) for r in record.rewards))
    print(f"token-value run: {len(by_key)} chat groups, max |diff| = {diff:.2e}")
    assert diff <= ATOL


@pytest.fixture(scope="module")
def internlm2(family_replica):
    return family_replica("demo", "internlm2-rm")


def test_the_reward_is_read_at_the_appended_reward_token(internlm2, tmp_path):
    import json

    from rmserve.server.render.chat import Renderer

    token = json.loads((internlm2 / "config.json").read_text())["reward_token_id"]
    argv = [*RMSERVE, "run", str(internlm2), "--bench", "rm-bench", "--data", str(RMBENCH), "--only", "chat", "--quiet",
            "--resamples", "0", "--dtype", "float32", "--max-model-len", "4096", "--block-size", "32",
            "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]
    refused = subprocess.run([*argv, "--out", str(tmp_path / "refused")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--trust-remote-code" in refused.stderr, refused.stderr[-2000:]
    out = tmp_path / "run"
    done = subprocess.run([*argv, "--out", str(out), "--trust-remote-code"], capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Chat |" in done.stdout and f"Scores: classifier, head reward-token (token id {token});" in done.stdout
    renderer = Renderer.from_pretrained(internlm2, max_model_len=4096, trust_remote_code=True)
    by_key, sample, sequences = chat_run_sample(out, RMBENCH, renderer)
    assert all(ids[-1] != token for ids in sequences)  # the conversation itself never holds it
    expected = internlm2_reward_forward(internlm2, sequences)
    got = [r for g in sample for r in by_key[g.key].rewards]
    assert [n for g in sample for n in by_key[g.key].num_tokens] == [len(ids) for ids in sequences]  # token left out
    cached = sum(sum(r.num_cached_tokens) for r in by_key.values())
    assert cached > 0, "a group's responses read its prompt from the prefix cache"
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    print(f"reward-token run: {len(by_key)} chat groups, {len(got)} rewards checked, max |diff| = {diff:.2e}")
    assert diff <= ATOL
    forgot = internlm2_reward_forward(internlm2, sequences[:6], append=False)  # teeth: the token matters
    assert min(abs(a - b) for a, b in zip(forgot, expected[:6], strict=True)) > 100 * ATOL
