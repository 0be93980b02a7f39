"""Generative-judge protocols: official prompts, permutations, output readers, per-group credit.

Expected values are written out by hand. The official prompt hashes below were computed once
from allenai/reward-bench@05a9005 ``rewardbench/generative_v2.py`` (the raw template strings
``prompt_v2``, ``MTBENCH_V2["prompt_template"]``, ``ratings_prompt``, ``ratings_prompt_ties``):
rendering our prompts with the template's own placeholder names must give those exact strings.
"""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest
from rmserve.server.kinds.judge_protocols import (
    RANKING_SYSTEM_PROMPT,
    JudgeOutput,
    JudgeProtocolConfig,
    pairwise_cells,
    pairwise_preference,
    pairwise_user_prompt,
    parse_pairwise,
    parse_rating,
    parse_ranking,
    plan_group,
    ranking_credit,
    ranking_permutation,
    ranking_position,
    ranking_user_prompt,
    rating_credit,
    rating_user_prompt,
    read_output,
    render_pairwise,
    render_ranking,
    render_rating,
    score_group,
    split_reasoning,
)

from rmserve.errors import InvalidRequest
from rmserve.judge_records import JUDGE_READERS, JudgeGroupResult
from rmserve.schema import RMBENCH_STYLES, Group, Message

OFFICIAL_SHA256 = {
    "prompt_v2": "cc81b612789438e858efeee67de4087ac07d451c750915b79b73d470ed36a5ff",
    "prompt_template": "0b53abc0dd92074fcf9351fb8edab886a23bc29ee68172e7592bd08bfe0e6221",
    "ratings_prompt": "dd94ed65b24c00d411e65e8a671611ed2cba7154e97ff457b96183112b99ee14",
    "ratings_prompt_ties": "86b62377fd01e9697fd87f04ef6d1163ee694a006b838d532d1866267d9722b4",
}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rb2_group(domain: str = "Math", id: str = "7", responses=("right", "wrong-1", "wrong-2", "wrong-3"),
              num_chosen: int = 1, messages=None) -> Group:
    return Group(
        benchmark="rewardbench2",
        domain=domain,
        id=id,
        messages=messages or (Message("user", "What is 2+2?"),),
        responses=tuple(responses),
        num_chosen=num_chosen,
    )


def rmbench_group(domain: str = "chat", id: str = "3") -> Group:
    return Group(
        benchmark="rm-bench",
        domain=domain,
        id=id,
        messages=(Message("user", "Name a prime."),),
        responses=("c0", "c1", "c2", "r0", "r1", "r2"),
        num_chosen=3,
        styles=RMBENCH_STYLES + RMBENCH_STYLES,
    )


def out(text: str, finish: str = "stop") -> JudgeOutput:
    return JudgeOutput(text=text, prompt_tokens=100, completion_tokens=20, finish_reason=finish)


# --- prompts ---------------------------------------------------------------------------


def test_prompts_are_the_official_templates():
    assert sha(RANKING_SYSTEM_PROMPT) == OFFICIAL_SHA256["prompt_v2"]
    template = ranking_user_prompt("{question}", ["{answer_a}", "{answer_b}", "{answer_c}", "{answer_d}"])
    assert sha(template) == OFFICIAL_SHA256["prompt_template"]
    assert sha(rating_user_prompt("{prompt}", "{completion}", ties=False)) == OFFICIAL_SHA256["ratings_prompt"]
    assert sha(rating_user_prompt("{prompt}", "{completion}", ties=True)) == OFFICIAL_SHA256["ratings_prompt_ties"]


