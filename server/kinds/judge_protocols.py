"""Generative-judge protocols: prompts, output readers and per-group credit, engine-free.

A judge is a chat model asked to compare or rate answers. This module turns a
:class:`~rmserve.schema.Group` into the chat messages to send (:func:`plan_group`), reads the
generated texts back (:func:`parse_ranking`, :func:`parse_rating`, :func:`parse_pairwise`) and
assembles the per-group record with the credit the protocol's rule gives
(:func:`score_group`, a :class:`~rmserve.judge_records.JudgeGroupResult`). No engine, no I/O.

RewardBench 2 (official: allenai/reward-bench ``rewardbench/generative_v2.py`` and
``scripts/run_generative_v2.py``; prompts reproduced word for word, since the judge must see
exactly the official prompt):

* **4-way ranking** (``rb2-ranking``, default for the five non-Ties subsets). System message
  :data:`RANKING_SYSTEM_PROMPT`, user message :func:`ranking_user_prompt` with the question and
  four answers labelled A–D. The official script starts from (correct, rejected 0, rejected 1,
  rejected 2) at (A, B, C, D) and *swaps* the answer at A with the one at position ``p``
  (:func:`ranking_permutation`); it draws ``p`` with an unseeded ``np.random.randint(0, 4)``,
  rmserve from a recorded seed (:func:`ranking_position`). With ``system_role=False`` the two
  messages are merged into one user message ``system + "\\n\\n" + user`` (official
  ``--no_system_prompt``). Readers (:func:`parse_ranking`): ``compat="official"`` reproduces
  the official ``process_judgement`` — the first of the tokens ``[[A]]``, ``[[B]]``, ``[[C]]``,
  ``[[D]]``, *in that order of letters*, that occurs anywhere in the text, so an output quoting
  the format (``"[[A]]" if assistant A is best``) or a candidate holding ``[[A]]`` reads ``A``
  whatever it concludes (a defect); the default reads the verdict the judge concludes with:
  the last token of the answer, no verdict when its statement names two letters
  (:func:`concluding_verdict`) or the output was cut at ``max_tokens``. Credit
  (:func:`ranking_credit`): 1 if the verdict names the position of the correct answer, 0 if it
  names another, 0.25 when none was read.
* **Ratings** (``rb2-rating``, official ``--score_w_ratings``; ``rb2-rating-ties`` always for
  Ties, with the Ties prompt variant). One user message (no system message) per answer,
  :func:`rating_user_prompt`. Readers (:func:`parse_rating`): ``compat="official"`` reproduces
  the official one exactly — strip the text, then the regex ``\\b([1-9]|10)\\b\\s*$``: the
  integer 1–10 standing alone at the very end — which reads ``7/10`` as 10 and ``8.5`` as 5
  (defects); the default reads the final rating as written (rules at :func:`parse_rating`).
  Credit of a non-Ties group (:func:`rating_credit`, official): failed ratings (the official
  −1) are left out; with ``k`` answers tied at the top valid rating the credit is ``1/k`` when
  the correct answer (index 0) is one of them, else 0; 0.25 when every rating failed (a failed
  correct answer next to any valid rating gets 0). Ties groups keep their ratings; the Ties
  score is the classifier path's weighted formula with the ratings as rewards and −1 for a
  failed rating (``rmserve.metrics.judge``), exactly as the official script passes them to
  ``process_single_model``.
* **Multi-turn**: the official judge has no multi-turn format (its prompts insert the first
  message and the second one, i.e. the first user and first assistant turn, and its API ratings
  path raises ``NotImplementedError``); every RewardBench 2 prompt is one user turn. A group with more than one message is rejected
  (:class:`~rmserve.errors.InvalidRequest`, field ``messages``), never cut.

RM-Bench pairwise (``rmbench-pairwise``, **rmserve's own protocol, not official**: RM-Bench
ships no judge script, only the comparison prompt in its README). One user message
:func:`pairwise_user_prompt` — the README's template rendered as text (it is written there as
a Python format string: ``\\\\boxed{{A>>B}}`` renders as ``\\boxed{A>>B}``). Each of the 9
(chosen style i, rejected style j) pairs is judged twice, chosen as A then chosen as B.
Reader (:func:`parse_pairwise`): the *last* ``\\boxed{V}`` with ``V`` one of ``A>>B``, ``A>B``,
``A=B``, ``B>A``, ``B>>A`` (spaces inside ignored, ``\\boxed{{V}}`` accepted), no verdict when
its statement names another verdict too (:func:`concluding_verdict`); an output cut at
``max_tokens`` gives no verdict (its final verdict was never written). Per order
(:func:`pairwise_preference`): 1 when the verdict prefers the chosen answer (either strength),
0 when it prefers the rejected one, 0.5 for ``A=B`` and 0.5 when no verdict was read (a tie at
chance level, as the official RewardBench 2 rule credits an unreadable verdict at chance).
Cell (i, j) = mean of the two orders; hard / normal / easy as the classifier path
(``rmserve.metrics.rmbench``). Unlike the classifier path, where an exact reward tie is a loss,
a judge's explicit tie counts one half.

Reasoning judges (:func:`split_reasoning`): rmserve's readers read only the answer after the
reasoning — after the first ``</think>``; a text that starts with ``<think>`` (or whose prompt
ended with it, :attr:`JudgeOutput.reasoning_open`) and never closes it has no answer
(``truncated`` when cut at ``max_tokens``, else ``unfinished_reasoning``). A reasoning an
endpoint returns apart (``reasoning_content``) is recorded, never read. The official readers
(``compat="official"``) read the whole text, as the official script does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from rmserve.errors import InvalidRequest
from rmserve.judge_records import (
    FINISH_LENGTH,
    JUDGE_COMPATS,
    JUDGE_THINKING,
    THINK_CLOSE,
    THINK_OPEN,
    JudgeCall,
    JudgeGroupResult,
    JudgeParse,
)
from rmserve.schema import RMBENCH_STYLES, Group, Message

# --- official RewardBench 2 prompts (text reproduced exactly) ---------------------------

RANKING_SYSTEM_PROMPT = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by four AI assistants "
    "to the user question displayed below. You should choose the assistant that follows the user's instructions "
    "and answers the user's question best. Your evaluation should consider factors such as the helpfulness, "
    "relevance, accuracy, depth, creativity, and level of detail of their responses. Begin your evaluation by "
    "comparing the four responses and provide a short explanation. Avoid any position biases and ensure that the "
    "order in which the responses were presented does not influence your decision. Do not allow the length of the "
    "responses to influence your evaluation. Do not favor certain names of the assistants. Be as objective as "
    "possible. After providing your explanation, output your final verdict by strictly following this format: "
    '"[[A]]" if assistant A is best, "[[B]]" if assistant B is best, "[[C]]" if assistant C is best, and "[[D]]" '
    "if assistant D is best."
)
"""System message of the 4-way ranking (official ``prompt_v2``)."""

RANKING_LETTERS = ("A", "B", "C", "D")
"""Answer labels of the 4-way ranking, position 0–3."""

_RATING_NOTES = {
    "rb2-rating": (
        "1- Your evaluation should consider factors such as the helpfulness, relevance, accuracy, depth, "
        "creativity, and level of detail of the response."
    ),
    "rb2-rating-ties": (
        "1- Your evaluation should consider factors such as the helpfulness, relevance, and accuracy of the "
        "response, but need not consider depth or level of detail of the response."
    ),
}

_RATING_TEMPLATE = (
    "\n### Task Description\n"
    "Please act as an impartial judge and evaluate the quality of the response provided by an\n"
    "AI assistant to the user query displayed below.\n"
    "\n"
    "Notes:\n"
    "{note}\n"
    "2- Begin your evaluation by providing a short explanation.\n"
    "3- Be as objective as possible. After providing your explanation, please rate the response on a scale of 1 "
    "to 10. For your rating, only give a number between 1 and 10 (inclusive), do not use any markdown, and do not "
    "put any text after your final rating.\n"
    "\n"
    "[Query]\n"
    "{prompt}\n"
    "\n"
    "[Response]\n"
    "{completion}\n"
    "\n"
    "[Your judgement]"
)
"""Official ``ratings_prompt`` / ``ratings_prompt_ties`` (they differ only in note 1); the
leading newline is part of the official text."""

# --- RM-Bench README comparison prompt (text reproduced, rendered) -----------------------

_PAIRWISE_TEMPLATE = (
    "You will be shown a user prompt followed by two responses from different assistants. Your task is to decide "
    "which response is better. You may consider any criteria you find appropriate. Try your best and think "
    "carefully, deeply analyze the responses, and provide a final verdict.\n"
    "Ensure in the end that you should include the final verdict in the specified format as follows:\n"
    "\n"
    "1. Assistant A is significantly better: \\boxed{A>>B}\n"
    "2. Assistant A is slightly better: \\boxed{A>B}\n"
    "3. Tie, relatively the same: \\boxed{A=B}\n"
    "4. Assistant B is slightly better: \\boxed{B>A}\n"
    "5. Assistant B is significantly better: \\boxed{B>>A}\n"
    "\n"
    "<|User Prompt|>\n"
    "{question}\n"
    "\n"
    "<|The Start of Assistant A's Answer|>\n"
    "{answer_a}\n"
    "<|The End of Assistant A's Answer|>\n"
    "\n"
    "<|The Start of Assistant B's Answer|>\n"
    "{answer_b}\n"
    "<|The End of Assistant B's Answer|>"
)
"""RM-Bench README comparison template, rendered (``\\boxed{A>>B}``); filled by plain
replacement of the three ``{…}`` fields (the ``\\boxed{…}`` braces are not fields)."""

PAIRWISE_VERDICTS = ("A>>B", "A>B", "A=B", "B>A", "B>>A")
"""Verdicts of the RM-Bench pairwise prompt, strongest for A first."""

# The official generation settings (greedy, 2,048 tokens) are the defaults of
# rmserve.schema.JudgeSampling, the one record every judge engine decodes with.

RANKING_ERROR_CREDIT = 0.25
"""Credit of a ranking or rating group whose verdict could not be read (official: "effectively a tie")."""

PAIRWISE_TIE_VALUE = 0.5
"""Preference value of a pairwise ``A=B`` verdict and of an unread pairwise verdict."""


@dataclass(frozen=True)
class JudgeProtocolConfig:
    """How groups are judged.

    Attributes:
        ratings: score the RewardBench 2 non-Ties subsets by rating each answer
            (official ``--score_w_ratings``) instead of the 4-way ranking. Default False.
            Ties is always rated.
        seed: integer ≥ 0 the ranking positions are drawn from (:func:`ranking_position`).
            Default 0.
        compat: ``none`` (default: rmserve's readers) or ``official`` (the official
            RewardBench 2 ranking and rating readers, defects included; see
            :func:`read_output`). The pairwise reader is the same under both.
        system_role: send the ranking instructions as a system message (default True);
            False merges them into the user message (official ``--no_system_prompt``, for
            templates without a system role).
        thinking: the judge's thinking switch (``on`` / ``off``), recorded with every group;
            None (default) when not set. It changes the prompt the engine renders, not the
            reading.
    """

    ratings: bool = False
    seed: int = 0
    compat: str = "none"
    system_role: bool = True
    thinking: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.compat not in JUDGE_COMPATS:
            raise ValueError(f"compat must be one of {JUDGE_COMPATS}, got {self.compat!r}")
        if self.thinking is not None and self.thinking not in JUDGE_THINKING:
            raise ValueError(f"thinking must be one of {JUDGE_THINKING} or None, got {self.thinking!r}")


@dataclass(frozen=True)
class JudgePrompt:
    """One judge call to make.

    Attributes:
        protocol: the protocol (:data:`rmserve.judge_records.JUDGE_PROTOCOLS`).
        messages: the chat messages to send, before the chat template.
        responses: the group's response indices shown, in shown order (see
            :attr:`rmserve.judge_records.JudgeCall.responses`).
    """

    protocol: str
    messages: tuple[Message, ...]
    responses: tuple[int, ...]

    @property
    def sha256(self) -> str:
        """:func:`messages_sha256` of ``messages``."""
        return messages_sha256(self.messages)


@dataclass(frozen=True)
class JudgePlan:
    """The calls a group needs, in order, and the ranking draw.

    Attributes:
        protocol: the group's protocol.
        prompts: the calls, in the order :func:`score_group` expects their outputs.
        position: ``rb2-ranking``: where the correct answer is shown (0–3), else None.
        seed: ``rb2-ranking``: the seed ``position`` came from, else None.
    """

    protocol: str
    prompts: tuple[JudgePrompt, ...]
    position: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class JudgeOutput:
    """What the engine returned for one call.

    Attributes:
        text: the generated text, unstripped.
        prompt_tokens, completion_tokens: token counts (≥ 0).
        finish_reason: ``stop``, or ``length`` when cut at ``max_tokens``.
        cached_tokens: of ``prompt_tokens``, those served from the engine's prefix cache
            (0 when the engine does not say).
        reasoning: reasoning the engine returned apart from ``text`` (an endpoint's
            ``reasoning_content``), None when none; never read for a verdict.
        reasoning_open: the templated prompt ended with :data:`THINK_OPEN`, so ``text``
            begins inside the reasoning (see :func:`split_reasoning`).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    cached_tokens: int = 0
    reasoning: str | None = None
    reasoning_open: bool = False

    @property
    def truncated(self) -> bool:
        """True when the output was cut at ``max_tokens``."""
        return self.finish_reason == FINISH_LENGTH


