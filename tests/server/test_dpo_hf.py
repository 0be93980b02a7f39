"""The transformers DPO engine (DPOEngine over HFLogprobEngine) against the independent
text-level reference (``testkit.dpo_reference``) on real RM-Bench groups.

Groups: chat 622 (short), code 843 (multi-line code in every response), safety-refuse 3183
(markdown answers); for the official compat also code 129 (a 480-token prompt: the pairwise
truncation keeps its last 128 tokens) and safety-refuse 3077 (a 2,500-token answer: cut to
1,920). Models: the demo policy (seed 1) and reference (seed 2), float32.

Tolerance 1e-4 (nats): the engine runs right-padded batches, the reference one unpadded
sequence at a time; both take float32 log-softmaxes and sum in float64, so the difference is
the float32 rounding of different matmul shapes (about 1e-6 per token), summed over at most
~2,000 answer tokens.
"""

from __future__ import annotations

import json

import pytest
from rmserve.server.config import EngineConfig, check_reward_head
from rmserve.server.engines.registry import build_engine
from rmserve.server.engines.dpo_pair import DPOEngine
from testkit.dpo_reference import reference_group_scores
from testkit.shared_data import shared_file

from rmserve.errors import ServerFault
from rmserve.schema import Message, RequestGroup

TOLERANCE = 1e-4
GROUPS = {"chat": "622", "code": "843", "safety-refuse": "3183"}
LONG_GROUPS = {"code": "129", "safety-refuse": "3077"}


def rmbench_group(domain: str, record_id: str) -> tuple[str, list[str]]:
    records = json.loads(shared_file("rm-bench", f"{domain}_filtered.json").read_text())
    (record,) = [r for r in records if str(r["id"]) == record_id]
    return record["prompt"], list(record["chosen"]) + list(record["rejected"])