def test_ranking_prompt_for_a_hand_made_question():
    prompt = render_ranking(rb2_group(), 2)
    assert prompt.protocol == "rb2-ranking"
    assert prompt.responses == (2, 1, 0, 3)
    system, user = prompt.messages
    assert system.role == "system" and user.role == "user"
    assert system.content.startswith("Please act as an impartial judge and evaluate the quality of the responses "
                                     "provided by four AI assistants to the user question displayed below.")
    assert system.content.endswith('"[[A]]" if assistant A is best, "[[B]]" if assistant B is best, "[[C]]" if '
                                   'assistant C is best, and "[[D]]" if assistant D is best.')
    assert user.content == (
        "[User Question]\nWhat is 2+2?\n\n"
        "[The Start of Assistant A's Answer]\nwrong-2\n[The End of Assistant A's Answer]\n\n"
        "[The Start of Assistant B's Answer]\nwrong-1\n[The End of Assistant B's Answer]\n\n"
        "[The Start of Assistant C's Answer]\nright\n[The End of Assistant C's Answer]\n\n"
        "[The Start of Assistant D's Answer]\nwrong-3\n[The End of Assistant D's Answer]"
    )


def test_ranking_without_system_role_merges_like_the_official_option():
    merged = render_ranking(rb2_group(), 0, system_role=False)
    with_system = render_ranking(rb2_group(), 0)
    assert len(merged.messages) == 1 and merged.messages[0].role == "user"
    assert merged.messages[0].content == with_system.messages[0].content + "\n\n" + with_system.messages[1].content


def test_rating_prompt_for_a_hand_made_question():
    group = rb2_group(responses=("4", "5 {not a field}", "22", "four"))
    prompt = render_rating(group, 1)
    assert prompt.protocol == "rb2-rating" and prompt.responses == (1,)
    (message,) = prompt.messages
    assert message.role == "user"
    text = message.content
    assert text.startswith("\n### Task Description\nPlease act as an impartial judge and evaluate the quality of the "
                           "response provided by an\nAI assistant to the user query displayed below.\n")
    assert "1- Your evaluation should consider factors such as the helpfulness, relevance, accuracy, depth, " \
           "creativity, and level of detail of the response.\n" in text
    assert "do not use any markdown, and do not put any text after your final rating.\n" in text
    assert text.endswith("[Query]\nWhat is 2+2?\n\n[Response]\n5 {not a field}\n\n[Your judgement]")


def test_ties_groups_get_the_ties_rating_prompt():
    group = rb2_group(domain="Ties", id="tied:4", responses=("a", "b", "c"), num_chosen=2)
    prompt = render_rating(group, 2)
    assert prompt.protocol == "rb2-rating-ties" and prompt.responses == (2,)
    text = prompt.messages[0].content
    assert "1- Your evaluation should consider factors such as the helpfulness, relevance, and accuracy of the " \
           "response, but need not consider depth or level of detail of the response.\n" in text
    assert text.endswith("[Query]\nWhat is 2+2?\n\n[Response]\nc\n\n[Your judgement]")


def test_pairwise_prompt_for_a_hand_made_question():
    prompt = render_pairwise(rmbench_group(), chosen_style=0, rejected_style=2, chosen_first=False)
    assert prompt.protocol == "rmbench-pairwise" and prompt.responses == (5, 0)
    (message,) = prompt.messages
    text = message.content
    assert message.role == "user"
    assert text.startswith("You will be shown a user prompt followed by two responses from different assistants.")
    assert "1. Assistant A is significantly better: \\boxed{A>>B}\n" in text
    assert "3. Tie, relatively the same: \\boxed{A=B}\n" in text
    assert "5. Assistant B is significantly better: \\boxed{B>>A}\n" in text
    assert text.endswith(
        "<|User Prompt|>\nName a prime.\n\n"
        "<|The Start of Assistant A's Answer|>\nr2\n<|The End of Assistant A's Answer|>\n\n"
        "<|The Start of Assistant B's Answer|>\nc0\n<|The End of Assistant B's Answer|>"
    )
    assert pairwise_user_prompt("q", "{answer_b}", "x").count("{answer_b}") == 1  # answers are not re-filled


@pytest.mark.parametrize(
    "group",
    [
        rb2_group(messages=(Message("user", "hi"), Message("assistant", "hello"), Message("user", "2+2?"))),
        rb2_group(messages=(Message("system", "be brief"), Message("user", "2+2?"))),
    ],
)
def test_multi_turn_groups_are_rejected(group):
    for render in (lambda: render_ranking(group, 0), lambda: render_rating(group, 0)):
        with pytest.raises(InvalidRequest) as err:
            render()
        assert err.value.field == "messages" and err.value.limit == 1
        assert err.value.value == len(group.messages)