# --- helpers --------------------------------------------------------------------------


def messages_sha256(messages: Sequence[Message]) -> str:
    """SHA-256 (hex) of chat messages: the compact JSON ``[[role, content], …]`` in UTF-8."""
    payload = msgspec.json.encode([[m.role, m.content] for m in messages])
    return hashlib.sha256(payload).hexdigest()


def question_of(group: Group) -> str:
    """The single user turn of ``group``, as the judge prompts insert it.

    Raises:
        InvalidRequest: ``messages`` is not exactly one user turn (field ``messages``,
            limit 1): the official judge has no multi-turn format.
    """
    if len(group.messages) != 1 or group.messages[0].role != "user":
        raise InvalidRequest(
            f"group {group.key}: judge prompts take exactly one user turn (the official judge has no "
            f"multi-turn format), got {len(group.messages)} message(s) with roles "
            f"{[m.role for m in group.messages]}",
            field="messages",
            value=len(group.messages),
            limit=1,
        )
    return group.messages[0].content


def _require(condition: bool, group: Group, field: str, message: str, value: object, limit: object) -> None:
    if not condition:
        raise InvalidRequest(f"group {group.key}: {message}", field=field, value=value, limit=limit)


# --- reasoning and the concluding statement ----------------------------------------------

def split_reasoning(text: str, *, reasoning_open: bool = False) -> tuple[str | None, str | None]:
    """A judge output's reasoning and its answer, ``(reasoning, answer)``.

    * ``text`` holds :data:`THINK_CLOSE`: the reasoning is the text before the first one
      (less a leading :data:`THINK_OPEN`), the answer the text after it. The first tag ends
      the reasoning, as vLLM's reasoning parsers for ``<think>`` models split it.
    * Else, when the reasoning was open — ``reasoning_open`` (the prompt ended with
      :data:`THINK_OPEN`) or ``text`` starts, after whitespace, with :data:`THINK_OPEN` —
      the whole text is reasoning and the answer is None: the reasoning never ended.
    * Else there is no reasoning (None) and the answer is the whole text.

    E.g. ``"<think>[[B]] looks best so far</think> Final: [[C]]"`` → (``"[[B]] looks best so
    far"``, ``" Final: [[C]]"``); ``"<think>[[B]] looks best so far"`` → (that text less the
    tag, None).
    """
    head, closed, tail = text.partition(THINK_CLOSE)
    stripped = head.lstrip()
    opened = stripped.startswith(THINK_OPEN)
    reasoning = stripped[len(THINK_OPEN):] if opened else head
    if closed:
        return reasoning, tail
    if reasoning_open or opened:
        return reasoning, None
    return None, text


