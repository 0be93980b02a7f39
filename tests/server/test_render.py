"""Renderer: chat template → token ids, exactly one BOS, length policy, truncation.

Expected ids are built independently: by hand from the demo template's layout
(``<s><|role|>\\n{content}</s>`` per turn, see ``rmserve.demo_model``) with the
tokenizer encoding only the plain-text pieces, or with transformers'
``apply_chat_template(tokenize=True)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rmserve.server.http import wire
from rmserve.server.render.chat import Renderer
from testkit.fakes import FakeRenderer, FakeTokenizer

from rmserve.datasets import load_rmbench
from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import Message, RequestGroup, ResponseError, ScoreRequest, Truncation


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo_model_dir))


@pytest.fixture(scope="module")
def renderer(tokenizer) -> Renderer:
    return Renderer(tokenizer, max_model_len=4096)


@pytest.fixture(scope="module")
def special(tokenizer) -> dict[str, int]:
    names = {"bos": "<s>", "eos": "</s>", "system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
    return {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in names.items()}


def _text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _hand_ids(tokenizer, special, turns: list[tuple[str, str]]) -> list[int]:
    """The demo template's ids, assembled turn by turn."""
    ids = [special["bos"]]
    for role, content in turns:
        ids += [special[role], *_text_ids(tokenizer, "\n" + content), special["eos"]]
    return ids


def _hf_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])


def test_ids_have_exactly_one_bos_and_match_hand_built_sequence(tokenizer, renderer, special):
    messages = (Message("user", "What is 2 + 2?"),)
    group = renderer.render_group(messages, ["It is 4.", "Five."], group_id="g0")

    for response, ids in zip(["It is 4.", "Five."], group.token_ids, strict=True):
        assert ids == _hand_ids(tokenizer, special, [("user", "What is 2 + 2?"), ("assistant", response)])
        assert ids[0] == special["bos"] and ids.count(special["bos"]) == 1
    # The trap the renderer avoids: tokenizing the rendered text with special tokens adds a
    # second BOS (the demo tokenizer prepends BOS like Llama tokenizers do).
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "Five."}], tokenize=False
    )
    naive = tokenizer(text).input_ids
    assert naive[:2] == [special["bos"], special["bos"]]
    assert naive[1:] == group.token_ids[1]


def test_multi_turn_conversation_renders_every_turn(tokenizer, renderer, special):
    turns = [
        ("system", "You are terse."),
        ("user", "Name a prime."),
        ("assistant", "Seven."),
        ("user", "Another one?"),
    ]
    group = renderer.render_group([Message(r, c) for r, c in turns], ["Eleven."], group_id="multi")
    ids = group.token_ids[0]
    assert ids == _hand_ids(tokenizer, special, [*turns, ("assistant", "Eleven.")])
    markers = [i for i in ids if i in (special["system"], special["user"], special["assistant"])]
    assert markers == [special["system"], special["user"], special["assistant"], special["user"], special["assistant"]]
    assert ids.count(special["eos"]) == 5


@pytest.mark.parametrize(
    "responses",
    [
        ["Hello world", "Hello there", "Hello"],  # shared text runs into the responses
        ["", "x"],
        ["same", "same"],
        ["only one"],
    ],
)
def test_shared_prompt_split_equals_whole_text_tokenization(tokenizer, renderer, responses):
    messages = [Message("user", "Say hello, twice over: hello hello.")]
    group = renderer.render_group(messages, responses, group_id="split")
    for response, ids in zip(responses, group.token_ids, strict=True):
        assert ids == _hf_ids(tokenizer, [{"role": "user", "content": messages[0].content}, {"role": "assistant", "content": response}])


def test_all_rmbench_groups_match_apply_chat_template(tokenizer, renderer, rmbench_dir):
    dataset = load_rmbench(rmbench_dir)
    groups = [RequestGroup(id=str(g.key), responses=g.responses, messages=g.messages) for g in dataset.groups]
    rendered = renderer.render_groups(groups)

    assert len(rendered) == len(groups) == 798
    conversations = [
        [*({"role": m.role, "content": m.content} for m in g.messages), {"role": "assistant", "content": r}]
        for g in dataset.groups
        for r in g.responses
    ]
    # whole-text tokenization by transformers, one batched call
    expected = iter(tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True)["input_ids"])
    mismatched = []
    for group, result in zip(dataset.groups, rendered, strict=True):
        assert result.id == str(group.key)
        for j in range(len(group.responses)):
            if result.token_ids[j] != list(next(expected)):
                mismatched.append((result.id, j))
        # prompt_tokens = longest common prefix of the group's sequences, counted by hand
        first, k = result.token_ids[0], 0
        while k < min(map(len, result.token_ids)) and all(ids[k] == first[k] for ids in result.token_ids):
            k += 1
        assert result.prompt_tokens == k
        assert result.truncated_tokens is None
    assert mismatched == []


