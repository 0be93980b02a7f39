"""The DPO renderer on hand-made cases: ids written out from the fake template.

Fake template (``testkit.fakes``): ids = [1 BOS] + per turn [role, *code points, 2 EOS];
user = 4, assistant = 5. "hi" = 104 105, "ok" = 111 107.
"""

from __future__ import annotations

import msgspec
import pytest
from rmserve.server.render.dpo import (
    OFFICIAL_MAX_LENGTH,
    OFFICIAL_MAX_PROMPT_LENGTH,
    DPORenderer,
    official_truncation,
    pair_partners,
)
from testkit.dpo_fakes import FakeDPOTokenizer

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import Message, RequestGroup, ResponseError, ScoreRequest, Truncation


def render(renderer: DPORenderer, prompt: str, responses: list[str], truncation: Truncation | None = None):
    return renderer.render_group([Message("user", prompt)], responses, group_id="g", truncation=truncation)


def test_default_mode_keeps_the_template_bos_single_and_appends_eos():
    rendered = render(DPORenderer(FakeDPOTokenizer(), max_model_len=64), "hi", ["ok"])
    assert rendered.token_ids == ([1, 4, 104, 105, 2, 5, 111, 107, 2, 2],)
    assert rendered.answer_start == (5,)
    assert rendered.truncated_tokens is None and rendered.errors is None
    assert rendered.num_tokens == (10,)


def test_official_mode_doubles_the_bos_as_the_official_script():
    rendered = render(DPORenderer(FakeDPOTokenizer(), max_model_len=64, compat="official"), "hi", ["ok"])
    assert rendered.token_ids == ([1, 1, 4, 104, 105, 2, 5, 111, 107, 2, 2],)
    assert rendered.answer_start == (6,)
    assert rendered.truncated_tokens == (0,)  # official mode always reports its cuts


def test_a_tokenizer_without_bos_gets_nothing_in_front_by_default_and_eos_in_official_mode():
    # Default: the template's own first token (the user marker 4) starts the sequence, no EOS stand-in.
    renderer = DPORenderer(FakeDPOTokenizer(bos=False), max_model_len=64)
    rendered = render(renderer, "hi", ["ok"])
    assert rendered.token_ids == ([4, 104, 105, 2, 5, 111, 107, 2, 2],)
    assert rendered.answer_start == (4,)
    assert (renderer.bos_rule, renderer.sequence_bos_id) == ("template", None)
    # Official: run_dpo.py sets bos_token_id = eos_token_id, so EOS (2) goes in front.
    official = DPORenderer(FakeDPOTokenizer(bos=False), max_model_len=64, compat="official")
    rendered = render(official, "hi", ["ok"])
    assert rendered.token_ids == ([2, 4, 104, 105, 2, 5, 111, 107, 2, 2],)
    assert rendered.answer_start == (5,)
    assert (official.bos_rule, official.sequence_bos_id) == ("eos-as-bos (official)", 2)


def test_the_bos_rule_of_a_tokenizer_with_bos():
    assert DPORenderer(FakeDPOTokenizer(), max_model_len=64).bos_rule == "template"
    assert DPORenderer(FakeDPOTokenizer(), max_model_len=64, compat="official").bos_rule == "bos-prepended (official)"


class AnswersOnly(FakeDPOTokenizer):
    """A template that writes the assistant turns only: the conversation before the answer renders to nothing."""

    def apply_chat_template(self, conversations, **kwargs):
        return ["".join(chr(5) + t["content"] + chr(2) for t in c if t["role"] == "assistant") for c in conversations]


def test_nothing_before_the_answer_is_a_clear_error_not_a_score_without_the_first_token():
    with pytest.raises(InvalidRequest, match="no token comes before the answer") as info:
        render(DPORenderer(AnswersOnly(bos=False), max_model_len=64), "hi", ["ok"])
    assert info.value.field == "groups[0]"
    assert "renders the conversation alone to 0 token(s) and nothing is put in front (BOS rule template)" in str(info.value)
    # With a BOS (the template writes none) or in official mode there is a token in front.
    assert render(DPORenderer(AnswersOnly(), max_model_len=64), "hi", ["ok"]).token_ids == ([1, 5, 111, 107, 2, 2],)
    official = render(DPORenderer(AnswersOnly(bos=False), max_model_len=64, compat="official"), "hi", ["ok"])
    assert official.token_ids == ([2, 5, 111, 107, 2, 2],)
    assert official.answer_start == (1,)


