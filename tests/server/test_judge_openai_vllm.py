"""OpenAIJudgeEngine against a real OpenAI-compatible server: vLLM's own API server (CPU
build) serving the demo causal LM, started by :func:`testkit.openai_server.vllm_openai_server`.

The texts must equal transformers' greedy ``generate`` on the same chat-templated prompts,
computed here independently (no rmserve rendering): one real RM-Bench chat group judged
pairwise (18 calls), and one RewardBench-2-shaped group judged by 4-way ranking (a system
message) and by ratings (4 calls).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rmserve.datasets import load_rmbench
from rmserve.errors import SequenceTooLong, ServerFault
from rmserve.schema import Group, Message
from rmserve.server.config import EngineConfig
from rmserve.server.engines.openai_judge import OpenAIJudgeEngine
from rmserve.server.kinds.judge_protocols import JudgeProtocolConfig, plan_group
from testkit.openai_server import vllm_openai_server
from testkit.shared_data import shared_data_dir

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
MAX_MODEL_LEN = 4096
SERVED_NAME = "demo-judge"

RB2_GROUP = Group(
    benchmark="rewardbench2",
    domain="Focus",
    id="made-up-1",
    messages=(Message("user", "How many legs does a spider have, and why does it matter for its movement?"),),
    responses=(
        "A spider has eight legs, which lets it keep four on the ground while moving the other four.",
        "Spiders have six legs like all insects.",
        "Ten legs, arranged in two rows of five.",
        "It depends on the weather.",
    ),
    num_chosen=1,
)
"""A RewardBench-2-shaped group (one correct answer, three rejected), written for this test."""


@pytest.fixture(scope="module")
def demo_judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo causal LM with the demo tokenizer and chat template (seed 1, max length 4096)."""
    from rmserve.demo_model import DemoModelConfig, build_demo_model

    out = tmp_path_factory.mktemp("demo-judge") / "judge"
    build_demo_model(out, shared_data_dir() / "rm-bench", DemoModelConfig(seed=1, max_len=MAX_MODEL_LEN, kind="causal"))
    return out


@pytest.fixture(scope="module")
def api_server(demo_judge_dir: Path):
    """vLLM's API server over the demo judge; yields its base URL."""
    with vllm_openai_server(demo_judge_dir, served_model_name=SERVED_NAME, max_model_len=MAX_MODEL_LEN) as url:
        print(f"\nvLLM API server started in {vllm_openai_server.last_start_s:.1f} s")
        yield url


