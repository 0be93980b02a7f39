"""Model families (``rmserve demo-model --family``): each replica's tokenizer and template behave
as the family's do, and every kind's renderer turns RM-Bench conversations into the token ids
the template's own rendering gives, with exactly one BOS where the family has one and none
invented where it has none.

The expected ids are built here from the template's text (``apply_chat_template(...,
tokenize=False)``) and the tokenizer's own call without special tokens, plus the family's BOS in
front only where the family's tokenizer adds one and its template writes none (Mistral) — the
rules of the family table (``rmserve/demo_families.py``), not the renderer's code.
"""

from __future__ import annotations

import pytest

from rmserve.datasets import load_rmbench
from rmserve.demo_families import FAMILIES, QWEN2_SYSTEM
from rmserve.errors import InvalidRequest, ServerFault
from rmserve.schema import Message, RequestGroup

pytestmark = pytest.mark.model

FAMILY_NAMES = ("llama3", "qwen2", "qwen3", "gemma2", "mistral")
NUM_GROUPS = 4


@pytest.fixture(scope="module")
def chat_groups(rmbench_dir) -> list[RequestGroup]:
    """Four RM-Bench chat groups (24 responses)."""
    chat = [g for g in load_rmbench(rmbench_dir).groups if g.key.domain == "chat"]
    picked = chat[:: len(chat) // NUM_GROUPS][:NUM_GROUPS]
    return [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in picked]


def _tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _conversation(messages, response=None) -> list[dict[str, str]]:
    turns = [{"role": m.role, "content": m.content} for m in messages]
    return turns + ([{"role": "assistant", "content": response}] if response is not None else [])


def expected_ids(tokenizer, family, text: str) -> list[int]:
    """The template's text tokenized as it is, with the family's BOS in front where only the
    tokenizer writes it."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if family.tokenizer_adds_bos and not family.template_writes_bos:
        ids = [tokenizer.bos_token_id, *ids]
    return ids


def _check_bos(tokenizer, family, ids) -> None:
    if family.bos is None:
        assert tokenizer.bos_token_id is None
        assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # no EOS standing in for a BOS
        assert tokenizer.convert_tokens_to_ids(family.pad) not in ids
    else:
        bos = tokenizer.bos_token_id
        assert ids[0] == bos and ids.count(bos) == 1


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_replicas_tokenizer_follows_the_familys_bos_rules(family_replica, name):
    family = FAMILIES[name]
    tokenizer = _tokenizer(family_replica(name))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                         tokenize=False)
    plain = tokenizer(text)["input_ids"]  # with special tokens: what a harness's tokenizer(text) gives
    bare = tokenizer(text, add_special_tokens=False)["input_ids"]
    if name in ("llama3", "gemma2"):  # BOS in the template and from the tokenizer: the doubled-BOS trap
        assert text.startswith(family.bos) and plain[:2] == [tokenizer.bos_token_id] * 2
    elif name == "mistral":  # the tokenizer alone writes it
        assert not text.startswith(family.bos) and plain == [tokenizer.bos_token_id, *bare]
    else:  # ChatML: no BOS anywhere
        assert tokenizer.bos_token_id is None and plain == bare
    assert tokenizer.eos_token == family.eos and tokenizer.pad_token == family.pad


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_classifier_rendering_equals_the_templates_own_with_one_bos_or_none(family_replica, chat_groups, name):
    from rmserve.server.render.chat import Renderer

    family = FAMILIES[name]
    folder = family_replica(name)
    tokenizer = _tokenizer(folder)
    renderer = Renderer.from_pretrained(folder, max_model_len=4096)
    for group, rendered in zip(chat_groups, renderer.render_groups(chat_groups), strict=True):
        for response, ids in zip(group.responses, rendered.token_ids, strict=True):
            text = tokenizer.apply_chat_template(_conversation(group.messages, response), tokenize=False)
            assert list(ids) == expected_ids(tokenizer, family, text)
            _check_bos(tokenizer, family, list(ids))
        assert rendered.prompt_tokens > 10  # the prompt is shared by the group (prefix cache)


def test_qwen_families_write_their_system_turn_and_think_block(family_replica):
    from rmserve.server.render.chat import Renderer

    group = RequestGroup(id="g", prompt="hi", responses=("yo",))
    qwen2 = Renderer.from_pretrained(family_replica("qwen2"), max_model_len=4096)
    (ids,) = qwen2.render_groups([group])[0].token_ids
    assert qwen2.tokenizer.decode(ids) == (f"<|im_start|>system\n{QWEN2_SYSTEM}<|im_end|>\n"
                                           "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n")
    qwen3 = Renderer.from_pretrained(family_replica("qwen3"), max_model_len=4096)
    (ids,) = qwen3.render_groups([group])[0].token_ids
    assert qwen3.tokenizer.decode(ids) == ("<|im_start|>user\nhi<|im_end|>\n"
                                           "<|im_start|>assistant\n<think>\n\n</think>\n\nyo<|im_end|>\n")


def test_gemma2_refuses_a_system_turn_by_group(family_replica):
    from rmserve.server.render.chat import Renderer

    renderer = Renderer.from_pretrained(family_replica("gemma2"), max_model_len=4096)
    group = RequestGroup(id="sys", messages=(Message("system", "Be brief."), Message("user", "hi")), responses=("yo",))
    with pytest.raises(InvalidRequest) as refused:
        renderer.render_groups([group])
    assert refused.value.field == "groups[0].messages"
    assert "System role not supported" in refused.value.message
    (ids,) = renderer.render_groups([RequestGroup(id="u", prompt="hi", responses=("yo",))])[0].token_ids
    assert renderer.tokenizer.decode(ids) == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_dpo_rendering_has_one_bos_or_none_and_the_answer_after_the_prompt(family_replica, chat_groups, name):
    from rmserve.server.render.dpo import DPORenderer

    family = FAMILIES[name]
    folder = family_replica(name, "causal")
    tokenizer = _tokenizer(folder)
    renderer = DPORenderer(tokenizer, max_model_len=4096)
    for group, rendered in zip(chat_groups[:2], renderer.render_groups(chat_groups[:2]), strict=True):
        assert rendered.answer_start is not None
        for response, ids, start in zip(group.responses, rendered.token_ids, rendered.answer_start, strict=True):
            ids = list(ids)
            _check_bos(tokenizer, family, ids)
            text = tokenizer.apply_chat_template(_conversation(group.messages, response), tokenize=False)
            assert ids[:-1] == expected_ids(tokenizer, family, text)  # EOS appended after the answer
            assert ids[-1] == tokenizer.eos_token_id
            assert 0 < start < len(ids)
    assert renderer.bos_rule == "template"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_judge_prompts_have_one_bos_or_none_and_end_with_the_generation_prompt(family_replica, name):
    from rmserve.server.config import EngineConfig
    from rmserve.server.kinds.judge import JudgeSettings
    from rmserve.server.kinds.judge_probe import check_chat_template
    from rmserve.server.render.judge import JudgeRenderer, judge_lead_bos

    family = FAMILIES[name]
    folder = family_replica(name, "causal")
    tokenizer = _tokenizer(folder)
    config = EngineConfig(model=str(folder), kind="judge")
    renderer = JudgeRenderer(tokenizer, chat_template=tokenizer.chat_template, max_prompt_tokens=4095,
                             lead_bos=judge_lead_bos(tokenizer, config))
    settings = JudgeSettings.from_engine_config(config)
    if not family.system_role:
        with pytest.raises(ServerFault, match="--no-judge-system-prompt"):
            check_chat_template(renderer.render_text, settings, model=str(folder))
    else:
        check_chat_template(renderer.render_text, settings, model=str(folder))
    call = [Message("user", "Which answer is better?")]
    (ids,) = renderer.render([call])
    text = tokenizer.apply_chat_template(_conversation(call), tokenize=False, add_generation_prompt=True)
    assert ids == expected_ids(tokenizer, family, text)
    _check_bos(tokenizer, family, ids)
    official = JudgeRenderer(tokenizer, chat_template=tokenizer.chat_template, max_prompt_tokens=4095,
                             lead_bos=judge_lead_bos(tokenizer, EngineConfig(model=str(folder), kind="judge",
                                                                             compat="official")))
    (official_ids,) = official.render([call])
    assert official_ids == list(tokenizer(text, add_special_tokens=False)["input_ids"])  # the official script's