def test_a_token_merged_across_the_boundary_belongs_to_the_answer():
    # EOS (2) followed by the assistant marker (5) merges into 300: the prompt's own last id
    # differs from the full text's, so the answer starts one token earlier (the BPE fix).
    tokenizer = FakeDPOTokenizer(merges={(2, 5): 300})
    rendered = render(DPORenderer(tokenizer, max_model_len=64), "hi", ["ok", ""])
    assert rendered.token_ids == ([1, 4, 104, 105, 300, 111, 107, 2, 2], [1, 4, 104, 105, 300, 2, 2])
    assert rendered.answer_start == (4, 4)
    assert rendered.prompt_tokens == 5  # 300 is shared too


def test_group_shares_the_prompt_and_responses_keep_their_order():
    rendered = render(DPORenderer(FakeDPOTokenizer(), max_model_len=64), "hi", ["ok", "a"])
    assert rendered.token_ids == ([1, 4, 104, 105, 2, 5, 111, 107, 2, 2], [1, 4, 104, 105, 2, 5, 97, 2, 2])
    assert rendered.answer_start == (5, 5)
    assert rendered.prompt_tokens == 6  # the assistant marker is common as well


def test_a_template_that_does_not_render_prompt_plus_answer_is_refused():
    tokenizer = FakeDPOTokenizer(closing="\x06")  # written after a conversation ending with a user turn
    with pytest.raises(InvalidRequest, match="does not render the conversation as prompt \\+ answer") as info:
        render(DPORenderer(tokenizer, max_model_len=64), "hi", ["ok"])
    assert info.value.field == "groups[0]"


def test_official_mode_reproduces_replace_when_the_prompt_is_not_a_prefix():
    # replace() finds nothing, so the whole full text is the "answer", after the prompt text.
    tokenizer = FakeDPOTokenizer(closing="\x06")
    rendered = render(DPORenderer(tokenizer, max_model_len=64, compat="official"), "hi", ["ok"])
    assert rendered.token_ids == ([1, 1, 4, 104, 105, 2, 6, 1, 4, 104, 105, 2, 5, 111, 107, 2, 2],)
    assert rendered.answer_start == (7,)


def test_official_replace_removes_every_occurrence_of_the_prompt_text():
    # The response repeats the whole prompt text "\x01\x04hi\x02": replace() drops it from the answer too.
    tokenizer = FakeDPOTokenizer()
    prompt_text = "\x01\x04hi\x02"
    official = render(DPORenderer(tokenizer, max_model_len=64, compat="official"), "hi", [f"a{prompt_text}b"])
    assert official.token_ids == ([1, 1, 4, 104, 105, 2, 5, 97, 98, 2, 2],)
    default = render(DPORenderer(tokenizer, max_model_len=64), "hi", ["a\x04b"])
    assert default.token_ids == ([1, 4, 104, 105, 2, 5, 97, 4, 98, 2, 2],)


def test_the_template_writing_bos_twice_is_a_server_fault():
    class DoubleBos(FakeDPOTokenizer):
        def apply_chat_template(self, conversations, **kwargs):
            texts = super().apply_chat_template(conversations, **kwargs)
            return ["\x01" + t for t in texts]

    with pytest.raises(ServerFault, match="writes BOS twice"):
        render(DPORenderer(DoubleBos(), max_model_len=64), "hi", ["ok"])


# --- official truncation -----------------------------------------------------------------


def test_pair_partners():
    assert pair_partners(6) == [3, 4, 5, 0, 1, 2]
    assert pair_partners(2) == [1, 0]
    assert pair_partners(3) == [None, None, None]


def test_official_truncation_rule_by_hand():
    prompt = list(range(300))
    # L = max(10, 1900) = 1900; 300 + 1900 > 2048 → prompt keeps its last 128; 128 + 1900 ≤ 2048.
    kept_prompt, kept_answer = official_truncation(prompt, [7] * 10, 1900)
    assert kept_prompt == list(range(172, 300)) and kept_answer == [7] * 10
    # L = 2000: 128 + 2000 > 2048 → the answer keeps its first 2048 − 128 = 1920.
    kept_prompt, kept_answer = official_truncation(prompt, [7] * 2000, None)
    assert len(kept_prompt) == 128 and kept_answer == [7] * 1920
    assert (OFFICIAL_MAX_LENGTH, OFFICIAL_MAX_PROMPT_LENGTH) == (2048, 128)


