"""Rendering for DPO implicit rewards: prompt and answer split, BOS/EOS, answer starts.

A DPO policy is scored on the log-probabilities of a response's *answer tokens* given the
conversation. :class:`DPORenderer` turns a group into one token sequence per response plus
the index of its first answer token (:attr:`~rmserve.server.render.RenderedGroup.answer_start`),
the way the official evaluator does (allenai/reward-bench ``rewardbench/utils.py``
``prepare_dialogue_from_tokenizer`` for the texts, ``rewardbench/dpo.py``
``DPOInference.tokenize_row`` and ``build_tokenized_answer`` for the ids):

1. ``prompt_text`` = the chat template over the conversation alone (no generation prompt,
   not tokenized); ``full_text`` = the template over conversation + assistant response.
2. ``answer_text`` = ``full_text`` minus ``prompt_text``. Ids: ``prompt_ids = tok(prompt_text)``,
   ``full_ids = tok(prompt_text + answer_text)`` (no special tokens added); the answer starts
   at ``len(prompt_ids)``, one earlier when ``prompt_ids`` is not a prefix of ``full_ids``
   (a token merged across the boundary belongs to the answer — the official BPE fix).
3. sequence = ``[BOS] + full_ids[:start] + full_ids[start:] + [EOS]``; BOS is the tokenizer's
   ``bos_token_id``, or its ``eos_token_id`` when it has none (as the official script sets).
   The answer tokens are ``full_ids[start:]`` and the appended EOS.

Two modes (``compat``):

- ``none`` (default), the correct computation: BOS is not prepended when the rendered text
  already starts with it (the demo template writes BOS itself, so the official script
  doubles it); ``answer_text`` is ``full_text`` with the ``prompt_text`` *prefix* removed, and
  a template that does not render the conversation as prompt + answer is refused
  (:class:`~rmserve.errors.InvalidRequest`, field ``groups[i]``).
- ``official``: the official script reproduced — BOS always prepended (doubled when the
  template writes one), ``answer_text = full_text.replace(prompt_text, "")`` (every
  occurrence, prefix or not), and its truncation (``max_length`` 2048, ``max_prompt_length``
  128, ``keep_end``) applied to every pair of the group automatically: see
  :func:`official_truncation`. The cut counts are reported in ``truncated_tokens``.

In both modes the EOS is appended after the answer, so a template that already closes the
assistant turn with EOS (the demo template does) ends the sequence with two EOS, both
counted as answer tokens — that is the official computation and both modes keep it.

Over-length sequences follow the classifier rules of :class:`~rmserve.server.render.Renderer`
(``sequence_too_long`` per response with ``too_long="mark"``, or
:class:`~rmserve.errors.SequenceTooLong`), with a request :class:`~rmserve.schema.Truncation`
defined for prompt + answer: ``left`` cuts prompt tokens right after the leading BOS and never
answer tokens — when BOS + answer alone is over ``max_tokens`` that response fails
(``sequence_too_long``); ``right`` cuts the answer's tail — when the prompt alone leaves no
answer token that response fails. Cut counts are reported per response in
``truncated_tokens``; nothing is cut silently.

Tokenizer work per request: one batched chat-template call (all prompts and all full
texts), one batched tokenizer call (one prompt text per group and every full text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import ResponseError, Truncation
from rmserve.server.render import RenderedGroup, Renderer, TooLong, _common_prefix_len, _Item

Compat = Literal["none", "official"]

OFFICIAL_MAX_LENGTH = 2048
"""``max_length`` of the official DPO evaluator (allenai/reward-bench ``rewardbench/dpo.py``,
``DPOInference.__init__``): the longest prompt + answer it keeps, in tokens."""

OFFICIAL_MAX_PROMPT_LENGTH = 128
"""``max_prompt_length`` of the official DPO evaluator: the prompt tokens kept (its last ones,
``truncation_mode="keep_end"``) when prompt + the pair's longer answer exceeds
:data:`OFFICIAL_MAX_LENGTH`."""


@dataclass(slots=True)
class _Split:
    """One response as prompt ids + answer ids, with its cut count and failure."""

    prompt: list[int]
    answer: list[int]
    cut: int = 0
    error: str | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.answer


def pair_partners(n: int) -> list[int | None]:
    """The response each response of a group of ``n`` is paired with for the official truncation.

    An even group pairs ``j`` with ``j + n/2`` (chosen ``i`` with rejected ``i``, as RM-Bench's
    harness pairs them: THU-KEG/RM-Bench ``scripts/utils.py``
    ``convert_robust_dataset_to_preference_dataset_list``; RewardBench's chosen/rejected is
    ``n = 2``); an odd group pairs nothing (each response uses its own answer length).
    """
    if n % 2:
        return [None] * n
    half = n // 2
    return [(j + half) % n for j in range(n)]


def official_truncation(
    prompt: Sequence[int], answer: Sequence[int], partner_answer_len: int | None,
    *, max_length: int = OFFICIAL_MAX_LENGTH, max_prompt_length: int = OFFICIAL_MAX_PROMPT_LENGTH,
) -> tuple[list[int], list[int]]:
    """The official script's truncation of one response (``DPOInference.tokenize_row``).

    With ``L = max(len(answer), partner_answer_len)`` (the longer answer of the pair, EOS
    included): when ``len(prompt) + L > max_length`` the prompt keeps its last
    ``max_prompt_length`` tokens (``keep_end``: a leading BOS is dropped with the rest); then,
    when the kept prompt + ``L`` is still over ``max_length``, the answer keeps its first
    ``max_length - max_prompt_length`` tokens.

    Args:
        prompt: the prompt ids, the prepended BOS included.
        answer: the answer ids, the appended EOS included.
        partner_answer_len: the answer length of the paired response, None when unpaired.

    Returns:
        (prompt ids kept, answer ids kept).
    """
    longer = max(len(answer), partner_answer_len or 0)
    kept_prompt, kept_answer = list(prompt), list(answer)
    if len(kept_prompt) + longer > max_length:
        kept_prompt = kept_prompt[-max_prompt_length:]
    if len(kept_prompt) + longer > max_length:
        kept_answer = kept_answer[: max_length - max_prompt_length]
    return kept_prompt, kept_answer


class DPORenderer(Renderer):
    """Renders groups for a DPO policy: full sequences plus each response's answer start.

    Same public API and contract as :class:`~rmserve.server.render.Renderer`
    (``render_request(request, too_long="mark")`` for the server, ``render_groups``,
    ``render_group``); the :class:`RenderedGroup` results also carry ``answer_start``. The
    computation is described in the module docstring.

    Args:
        tokenizer: the policy's transformers tokenizer (with a chat template, an EOS token).
        max_model_len: longest sequence the engines accept, in tokens.
        chat_template: Jinja text replacing the tokenizer's template; None = its own.
        compat: ``none`` (correct) or ``official`` (the official script's BOS, answer split
            and truncation reproduced).

    Raises:
        ServerFault: no chat template, or the tokenizer has no EOS token.
        ValueError: ``compat`` is not ``none`` or ``official``.
    """

    def __init__(
        self, tokenizer: Any, *, max_model_len: int, chat_template: str | None = None, compat: Compat = "none"
    ) -> None:
        super().__init__(tokenizer, max_model_len=max_model_len, chat_template=chat_template)
        if compat not in ("none", "official"):
            raise ValueError(f"compat: {compat!r} is not one of none, official")
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ServerFault("the tokenizer has no EOS token; a DPO reward appends EOS to every answer")
        self.compat: Compat = compat
        self.eos_token_id: int = int(eos)
        self.sequence_bos_id: int = int(self.bos_token_id) if self.bos_token_id is not None else self.eos_token_id
        """The id put in front of every sequence: BOS, or EOS for a tokenizer without BOS."""

    def _render(
        self, items: Sequence[_Item], truncation: Truncation | None, *, too_long: TooLong = "raise"
    ) -> list[RenderedGroup]:
        """Render checked groups the DPO way (see the module docstring)."""
        prompts: list[list[dict[str, str]]] = []
        fulls: list[list[dict[str, str]]] = []
        for _, _, messages, responses in items:
            turns = [{"role": m.role, "content": m.content} for m in messages]
            prompts.append(turns)
            fulls.extend([*turns, {"role": "assistant", "content": r}] for r in responses)
        texts = self._apply_template(prompts + fulls, items)
        prompt_texts, full_texts = texts[: len(prompts)], texts[len(prompts) :]

        joined: list[str] = []
        start = 0
        for (index, group_id, _, responses), prompt_text in zip(items, prompt_texts, strict=True):
            for j, full_text in enumerate(full_texts[start : start + len(responses)]):
                joined.append(prompt_text + self._answer_text(prompt_text, full_text, index, j, group_id))
            start += len(responses)
        encoded = self._encode([*prompt_texts, *joined])
        prompt_ids, full_ids = encoded[: len(prompt_texts)], encoded[len(prompt_texts) :]

        results = []
        start = 0
        for (index, group_id, _, responses), group_prompt in zip(items, prompt_ids, strict=True):
            group_full = full_ids[start : start + len(responses)]
            start += len(responses)
            splits = [self._split(group_prompt, ids, index, group_id) for ids in group_full]
            if self.compat == "official":
                self._official_truncation(splits)
            if truncation is not None:
                for split in splits:
                    self._truncate_split(split, truncation)
            else:
                for split in splits:
                    if len(split.ids) > self.max_model_len:
                        split.error = (
                            f"{len(split.ids):,} tokens (chat template included), over max_model_len={self.max_model_len:,}"
                        )
            failed = [j for j, split in enumerate(splits) if split.error is not None]
            if failed and too_long == "raise":
                j = failed[0]
                raise SequenceTooLong(
                    f"groups[{index}].responses[{j}] of group {group_id!r}: {splits[j].error}; "
                    + ("shorten it" if truncation is not None else "shorten it or request truncation"),
                    field=f"groups[{index}].responses[{j}]", value=len(splits[j].ids),
                    limit=self.max_model_len if truncation is None else truncation.max_tokens,
                )
            sequences = [split.ids for split in splits]
            cuts = tuple(s.cut for s in splits) if truncation is not None or self.compat == "official" else None
            errors = (
                tuple(None if s.error is None else ResponseError("sequence_too_long", s.error) for s in splits)
                if failed else None
            )
            results.append(
                RenderedGroup(
                    id=group_id,
                    token_ids=tuple(sequences),
                    prompt_tokens=_common_prefix_len(sequences),
                    truncated_tokens=cuts,
                    errors=errors,
                    answer_start=tuple(len(s.prompt) for s in splits),
                )
            )
        return results

    def _answer_text(self, prompt_text: str, full_text: str, index: int, j: int, group_id: str) -> str:
        """``full_text`` minus ``prompt_text``: the official ``replace``, or (``none``) the prefix cut."""
        if self.compat == "official":
            return full_text.replace(prompt_text, "")
        if not full_text.startswith(prompt_text):
            raise InvalidRequest(
                f"groups[{index}] (id {group_id!r}): the chat template does not render the conversation as "
                f"prompt + answer (the text rendered without responses[{j}] is not a prefix of the text with "
                "it), so the answer tokens cannot be told apart; pass a --chat-template that does",
                field=f"groups[{index}]",
            )
        return full_text[len(prompt_text) :]

    def _split(self, prompt_ids: list[int], full_ids: list[int], index: int, group_id: str) -> _Split:
        """BPE boundary fix, BOS and EOS (steps 2–3 of the module docstring).

        The template's own BOS is kept as the only one (``none``) only when it lies in the
        prompt part, so every answer starts at index ≥ 1 (its first token has a context).
        """
        self._check_bos(full_ids, index, group_id)
        start = len(prompt_ids)
        if prompt_ids != full_ids[:start]:
            start -= 1
        start = max(0, min(start, len(full_ids)))
        if self.compat == "none" and start >= 1 and full_ids[:1] == [self.sequence_bos_id]:
            head: list[int] = []
        else:
            head = [self.sequence_bos_id]
        return _Split(prompt=head + full_ids[:start], answer=full_ids[start:] + [self.eos_token_id])

    @staticmethod
    def _official_truncation(splits: list[_Split]) -> None:
        """Apply :func:`official_truncation` to every response with its pair partner."""
        lengths = [len(s.answer) for s in splits]
        for split, partner in zip(splits, pair_partners(len(splits)), strict=True):
            before = len(split.prompt) + len(split.answer)
            split.prompt, split.answer = official_truncation(
                split.prompt, split.answer, None if partner is None else lengths[partner]
            )
            split.cut += before - len(split.prompt) - len(split.answer)

    def _truncate_split(self, split: _Split, truncation: Truncation) -> None:
        """A request truncation on prompt + answer (module docstring); sets ``error`` when it cannot."""
        limit = truncation.max_tokens
        excess = len(split.prompt) + len(split.answer) - limit
        if excess <= 0:
            return
        if truncation.side == "right":
            if len(split.prompt) >= limit:
                split.error = (
                    f"the prompt alone is {len(split.prompt):,} tokens, so a right cut to "
                    f"truncation.max_tokens={limit:,} leaves no answer token"
                )
                return
            split.answer = split.answer[: limit - len(split.prompt)]
        else:
            keep = 1 if split.prompt[:1] == [self.sequence_bos_id] else 0
            if excess > len(split.prompt) - keep:
                split.error = (
                    f"the answer alone is {len(split.answer):,} tokens (+{keep} BOS), over "
                    f"truncation.max_tokens={limit:,}; a left cut never cuts answer tokens"
                )
                return
            split.prompt = split.prompt[:keep] + split.prompt[keep + excess :]
        split.cut += excess
