"""The local judge engines' rendering, length and stop rules, and the judge engine registry.

No torch, no vllm: :mod:`rmserve.server.render.judge` is exercised with a tiny fake tokenizer
whose template and tokenization are written out here, so every expected token id is counted
by hand. The engines themselves are tested on the demo causal LM in
``test_judge_engine_vllm.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rmserve.server.engines import registry
from rmserve.server.config import EngineConfig
from rmserve.server.render.judge import (
    JudgeRenderer,
    check_prompt_lengths,
    enable_thinking,
    finish_reason,
    judge_chat_template,
    judge_stop_ids,
    max_new_tokens,
    opens_reasoning,
)

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import Message


class FakeTokenizer:
    """Template ``<s>`` + ``[role]content|`` per message + ``[assistant]`` when asked; one token per
    character (id = code point). Records the keyword arguments of its calls."""

    chat_template = "FAKE"

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply_chat_template(self, chat, *, chat_template, tokenize, add_generation_prompt):
        self.calls.append({"chat_template": chat_template, "tokenize": tokenize, "gen": add_generation_prompt})
        if any(m["role"] not in ("system", "user", "assistant") for m in chat):
            raise ValueError("unknown role")
        text = "<" + "".join(f"[{m['role'][0]}]{m['content']}|" for m in chat)
        return text + ("[a]" if add_generation_prompt else "")

    def decode(self, ids, *, skip_special_tokens):
        assert skip_special_tokens is True
        return "".join(chr(i) for i in ids if i != 2)  # id 2 plays EOS, a special token

    def __call__(self, texts, *, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [[ord(c) for c in text] for text in texts]}


def _renderer(limit: int, template: str = "FAKE") -> tuple[JudgeRenderer, FakeTokenizer]:
    tokenizer = FakeTokenizer()
    return JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=limit), tokenizer


def test_render_uses_the_template_with_its_generation_prompt_and_no_added_tokens():
    renderer, tokenizer = _renderer(100, template="MINE")
    ids = renderer.render([[Message("system", "S"), Message("user", "hi")], [Message("user", "x")]])
    # "<[s]S|[u]hi|[a]" is 15 characters; "<[u]x|[a]" is 9.
    assert ids == [[ord(c) for c in "<[s]S|[u]hi|[a]"], [ord(c) for c in "<[u]x|[a]"]]
    assert [len(x) for x in ids] == [15, 9]
    assert tokenizer.calls == [{"chat_template": "MINE", "tokenize": False, "gen": True}] * 2


def test_lead_bos_goes_in_front_once_where_the_template_wrote_none():
    tokenizer = FakeTokenizer()
    bos = ord("<")  # the fake template writes "<" first: a prompt already starting with it is kept
    renderer = JudgeRenderer(tokenizer, chat_template="T", max_prompt_tokens=100, lead_bos=bos)
    assert renderer.render([[Message("user", "x")]]) == [[ord(c) for c in "<[u]x|[a]"]]
    renderer = JudgeRenderer(tokenizer, chat_template="T", max_prompt_tokens=100, lead_bos=1)
    assert renderer.render([[Message("user", "x")]]) == [[1, *(ord(c) for c in "<[u]x|[a]")]]


def test_a_prompt_of_exactly_the_limit_is_accepted_one_more_is_refused():
    renderer, _ = _renderer(9)
    assert len(renderer.render([[Message("user", "x")]])[0]) == 9  # "<[u]x|[a]"
    with pytest.raises(SequenceTooLong) as info:
        renderer.render([[Message("user", "x")], [Message("user", "xy")]])  # second: 10 tokens
    err = info.value
    assert (err.field, err.value, err.limit) == ("messages", 10, 9)
    assert "judge call 1 renders to 10 prompt tokens" in err.message
    assert "at most 9" in err.message


def test_template_errors_and_empty_calls_name_messages():
    renderer, _ = _renderer(100)
    with pytest.raises(InvalidRequest) as info:
        renderer.render([[Message("tool", "x")]])
    assert info.value.field == "messages"
    assert "['tool']" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        renderer.render([[]])
    assert info.value.field == "messages"
    with pytest.raises(InvalidRequest):
        renderer.render([])
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        JudgeRenderer(FakeTokenizer(), chat_template="T", max_prompt_tokens=0)


THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n"
    "{% elif enable_thinking is defined %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""A tiny template with a thinking switch: on opens the reasoning for the model (as
QwQ/DeepSeek-R1 templates do), off writes an empty closed block (as Qwen3's does), unset
neither."""