def test_official_mode_truncates_pairs_and_reports_the_cuts():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=4096, compat="official")
    prompt = "x" * 2000  # prompt ids: BOS BOS user x*2000 EOS = 2004
    responses = ["a" * 10, "c" * 5, "b" * 100, "d" * 2000]  # answers: marker + text + EOS + EOS
    rendered = render(renderer, prompt, responses)
    # Pair (0, 2): L = 103, 2004 + 103 > 2048 → both prompts keep 128 (cut 1876 each).
    # Pair (1, 3): L = 2003 → prompts keep 128, then 128 + 2003 > 2048 → answers keep 1920
    # (response 3 loses 2003 − 1920 = 83 more; response 1's 8 are untouched).
    assert rendered.truncated_tokens == (1876, 1876, 1876, 1876 + 83)
    kept_prompt = [120] * 127 + [2]  # keep_end: the last 128 prompt ids, BOS gone
    assert rendered.token_ids[0] == kept_prompt + [5] + [97] * 10 + [2, 2]
    assert rendered.token_ids[1] == kept_prompt + [5] + [99] * 5 + [2, 2]
    assert rendered.token_ids[3] == kept_prompt + [5] + [100] * 1919
    assert rendered.answer_start == (128, 128, 128, 128)
    assert rendered.prompt_tokens == 129


def test_official_mode_odd_group_uses_each_answer_alone():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=4096, compat="official")
    rendered = render(renderer, "x" * 2000, ["a" * 10, "c" * 5, "b" * 100])
    # 2004 + 13 and 2004 + 8 fit; 2004 + 103 does not → that prompt keeps 128.
    assert rendered.truncated_tokens == (0, 0, 1876)
    assert rendered.num_tokens == (2017, 2012, 128 + 103)


def test_default_mode_never_cuts_silently():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=4096)
    rendered = render(renderer, "x" * 2000, ["a" * 10, "d" * 2000])
    assert rendered.truncated_tokens is None
    assert rendered.num_tokens == (2003 + 13, 2003 + 2003)


# --- the classifier length rules on prompt + answer ----------------------------------------

HELLO = [1, 4, 104, 101, 108, 108, 111, 2]  # BOS user "hello" EOS


def test_left_truncation_cuts_prompt_tokens_after_bos_only():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=64)
    rendered = render(renderer, "hello", ["ok", "abcdefgh"], Truncation("left", 12))
    assert rendered.token_ids == (
        [1, 104, 101, 108, 108, 111, 2, 5, 111, 107, 2, 2],  # the user marker went (1 cut)
        [1, 5, 97, 98, 99, 100, 101, 102, 103, 104, 2, 2],  # the whole prompt but BOS (7 cut)
    )
    assert rendered.truncated_tokens == (1, 7)
    assert rendered.answer_start == (7, 1)


def test_left_truncation_fails_a_response_whose_answer_alone_is_too_long():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=64)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok", "abcdefgh")),),
                           truncation=Truncation("left", 11))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.errors == (
        None,
        ResponseError("sequence_too_long", "the answer alone is 11 tokens (+1 BOS), over truncation.max_tokens=11; "
                      "a left cut never cuts answer tokens"),
    )
    assert rendered.token_ids[1] == HELLO + [5, 97, 98, 99, 100, 101, 102, 103, 104, 2, 2]  # kept whole
    assert rendered.truncated_tokens == (2, 0)
    assert rendered.scorable == (0,)
    with pytest.raises(SequenceTooLong, match=r"groups\[0\].responses\[1\]") as info:
        render(renderer, "hello", ["ok", "abcdefgh"], Truncation("left", 11))
    assert info.value.limit == 11


def test_right_truncation_cuts_the_answer_tail():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=64)
    rendered = render(renderer, "hello", ["ok", "abcdefgh"], Truncation("right", 10))
    assert rendered.token_ids == (HELLO + [5, 111], HELLO + [5, 97])
    assert rendered.truncated_tokens == (3, 9)
    assert rendered.answer_start == (8, 8)


def test_left_truncation_without_bos_keeps_the_first_template_token_so_no_answer_starts_at_0():
    renderer = DPORenderer(FakeDPOTokenizer(bos=False), max_model_len=64)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok", "abcdefgh")),),
                           truncation=Truncation("left", 6))
    (rendered,) = renderer.render_request(request, too_long="mark")
    # prompt [4, 104, 101, 108, 108, 111, 2] (7) + "ok" [5, 111, 107, 2, 2]: 12 → the user marker and the answer.
    assert rendered.token_ids[0] == [4, 5, 111, 107, 2, 2]
    assert rendered.answer_start[0] == 1
    assert rendered.truncated_tokens == (6, 0)
    assert rendered.errors == (
        None,
        ResponseError("sequence_too_long", "the answer alone is 11 tokens (+1 first prompt token), over "
                      "truncation.max_tokens=6; a left cut never cuts answer tokens"),
    )


