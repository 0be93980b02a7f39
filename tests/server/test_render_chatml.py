"""The renderers on a tokenizer shaped like Qwen2.5's: no BOS, EOS ``<|im_end|>``, ChatML with a
default system block (``testkit.chatml``, built locally with ``tokenizers``).

Ids are written out from the tokenizer's hand-made vocabulary: a byte is its own id,
``<|im_start|>`` 257, ``<|im_end|>`` 258, ``"Hi"`` 260, ``"\\n\\n"`` 259 (before a space). Marked
``model``: the tokenizer is a transformers tokenizer (the fast lane has neither library).
"""

from __future__ import annotations

import pytest
from rmserve.server.render.chat import Renderer
from rmserve.server.render.dpo import DPORenderer
from rmserve.server.render.judge import JudgeRenderer, judge_chat_template
from testkit.chatml import CHATML_TEMPLATE, HI, IM_END, IM_START, NEWLINES, chatml_tokenizer

from rmserve.schema import Message, RequestGroup, ResponseError, ScoreRequest, Truncation

pytestmark = pytest.mark.model

SYSTEM = [IM_START, *b"system\nYou are a helpful assistant.", IM_END, *b"\n"]  # the default system block
PROMPT = SYSTEM + [IM_START, *b"user\n", HI, IM_END, *b"\n"]  # [user "Hi"]: 47 tokens
HEADER = [IM_START, *b"assistant\n"]  # 11 tokens before the response
HELLO = PROMPT + HEADER + [*b"Hello", IM_END, *b"\n"]  # what the template writes for "Hello" (65)
# "\n x": the header's newline and the response's merge into 259, which holds response text.
NEWLINE_X = PROMPT + [IM_START, *b"assistant", NEWLINES, *b" x", IM_END, *b"\n"]  # 62


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return chatml_tokenizer(tmp_path_factory.mktemp("chatml"))


def test_the_hand_written_ids_are_the_tokenizers(tokenizer):
    # The template and the tokenizer themselves (no renderer): the ids above are theirs.
    for response, ids in (("Hello", HELLO), ("\n x", NEWLINE_X)):
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": response}],
                                             tokenize=False)
        assert tokenizer.encode(text, add_special_tokens=False) == ids
    assert (len(PROMPT), len(HEADER), len(HELLO), len(NEWLINE_X)) == (47, 11, 65, 62)


def test_dpo_default_starts_with_the_templates_first_token_not_an_invented_bos(tokenizer):
    renderer = DPORenderer(tokenizer, max_model_len=512)
    rendered = renderer.render_group([Message("user", "Hi")], ["Hello"], group_id="g")
    assert rendered.token_ids == (HELLO + [IM_END],)  # + the appended EOS
    assert rendered.token_ids[0][:3] == [IM_START, *b"sy"]
    assert rendered.answer_start == (47,)  # the answer is the assistant turn and the EOS
    assert renderer.bos_rule == "template"


def test_dpo_official_puts_eos_in_front_as_the_official_script(tokenizer):
    renderer = DPORenderer(tokenizer, max_model_len=512, compat="official")
    rendered = renderer.render_group([Message("user", "Hi")], ["Hello"], group_id="g")
    assert rendered.token_ids == ([IM_END] + HELLO + [IM_END],)
    assert rendered.answer_start == (48,)
    assert renderer.bos_rule == "eos-as-bos (official)"


def test_classifier_and_judge_write_what_the_template_writes(tokenizer):
    rendered = Renderer(tokenizer, max_model_len=512).render_group([Message("user", "Hi")], ["Hello"], group_id="g")
    assert rendered.token_ids == (HELLO,)
    assert judge_chat_template(tokenizer, None, "chatml") == CHATML_TEMPLATE
    judge = JudgeRenderer(tokenizer, chat_template=CHATML_TEMPLATE, max_prompt_tokens=511)
    assert judge.render([[Message("user", "Hi")]]) == [PROMPT + HEADER]  # the generation prompt, nothing in front


def test_dpo_right_cut_to_the_header_fails_and_a_merged_header_token_counts_as_the_response(tokenizer):
    renderer = DPORenderer(tokenizer, max_model_len=512)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="Hi", responses=("Hello", "\n x")),),
                           truncation=Truncation("right", 58))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.errors == (ResponseError(
        "sequence_too_long",
        "a right cut to truncation.max_tokens=58 keeps none of the response: after the 47-token prompt it keeps 11 "
        "of the 19 answer tokens, but the answer's first 11 are the chat template's, before the response",
    ), None)
    assert rendered.token_ids == (HELLO + [IM_END], PROMPT + [IM_START, *b"assistant", NEWLINES])
    assert rendered.truncated_tokens == (0, 5)  # 62 + EOS = 63 → 58
    assert rendered.answer_start == (47, 47)
    (one_more,) = renderer.render_request(
        ScoreRequest(groups=request.groups, truncation=Truncation("right", 59)), too_long="mark"
    )
    assert one_more.errors is None
    assert one_more.token_ids[0] == PROMPT + HEADER + [*b"H"]
    assert one_more.truncated_tokens == (7, 4)


def test_dpo_left_cut_keeps_the_templates_first_token(tokenizer):
    renderer = DPORenderer(tokenizer, max_model_len=512)
    rendered = renderer.render_group([Message("user", "Hi")], ["Hello"], group_id="g", truncation=Truncation("left", 30))
    # 66 → 30: <|im_start|> stays first, the 36 prompt tokens after it go, the 19 answer tokens stay.
    assert rendered.token_ids == ([IM_START, *PROMPT[37:], *HEADER, *b"Hello", IM_END, *b"\n", IM_END],)
    assert rendered.answer_start == (11,)
    assert rendered.truncated_tokens == (36,)


def test_classifier_right_cut_to_the_header_fails(tokenizer):
    renderer = Renderer(tokenizer, max_model_len=512)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="Hi", responses=("Hello", "\n x")),),
                           truncation=Truncation("right", 58))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.errors == (ResponseError(
        "sequence_too_long",
        "a right cut to truncation.max_tokens=58 keeps none of the response: the first 58 of its 65 tokens are the "
        "prompt and the chat template before it",
    ), None)
    assert rendered.token_ids == (HELLO, PROMPT + [IM_START, *b"assistant", NEWLINES])
    assert rendered.truncated_tokens == (0, 4)