@pytest.fixture(scope="module")
def hf_models(demo_policy_dir, demo_reference_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    return load(demo_policy_dir), load(demo_reference_dir), AutoTokenizer.from_pretrained(demo_policy_dir)


async def served(engine: DPOEngine, prompt: str, responses: list[str]):
    (rendered,) = engine.renderer.render_groups([RequestGroup(id="g", prompt=prompt, responses=tuple(responses))])
    scores = await engine.score_group(rendered.token_ids, "t", answer_starts=rendered.answer_start)
    return rendered, scores


def dpo_config(policy, reference, **options) -> EngineConfig:
    return EngineConfig(model=str(policy), kind="dpo", engine="hf", dtype="float32", max_model_len=4096,
                        ref_model=None if reference is None else str(reference), **options)


@pytest.mark.parametrize("mode", ["reference", "avg", "sum", "norm"])
async def test_hf_dpo_engine_matches_the_reference(demo_policy_dir, demo_reference_dir, hf_models, mode):
    policy, reference, tokenizer = hf_models
    config = dpo_config(demo_policy_dir, demo_reference_dir if mode == "reference" else None,
                        ref_free=None if mode == "reference" else mode)
    engine = build_engine(config)
    assert isinstance(engine, DPOEngine)
    await engine.start()
    try:
        for domain, record_id in GROUPS.items():
            prompt, responses = rmbench_group(domain, record_id)
            expected = reference_group_scores(policy, reference if mode == "reference" else None, tokenizer,
                                              [{"role": "user", "content": prompt}], responses)
            rendered, scores = await served(engine, prompt, responses)
            assert [list(ids) for ids in rendered.token_ids] == [e.input_ids for e in expected], domain
            assert rendered.answer_start == tuple(e.prompt_len for e in expected)
            assert rendered.truncated_tokens is None
            for j, (score, ref) in enumerate(zip(scores, expected, strict=True)):
                assert score.reward == pytest.approx(ref.rewards[mode], abs=TOLERANCE), (domain, j)
                assert score.extras["answer_tokens"] == len(ref.policy_logps)
                assert score.extras["policy_logp"] == pytest.approx(sum(ref.policy_logps), abs=TOLERANCE)
                if mode == "reference":
                    assert score.extras["ref_logp"] == pytest.approx(sum(ref.reference_logps), abs=TOLERANCE)
                assert score.extras["policy_logp_norm"] == pytest.approx(-ref.rewards["norm"], abs=TOLERANCE)
                assert score.extras["bos"] == "template"
    finally:
        await engine.shutdown()


async def test_official_compat_matches_the_reference_with_its_truncation(demo_policy_dir, demo_reference_dir,
                                                                         hf_models):
    policy, reference, tokenizer = hf_models
    engine = build_engine(dpo_config(demo_policy_dir, demo_reference_dir, compat="official"))
    await engine.start()
    try:
        cut_any = False
        for domain, record_id in {**LONG_GROUPS, "chat": GROUPS["chat"]}.items():
            prompt, responses = rmbench_group(domain, record_id)
            expected = reference_group_scores(policy, reference, tokenizer, [{"role": "user", "content": prompt}],
                                              responses, compat="official")
            rendered, scores = await served(engine, prompt, responses)
            assert [list(ids) for ids in rendered.token_ids] == [e.input_ids for e in expected], domain
            assert all(ids[:2] == [tokenizer.bos_token_id] * 2 for ids in rendered.token_ids if len(ids) < 2048 - 128)
            assert rendered.truncated_tokens is not None
            cut_any |= any(rendered.truncated_tokens)
            for j, (score, ref) in enumerate(zip(scores, expected, strict=True)):
                assert score.reward == pytest.approx(ref.rewards["reference"], abs=TOLERANCE), (domain, j)
                assert score.extras["bos"] == "bos-prepended (official)"
        assert cut_any
    finally:
        await engine.shutdown()


async def test_a_reward_model_as_policy_is_refused_before_loading(demo_model_dir, demo_reference_dir):
    engine = build_engine(dpo_config(demo_model_dir, demo_reference_dir))
    with pytest.raises(ServerFault, match=r"^model: .*LlamaForSequenceClassification.*--kind classifier"):
        await engine.start()
    assert engine.policy.start_time_s is None  # nothing was loaded


def test_the_classifier_check_points_a_causal_lm_to_kind_dpo(demo_policy_dir):
    with pytest.raises(ServerFault, match=r"has architectures \[.LlamaForCausalLM.\], whose reward head rmserve does not know; .*to score a DPO policy by its implicit reward use --kind dpo"):
        check_reward_head(str(demo_policy_dir))


def test_prompt_messages_render_like_a_prompt(demo_policy_dir):
    """``prompt`` and a one-user-turn ``messages`` give the same DPO ids (the reference uses messages)."""
    from transformers import AutoTokenizer

    from rmserve.server.render.dpo import DPORenderer

    renderer = DPORenderer(AutoTokenizer.from_pretrained(demo_policy_dir), max_model_len=4096)
    a = renderer.render_group([Message("user", "Write a haiku.")], ["Leaves fall.\n- quietly"], group_id="a")
    (b,) = renderer.render_groups([RequestGroup(id="b", prompt="Write a haiku.", responses=("Leaves fall.\n- quietly",))])
    assert a.token_ids == b.token_ids and a.answer_start == b.answer_start


async def test_reloading_the_reference_weights_as_policy_gives_zero_rewards(demo_policy_dir, demo_reference_dir):
    """After a policy swap to the reference's own checkpoint both engines compute the same
    log-probs, so every reference-mode reward is exactly 0; the fingerprint changes."""
    engine = build_engine(dpo_config(demo_policy_dir, demo_reference_dir))
    first = await engine.start()
    try:
        prompt, responses = rmbench_group("chat", GROUPS["chat"])
        _, before = await served(engine, prompt, responses[:2])
        assert all(s.reward != 0.0 for s in before)
        loaded = await engine.reload_weights(str(demo_reference_dir))
        assert loaded.info.fingerprint != first.info.fingerprint
        _, after = await served(engine, prompt, responses[:2])
        assert [s.reward for s in after] == [0.0, 0.0]
        assert [s.extras["policy_logp"] for s in after] == [s.extras["ref_logp"] for s in before]
    finally:
        await engine.shutdown()