def test_right_truncation_that_keeps_only_template_tokens_fails_the_response():
    # HELLO (8) + "ok" [5 | 111, 107, 2, 2]: a cut to 9 keeps the assistant marker 5 alone, the
    # template's header; "" [5, 2 | 2] has nothing of its own, so any cut leaves template only.
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=64)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok", "", "abc")),),
                           truncation=Truncation("right", 10))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.token_ids == (HELLO + [5, 111], HELLO + [5, 2, 2], HELLO + [5, 97])
    assert rendered.truncated_tokens == (3, 0, 4)
    assert rendered.errors == (None, ResponseError(
        "sequence_too_long",
        "the response is empty: its 3 answer tokens are the chat template's and the EOS, so a right cut to "
        "truncation.max_tokens=10 after the 8-token prompt (keeping 2 of them) would score none of the response",
    ), None)
    assert rendered.scorable == (0, 2)
    (cut,) = renderer.render_request(msgspec.structs.replace(request, truncation=Truncation("right", 9)), too_long="mark")
    assert cut.errors is not None and cut.errors[0] == ResponseError(
        "sequence_too_long",
        "a right cut to truncation.max_tokens=9 keeps none of the response: after the 8-token prompt it keeps 1 of the "
        "5 answer tokens, but the answer's first 1 are the chat template's, before the response",
    )
    assert cut.scorable == () and cut.truncated_tokens == (0, 0, 0)
    assert cut.token_ids == (HELLO + [5, 111, 107, 2, 2], HELLO + [5, 2, 2], HELLO + [5, 97, 98, 99, 2, 2])
    with pytest.raises(SequenceTooLong, match=r"groups\[0\].responses\[0\] of group 'g': a right cut") as info:
        render(renderer, "hello", ["ok"], Truncation("right", 9))
    assert (info.value.value, info.value.limit) == (13, 9)


def test_right_truncation_finds_the_response_after_a_merged_header_token():
    # The assistant marker 5 merges with "x" into 300: the merged token holds response text, so
    # it counts as the response's and a cut that keeps it scores the response.
    renderer = DPORenderer(FakeDPOTokenizer(merges={(5, 120): 300}), max_model_len=64)
    rendered = render(renderer, "hello", ["xyz"], Truncation("right", 9))
    assert rendered.token_ids == (HELLO + [300],)
    assert rendered.truncated_tokens == (4,)
    assert rendered.errors is None


def test_right_truncation_that_leaves_no_answer_token_fails_the_response():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=64)
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok",)),),
                           truncation=Truncation("right", 8))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.errors is not None and rendered.errors[0] is not None
    assert rendered.errors[0].type == "sequence_too_long"
    assert "leaves no answer token" in rendered.errors[0].message


def test_over_length_without_truncation_is_marked_or_raised_like_the_classifier():
    renderer = DPORenderer(FakeDPOTokenizer(), max_model_len=13)  # "ok" is 13 tokens, "abcdefgh" 19
    request = ScoreRequest(groups=(RequestGroup(id="g", prompt="hello", responses=("ok", "abcdefgh")),))
    (rendered,) = renderer.render_request(request, too_long="mark")
    assert rendered.errors == (
        None, ResponseError("sequence_too_long", "19 tokens (chat template included), over max_model_len=13"),
    )
    assert rendered.scorable == (0,)
    assert rendered.answer_start == (8, 8)
    with pytest.raises(SequenceTooLong) as info:
        render(renderer, "hello", ["ok", "abcdefgh"])
    assert (info.value.field, info.value.value, info.value.limit) == ("groups[0].responses[1]", 19, 13)


def test_one_template_call_and_one_tokenizer_call_per_request():
    class Counting(FakeDPOTokenizer):
        template_calls = 0
        encode_calls = 0

        def apply_chat_template(self, conversations, **kwargs):
            Counting.template_calls += 1
            return super().apply_chat_template(conversations, **kwargs)

    class Backend:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer
            self.normalizer = None
            self.calls = []

        def encode_batch(self, texts, add_special_tokens):
            self.calls.append(len(texts))

            class Encoding:
                def __init__(self, ids):
                    self.ids = ids

            return [Encoding(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    tokenizer = Counting()
    tokenizer.backend_tokenizer = Backend(tokenizer)
    tokenizer.added_tokens_decoder = {}
    renderer = DPORenderer(tokenizer, max_model_len=64)
    groups = (RequestGroup(id="a", prompt="hi", responses=("ok", "no")), RequestGroup(id="b", prompt="yo", responses=("x",)))
    rendered = renderer.render_request(ScoreRequest(groups=groups), too_long="mark")
    assert Counting.template_calls == 1
    assert tokenizer.backend_tokenizer.calls == [2 + 3]  # two prompt texts, three full texts
    assert rendered[1].token_ids == ([1, 4, 121, 111, 2, 5, 120, 2, 2],)