def test_ranking_needs_one_correct_and_three_rejected():
    with pytest.raises(InvalidRequest) as err:
        render_ranking(rb2_group(responses=("a", "b", "c", "d", "e")), 0)
    assert err.value.field == "responses" and err.value.value == 5 and err.value.limit == 4
    with pytest.raises(InvalidRequest) as err:
        render_ranking(rb2_group(num_chosen=2), 0)
    assert err.value.field == "num_chosen"


# --- permutation and the seeded position ---------------------------------------------------


@pytest.mark.parametrize(
    ("position", "order", "letter"),
    [(0, (0, 1, 2, 3), "A"), (1, (1, 0, 2, 3), "B"), (2, (2, 1, 0, 3), "C"), (3, (3, 1, 2, 0), "D")],
)
def test_permutation_swaps_a_with_the_position(position, order, letter):
    assert ranking_permutation(position) == order
    prompt = render_ranking(rb2_group(), position)
    assert prompt.responses == order
    shown = [prompt.messages[1].content.split(f"[The Start of Assistant {x}'s Answer]\n")[1].split("\n")[0]
             for x in "ABCD"]
    names = ("right", "wrong-1", "wrong-2", "wrong-3")
    assert shown == [names[k] for k in order]
    assert shown["ABCD".index(letter)] == "right"
    assert ranking_credit(letter, position) == 1.0
    assert [ranking_credit(x, position) for x in "ABCD" if x != letter] == [0.0, 0.0, 0.0]
    assert ranking_credit(None, position) == 0.25


def test_ranking_position_is_the_documented_hash():
    for seed, subset, gid in [(0, "Math", "7"), (13, "Precise IF", "1042"), (2**40, "Focus", "a/b")]:
        digest = hashlib.sha256(json.dumps(["rb2-ranking", seed, subset, gid], separators=(",", ":")).encode()).digest()
        assert ranking_position(seed, subset, gid) == int.from_bytes(digest[:8], "big") % 4


def test_ranking_position_ignores_call_order_and_spreads_evenly():
    ids = [str(k) for k in range(4000)]
    forward = {i: ranking_position(3, "Factuality", i) for i in ids}
    backward = {i: ranking_position(3, "Factuality", i) for i in reversed(ids)}
    assert forward == backward
    counts = [list(forward.values()).count(p) for p in range(4)]
    assert all(850 <= c <= 1150 for c in counts), counts  # 1000 expected, sd ≈ 27
    other_seed = [ranking_position(4, "Factuality", i) for i in ids]
    assert sum(a != b for a, b in zip(forward.values(), other_seed)) > 2500  # 3000 expected


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_ranking_position_rejects_bad_seeds(seed):
    with pytest.raises(ValueError, match="seed"):
        ranking_position(seed, "Math", "1")


# --- ranking readers -----------------------------------------------------------------------