THINKING_CALL = [Message("system", "S"), Message("user", "hi")]

# (switch, enable_thinking passed, the rendered prompt, the prompt opens the reasoning)
THINKING_RENDERS = [
    (None, None, "<|system|>S\n<|user|>hi\n<|assistant|>", False),
    ("on", True, "<|system|>S\n<|user|>hi\n<|assistant|><think>\n", True),
    ("off", False, "<|system|>S\n<|user|>hi\n<|assistant|><think>\n\n</think>\n\n", False),
]


class JinjaTokenizer(FakeTokenizer):
    """:class:`FakeTokenizer` whose ``apply_chat_template`` renders the Jinja template with
    every extra keyword as a template variable (what transformers does)."""

    def apply_chat_template(self, chat, *, chat_template, tokenize, add_generation_prompt, **kwargs):
        import jinja2

        self.calls.append({"chat_template": chat_template, "gen": add_generation_prompt, **kwargs})
        return jinja2.Template(chat_template).render(messages=chat, add_generation_prompt=add_generation_prompt, **kwargs)


@pytest.mark.parametrize(("switch", "flag", "text", "opened"), THINKING_RENDERS)
def test_the_thinking_switch_reaches_the_template(switch, flag, text, opened):
    assert enable_thinking(switch) is flag
    tokenizer = JinjaTokenizer()
    renderer = JudgeRenderer(tokenizer, chat_template=THINKING_TEMPLATE, max_prompt_tokens=100,
                             enable_thinking=flag)
    assert renderer.render_text(THINKING_CALL) == text
    ids, opens = renderer.render_calls([THINKING_CALL, [Message("user", "x")]])
    assert ids[0] == [ord(c) for c in text] and opens == [opened, opened]
    assert renderer.render([THINKING_CALL]) == [ids[0]]
    # enable_thinking is passed only when the switch is set
    assert all(("enable_thinking" in call) == (flag is not None) for call in tokenizer.calls)