def test_prompt_string_equals_single_user_turn(renderer):
    by_prompt = renderer.render_groups([RequestGroup(id="a", responses=("r1", "r2"), prompt="Why?")])[0]
    by_messages = renderer.render_groups(
        [RequestGroup(id="a", responses=("r1", "r2"), messages=(Message("user", "Why?"),))]
    )[0]
    assert by_prompt.token_ids == by_messages.token_ids


def test_render_request_uses_request_truncation(renderer):
    request = ScoreRequest(
        groups=(RequestGroup(id="t", responses=("word " * 40,), prompt="Repeat."),),
        truncation=Truncation(side="right", max_tokens=12),
    )
    (result,) = renderer.render_request(request)
    assert result.num_tokens == (12,)
    assert result.truncated_tokens is not None and result.truncated_tokens[0] > 0


def test_empty_response_is_scored_as_an_empty_assistant_turn(tokenizer, renderer, special):
    group = renderer.render_group([Message("user", "Anything?")], ["", "Yes."], group_id="empty")
    expected = _hand_ids(tokenizer, special, [("user", "Anything?"), ("assistant", "")])
    assert group.token_ids[0] == expected
    assert expected[-3:] == [special["assistant"], *_text_ids(tokenizer, "\n"), special["eos"]]


def _long_group(renderer: Renderer):
    messages = [Message("user", "Count to forty.")]
    responses = ["ok", " ".join(str(i) for i in range(40)), "one two three four five six seven"]
    full = renderer.render_group(messages, responses, group_id="long").token_ids
    return messages, responses, full


def test_truncation_right_keeps_the_start_and_reports_cuts(renderer):
    messages, responses, full = _long_group(renderer)
    limit = 20
    group = renderer.render_group(
        messages, responses, group_id="long", truncation=Truncation(side="right", max_tokens=limit)
    )
    assert group.truncated_tokens == tuple(max(0, len(ids) - limit) for ids in full)
    assert group.truncated_tokens[0] == 0 and group.truncated_tokens[1] > 0
    for ids, cut_ids in zip(full, group.token_ids, strict=True):
        assert cut_ids == ids[:limit]


def test_truncation_left_keeps_the_end_and_a_single_bos(renderer, special):
    messages, responses, full = _long_group(renderer)
    limit = 20
    group = renderer.render_group(
        messages, responses, group_id="long", truncation=Truncation(side="left", max_tokens=limit)
    )
    assert group.truncated_tokens == tuple(max(0, len(ids) - limit) for ids in full)
    for ids, cut_ids in zip(full, group.token_ids, strict=True):
        if len(ids) <= limit:
            assert cut_ids == ids
        else:
            assert len(cut_ids) == limit
            assert cut_ids == [special["bos"], *ids[len(ids) - limit + 1 :]]
            assert cut_ids.count(special["bos"]) == 1


def test_too_long_sequence_names_group_index_count_and_limit(tokenizer):
    small = Renderer(tokenizer, max_model_len=30)
    responses = ["short", " ".join(str(i) for i in range(60))]
    full_len = len(_hf_ids(tokenizer, [{"role": "user", "content": "Count."}, {"role": "assistant", "content": responses[1]}]))
    assert full_len > 30
    groups = [
        RequestGroup(id="ok-group", responses=("fine",), prompt="Hi."),
        RequestGroup(id="rm-bench/chat/17", responses=tuple(responses), prompt="Count."),
    ]
    with pytest.raises(SequenceTooLong) as info:
        small.render_groups(groups)
    err = info.value
    assert err.field == "groups[1].responses[1]"
    assert (err.value, err.limit) == (full_len, 30)
    for part in ("rm-bench/chat/17", "groups[1].responses[1]", str(full_len), "30"):
        assert part in err.message
    assert err.status == 413


def test_truncation_avoids_too_long_error(tokenizer):
    small = Renderer(tokenizer, max_model_len=30)
    group = small.render_group(
        [Message("user", "Count.")], [" ".join(str(i) for i in range(60))], group_id="g",
        truncation=Truncation(side="left", max_tokens=30),
    )
    assert group.num_tokens == (30,)


@pytest.mark.parametrize(("max_tokens", "limit"), [(31, 30), (1, 2)])
def test_truncation_max_tokens_outside_range_is_rejected(tokenizer, max_tokens, limit):
    small = Renderer(tokenizer, max_model_len=30)
    with pytest.raises(InvalidRequest) as info:
        small.render_group([Message("user", "x")], ["y"], group_id="g", truncation=Truncation("right", max_tokens))
    assert info.value.field == "truncation.max_tokens"
    assert (info.value.value, info.value.limit) == (max_tokens, limit)
    assert str(limit) in info.value.message


