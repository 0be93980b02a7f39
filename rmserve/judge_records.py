"""Records of generative-judge (LLM-as-judge) scoring: one judge call, one judged group.

Ground floor, next to :mod:`rmserve.schema`: the server stage builds these records
(``rmserve.server.kinds.judge_protocols``) and the metrics stage reads them (``rmserve.metrics.judge``),
so they live below both. Frozen ``msgspec.Struct`` types, like every record of the data flow.

Protocols (:data:`JUDGE_PROTOCOLS`):

* ``rb2-ranking`` — RewardBench 2 non-Ties subsets, one call per group: the four answers labelled
  A–D, the correct one moved to a recorded position (official default).
* ``rb2-rating`` — RewardBench 2 non-Ties subsets, one call per answer, each rated 1–10
  (official ``--score_w_ratings``).
* ``rb2-rating-ties`` — the Ties subset, always rated (official Ties prompt variant).
* ``rmbench-pairwise`` — RM-Bench, rmserve's own protocol (RM-Bench ships no judge script): each
  of the 9 (chosen style, rejected style) pairs judged in both orders, 18 calls per group.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

JUDGE_PROTOCOLS: tuple[str, ...] = ("rb2-ranking", "rb2-rating", "rb2-rating-ties", "rmbench-pairwise")
"""Judge protocols, as named in records (see the module docstring)."""

JudgeProtocol = Literal["rb2-ranking", "rb2-rating", "rb2-rating-ties", "rmbench-pairwise"]

JUDGE_COMPATS: tuple[str, ...] = ("none", "official")
"""``none``: rmserve's reading of judge outputs (the default); ``official``: the official
RewardBench 2 readers reproduced, defects included (the ranking and rating readers differ, see
:data:`JUDGE_READERS`; RM-Bench's pairwise protocol is rmserve's own and has one reader)."""

JUDGE_READERS: dict[str, dict[str, str]] = {
    "none": {
        "rb2-ranking": "rb2-ranking",
        "rb2-rating": "rb2-rating",
        "rb2-rating-ties": "rb2-rating",
        "rmbench-pairwise": "rmbench-pairwise",
    },
    "official": {
        "rb2-ranking": "rb2-ranking-official",
        "rb2-rating": "rb2-rating-official",
        "rb2-rating-ties": "rb2-rating-official",
        "rmbench-pairwise": "rmbench-pairwise",
    },
}
"""Per compat, per protocol, the reader (:attr:`JudgeParse.parser`) that reads its outputs."""

JUDGE_READER_VERSION = 2
"""The version of the readers' rules, bound into every judge fingerprint
(:func:`rmserve.fingerprint.judge_fingerprint`): version 2 reads ranking and pairwise verdicts
from the concluding statement and only after the reasoning, so scores read by version 1 rules
are not resumed as if read by these."""

JUDGE_THINKING: tuple[str, ...] = ("on", "off")
"""Values of the judge's thinking switch (the chat template's ``enable_thinking``); None = the
template's own default (the switch is not passed)."""

PARSE_REASONS: tuple[str, ...] = (
    "ok",
    "no_verdict",
    "no_trailing_rating",
    "not_integer",
    "out_of_range",
    "bad_scale",
    "truncated",
    "ambiguous_verdict",
    "unfinished_reasoning",
)
"""Why a judge output did or did not give a verdict or rating (:attr:`JudgeParse.reason`):
``ok`` — parsed; ``no_verdict`` — no verdict token in the text; ``no_trailing_rating`` — the text
does not end in a rating (empty text included); ``not_integer`` — the final number has a
fractional part (``8.5``); ``out_of_range`` — the final integer is outside 1–10 (``0``, ``11``,
``-3``); ``bad_scale`` — a ``N/D`` or ``N out of D`` rating with ``D != 10``; ``truncated`` — the
output hit ``max_tokens`` and the reader in use does not trust a cut output (a cut inside the
reasoning included); ``ambiguous_verdict`` — the concluding statement names two different
verdicts (``[[B]] or [[C]]``); ``unfinished_reasoning`` — the output stopped (not cut) inside
its reasoning, so no answer follows it."""