def transformers_greedy(model_dir: Path, calls: list[tuple[Message, ...]]) -> list[tuple[str, int, int, str, str]]:
    """Per call: (text, prompt tokens, generated tokens, finish reason, templated prompt) from
    transformers ``generate`` (greedy, at most ``MAX_TOKENS`` new tokens, float32), the prompt
    rendered by the tokenizer's chat template with the generation prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    for messages in calls:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[0, len(ids):].tolist()
        stopped = tokenizer.eos_token_id in new
        if stopped:
            new = new[: new.index(tokenizer.eos_token_id) + 1]
        text = tokenizer.decode(new, skip_special_tokens=True)
        results.append((text, len(ids), len(new), "stop" if stopped else "length", prompt))
    return results


def rmbench_chat_group() -> Group:
    """The first RM-Bench chat group of the shared data."""
    groups = load_rmbench(shared_data_dir() / "rm-bench", domains=["chat"]).groups
    return groups[0]


@pytest.mark.parametrize(
    ("name", "protocol_config"),
    [
        ("rm-bench-chat-pairwise", JudgeProtocolConfig()),
        ("rb2-ranking", JudgeProtocolConfig()),
        ("rb2-ratings", JudgeProtocolConfig(ratings=True)),
    ],
)
async def test_outputs_equal_transformers_greedy(api_server, demo_judge_dir, name, protocol_config):
    group = rmbench_chat_group() if name.startswith("rm-bench") else RB2_GROUP
    plan = plan_group(group, protocol_config)
    calls = [prompt.messages for prompt in plan.prompts]
    assert len(calls) == {"rm-bench-chat-pairwise": 18, "rb2-ranking": 1, "rb2-ratings": 4}[name]

    engine = OpenAIJudgeEngine(
        EngineConfig(model=SERVED_NAME, kind="judge", judge_url=api_server, judge_max_tokens=MAX_TOKENS)
    )
    try:
        loaded = await engine.start()
        assert loaded.info.max_model_len == MAX_MODEL_LEN
        assert loaded.info.engine == "openai"
        began = time.monotonic()
        outputs = await engine.judge_group(calls, f"test-{name}")
        elapsed = time.monotonic() - began
        print(f"\n{name}: {len(calls)} calls in {elapsed:.2f} s ({elapsed / len(calls):.3f} s per call, concurrent)")
        began = time.monotonic()
        [single] = await engine.judge_group(calls[:1], f"test-{name}-single")
        print(f"{name}: one call alone {time.monotonic() - began:.3f} s")
        again = await engine.judge_group(calls, f"test-{name}-again")
    finally:
        await engine.shutdown()

    expected = transformers_greedy(demo_judge_dir, calls)
    assert [o.text for o in outputs] == [e[0] for e in expected]
    assert [o.prompt_tokens for o in outputs] == [e[1] for e in expected]
    assert [o.completion_tokens for o in outputs] == [e[2] for e in expected]
    assert [o.finish_reason for o in outputs] == [e[3] for e in expected]
    assert all(o.finish_reason == "length" for o, e in zip(outputs, expected) if e[2] == MAX_TOKENS and e[3] == "length")
    assert single.text == outputs[0].text
    assert [o.text for o in again] == [o.text for o in outputs]
    # The second pass of the same prompts hits vLLM's prefix cache: every full 32-token block
    # of each prompt but the last prompt token (vLLM always computes that one).
    assert [o.cached_tokens for o in again] == [(o.prompt_tokens - 1) // 32 * 32 for o in outputs]
    if name == "rb2-ranking":
        # The ranking protocol sends a system message; the demo chat template renders it.
        assert [m.role for m in calls[0]] == ["system", "user"]
        assert expected[0][4].startswith("<s><|system|>\n")


def words_for_prompt_tokens(model_dir: Path, tokens: int) -> str:
    """A user message of repeated words whose chat-templated prompt is exactly ``tokens`` long
    (checked with the tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def length(n: int) -> int:
        chat = [{"role": "user", "content": "word " * n}]
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    n = max(1, tokens - length(1) - 8)
    while length(n + 1) <= tokens:
        n += 1
    assert length(n) == tokens, (n, length(n))
    return "word " * n


async def test_prompt_filling_the_context_is_too_long_and_one_token_less_fits(api_server, demo_judge_dir):
    engine = OpenAIJudgeEngine(
        EngineConfig(model=SERVED_NAME, kind="judge", judge_url=api_server, judge_max_tokens=MAX_TOKENS)
    )
    try:
        await engine.start()
        for tokens in (MAX_MODEL_LEN, MAX_MODEL_LEN + 50):
            with pytest.raises(SequenceTooLong) as caught:
                await engine.judge_group(
                    [[Message("user", "short")], [Message("user", words_for_prompt_tokens(demo_judge_dir, tokens))]], "long"
                )
            assert caught.value.field == "messages"
            assert caught.value.limit == MAX_MODEL_LEN
        # One token of room: vLLM cuts max_tokens to it, and the output ends at the length limit.
        [output] = await engine.judge_group(
            [[Message("user", words_for_prompt_tokens(demo_judge_dir, MAX_MODEL_LEN - 1))]], "fits"
        )
        assert (output.prompt_tokens, output.completion_tokens, output.finish_reason) == (MAX_MODEL_LEN - 1, 1, "length")
    finally:
        await engine.shutdown()


async def test_model_not_served_names_what_is(api_server):
    engine = OpenAIJudgeEngine(EngineConfig(model="some-other-judge", kind="judge", judge_url=api_server))
    with pytest.raises(ServerFault) as caught:
        await engine.start()
    assert f"'some-other-judge' is not served at judge_url {api_server} (it lists '{SERVED_NAME}')" in str(caught.value)
    await engine.shutdown()