def test_unknown_role_is_an_invalid_request_naming_the_group(renderer):
    groups = [
        RequestGroup(id="fine", responses=("a",), prompt="q"),
        RequestGroup(id="bad", responses=("a",), messages=(Message("tool", "output"), Message("user", "q"))),
    ]
    with pytest.raises(InvalidRequest) as info:
        renderer.render_groups(groups)
    assert info.value.field == "groups[1].messages"
    assert "'bad'" in info.value.message and "tool" in info.value.message


@pytest.mark.parametrize(
    ("group", "field"),
    [
        (RequestGroup(id="n", responses=("a",)), "groups[0].messages"),
        (RequestGroup(id="b", responses=("a",), prompt="p", messages=(Message("user", "p"),)), "groups[0].messages"),
        (RequestGroup(id="z", responses=(), prompt="p"), "groups[0].responses"),
    ],
)
def test_malformed_groups_are_rejected(renderer, group, field):
    with pytest.raises(InvalidRequest) as info:
        renderer.render_groups([group])
    assert info.value.field == field


def _wire_error(groups, truncation=None, max_model_len=30) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        wire.validate_score_request(ScoreRequest(groups=tuple(groups), truncation=truncation), max_model_len=max_model_len)
    return info.value


@pytest.mark.parametrize(
    "bad",
    [
        RequestGroup(id="n", responses=("a",)),
        RequestGroup(id="b", responses=("a",), prompt="p", messages=(Message("user", "p"),)),
        RequestGroup(id="e", responses=("a",), messages=()),
        RequestGroup(id="r", responses=("a",), messages=(Message("", "p"),)),
        RequestGroup(id="l", responses=("a",), messages=(Message("user", "p"), Message("assistant", "q"))),
        RequestGroup(id="z", responses=(), prompt="p"),
        RequestGroup(id="", responses=("a",), prompt="p"),
    ],
    ids=["neither", "both", "no-turn", "empty-role", "last-not-user", "no-response", "empty-id"],
)
def test_renderer_rejects_a_bad_group_with_the_wire_error(bad):
    # One owner per rule: loose groups given to the renderer get the request body's error.
    fine = RequestGroup(id="fine", responses=("a",), prompt="q")
    expected = _wire_error([fine, bad])
    with pytest.raises(InvalidRequest) as info:
        FakeRenderer(max_model_len=30).render_groups([fine, bad])
    got = info.value
    assert (got.field, got.value, got.limit, got.message) == (expected.field, expected.value, expected.limit, expected.message)
    assert got.field.startswith("groups[1].")


@pytest.mark.parametrize(("max_tokens", "limit"), [(31, 30), (1, 2)])
def test_renderer_truncation_bounds_are_the_wire_error(max_tokens, limit):
    truncation = Truncation("left", max_tokens)
    expected = _wire_error([RequestGroup(id="g", responses=("y",), prompt="x")], truncation)
    with pytest.raises(InvalidRequest) as info:
        FakeRenderer(max_model_len=30).render_group([Message("user", "x")], ["y"], group_id="g", truncation=truncation)
    assert (info.value.field, info.value.value, info.value.limit) == ("truncation.max_tokens", max_tokens, limit)
    assert info.value.message == expected.message == (
        f"truncation.max_tokens is {max_tokens}; it must be between 2 and the model's max length 30"
    )


def test_render_group_names_its_index_in_error_fields():
    with pytest.raises(InvalidRequest) as info:
        FakeRenderer().render_group([Message("user", "x")], [], group_id="g", group_index=4)
    assert info.value.field == "groups[4].responses"
    assert info.value.message == "groups[4].responses (id 'g') must hold at least one response"


def test_chat_template_override_file_is_used(demo_model_dir, tmp_path, tokenizer, special):
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    path = tmp_path / "plain.jinja"
    path.write_text(template, encoding="utf-8")
    renderer = Renderer.from_pretrained(demo_model_dir, max_model_len=4096, chat_template_path=path)
    assert renderer.chat_template == template
    ids = renderer.render_group([Message("user", "Hi")], ["Yo"], group_id="o").token_ids[0]
    assert ids == [  # the template writes no BOS: the demo tokenizer's own (it adds one on encode) comes first
        special["bos"], special["user"], *_text_ids(tokenizer, "Hi"), special["eos"],
        special["assistant"], *_text_ids(tokenizer, "Yo"), special["eos"],
    ]