THINK_OPEN = "<think>"
"""The tag that opens a reasoning block (Qwen3, DeepSeek-R1, QwQ and other ``<think>`` models)."""

THINK_CLOSE = "</think>"
"""The tag that ends a reasoning block; the answer follows it."""

FINISH_LENGTH = "length"
"""The finish reason of an output cut at ``max_tokens`` (vLLM and OpenAI name it so)."""


class JudgeParse(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a parser read from one judge output.

    Attributes:
        parser: the reader that read it (:data:`JUDGE_READERS`): ``rb2-ranking``,
            ``rb2-ranking-official``, ``rb2-rating``, ``rb2-rating-official`` or
            ``rmbench-pairwise``.
        reason: one of :data:`PARSE_REASONS`; ``ok`` exactly when ``verdict`` or ``rating`` is set.
        verdict: ranking ``A``–``D``; pairwise ``A>>B``, ``A>B``, ``A=B``, ``B>A`` or ``B>>A``;
            None for ratings and on failure.
        rating: an integer in 1–10 for the rating protocols, None otherwise and on failure.
        candidates: every distinct verdict token found, in order of first appearance (ranking
            and pairwise), so an output naming several verdicts stays visible even where the
            rule picked one.
    """

    parser: str
    reason: str
    verdict: str | None = None
    rating: int | None = None
    candidates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.reason not in PARSE_REASONS:
            raise ValueError(f"reason must be one of {PARSE_REASONS}, got {self.reason!r}")
        parsed = self.verdict is not None or self.rating is not None
        if parsed != (self.reason == "ok"):
            raise ValueError(f"reason is {self.reason!r} but verdict={self.verdict!r}, rating={self.rating!r}")
        if self.rating is not None and not 1 <= self.rating <= 10:
            raise ValueError(f"rating must lie in [1, 10], got {self.rating}")

    @property
    def ok(self) -> bool:
        """True when a verdict or rating was read."""
        return self.reason == "ok"


class JudgeCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One generation by the judge model and what was read from it.

    Attributes:
        protocol: one of :data:`JUDGE_PROTOCOLS`.
        messages_sha256: SHA-256 (hex) of the rendered chat messages, as
            ``rmserve.server.kinds.judge_protocols.messages_sha256`` computes it; the messages
            themselves are re-rendered from the group, the protocol and ``responses``.
        responses: the group's response indices shown in the prompt, in shown order:
            ``rb2-ranking`` the answers at A, B, C, D (the permutation); the rating protocols
            the one rated answer; ``rmbench-pairwise`` the answers at A and B.
        text: the generated text exactly as the engine returned it (not stripped); for an
            OpenAI-compatible endpoint ``message.content`` ("" when the endpoint sent null).
        parse: what the parser read from ``text``.
        prompt_tokens: tokens of the templated prompt.
        completion_tokens: tokens generated.
        finish_reason: the engine's finish reason (``stop``; ``length`` when cut at
            ``max_tokens``, see :data:`FINISH_LENGTH`).
        cached_tokens: of ``prompt_tokens``, those the engine served from its prefix cache
            (0 when it does not say, e.g. most hosted APIs).
        reasoning: the reasoning an endpoint returned apart from ``text``
            (``message.reasoning_content`` or ``message.reasoning``), None when it returned
            none; a local engine's reasoning stays inside ``text`` (``<think>…</think>``).
        reasoning_open: the templated prompt ended with ``<think>`` (a template that opens the
            reasoning for the model), so ``text`` begins inside the reasoning.
    """

    protocol: str
    messages_sha256: str
    responses: tuple[int, ...]
    text: str
    parse: JudgeParse
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    cached_tokens: int = 0
    reasoning: str | None = None
    reasoning_open: bool = False

    def __post_init__(self) -> None:
        if self.protocol not in JUDGE_PROTOCOLS:
            raise ValueError(f"protocol must be one of {JUDGE_PROTOCOLS}, got {self.protocol!r}")
        if self.prompt_tokens < 0 or self.completion_tokens < 0:
            raise ValueError(
                f"token counts must be >= 0, got prompt_tokens={self.prompt_tokens}, "
                f"completion_tokens={self.completion_tokens}"
            )
        if not 0 <= self.cached_tokens <= self.prompt_tokens:
            raise ValueError(
                f"cached_tokens must lie in [0, prompt_tokens={self.prompt_tokens}], got {self.cached_tokens}"
            )

    @property
    def truncated(self) -> bool:
        """True when the output was cut at ``max_tokens`` (``finish_reason == "length"``)."""
        return self.finish_reason == FINISH_LENGTH


class JudgeGroupResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One benchmark group judged, with the per-group score its protocol's rule gives.

    Exactly one score field is set, by protocol: ``credit`` for ``rb2-ranking`` and
    ``rb2-rating``; ``ratings`` for the rating protocols (``rb2-rating`` keeps them next to its
    credit; ``rb2-rating-ties`` is scored per subset from them); ``cells`` for
    ``rmbench-pairwise``.

    Attributes:
        benchmark, domain, id: the group key (:class:`rmserve.schema.GroupKey`).
        protocol: one of :data:`JUDGE_PROTOCOLS`.
        compat: ``none`` or ``official`` (:data:`JUDGE_COMPATS`): which readers read the
            outputs (:data:`JUDGE_READERS`; each call's ``parse.parser`` names its reader).
        num_chosen: leading responses that are chosen/correct (RewardBench 2 ``num_correct``).
        calls: the judge calls, in the order the protocol plans them.
        credit: RewardBench 2 non-Ties credit under the official rule, a fraction in [0, 1].
        ratings: per response (group order), the rating read, None where none was read
            (the official code counts those as −1).
        cells: ``rmbench-pairwise``: 9 values, row-major over (chosen style i, rejected style j),
            each the mean of the two orders' preference for the chosen answer, in [0, 1].
        position: ``rb2-ranking``: the position (0–3 = A–D) the correct answer was shown at.
        seed: ``rb2-ranking``: the seed ``position`` was drawn from.
        thinking: the thinking switch the judge ran with (``on`` / ``off``, see
            :data:`JUDGE_THINKING`); None when it was not set (the template's default).
    """

    benchmark: str
    domain: str
    id: str
    protocol: str
    compat: str
    num_chosen: int
    calls: tuple[JudgeCall, ...]
    credit: float | None = None
    ratings: tuple[int | None, ...] | None = None
    cells: tuple[float, ...] | None = None
    position: int | None = None
    seed: int | None = None
    thinking: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in JUDGE_PROTOCOLS:
            raise ValueError(f"protocol must be one of {JUDGE_PROTOCOLS}, got {self.protocol!r}")
        if self.thinking is not None and self.thinking not in JUDGE_THINKING:
            raise ValueError(f"thinking must be one of {JUDGE_THINKING} or None, got {self.thinking!r}")
        if self.compat not in JUDGE_COMPATS:
            raise ValueError(f"compat must be one of {JUDGE_COMPATS}, got {self.compat!r}")
        if self.credit is not None and not (math.isfinite(self.credit) and 0.0 <= self.credit <= 1.0):
            raise ValueError(f"credit must lie in [0, 1], got {self.credit}")
        if self.cells is not None and len(self.cells) != 9:
            raise ValueError(f"cells must hold 9 values (3x3, row-major), got {len(self.cells)}")
        if self.position is not None and not 0 <= self.position <= 3:
            raise ValueError(f"position must lie in [0, 3], got {self.position}")