# (text, cut at max_tokens, prompt opened the reasoning,
#  official verdict, rmserve verdict, rmserve reason, candidates)
RANKING_CASES = [
    ("Assistant C is best.\n\n[[C]]", False, False, "C", "C", "ok", ("C",)),
    ("No verdict here, maybe C.", False, False, None, None, "no_verdict", ()),
    ("", False, False, None, None, "no_verdict", ()),
    ("[[a]] [ [B] ] [B] [[ B ]]", False, False, None, None, "no_verdict", ()),  # tokens are exact
    ("Comparing: A is wrong, [[B]", False, False, None, None, "no_verdict", ()),
    # the official rule takes letter order, not text order
    ("[[D]] ... on reflection [[C]]", False, False, "C", "C", "ok", ("D", "C")),
    ("First thought [[D]].\nFinal verdict: [[C]]", False, False, "C", "C", "ok", ("D", "C")),
    # the judge quotes the format sentence, then concludes C
    ('The required format is "[[A]]" if A is best. ... Final verdict: [[C]]', False, False, "A", "C", "ok",
     ("A", "C")),
    # a quoted candidate holds [[A]]; the judge concludes B
    ('Assistant D\'s answer ends with "[[A]]", copied from its prompt.\nFinal verdict: [[B]]', False, False,
     "A", "B", "ok", ("A", "B")),
    # a final line naming two letters is no verdict
    ("A and C are close.\n[[B]] or [[C]]", False, False, "B", None, "ambiguous_verdict", ("B", "C")),
    ("[[B]] is tempting, but the final verdict is [[A]]", False, False, "A", None, "ambiguous_verdict", ("B", "A")),
    ("Verdict: [[D]] [[D]]", False, False, "D", "D", "ok", ("D",)),  # one letter twice: not ambiguous
    ("Final verdict: [[D]].\nThank you!", False, False, "D", "D", "ok", ("D",)),
    # reasoning: only the answer after </think> is read by rmserve's reader
    ("<think>[[B]] looks best so far</think> Final: [[C]]", False, False, "B", "C", "ok", ("B", "C")),
    ("<think>[[A]] or [[B]]?</think>\n\n[[B]]", False, False, "A", "B", "ok", ("A", "B")),
    ("[[B]] looks best so far</think>\n\nFinal verdict: [[D]]", False, True, "B", "D", "ok", ("B", "D")),
    # cut inside the reasoning: no verdict, counted as cut
    ("<think>Comparing the four. [[B]] looks best so far", True, False, "B", None, "truncated", ("B",)),
    ("Comparing the four. [[B]] looks best so far", True, True, "B", None, "truncated", ("B",)),
    # stopped inside the reasoning (never closed it): no answer
    ("<think>[[B]] looks best so far", False, False, "B", None, "unfinished_reasoning", ("B",)),
    ("[[C]] looks best so far", False, True, "C", None, "unfinished_reasoning", ("C",)),
    # cut after the reasoning, or without any: the concluding statement was never written
    ("<think>ok</think> A is best: [[A]]. Also", True, False, "A", None, "truncated", ("A",)),
    ("Let me think. [[B]] looks right, but", True, False, "B", None, "truncated", ("B",)),
]


@pytest.mark.parametrize(("text", "cut", "opened", "official", "ours", "reason", "candidates"), RANKING_CASES)
def test_parse_ranking_both_readers(text, cut, opened, official, ours, reason, candidates):
    theirs = parse_ranking(text, compat="official", truncated=cut, reasoning_open=opened)
    assert (theirs.parser, theirs.verdict, theirs.reason) == (
        "rb2-ranking-official", official, "ok" if official else "no_verdict"
    )
    assert theirs.candidates == (candidates if official else ())
    got = parse_ranking(text, truncated=cut, reasoning_open=opened)
    assert (got.parser, got.verdict, got.reason, got.candidates) == ("rb2-ranking", ours, reason, candidates)


def test_read_output_picks_the_ranking_reader_by_compat():
    prompt = render_ranking(rb2_group(), 1)
    text = 'Format: "[[A]]" if A is best. Final verdict: [[B]]'
    ours = read_output(prompt, out(text))
    theirs = read_output(prompt, out(text), "official")
    assert (ours.parse.parser, ours.parse.verdict) == ("rb2-ranking", "B")
    assert (theirs.parse.parser, theirs.parse.verdict) == ("rb2-ranking-official", "A")
    cut = read_output(prompt, out("Let me think. [[B]] looks right, but", "length"))
    assert cut.truncated and (cut.parse.verdict, cut.parse.reason) == (None, "truncated")
    assert read_output(prompt, out("Let me think. [[B]] looks right, but", "length"), "official").parse.verdict == "B"
    with pytest.raises(ValueError, match="compat"):
        parse_ranking("[[A]]", compat="strict")