_STATEMENT_BREAK = re.compile(r"\n|[.!?](?=\s)")
"""Where a statement ends: a line break, or ``.``, ``!`` or ``?`` followed by whitespace."""


def concluding_verdict(text: str, tokens: Sequence[tuple[int, str]]) -> tuple[str | None, str]:
    """The verdict ``text`` concludes with, from its verdict tokens.

    The concluding statement is the one holding the last token: from the last statement
    break before that token (:data:`_STATEMENT_BREAK`: a line break, or ``.``/``!``/``?``
    followed by whitespace; else the start of ``text``) to the end of ``text``. Its verdict is
    the last token's when every token in it names that verdict.

    Args:
        text: the text read (the answer).
        tokens: ``(start offset, verdict)`` of every verdict token in ``text``, in text order.

    Returns:
        ``(verdict, "ok")``; ``(None, "ambiguous_verdict")`` when the concluding statement
        names two different verdicts (``"[[B]] or [[C]]"``); ``(None, "no_verdict")`` when
        there is no token. E.g. ``'The format is "[[A]]" if A is best. Final verdict:
        [[C]]'`` → ``("C", "ok")``.
    """
    if not tokens:
        return None, "no_verdict"
    last, verdict = tokens[-1]
    breaks = [m.end() for m in _STATEMENT_BREAK.finditer(text, 0, last)]
    start = breaks[-1] if breaks else 0
    if len({v for at, v in tokens if at >= start}) > 1:
        return None, "ambiguous_verdict"
    return verdict, "ok"