def test_template_writing_bos_twice_is_a_server_fault(tokenizer):
    renderer = Renderer(
        tokenizer, max_model_len=4096,
        chat_template="{{ bos_token }}{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )
    with pytest.raises(ServerFault, match="BOS twice"):
        renderer.render_group([Message("user", "Hi")], ["Yo"], group_id="double")


# --- a right cut must leave something of the response (fake template: ids by hand) ---------

HELLO = [1, 4, 104, 101, 108, 108, 111, 2]  # BOS user "hello" EOS


def test_right_cut_into_the_assistant_header_is_not_scored_as_the_shared_prompt():
    # "ok": HELLO + [5 | 111, 107, 2] (12): the response starts at token 9, after the marker 5.
    # "": HELLO + [5, 2] (10): nothing of its own. "abc": HELLO + [5 | 97, 98, 99, 2] (13).
    renderer = FakeRenderer(max_model_len=64)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok", "", "abc")),),
                           truncation=Truncation("right", 9))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.token_ids == (HELLO + [5, 111, 107, 2], HELLO + [5, 2], HELLO + [5, 97, 98, 99, 2])  # kept whole
    assert rendered.truncated_tokens == (0, 0, 0)
    assert rendered.errors == (
        ResponseError("sequence_too_long", "a right cut to truncation.max_tokens=9 keeps none of the response: "
                      "the first 9 of its 12 tokens are the prompt and the chat template before it"),
        ResponseError("sequence_too_long", "the response is empty: all 10 tokens are the prompt and the chat "
                      "template, so a right cut to truncation.max_tokens=9 would score the shared prompt, not the response"),
        ResponseError("sequence_too_long", "a right cut to truncation.max_tokens=9 keeps none of the response: "
                      "the first 9 of its 13 tokens are the prompt and the chat template before it"),
    )
    assert rendered.scorable == ()
    # One token of the response more, and the two non-empty responses are scored.
    (cut,) = renderer.render_request(
        ScoreRequest(groups=request.groups, truncation=Truncation("right", 10)), too_long="mark"
    )
    assert cut.token_ids == (HELLO + [5, 111], HELLO + [5, 2], HELLO + [5, 97])
    assert cut.truncated_tokens == (2, 0, 3)
    assert cut.errors is None
    with pytest.raises(SequenceTooLong, match=r"groups\[0\].responses\[0\] of group 'g': a right cut") as info:
        renderer.render_group([Message("user", "hello")], ["ok"], group_id="g", truncation=Truncation("right", 9))
    assert (info.value.field, info.value.value, info.value.limit) == ("groups[0].responses[0]", 12, 9)


def test_right_cut_content_start_is_looked_up_only_for_sequences_it_shortens():
    class Counting(FakeRenderer):
        template_calls = 0

        def _apply_template(self, conversations, items):
            Counting.template_calls += 1
            return super()._apply_template(conversations, items)

    renderer = Counting(max_model_len=64)
    renderer.render_group([Message("user", "hello")], ["ok"], group_id="g", truncation=Truncation("right", 12))
    assert Counting.template_calls == 1  # 12 tokens fit: no second rendering
    renderer.render_group([Message("user", "hello")], ["ok"], group_id="g", truncation=Truncation("right", 11))
    assert Counting.template_calls == 3


class NoBosTemplateTokenizer(FakeTokenizer):
    """The fake tokenizer (adds BOS 1 on a plain encode) under a template that writes no BOS, as
    Mistral's ``[INST]`` format: the one BOS must come from the tokenizer."""

    def apply_chat_template(self, conversations, **options):
        texts = super().apply_chat_template(conversations, **options)
        return texts[1:] if isinstance(texts, str) else [t[1:] for t in texts]


class NoBosTokenizer(NoBosTemplateTokenizer):
    """No BOS at all (Qwen's ChatML): nothing may be put in front."""

    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


@pytest.mark.parametrize(("tokenizer_class", "lead"), [(NoBosTemplateTokenizer, [1]), (NoBosTokenizer, [])])
def test_a_template_without_bos_gets_the_tokenizers_bos_once_or_none(tokenizer_class, lead):
    renderer = Renderer(tokenizer_class(), max_model_len=64)
    assert renderer.added_bos_id == (1 if lead else None)
    (group,) = renderer.render_groups([RequestGroup(id="g", prompt="hi", responses=("yo", "yes"))])
    # user 4 'h' 'i' EOS 2, assistant 5, response, EOS 2 — by hand from the fake's rules
    assert [list(ids) for ids in group.token_ids] == [lead + [4, 104, 105, 2, 5, 121, 111, 2],
                                                      lead + [4, 104, 105, 2, 5, 121, 101, 115, 2]]
    assert group.prompt_tokens == len(lead) + 6  # both responses start with "y" (121)
    right = Truncation(max_tokens=len(lead) + 7, side="right")
    (cut,) = renderer.render_groups([RequestGroup(id="g", prompt="hi", responses=("yes",))], right)
    assert [list(ids) for ids in cut.token_ids] == [lead + [4, 104, 105, 2, 5, 121, 101]]
    assert cut.truncated_tokens == (2,)
