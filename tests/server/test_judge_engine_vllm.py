"""The local judge engines on the demo causal LM: vLLM texts = transformers greedy texts.

One :class:`~rmserve.server.engines.vllm_engine.VLLMJudgeEngine` over ``demo_policy_dir`` serves the module
(float32, eager, block 32, 1 GiB KV cache, ``judge_max_tokens=32``); the independent reference
is :class:`~rmserve.server.engines.hf_engine.HFJudgeEngine` (transformers ``generate``, greedy, one
prompt at a time). The calls are the real ones :func:`~rmserve.server.kinds.judge_protocols.plan_group`
makes: two RM-Bench chat groups (18 pairwise calls each) and RewardBench 2-shaped groups (a
4-way ranking call, ratings of a Focus group, ratings of a Ties group). The demo model has
random weights: its texts are noise, which is what a parity check wants (any drift in a
logit shows as another token).

The demo chat template accepts a system message (``<|system|>``), so the ranking protocol's
system prompt is rendered as a system turn.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import pytest_asyncio
from rmserve.server.config import EngineConfig

from rmserve.datasets import load_rmbench
from rmserve.errors import SequenceTooLong, ServerFault
from rmserve.schema import Group, JudgeSampling, Message

pytestmark = pytest.mark.slow

DEMO_MAX_MODEL_LEN = 4096
"""The demo policy's max length (``demo_policy_dir`` is built with it); the judge takes prompts
of at most 4,095 tokens."""
JUDGE_MAX_TOKENS = 32


def _config(model: Path, **extra) -> EngineConfig:
    return EngineConfig(
        model=str(model), kind="judge", judge_max_tokens=JUDGE_MAX_TOKENS, dtype="float32",
        max_model_len=DEMO_MAX_MODEL_LEN, block_size=32, kv_cache_memory_bytes=1 << 30, enforce_eager=True,
        **extra,
    )


def _rb2_groups() -> list[Group]:
    """RewardBench 2-shaped groups (official schema: one user turn, the correct answer first)."""
    question = "Name the largest planet of the solar system and give one fact about it."
    answers = (
        "Jupiter is the largest planet; it has a storm called the Great Red Spot.",
        "Saturn is the largest planet because of its rings.",
        "The Earth is the largest planet, it has oceans.",
        "Mars is the largest planet and it is red.",
    )
    return [
        Group("rewardbench2", "Factuality", "f-1", (Message("user", question),), answers, num_chosen=1),
        Group("rewardbench2", "Focus", "fo-2", (Message("user", "Say hello in French."),),
              ("Bonjour.", "Hola.", "Hello.", "Ciao."), num_chosen=1),
        Group("rewardbench2", "Ties", "t-3", (Message("user", "Name a primary colour."),),
              ("Red.", "Blue.", "Green is not one."), num_chosen=2),
    ]


@pytest.fixture(scope="module")
def judge_groups(rmbench_dir: Path) -> list[tuple[Group, object]]:
    """(group, plan) of two RM-Bench chat groups and the RewardBench 2-shaped ones."""
    from rmserve.server.kinds.judge_protocols import JudgeProtocolConfig, plan_group

    chat = load_rmbench(rmbench_dir, ["chat"]).groups[:2]
    ranking = JudgeProtocolConfig(seed=3)
    ratings = JudgeProtocolConfig(ratings=True)
    rb2 = _rb2_groups()
    planned = [(g, plan_group(g, ranking)) for g in [*chat, rb2[0], rb2[2]]]
    planned.append((rb2[1], plan_group(rb2[1], ratings)))
    assert [p.protocol for _, p in planned] == [
        "rmbench-pairwise", "rmbench-pairwise", "rb2-ranking", "rb2-rating-ties", "rb2-rating"
    ]
    assert [len(p.prompts) for _, p in planned] == [18, 18, 1, 3, 4]
    return planned


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm_judge(demo_policy_dir: Path):
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    engine = VLLMJudgeEngine(_config(demo_policy_dir))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def hf_judge(demo_policy_dir: Path):
    from rmserve.server.engines.hf_engine import HFJudgeEngine

    engine = HFJudgeEngine(_config(demo_policy_dir, engine="hf"))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


def _prompt_tokens(renderer, call: list[Message]) -> int:
    """Tokens of a call's prompt, measured without the renderer's length rule."""
    return len(renderer.tokenizer(renderer.render_text(call), add_special_tokens=False)["input_ids"])


def _long_message(renderer, target_tokens: int) -> list[Message]:
    """A one-user-turn call whose prompt is exactly ``target_tokens`` long (" a" is one token)."""
    base = _prompt_tokens(renderer, [Message("user", "a")])
    call = [Message("user", "a" + " a" * (target_tokens - base))]
    assert _prompt_tokens(renderer, call) == target_tokens
    return call


@pytest.mark.asyncio(loop_scope="session")
async def test_vllm_texts_equal_transformers_greedy_texts(vllm_judge, hf_judge, judge_groups, demo_policy_dir):
    from rmserve.server.kinds.judge_protocols import JudgeProtocolConfig, score_group
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_policy_dir))
    compared = 0
    for i, (group, plan) in enumerate(judge_groups):
        calls = [p.messages for p in plan.prompts]
        fast = await vllm_judge.judge_group(calls, f"parity-{i}")
        reference = await hf_judge.judge_group(calls, f"parity-{i}")
        for k, (a, b, messages) in enumerate(zip(fast, reference, calls, strict=True)):
            assert a.text == b.text, f"group {group.key} call {k}"
            assert (a.prompt_tokens, a.completion_tokens, a.finish_reason) == (
                b.prompt_tokens, b.completion_tokens, b.finish_reason,
            )
            # transformers' own tokenizing template path gives the same prompt length
            chat = [{"role": m.role, "content": m.content} for m in messages]
            own = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)["input_ids"]
            assert a.prompt_tokens == len(own)
            assert a.text.strip(), "random weights still generate visible text"
            compared += 1
        config = JudgeProtocolConfig(seed=3, ratings=plan.protocol == "rb2-rating")
        mine, theirs = score_group(group, plan, fast, config), score_group(group, plan, reference, config)
        assert [c.parse for c in mine.calls] == [c.parse for c in theirs.calls]
        assert (mine.credit, mine.ratings, mine.cells) == (theirs.credit, theirs.ratings, theirs.cells)
    assert compared == 18 + 18 + 1 + 3 + 4
    # 32 random-weight tokens never reach the demo EOS here: every output is cut at max_tokens.
    assert {o.finish_reason for o in fast} == {"length"}
    assert {o.completion_tokens for o in fast} == {JUDGE_MAX_TOKENS}


@pytest.mark.asyncio(loop_scope="session")
async def test_output_cut_by_the_context_is_length(vllm_judge, hf_judge):
    renderer = vllm_judge.renderer
    assert renderer.max_prompt_tokens == DEMO_MAX_MODEL_LEN - 1
    call = _long_message(renderer, DEMO_MAX_MODEL_LEN - 5)  # room for 5 generated tokens, not 32
    short = [Message("user", "Say one word.")]
    (cut, fine) = await vllm_judge.judge_group([call, short], "context-cut")
    assert (cut.prompt_tokens, cut.completion_tokens, cut.finish_reason) == (4091, 5, "length")
    assert (fine.completion_tokens, fine.finish_reason) == (JUDGE_MAX_TOKENS, "length")
    (reference,) = await hf_judge.judge_group([call], "context-cut")
    assert (reference.text, reference.completion_tokens, reference.finish_reason) == (cut.text, 5, "length")
    # the exact limit: one generated token
    (last,) = await vllm_judge.judge_group([_long_message(renderer, DEMO_MAX_MODEL_LEN - 1)], "one-token")
    assert (last.prompt_tokens, last.completion_tokens, last.finish_reason) == (4095, 1, "length")


@pytest.mark.asyncio(loop_scope="session")
async def test_prompt_without_room_for_one_token_is_refused(vllm_judge, hf_judge):
    call = _long_message(vllm_judge.renderer, DEMO_MAX_MODEL_LEN)
    for engine in (vllm_judge, hf_judge):
        with pytest.raises(SequenceTooLong) as info:
            await engine.judge_group([[Message("user", "fine")], call], "too-long")
        assert (info.value.field, info.value.value, info.value.limit) == ("messages", 4096, 4095)
        assert "judge call 1 renders to 4096 prompt tokens" in info.value.message
    # the engine serves on afterwards
    (ok,) = await vllm_judge.judge_group([[Message("user", "fine")]], "after")
    assert ok.completion_tokens == JUDGE_MAX_TOKENS


@pytest.mark.asyncio(loop_scope="session")
async def test_group_calls_hit_the_prefix_cache(vllm_judge, judge_groups):
    group, plan = judge_groups[0]
    assert await vllm_judge.reset_prefix_cache()
    before = vllm_judge.prefix_cache_stats()
    outputs = await vllm_judge.judge_group([p.messages for p in plan.prompts], "cache")
    after = vllm_judge.prefix_cache_stats()
    hits = sum(o.cached_tokens for o in outputs)
    assert hits > 0
    assert after.hit_tokens - before.hit_tokens == hits
    assert after.query_tokens - before.query_tokens == sum(o.prompt_tokens for o in outputs)
    assert all(o.cached_tokens % 32 == 0 and o.cached_tokens < o.prompt_tokens for o in outputs)


def test_info_is_a_judge_with_the_checkpoint_fingerprint(vllm_judge, hf_judge, demo_policy_dir):
    from rmserve.fingerprint import model_fingerprint
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(str(demo_policy_dir)).chat_template
    expected = model_fingerprint(str(demo_policy_dir), template, "float32")
    for engine, name in ((vllm_judge, "vllm"), (hf_judge, "hf")):
        info = engine.info()
        assert (info.kind, info.mode, info.compat, info.engine) == ("judge", "auto", "none", name)
        assert (info.max_model_len, info.dtype, info.fingerprint) == (4095, "float32", expected)
        assert info.judge_sampling == JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=JUDGE_MAX_TOKENS)
    import importlib.metadata

    hf_engine = hf_judge.info().judge_engine
    assert (hf_engine.engine, hf_engine.version, hf_engine.batch_invariant) == (
        "hf", importlib.metadata.version("transformers"), True
    )
    assert hf_engine.batch_invariant_note.startswith("each call is generated alone (a batch of one, no padding)")
    vllm_engine = vllm_judge.info().judge_engine
    assert (vllm_engine.engine, vllm_engine.batch_invariant) == ("vllm", False)
    assert vllm_judge.max_tokens == hf_judge.max_tokens == JUDGE_MAX_TOKENS
    from rmserve.server.engines.protocol import JudgeEngine, SupportsPrefixCacheStats

    assert isinstance(vllm_judge, JudgeEngine) and isinstance(hf_judge, JudgeEngine)
    assert isinstance(vllm_judge, SupportsPrefixCacheStats)


def _without_template(demo: Path, out: Path) -> Path:
    """A copy of the demo checkpoint whose tokenizer has no chat template."""
    shutil.copytree(demo, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    for name in ("chat_template.jinja", "chat_template.json"):
        (out / name).unlink(missing_ok=True)
    return out


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_without_chat_template_is_refused(demo_policy_dir, tmp_path):
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine
    from rmserve.server.engines.hf_engine import HFJudgeEngine

    bare = _without_template(demo_policy_dir, tmp_path / "bare")
    for cls, extra in ((VLLMJudgeEngine, {}), (HFJudgeEngine, {"engine": "hf"})):
        with pytest.raises(ServerFault) as info:
            await cls(_config(bare, **extra)).start()
        assert info.value.message.startswith("chat_template: the tokenizer of")
        assert "--chat-template FILE" in info.value.message
    # with a template file the same checkpoint starts (transformers engine: no vLLM start here)
    template = tmp_path / "judge.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}", encoding="utf-8")
    engine = HFJudgeEngine(_config(bare, engine="hf", chat_template=template))
    await engine.start()
    (out,) = await engine.judge_group([[Message("user", "hi")]], "file-template")
    own = engine._require().judge.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], chat_template=template.read_text(), tokenize=True,
        add_generation_prompt=True,
    )["input_ids"]
    assert out.prompt_tokens == len(own) < 8  # "<s>hi", no generation prompt in this template
    await engine.shutdown()


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_without_lm_head_is_refused(tmp_path):
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine

    folder = tmp_path / "classifier"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(ServerFault) as info:
        await VLLMJudgeEngine(_config(folder)).start()
    assert "kind judge needs a causal LM with an LM head" in info.value.message
    assert info.value.message.startswith("model: ")


THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n"
    "{% elif enable_thinking is defined %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""The demo template's layout with a thinking switch: on opens the reasoning for the model,
off writes an empty closed block."""