def _read_verdict(
    parser: str,
    pattern: re.Pattern[str],
    text: str,
    candidates: tuple[str, ...],
    truncated: bool,
    reasoning_open: bool,
    normalise: Callable[[str], str],
) -> JudgeParse:
    """rmserve's verdict reading, shared by the ranking and pairwise readers: the answer after
    the reasoning, read by :func:`concluding_verdict` (``truncated``: reason ``truncated``; no
    answer: ``unfinished_reasoning``). ``pattern``'s group 1, through ``normalise``, is the
    verdict."""
    _, answer = split_reasoning(text, reasoning_open=reasoning_open)
    if truncated:
        return JudgeParse(parser, "truncated", candidates=candidates)
    if answer is None:
        return JudgeParse(parser, "unfinished_reasoning", candidates=candidates)
    tokens = [(m.start(), normalise(m.group(1))) for m in pattern.finditer(answer)]
    verdict, reason = concluding_verdict(answer, tokens)
    return JudgeParse(parser, reason, verdict=verdict, candidates=candidates)


# --- 4-way ranking --------------------------------------------------------------------


def ranking_position(seed: int, subset: str, group_id: str) -> int:
    """The position (0–3 = A–D) the correct answer is shown at, drawn from a seed.

    ``int.from_bytes(sha256(json(["rb2-ranking", seed, subset, group_id]))[:8], "big") % 4``
    with compact JSON in UTF-8. A pure function of its arguments, so the draw does not depend on
    the order or concurrency of the calls; uniform over 0–3 (2**64 is a multiple of 4). Replaces
    the official unseeded ``np.random.randint(0, 4)``.

    Raises:
        ValueError: ``seed`` not an integer ≥ 0.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    digest = hashlib.sha256(msgspec.json.encode(["rb2-ranking", seed, subset, group_id])).digest()
    return int.from_bytes(digest[:8], "big") % 4


def ranking_permutation(position: int) -> tuple[int, int, int, int]:
    """Response indices shown at A, B, C, D when the correct answer (index 0) goes to ``position``.

    The official script swaps A with the answer at ``position``: 0 → (0, 1, 2, 3),
    1 → (1, 0, 2, 3), 2 → (2, 1, 0, 3), 3 → (3, 1, 2, 0) (index 0 correct, 1–3 the rejected
    answers in dataset order).

    Raises:
        ValueError: ``position`` outside 0–3.
    """
    if isinstance(position, bool) or position not in (0, 1, 2, 3):
        raise ValueError(f"position must be 0, 1, 2 or 3, got {position!r}")
    order = [0, 1, 2, 3]
    order[0], order[position] = order[position], order[0]
    return (order[0], order[1], order[2], order[3])


def ranking_user_prompt(question: str, answers: Sequence[str]) -> str:
    """The official 4-way user message (``MTBENCH_V2["prompt_template"]``) for four answers A–D.

    Raises:
        ValueError: not exactly 4 answers.
    """
    if len(answers) != 4:
        raise ValueError(f"the ranking prompt takes exactly 4 answers, got {len(answers)}")
    blocks = [f"[User Question]\n{question}"]
    for letter, answer in zip(RANKING_LETTERS, answers):
        blocks.append(
            f"[The Start of Assistant {letter}'s Answer]\n{answer}\n[The End of Assistant {letter}'s Answer]"
        )
    return "\n\n".join(blocks)


def render_ranking(group: Group, position: int, *, system_role: bool = True) -> JudgePrompt:
    """The 4-way ranking call for a RewardBench 2 non-Ties group, correct answer at ``position``.

    Raises:
        InvalidRequest: not one user turn (``messages``), not exactly 4 responses
            (``responses``, the official script reads exactly 3 rejected) or ``num_chosen != 1``.
        ValueError: ``position`` outside 0–3.
    """
    question = question_of(group)
    n = len(group.responses)
    _require(n == 4, group, "responses", f"the 4-way ranking needs exactly 4 responses (1 correct, 3 rejected), "
             f"got {n}", n, 4)
    _require(group.num_chosen == 1, group, "num_chosen",
             f"the 4-way ranking needs num_chosen == 1, got {group.num_chosen}", group.num_chosen, 1)
    order = ranking_permutation(position)
    user = ranking_user_prompt(question, [group.responses[k] for k in order])
    if system_role:
        messages = (Message("system", RANKING_SYSTEM_PROMPT), Message("user", user))
    else:
        messages = (Message("user", f"{RANKING_SYSTEM_PROMPT}\n\n{user}"),)
    return JudgePrompt("rb2-ranking", messages, order)


_RANKING_TOKENS = tuple(f"[[{letter}]]" for letter in RANKING_LETTERS)
_RANKING_TOKEN = re.compile(r"\[\[([ABCD])\]\]")


def parse_ranking(
    text: str, *, compat: str = "none", truncated: bool = False, reasoning_open: bool = False
) -> JudgeParse:
    """Read a 4-way verdict (``[[A]]`` … ``[[D]]``) from a judge output.

    ``compat="official"`` (reader ``rb2-ranking-official``, official ``process_judgement``):
    the verdict is the first letter, in the order A, B, C, D, whose token ``[[X]]`` occurs
    anywhere in ``text`` (substring test; where in the text does not matter): an output
    quoting the format ``"[[A]]" if A is best`` reads A whatever it concludes. ``truncated``
    and ``reasoning_open`` are ignored (the whole text is read, reasoning included).

    Default (reader ``rb2-ranking``): the verdict the judge concludes with. Only the answer is
    read (:func:`split_reasoning`: after ``</think>``); the verdict is the last token
    ``[[X]]`` in it, unless the statement it stands in (:func:`concluding_verdict`) names
    another letter too (``[[B]] or [[C]]``: reason ``ambiguous_verdict``). An output cut at
    ``max_tokens`` (``truncated``) gives reason ``truncated`` (its concluding statement was
    never written, whether the cut fell in the reasoning or the answer); one that stopped
    inside its reasoning, ``unfinished_reasoning``.

    Tokens are exact: ``[[a]]``, ``[[ B ]]`` and ``[B]`` are not verdicts. ``candidates``
    lists every letter whose token occurs in ``text`` (reasoning included), in order of first
    appearance.

    Returns:
        :class:`JudgeParse` with ``verdict`` ``A``–``D`` and reason ``ok``, or the failure
        reason (``no_verdict`` when no token was found).

    Raises:
        ValueError: ``compat`` not in ``none``, ``official``.
    """
    found = sorted((text.find(tok), letter) for tok, letter in zip(_RANKING_TOKENS, RANKING_LETTERS) if tok in text)
    candidates = tuple(letter for _, letter in found)
    if compat == "official":
        for token, letter in zip(_RANKING_TOKENS, RANKING_LETTERS):
            if token in text:
                return JudgeParse("rb2-ranking-official", "ok", verdict=letter, candidates=candidates)
        return JudgeParse("rb2-ranking-official", "no_verdict")
    if compat != "none":
        raise ValueError(f"compat must be one of {JUDGE_COMPATS}, got {compat!r}")
    return _read_verdict("rb2-ranking", _RANKING_TOKEN, text, candidates, truncated, reasoning_open, lambda v: v)


def ranking_credit(verdict: str | None, position: int) -> float:
    """Official credit of one ranking verdict: 1 if it names ``position`` (0–3 = A–D), 0 if it
    names another answer, 0.25 when there is none (``verdict`` None).

    Raises:
        ValueError: a verdict other than A–D or None, or ``position`` outside 0–3.
    """
    if isinstance(position, bool) or position not in (0, 1, 2, 3):
        raise ValueError(f"position must be 0, 1, 2 or 3, got {position!r}")
    if verdict is None:
        return RANKING_ERROR_CREDIT
    if verdict not in RANKING_LETTERS:
        raise ValueError(f"verdict must be one of {RANKING_LETTERS} or None, got {verdict!r}")
    return 1.0 if verdict == RANKING_LETTERS[position] else 0.0


# --- ratings --------------------------------------------------------------------------


def rating_user_prompt(question: str, answer: str, *, ties: bool) -> str:
    """The official rating prompt for one answer (``ratings_prompt``, or
    ``ratings_prompt_ties`` when ``ties``)."""
    note = _RATING_NOTES["rb2-rating-ties" if ties else "rb2-rating"]
    # Plain replacement in one pass, so braces in the question or answer stay as they are.
    fields = {"{note}": note, "{prompt}": question, "{completion}": answer}
    return re.sub(r"\{note\}|\{prompt\}|\{completion\}", lambda m: fields[m.group(0)], _RATING_TEMPLATE)


def render_rating(group: Group, index: int) -> JudgePrompt:
    """The rating call for response ``index`` of a RewardBench 2 group (Ties variant for Ties).

    Raises:
        InvalidRequest: not one user turn (``messages``); outside Ties, ``num_chosen != 1``.
        IndexError: ``index`` outside the responses.
    """
    question = question_of(group)
    ties = group.domain == "Ties"
    if not ties:
        _require(group.num_chosen == 1, group, "num_chosen",
                 f"rated non-Ties groups need num_chosen == 1, got {group.num_chosen}", group.num_chosen, 1)
    if not 0 <= index < len(group.responses):
        raise IndexError(f"response index {index} outside 0..{len(group.responses) - 1}")
    protocol = "rb2-rating-ties" if ties else "rb2-rating"
    user = rating_user_prompt(question, group.responses[index], ties=ties)
    return JudgePrompt(protocol, (Message("user", user),), (index,))


_OFFICIAL_RATING = re.compile(r"\b([1-9]|10)\b\s*$")
"""The official rating regex, applied to the stripped text."""

_RATING_TAIL = re.compile(
    r"(?<![\w.,/+\-\u2212])"  # the number starts a token
    r"(?P<sign>[+\-\u2212]?)"
    r"(?P<number>[0-9]+(?:\.[0-9]+)?)"
    r"(?:\s*(?:/|out\s+of)\s*(?P<scale>[0-9]+(?:\.[0-9]+)?))?"
    r"[\]\)\*\"'`.]*\Z"  # closing brackets, bold, quotes, a full stop
)


def parse_rating(
    text: str, *, compat: str = "none", truncated: bool = False, reasoning_open: bool = False
) -> JudgeParse:
    """Read a 1–10 rating from a judge output.

    ``compat="official"`` (reader ``rb2-rating-official``, official ``get_single_rating``):
    strip the text; the rating is the integer 1–10 that stands alone (word boundaries) at its
    very end, else none. It reads ``7/10`` and ``Rating: 8/10`` as 10, ``3 out of 10`` as 10,
    ``8.5`` as 5, ``-3`` as 3, and ``[[8]]``, ``9.`` and ``**9**`` as nothing; ``truncated``
    and ``reasoning_open`` are ignored (the whole text is read).

    Default (reader ``rb2-rating``): only the answer after the reasoning is read
    (:func:`split_reasoning`); the rating is the number it ends with (trailing whitespace
    ignored), optionally written ``N/10`` or ``N out of 10``, optionally followed by closing
    ``]`` ``)`` ``*`` quotes or a full stop (so ``[[8]]``, ``**9**``, ``9.`` read 8, 9, 9).
    It must be an integer in 1–10: ``8.5`` → ``not_integer``; ``0``, ``11``, ``-3`` →
    ``out_of_range``; ``7/5`` → ``bad_scale``; text after the number →
    ``no_trailing_rating``; an output cut at ``max_tokens`` (``truncated``) → ``truncated``
    (the final rating was never written); one that stopped inside its reasoning →
    ``unfinished_reasoning``.

    Returns:
        :class:`JudgeParse` with ``rating`` set and reason ``ok``, or the failure reason.

    Raises:
        ValueError: ``compat`` not in ``none``, ``official``.
    """
    if compat == "official":
        match = _OFFICIAL_RATING.search(text.strip())
        if match is None:
            return JudgeParse("rb2-rating-official", "no_trailing_rating")
        return JudgeParse("rb2-rating-official", "ok", rating=int(match.group(1)))
    if compat != "none":
        raise ValueError(f"compat must be one of {JUDGE_COMPATS}, got {compat!r}")
    if truncated:
        return JudgeParse("rb2-rating", "truncated")
    _, answer = split_reasoning(text, reasoning_open=reasoning_open)
    if answer is None:
        return JudgeParse("rb2-rating", "unfinished_reasoning")
    match = _RATING_TAIL.search(answer.rstrip())
    if match is None:
        return JudgeParse("rb2-rating", "no_trailing_rating")
    number, scale = match.group("number"), match.group("scale")
    if "." in number:
        return JudgeParse("rb2-rating", "not_integer")
    if scale is not None and scale != "10":
        return JudgeParse("rb2-rating", "bad_scale")
    value = int(number)
    if match.group("sign") in ("-", "\u2212") or not 1 <= value <= 10:
        return JudgeParse("rb2-rating", "out_of_range")
    return JudgeParse("rb2-rating", "ok", rating=value)


def rating_credit(ratings: Sequence[int | None]) -> float:
    """Official credit of a rated non-Ties group (correct answer at index 0).

    Failed ratings (None; the official −1) are left out. With ``k`` answers at the top valid
    rating: ``1/k`` if answer 0 is among them, else 0; 0.25 when every rating failed.

    Raises:
        ValueError: no ratings.
    """
    if not ratings:
        raise ValueError("ratings is empty")
    valid = [r for r in ratings if r is not None]
    if not valid:
        return RANKING_ERROR_CREDIT
    top = max(valid)
    winners = [k for k, r in enumerate(ratings) if r == top]
    return (1.0 if 0 in winners else 0.0) / len(winners)


# --- RM-Bench pairwise (rmserve's own protocol) -------------------------------------------


def pairwise_user_prompt(question: str, answer_a: str, answer_b: str) -> str:
    """The RM-Bench README comparison prompt for answers A and B (see :data:`_PAIRWISE_TEMPLATE`)."""
    fields = {"{question}": question, "{answer_a}": answer_a, "{answer_b}": answer_b}
    return re.sub(r"\{question\}|\{answer_a\}|\{answer_b\}", lambda m: fields[m.group(0)], _PAIRWISE_TEMPLATE)


def render_pairwise(group: Group, chosen_style: int, rejected_style: int, chosen_first: bool) -> JudgePrompt:
    """The pairwise call for (chosen style i, rejected style j) of an RM-Bench group.

    Responses 0–2 are the chosen answers and 3–5 the rejected ones, each in style order
    concise, detailed plain, detailed markdown; ``chosen_first`` puts the chosen one at A.

    Raises:
        InvalidRequest: not one user turn, not 6 responses with ``num_chosen == 3``, or styles
            not in release order.
        ValueError: a style index outside 0–2.
    """
    question = question_of(group)
    _require(len(group.responses) == 6 and group.num_chosen == 3, group, "responses",
             f"RM-Bench pairwise needs 3 chosen then 3 rejected responses, got {len(group.responses)} with "
             f"num_chosen={group.num_chosen}", len(group.responses), 6)
    if group.styles is not None:
        _require(group.styles == RMBENCH_STYLES + RMBENCH_STYLES, group, "styles",
                 f"styles must be {list(RMBENCH_STYLES)} for each side", group.styles, RMBENCH_STYLES)
    for name, style in (("chosen_style", chosen_style), ("rejected_style", rejected_style)):
        if isinstance(style, bool) or style not in (0, 1, 2):
            raise ValueError(f"{name} must be 0, 1 or 2, got {style!r}")
    chosen, rejected = chosen_style, 3 + rejected_style
    order = (chosen, rejected) if chosen_first else (rejected, chosen)
    user = pairwise_user_prompt(question, group.responses[order[0]], group.responses[order[1]])
    return JudgePrompt("rmbench-pairwise", (Message("user", user),), order)


_PAIRWISE_VERDICT = re.compile(r"\\boxed\{\{?\s*(A\s*>>\s*B|A\s*>\s*B|A\s*=\s*B|B\s*>\s*A|B\s*>>\s*A)\s*\}\}?")


def parse_pairwise(text: str, *, truncated: bool = False, reasoning_open: bool = False) -> JudgeParse:
    """Read an RM-Bench pairwise verdict (reader ``rmbench-pairwise``; rmserve's rule, not
    official, the same under both compat values).

    Only the answer after the reasoning is read (:func:`split_reasoning`). The verdict is the
    last ``\\boxed{V}`` in it with ``V`` one of :data:`PAIRWISE_VERDICTS` (whitespace inside
    ignored, doubled braces accepted; other ``\\boxed{…}`` contents are not verdicts), unless
    the statement it stands in (:func:`concluding_verdict`) names another verdict too
    (``\\boxed{A>B} or \\boxed{B>A}``: reason ``ambiguous_verdict``). ``candidates`` lists
    every distinct verdict in ``text`` (reasoning included), in order of first appearance. An
    output cut at ``max_tokens`` (``truncated``) gives reason ``truncated`` whatever it holds;
    one that stopped inside its reasoning, ``unfinished_reasoning``.

    Returns:
        :class:`JudgeParse` with ``verdict`` and reason ``ok``, or the failure reason
        (``no_verdict`` when there is no verdict).
    """
    candidates = tuple(dict.fromkeys(_compact(m.group(1)) for m in _PAIRWISE_VERDICT.finditer(text)))
    return _read_verdict("rmbench-pairwise", _PAIRWISE_VERDICT, text, candidates, truncated, reasoning_open, _compact)


def _compact(verdict: str) -> str:
    return re.sub(r"\s+", "", verdict)


def pairwise_preference(verdict: str | None, chosen_first: bool) -> float:
    """How much one pairwise verdict prefers the chosen answer: 1, 0, or 0.5.

    1 when it prefers the chosen answer (``A>>B``/``A>B`` with the chosen at A,
    ``B>A``/``B>>A`` with it at B), 0 when it prefers the rejected one, 0.5 for ``A=B`` and for
    no verdict (None).

    Raises:
        ValueError: a verdict outside :data:`PAIRWISE_VERDICTS`.
    """
    if verdict is None or verdict == "A=B":
        return PAIRWISE_TIE_VALUE
    if verdict not in PAIRWISE_VERDICTS:
        raise ValueError(f"verdict must be one of {PAIRWISE_VERDICTS} or None, got {verdict!r}")
    prefers_a = verdict.startswith("A")
    return 1.0 if prefers_a == chosen_first else 0.0


def pairwise_cells(calls: Sequence[JudgeCall]) -> tuple[float, ...]:
    """The 9 cells (row-major, chosen style i × rejected style j) from 18 pairwise calls.

    Each call's ``responses`` says which answers were at A and B; cell (i, j) is the mean of
    :func:`pairwise_preference` over its two calls.

    Raises:
        ValueError: a cell without exactly one call per order, or a call not showing one chosen
            (0–2) and one rejected (3–5) answer.
    """
    values: dict[tuple[int, int, bool], float] = {}
    for call in calls:
        if len(call.responses) != 2:
            raise ValueError(f"pairwise calls show 2 responses, got {call.responses}")
        a, b = call.responses
        chosen_first = a < 3
        chosen, rejected = (a, b) if chosen_first else (b, a)
        if not (0 <= chosen < 3 <= rejected < 6):
            raise ValueError(
                f"a pairwise call must show one chosen (0-2) and one rejected (3-5) answer, got {call.responses}"
            )
        key = (chosen, rejected - 3, chosen_first)
        if key in values:
            raise ValueError(f"two calls for chosen style {key[0]}, rejected style {key[1]}, chosen_first={key[2]}")
        values[key] = pairwise_preference(call.parse.verdict, chosen_first)
    cells = []
    for i in range(3):
        for j in range(3):
            pair = [values.get((i, j, first)) for first in (True, False)]
            if None in pair:
                raise ValueError(f"cell (chosen style {i}, rejected style {j}) needs one call per order")
            cells.append((pair[0] + pair[1]) / 2)
    return tuple(cells)


# --- planning and assembling ------------------------------------------------------------


def group_protocol(group: Group, config: JudgeProtocolConfig) -> str:
    """The protocol for ``group``: RM-Bench → ``rmbench-pairwise``; RewardBench 2 Ties →
    ``rb2-rating-ties``; other RewardBench 2 subsets → ``rb2-rating`` when ``config.ratings``
    else ``rb2-ranking``.

    Raises:
        InvalidRequest: an unknown benchmark (field ``benchmark``).
    """
    if group.benchmark == "rm-bench":
        return "rmbench-pairwise"
    if group.benchmark == "rewardbench2":
        if group.domain == "Ties":
            return "rb2-rating-ties"
        return "rb2-rating" if config.ratings else "rb2-ranking"
    raise InvalidRequest(
        f"group {group.key}: no judge protocol for benchmark {group.benchmark!r}",
        field="benchmark",
        value=group.benchmark,
        limit=("rm-bench", "rewardbench2"),
    )


def plan_group(group: Group, config: JudgeProtocolConfig) -> JudgePlan:
    """The judge calls of one group, in order.

    ``rb2-ranking``: one call, correct answer at :func:`ranking_position` (config seed, subset,
    id). Rating protocols: one call per response, response order. ``rmbench-pairwise``: 18
    calls, for chosen style i, rejected style j (row-major), chosen first then rejected first.

    Raises:
        InvalidRequest: a group the protocol cannot take (see the ``render_*`` functions).
    """
    protocol = group_protocol(group, config)
    if protocol == "rb2-ranking":
        position = ranking_position(config.seed, group.domain, group.id)
        prompt = render_ranking(group, position, system_role=config.system_role)
        return JudgePlan(protocol, (prompt,), position=position, seed=config.seed)
    if protocol in ("rb2-rating", "rb2-rating-ties"):
        return JudgePlan(protocol, tuple(render_rating(group, k) for k in range(len(group.responses))))
    prompts = tuple(
        render_pairwise(group, i, j, first) for i in range(3) for j in range(3) for first in (True, False)
    )
    return JudgePlan(protocol, prompts)


def read_output(prompt: JudgePrompt, output: JudgeOutput, compat: str = "none") -> JudgeCall:
    """Parse one output with its protocol's reader under ``compat``
    (:data:`rmserve.judge_records.JUDGE_READERS`) and record the call.

    ``output.text`` is what is read (a reasoning returned apart, ``output.reasoning``, never
    is); the default readers read only its answer after the reasoning, the official ones the
    whole text.

    Raises:
        ValueError: a bad ``compat`` or negative token counts.
    """
    cut, opened = output.truncated, output.reasoning_open
    if prompt.protocol == "rb2-ranking":
        parse = parse_ranking(output.text, compat=compat, truncated=cut, reasoning_open=opened)
    elif prompt.protocol == "rmbench-pairwise":
        if compat not in JUDGE_COMPATS:
            raise ValueError(f"compat must be one of {JUDGE_COMPATS}, got {compat!r}")
        parse = parse_pairwise(output.text, truncated=cut, reasoning_open=opened)
    else:
        parse = parse_rating(output.text, compat=compat, truncated=cut, reasoning_open=opened)
    return JudgeCall(
        protocol=prompt.protocol,
        messages_sha256=prompt.sha256,
        responses=prompt.responses,
        text=output.text,
        parse=parse,
        prompt_tokens=output.prompt_tokens,
        completion_tokens=output.completion_tokens,
        finish_reason=output.finish_reason,
        cached_tokens=output.cached_tokens,
        reasoning=output.reasoning,
        reasoning_open=output.reasoning_open,
    )


def score_group(
    group: Group, plan: JudgePlan, outputs: Sequence[JudgeOutput], config: JudgeProtocolConfig
) -> JudgeGroupResult:
    """Read the outputs of ``plan``'s calls (same order) and give the group its score.

    ``rb2-ranking``: ``credit`` by :func:`ranking_credit`. ``rb2-rating``: ``ratings`` and
    ``credit`` by :func:`rating_credit`. ``rb2-rating-ties``: ``ratings`` only (scored per
    subset). ``rmbench-pairwise``: ``cells`` by :func:`pairwise_cells`.

    Raises:
        ValueError: ``outputs`` not one per planned call.
    """
    if len(outputs) != len(plan.prompts):
        raise ValueError(f"outputs must hold one output per planned call ({len(plan.prompts)}), got {len(outputs)}")
    calls = tuple(read_output(p, o, config.compat) for p, o in zip(plan.prompts, outputs))
    base = dict(
        benchmark=group.benchmark,
        domain=group.domain,
        id=group.id,
        protocol=plan.protocol,
        compat=config.compat,
        num_chosen=group.num_chosen,
        calls=calls,
        thinking=config.thinking,
    )
    if plan.protocol == "rb2-ranking":
        assert plan.position is not None
        credit = ranking_credit(calls[0].parse.verdict, plan.position)
        return JudgeGroupResult(**base, credit=credit, position=plan.position, seed=plan.seed)
    if plan.protocol == "rmbench-pairwise":
        return JudgeGroupResult(**base, cells=pairwise_cells(calls))
    ratings = tuple(c.parse.rating for c in calls)
    if plan.protocol == "rb2-rating":
        return JudgeGroupResult(**base, ratings=ratings, credit=rating_credit(ratings))
    return JudgeGroupResult(**base, ratings=ratings)