@pytest.mark.parametrize(
    ("text", "opened", "reasoning", "answer"),
    [
        ("plain answer [[A]]", False, None, "plain answer [[A]]"),
        ("<think>r</think>a", False, "r", "a"),
        ("\n <think>r</think>\n\na", False, "r", "\n\na"),
        ("r</think>a</think>b", False, "r", "a</think>b"),  # the first </think> ends the reasoning
        ("<think>still thinking", False, "still thinking", None),
        ("still thinking", True, "still thinking", None),
        ("r</think>a", True, "r", "a"),
        ("I quote <think> here", False, None, "I quote <think> here"),  # a tag inside the text opens nothing
        ("", True, "", None),
    ],
)
def test_split_reasoning(text, opened, reasoning, answer):
    assert split_reasoning(text, reasoning_open=opened) == (reasoning, answer)


def test_every_reader_is_named_in_the_readers_table():
    group, rmbench = rb2_group(), rmbench_group()
    prompts = {
        "rb2-ranking": render_ranking(group, 0),
        "rb2-rating": render_rating(group, 0),
        "rb2-rating-ties": render_rating(rb2_group(domain="Ties", responses=("a", "b", "c")), 0),
        "rmbench-pairwise": render_pairwise(rmbench, 0, 0, True),
    }
    assert JUDGE_READERS == {
        "none": {"rb2-ranking": "rb2-ranking", "rb2-rating": "rb2-rating", "rb2-rating-ties": "rb2-rating",
                 "rmbench-pairwise": "rmbench-pairwise"},
        "official": {"rb2-ranking": "rb2-ranking-official", "rb2-rating": "rb2-rating-official",
                     "rb2-rating-ties": "rb2-rating-official", "rmbench-pairwise": "rmbench-pairwise"},
    }
    for compat, readers in JUDGE_READERS.items():
        for protocol, prompt in prompts.items():
            assert read_output(prompt, out("x"), compat).parse.parser == readers[protocol]


def test_read_output_records_the_reasoning_apart_and_an_opened_prompt():
    prompt = render_rating(rb2_group(), 0)
    output = JudgeOutput("Good.\n\n8", 100, 20, "stop", reasoning="[[B]] first, then a 3")
    call = read_output(prompt, output)
    assert (call.text, call.reasoning, call.reasoning_open, call.parse.rating) == (
        "Good.\n\n8", "[[B]] first, then a 3", False, 8
    )
    opened = read_output(prompt, JudgeOutput("I would give it 6", 100, 20, "stop", reasoning_open=True))
    assert (opened.reasoning_open, opened.parse.reason, opened.parse.rating) == (True, "unfinished_reasoning", None)
    # an endpoint's null content: no text, cut at max_tokens
    empty = read_output(render_ranking(rb2_group(), 0), JudgeOutput("", 100, 32, "length", reasoning="[[B]] so far"))
    assert (empty.parse.reason, empty.parse.candidates, empty.truncated) == ("truncated", (), True)


# --- rating reader --------------------------------------------------------------------------

# (text, official reading, rmserve reading, rmserve reason)
RATING_CASES = [
    ("The response is accurate.\n\n9", 9, 9, "ok"),
    ("10", 10, 10, "ok"),
    ("Rating: 10/10", 10, 10, "ok"),
    ("7/10", 10, 7, "ok"),
    ("Rating: 8/10", 10, 8, "ok"),
    ("3 out of 10", 10, 3, "ok"),
    ("8 / 10", 10, 8, "ok"),
    ("[[8]]", None, 8, "ok"),
    ("**9**", None, 9, "ok"),
    ("Final rating: 9.", None, 9, "ok"),
    ("Good answer.\n\n9  \n\t", 9, 9, "ok"),
    ("8.5", 5, None, "not_integer"),
    ("7/5", 5, None, "bad_scale"),
    ("-3", 3, None, "out_of_range"),
    ("0", None, None, "out_of_range"),
    ("11", None, None, "out_of_range"),
    ("9\nThe response is clear and correct.", None, None, "no_trailing_rating"),
    ("Rating: 9. Well done", None, None, "no_trailing_rating"),
    ("8,5", 5, None, "no_trailing_rating"),
    ("", None, None, "no_trailing_rating"),
    ("   \n", None, None, "no_trailing_rating"),
]