@pytest.mark.model
@pytest.mark.parametrize(("switch", "flag", "text", "opened"), THINKING_RENDERS)
def test_the_thinking_switch_reaches_a_transformers_template(switch, flag, text, opened):
    """The same template through transformers' own ``apply_chat_template`` (a word-level
    tokenizer built here, no files)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
    renderer = JudgeRenderer(tokenizer, chat_template=THINKING_TEMPLATE, max_prompt_tokens=100,
                             enable_thinking=enable_thinking(switch))
    assert renderer.render_text(THINKING_CALL) == text
    assert renderer.render_calls([THINKING_CALL])[1] == [opened]


def test_opens_reasoning_and_bad_switches():
    assert opens_reasoning("<|assistant|><think>\n") and opens_reasoning("<think>")
    assert not opens_reasoning("<|assistant|><think>\n\n</think>\n\n")
    assert not opens_reasoning("<|user|>quote <think> here\n<|assistant|>")
    with pytest.raises(ValueError, match="judge_thinking: 'yes' is not one of on, off"):
        enable_thinking("yes")
    with pytest.raises(ValueError, match="enable_thinking"):
        JudgeRenderer(FakeTokenizer(), chat_template="T", max_prompt_tokens=9, enable_thinking="on")


def test_decode_skips_special_tokens_and_keeps_spaces():
    renderer, _ = _renderer(100)
    assert renderer.decode([32, 104, 105, 32, 2]) == " hi "
    assert renderer.decode_all([[104], [], [2]]) == ["h", "", ""]


def test_check_prompt_lengths_by_hand():
    check_prompt_lengths([[1, 2, 3], [4]], 3)
    with pytest.raises(SequenceTooLong) as info:
        check_prompt_lengths([[1], [1, 2, 3, 4]], 3)
    assert (info.value.value, info.value.limit) == (4, 3)
    with pytest.raises(InvalidRequest):
        check_prompt_lengths([[]], 3)


def test_max_new_tokens_stops_at_the_context():
    assert max_new_tokens(10, 32, 100) == 32  # room 90
    assert max_new_tokens(80, 32, 100) == 20  # room 20 < 32
    assert max_new_tokens(99, 32, 100) == 1  # the one token the length rule keeps
    with pytest.raises(ValueError):
        max_new_tokens(100, 32, 100)


def test_finish_reason_by_hand():
    assert finish_reason([5, 6, 2], {2}, 32) == "stop"  # ended on EOS before the limit
    assert finish_reason([5, 6, 2], {2}, 3) == "stop"  # EOS as the last allowed token is a stop
    assert finish_reason([5, 6, 7], {2}, 3) == "length"
    with pytest.raises(ValueError):
        finish_reason([5, 6], {2}, 3)  # neither a stop nor the limit
    with pytest.raises(ValueError):
        finish_reason([], {2}, 3)


def test_stop_ids_merge_tokenizer_and_generation_config():
    assert judge_stop_ids(2, None) == (2,)
    assert judge_stop_ids(2, 2) == (2,)
    assert judge_stop_ids(128009, [128001, 128009]) == (128009, 128001)
    assert judge_stop_ids(None, [7]) == (7,)
    assert judge_stop_ids(None, None) == ()


def test_chat_template_from_file_wins_and_a_missing_one_is_refused(tmp_path: Path):
    class NoTemplate:
        chat_template = None

    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}", encoding="utf-8")
    assert judge_chat_template(NoTemplate(), path, "m") == "{{ messages }}"
    assert judge_chat_template(FakeTokenizer(), None, "m") == "FAKE"
    with pytest.raises(ServerFault) as info:
        judge_chat_template(NoTemplate(), None, "some/model")
    assert "chat_template" in info.value.message
    assert "--chat-template" in info.value.message
    assert "'some/model'" in info.value.message

    class Named:
        chat_template = {"tool_use": "T"}  # named templates without a default

    with pytest.raises(ServerFault):
        judge_chat_template(Named(), None, "m")


def test_judge_engine_registry_and_choice(monkeypatch, tmp_path: Path):
    assert registry.JUDGE_ENGINES == {
        "vllm": "rmserve.server.engines.vllm_engine:VLLMJudgeEngine",
        "hf": "rmserve.server.engines.hf_engine:HFJudgeEngine",
    }
    assert registry.OPENAI_JUDGE_ENGINE == "rmserve.server.engines.openai_judge:OpenAIJudgeEngine"
    imported: list[str] = []

    class Built:
        def __init__(self, config):
            self.config = config

    def fake_import(target: str) -> type:
        imported.append(target)
        return Built

    monkeypatch.setattr(registry, "_import", fake_import)
    local = EngineConfig(model=str(tmp_path), kind="judge", engine="hf")
    engine = registry.build_engine(local)
    assert isinstance(engine, Built) and engine.config is local
    remote = EngineConfig(model="judge-name", kind="judge", judge_url="http://127.0.0.1:9/v1")
    registry.build_engine(remote)
    assert imported == ["rmserve.server.engines.hf_engine:HFJudgeEngine", "rmserve.server.engines.openai_judge:OpenAIJudgeEngine"]


def test_unknown_judge_engine_lists_the_choices(tmp_path: Path):
    config = EngineConfig(model=str(tmp_path), kind="judge")
    object.__setattr__(config, "engine", "tgi")
    with pytest.raises(ValueError, match="no judge engine 'tgi'; choose one of hf, vllm"):
        registry.judge_engine_class(config)
