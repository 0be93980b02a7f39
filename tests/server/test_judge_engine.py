"""The local judge engines' rendering, length and stop rules, and the judge engine registry.

No torch, no vllm: :mod:`rmserve.server.judge_render` is exercised with a tiny fake tokenizer
whose template and tokenization are written out here, so every expected token id is counted
by hand. The engines themselves are tested on the demo causal LM in
``test_judge_engine_vllm.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rmserve.server import backends
from rmserve.server.config import EngineConfig
from rmserve.server.judge_render import (
    JudgeRenderer,
    check_prompt_lengths,
    finish_reason,
    judge_chat_template,
    judge_stop_ids,
    max_new_tokens,
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
    assert backends.JUDGE_ENGINES == {
        "vllm": "rmserve.server.engine:VLLMJudgeEngine",
        "hf": "rmserve.server.engine_hf:HFJudgeEngine",
    }
    assert backends.OPENAI_JUDGE_ENGINE == "rmserve.server.judge_openai:OpenAIJudgeEngine"
    imported: list[str] = []

    class Built:
        def __init__(self, config):
            self.config = config

    def fake_import(target: str) -> type:
        imported.append(target)
        return Built

    monkeypatch.setattr(backends, "_import", fake_import)
    local = EngineConfig(model=str(tmp_path), kind="judge", engine="hf")
    engine = backends.build_engine(local)
    assert isinstance(engine, Built) and engine.config is local
    remote = EngineConfig(model="judge-name", kind="judge", judge_url="http://127.0.0.1:9/v1")
    backends.build_engine(remote)
    assert imported == ["rmserve.server.engine_hf:HFJudgeEngine", "rmserve.server.judge_openai:OpenAIJudgeEngine"]


def test_unknown_judge_engine_lists_the_choices(tmp_path: Path):
    config = EngineConfig(model=str(tmp_path), kind="judge")
    object.__setattr__(config, "engine", "tgi")
    with pytest.raises(ValueError, match="no judge engine 'tgi'; choose one of hf, vllm"):
        backends.judge_engine_class(config)