@pytest.mark.parametrize(("text", "official", "ours", "reason"), RATING_CASES)
def test_parse_rating_both_readers(text, official, ours, reason):
    got_official = parse_rating(text, compat="official")
    assert got_official.rating == official
    assert got_official.reason == ("ok" if official is not None else "no_trailing_rating")
    assert got_official.parser == "rb2-rating-official"
    got = parse_rating(text)
    assert (got.rating, got.reason, got.parser) == (ours, reason, "rb2-rating")


# (text, cut, prompt opened the reasoning, official reading, rmserve reading, rmserve reason)
RATING_REASONING_CASES = [
    ("<think>I'd say 3</think>\n\nGood answer.\n\n8", False, False, 8, 8, "ok"),
    ("Considering a 4</think>\n9", False, True, 9, 9, "ok"),
    ("<think>hmm</think>", False, False, None, None, "no_trailing_rating"),
    ("<think>Maybe a 3", True, False, 3, None, "truncated"),
    ("<think>Maybe a 3", False, False, 3, None, "unfinished_reasoning"),
    ("Maybe a 3", False, True, 3, None, "unfinished_reasoning"),
]


@pytest.mark.parametrize(("text", "cut", "opened", "official", "ours", "reason"), RATING_REASONING_CASES)
def test_parse_rating_after_the_reasoning(text, cut, opened, official, ours, reason):
    assert parse_rating(text, compat="official", truncated=cut, reasoning_open=opened).rating == official
    got = parse_rating(text, truncated=cut, reasoning_open=opened)
    assert (got.rating, got.reason) == (ours, reason)


def test_rating_of_a_cut_output():
    text = "The answer is mostly right; I would rate it a 7"
    assert parse_rating(text, truncated=True).reason == "truncated"
    assert parse_rating(text, truncated=True).rating is None
    assert parse_rating(text, compat="official", truncated=True).rating == 7


def test_parse_rating_rejects_unknown_compat():
    with pytest.raises(ValueError, match="compat"):
        parse_rating("9", compat="strict")


@pytest.mark.parametrize(
    ("ratings", "credit"),
    [
        ((9, 7, 7, 7), 1.0),
        ((9, 9, 7, 7), 0.5),
        ((9, 9, 9, 7), 1 / 3),
        ((9, 9, 9, 9), 0.25),
        ((3, 9, 9, 1), 0.0),
        ((None, None, None, None), 0.25),  # every rating failed
        ((None, 5, 3, 2), 0.0),  # the correct answer failed, others did not
        ((7, None, None, None), 1.0),  # failures never win
        ((8, 8, None, None), 0.5),
        ((1, None, None, 1), 0.5),
    ],
)
def test_rating_credit_official_rule(ratings, credit):
    assert rating_credit(ratings) == pytest.approx(credit, abs=1e-15)


# --- RM-Bench pairwise -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "verdict", "reason"),
    [
        ("Both fine, B is clearer.\n\n\\boxed{B>A}", "B>A", "ok"),
        ("\\boxed{A>B} at first sight... final verdict: \\boxed{ B >> A }", "B>>A", "ok"),  # last wins
        ("\\boxed{{A=B}}", "A=B", "ok"),
        ("Final verdict: A>>B", None, "no_verdict"),
        ("\\boxed{A}", None, "no_verdict"),
        ("\\boxed{A>>C}", None, "no_verdict"),
        ("", None, "no_verdict"),
        # a concluding statement naming two verdicts is none
        ("A is clearer, B more complete.\n\\boxed{A>B} or \\boxed{B>A}", None, "ambiguous_verdict"),
        ("\\boxed{A>B} or maybe \\boxed{A>>B}", None, "ambiguous_verdict"),
        ("Draft: \\boxed{B>A}.\nFinal: \\boxed{A=B} \\boxed{ A = B }", "A=B", "ok"),
        # only the answer after the reasoning is read
        ("<think>\\boxed{A>B} so far</think>\nVerdict: \\boxed{B>A}", "B>A", "ok"),
        ("<think>\\boxed{A>B} so far", None, "unfinished_reasoning"),
        ("<think>\\boxed{A>B} so far</think>\nI cannot decide.", None, "no_verdict"),
    ],
)
def test_parse_pairwise(text, verdict, reason):
    parse = parse_pairwise(text)
    assert (parse.verdict, parse.reason) == (verdict, reason)