@pytest.mark.asyncio(loop_scope="session")
async def test_the_thinking_switch_reaches_both_local_engines(demo_policy_dir, tmp_path):
    """``judge_thinking`` is passed to the template as ``enable_thinking`` by both local engines;
    with it on the prompt ends in ``<think>``, so the outputs begin inside the reasoning: a cut
    output has no verdict, whatever it holds."""
    from transformers import AutoTokenizer

    from rmserve.server.engines.hf_engine import HFJudgeEngine
    from rmserve.server.engines.vllm_engine import VLLMJudgeEngine
    from rmserve.server.kinds.judge_protocols import JudgeProtocolConfig, plan_group, score_group

    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE, encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(str(demo_policy_dir))
    group = _rb2_groups()[0]
    plan = plan_group(group, JudgeProtocolConfig(seed=3))
    calls = [p.messages for p in plan.prompts]
    chat = [{"role": m.role, "content": m.content} for m in calls[0]]
    outputs = {}
    for switch in ("on", "off"):
        text = tokenizer.apply_chat_template(chat, chat_template=THINKING_TEMPLATE, tokenize=False,
                                             add_generation_prompt=True, enable_thinking=switch == "on")
        assert text.endswith("<|assistant|>\n<think>\n" if switch == "on" else "<think>\n\n</think>\n\n")
        expected_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        engine = HFJudgeEngine(_config(demo_policy_dir, engine="hf", chat_template=template, judge_thinking=switch))
        await engine.start()
        try:
            (out,) = await engine.judge_group(calls, f"thinking-{switch}")
        finally:
            await engine.shutdown()
        assert (out.prompt_tokens, out.reasoning_open, out.finish_reason) == (expected_tokens, switch == "on", "length")
        outputs[switch] = out
    vllm = VLLMJudgeEngine(_config(demo_policy_dir, chat_template=template, judge_thinking="on"))
    await vllm.start()
    try:
        (fast,) = await vllm.judge_group(calls, "thinking-vllm")
    finally:
        await vllm.shutdown()
    ref = outputs["on"]  # same prompt, same greedy text, reasoning_open set
    assert (fast.text, fast.prompt_tokens, fast.completion_tokens, fast.finish_reason, fast.reasoning_open) == (
        ref.text, ref.prompt_tokens, ref.completion_tokens, ref.finish_reason, True
    )
    judged = score_group(group, plan, [fast], JudgeProtocolConfig(seed=3, thinking="on"))
    assert (judged.calls[0].reasoning_open, judged.calls[0].parse.reason, judged.credit) == (True, "truncated", 0.25)
    assert judged.thinking == "on"