def test_pairwise_cut_inside_the_reasoning_has_no_verdict():
    parse = parse_pairwise("\\boxed{A>B} so far, now the second answer", truncated=True, reasoning_open=True)
    assert (parse.verdict, parse.reason, parse.candidates) == (None, "truncated", ("A>B",))
    opened = parse_pairwise("\\boxed{A>B} so far</think>\n\\boxed{B>>A}", reasoning_open=True)
    assert (opened.verdict, opened.candidates) == ("B>>A", ("A>B", "B>>A"))


def test_pairwise_cut_output_has_no_verdict():
    parse = parse_pairwise("Draft: \\boxed{A>B}. Now checking the second answer", truncated=True)
    assert (parse.verdict, parse.reason, parse.candidates) == (None, "truncated", ("A>B",))


@pytest.mark.parametrize(
    ("verdict", "chosen_first", "value"),
    [
        ("A>>B", True, 1.0), ("A>B", True, 1.0), ("A=B", True, 0.5), ("B>A", True, 0.0), ("B>>A", True, 0.0),
        ("A>>B", False, 0.0), ("A>B", False, 0.0), ("A=B", False, 0.5), ("B>A", False, 1.0), ("B>>A", False, 1.0),
        (None, True, 0.5), (None, False, 0.5),
    ],
)
def test_pairwise_preference(verdict, chosen_first, value):
    assert pairwise_preference(verdict, chosen_first) == value


# Verdict text per (chosen style i, rejected style j, chosen first?) for the hand-made group below.
PAIRWISE_TEXTS = {
    (0, 0, True): "\\boxed{A>B}", (0, 0, False): "\\boxed{A=B}",  # 1, 0.5 → 0.75
    (0, 1, True): "\\boxed{B>A}", (0, 1, False): "\\boxed{A>>B}",  # 0, 0 → 0
    (0, 2, True): "\\boxed{A>>B}", (0, 2, False): "no verdict",  # 1, 0.5 → 0.75
    (1, 0, True): "\\boxed{A>B}", (1, 0, False): "\\boxed{B>A}",  # 1, 1 → 1
    (1, 1, True): "\\boxed{A=B}", (1, 1, False): "\\boxed{A=B}",  # 0.5, 0.5 → 0.5
    (1, 2, True): "\\boxed{B>>A}", (1, 2, False): "\\boxed{B>A}",  # 0, 1 → 0.5
    (2, 0, True): "\\boxed{A>>B}", (2, 0, False): "\\boxed{B>>A}",  # 1, 1 → 1
    (2, 1, True): "\\boxed{A>B}", (2, 1, False): "\\boxed{B>A}",  # cut at max_tokens below → 0.5, 1 → 0.75
    (2, 2, True): "\\boxed{B>A}", (2, 2, False): "\\boxed{A>B}",  # 0, 0 → 0
}
PAIRWISE_CELLS = (0.75, 0.0, 0.75, 1.0, 0.5, 0.5, 1.0, 0.75, 0.0)


def test_pairwise_group_from_hand_made_verdicts():
    group = rmbench_group()
    plan = plan_group(group, JudgeProtocolConfig())
    assert plan.protocol == "rmbench-pairwise" and len(plan.prompts) == 18
    outputs = []
    for prompt in plan.prompts:
        a, b = prompt.responses
        first = a < 3
        i, j = (a, b - 3) if first else (b, a - 3)
        finish = "length" if (i, j, first) == (2, 1, True) else "stop"
        outputs.append(out(PAIRWISE_TEXTS[(i, j, first)], finish))
    result = score_group(group, plan, outputs, JudgeProtocolConfig())
    assert result.cells == PAIRWISE_CELLS
    assert pairwise_cells(result.calls) == PAIRWISE_CELLS
    assert [c.parse.reason for c in result.calls].count("no_verdict") == 1
    assert [c.parse.reason for c in result.calls].count("truncated") == 1
    assert plan.prompts[0].responses == (0, 3) and plan.prompts[1].responses == (3, 0)
    assert plan.prompts[-2].responses == (2, 5) and plan.prompts[-1].responses == (5, 2)


def test_pairwise_cells_need_both_orders():
    group = rmbench_group()
    plan = plan_group(group, JudgeProtocolConfig())
    calls = [read_output(p, out("\\boxed{A>B}")) for p in plan.prompts]
    with pytest.raises(ValueError, match="one call per order"):
        pairwise_cells(calls[:-1])


# --- plan and score whole groups ------------------------------------------------------------


def test_ranking_group_end_to_end():
    group = rb2_group(domain="Factuality", id="12")
    config = JudgeProtocolConfig(seed=5)
    plan = plan_group(group, config)
    position = ranking_position(5, "Factuality", "12")
    assert (plan.protocol, plan.position, plan.seed) == ("rb2-ranking", position, 5)
    letter = "ABCD"[position]
    result = score_group(group, plan, [out(f"Best is [[{letter}]]")], config)
    assert (result.credit, result.position, result.seed) == (1.0, position, 5)
    assert result.calls[0].responses == ranking_permutation(position)
    assert result.calls[0].messages_sha256 == hashlib.sha256(
        json.dumps([[m.role, m.content] for m in plan.prompts[0].messages], separators=(",", ":"),
                   ensure_ascii=False).encode()
    ).hexdigest()
    wrong = "ABCD"[(position + 1) % 4]
    assert score_group(group, plan, [out(f"[[{wrong}]]")], config).credit == 0.0
    assert score_group(group, plan, [out("I cannot decide.")], config).credit == 0.25


def test_rating_group_end_to_end_both_readers():
    group = rb2_group(domain="Safety", id="3")
    texts = ["Solid.\n8/10", "Weak.\n8", "Rating: 8.5", "Poor.\n2"]
    default = JudgeProtocolConfig(ratings=True)
    official = JudgeProtocolConfig(ratings=True, compat="official")
    plan = plan_group(group, default)
    assert plan.protocol == "rb2-rating" and [p.responses for p in plan.prompts] == [(0,), (1,), (2,), (3,)]
    ours = score_group(group, plan, [out(t) for t in texts], default)
    assert ours.ratings == (8, 8, None, 2) and ours.credit == 0.5 and ours.compat == "none"
    theirs = score_group(group, plan, [out(t) for t in texts], official)
    assert theirs.ratings == (10, 8, 5, 2) and theirs.credit == 1.0 and theirs.compat == "official"


def test_ties_group_keeps_ratings_and_no_credit():
    group = rb2_group(domain="Ties", id="ref:9", responses=("a", "b", "c"), num_chosen=1)
    config = JudgeProtocolConfig()  # ranking by default, Ties still rated
    plan = plan_group(group, config)
    assert plan.protocol == "rb2-rating-ties" and len(plan.prompts) == 3
    result = score_group(group, plan, [out("7"), out("no rating"), out("3")], config)
    assert result.ratings == (7, None, 3) and result.credit is None


def test_score_group_needs_one_output_per_call():
    group = rb2_group()
    plan = plan_group(group, JudgeProtocolConfig(ratings=True))
    with pytest.raises(ValueError, match="one output per planned call"):
        score_group(group, plan, [out("9")] * 3, JudgeProtocolConfig(ratings=True))


def test_judge_records_round_trip_as_json():
    group = rb2_group()
    config = JudgeProtocolConfig(ratings=True)
    result = score_group(group, plan_group(group, config), [out("9"), out("7", "length"), out("x"), out("7")], config)
    decoded = msgspec.json.decode(msgspec.json.encode(result), type=JudgeGroupResult)
    assert decoded == result
    assert decoded.calls[1].truncated and decoded.calls[1].parse.reason == "truncated"
    assert decoded.calls[1].prompt_tokens == 100 and decoded.calls[1].completion_tokens == 20


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"seed": -1}, "seed"), ({"seed": True}, "seed"), ({"compat": "strict"}, "compat")],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        JudgeProtocolConfig(**kwargs)
