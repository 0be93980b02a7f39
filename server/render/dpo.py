"""Rendering for DPO implicit rewards: prompt and answer split, BOS/EOS, answer starts.

A DPO policy is scored on the log-probabilities of a response's *answer tokens* given the
conversation. :class:`DPORenderer` turns a group into one token sequence per response plus
the index of its first answer token (:attr:`~rmserve.server.render.chat.RenderedGroup.answer_start`),
the way the official evaluator does (allenai/reward-bench ``rewardbench/utils.py``
``prepare_dialogue_from_tokenizer`` for the texts, ``rewardbench/dpo.py``
``DPOInference.tokenize_row`` and ``build_tokenized_answer`` for the ids):

1. ``prompt_text`` = the chat template over the conversation alone (no generation prompt,
   not tokenized); ``full_text`` = the template over conversation + assistant response.
2. ``answer_text`` = ``full_text`` minus ``prompt_text``. Ids: ``prompt_ids = tok(prompt_text)``,
   ``full_ids = tok(prompt_text + answer_text)`` (no special tokens added); the answer starts
   at ``len(prompt_ids)``, one earlier when ``prompt_ids`` is not a prefix of ``full_ids``
   (a token merged across the boundary belongs to the answer — the official BPE fix).
3. sequence = ``head + full_ids[:start] + full_ids[start:] + [EOS]``, ``head`` by the BOS rule
   of the mode (below). The answer tokens are ``full_ids[start:]`` and the appended EOS.

Two modes (``compat``):

- ``none`` (default), the correct computation (BOS rule ``template``): the sequence is what
  the chat template writes, with the tokenizer's BOS in front only where the tokenizer has
  one and the template did not write it (the demo template writes BOS itself, so the
  official script doubles it); a tokenizer without BOS (Qwen2, Qwen2.5, Qwen3: ChatML) gets
  nothing in front, its sequences start with the template's first token. ``answer_text`` is
  ``full_text`` with the ``prompt_text`` *prefix* removed, and a template that does not
  render the conversation as prompt + answer is refused
  (:class:`~rmserve.errors.InvalidRequest`, field ``groups[i]``), as is a conversation that
  renders to no token before the answer (the first token of a sequence has no
  log-probability, so the answer would lose its first token's).
- ``official``: the official script reproduced — BOS always prepended (BOS rule
  ``bos-prepended (official)``: doubled when the template writes one), or, for a tokenizer
  without BOS, its EOS in the BOS's place (``eos-as-bos (official)``: allenai/reward-bench
  ``scripts/run_dpo.py`` sets ``bos_token_id`` to ``eos_token_id``, naming Qwen models);
  ``answer_text = full_text.replace(prompt_text, "")`` (every occurrence, prefix or not), and
  its truncation (``max_length`` 2048, ``max_prompt_length`` 128, ``keep_end``) applied to
  every pair of the group automatically: see :func:`official_truncation`. The cut counts are
  reported in ``truncated_tokens``.

The rule used is :attr:`DPORenderer.bos_rule`; the DPO engine records it with every
response (extra ``bos``).

In both modes the EOS is appended after the answer, so a template that already closes the
assistant turn with EOS (the demo template does) ends the sequence with two EOS, both
counted as answer tokens — that is the official computation and both modes keep it.

Over-length sequences follow the classifier rules of :class:`~rmserve.server.render.chat.Renderer`
(``sequence_too_long`` per response with ``too_long="mark"``, or
:class:`~rmserve.errors.SequenceTooLong`), with a request :class:`~rmserve.schema.Truncation`
defined for prompt + answer: ``left`` cuts prompt tokens right after the sequence's first
token (BOS, or the template's first token where nothing is put in front) and never answer
tokens — when that token + the answer alone is over ``max_tokens`` that response fails
(``sequence_too_long``); ``right`` cuts the answer's tail and must keep at least one token of
the response itself — when the prompt and the assistant turn's template tokens before the
response (its header, e.g. ``<|im_start|>assistant\\n``) already fill ``max_tokens``, or the
response is empty (all of its answer is template), that response fails
(``sequence_too_long``, naming the limit and the counts): a score of header tokens alone is
the same for every response. Where the response starts is found as the classifier renderer
finds it (:meth:`~rmserve.server.render.chat.Renderer._content_starts`). Cut counts are
reported per response in ``truncated_tokens`` (0 for a response that fails, whose ids are
kept whole); nothing is cut silently.

Tokenizer work per request: one batched chat-template call (all prompts and all full
texts), one batched tokenizer call (one prompt text per group and every full text); a right
cut adds one of each for the sequences it shortens (the conversation with an empty
assistant turn, the text before each response).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import ResponseError, Truncation
from rmserve.server.render.chat import RenderedGroup, Renderer, TooLong, common_prefix_len, _Item

Compat = Literal["none", "official"]

BosRule = Literal["template", "bos-prepended (official)", "eos-as-bos (official)"]
"""What a DPO sequence starts with (:attr:`DPORenderer.bos_rule`; module docstring): the
template's own tokens with the tokenizer's BOS only where the template wrote none
(``template``, compat ``none``); BOS always prepended (``bos-prepended (official)``); the
tokenizer's EOS prepended in place of a BOS it lacks (``eos-as-bos (official)``)."""

OFFICIAL_MAX_LENGTH = 2048
"""``max_length`` of the official DPO evaluator (allenai/reward-bench ``rewardbench/dpo.py``,
``DPOInference.__init__``): the longest prompt + answer it keeps, in tokens."""

OFFICIAL_MAX_PROMPT_LENGTH = 128
"""``max_prompt_length`` of the official DPO evaluator: the prompt tokens kept (its last ones,
``truncation_mode="keep_end"``) when prompt + the pair's longer answer exceeds
:data:`OFFICIAL_MAX_LENGTH`."""


@dataclass(slots=True)
class _Split:
    """One response as prompt ids + answer ids, with its cut count and failure.

    ``start`` is where the answer starts in the full ids (before any head or cut);
    ``header`` the answer tokens before the response's own text (set for a right cut only).
    """

    prompt: list[int]
    answer: list[int]
    start: int = 0
    header: int = 0
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

    Same public API and contract as :class:`~rmserve.server.render.chat.Renderer`
    (``render_request(request, too_long="mark")`` for the server, ``render_groups``,
    ``render_group``); the :class:`RenderedGroup` results also carry ``answer_start``. The
    computation is described in the module docstring.

    Args:
        tokenizer: the policy's transformers tokenizer (with a chat template, an EOS token).
        max_model_len: longest sequence the engines accept, in tokens.
        chat_template: Jinja text replacing the tokenizer's template; None = its own.
        compat: ``none`` (correct) or ``official`` (the official script's BOS, answer split
            and truncation reproduced).

    Attributes:
        bos_rule: what every sequence starts with (:data:`BosRule`).
        sequence_bos_id: the id put in front of a sequence — of every one (``official``:
            BOS, or EOS for a tokenizer without BOS), or of one whose template wrote no BOS
            (``none``); None: nothing is ever put in front (``none``, no BOS).

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
        bos = None if self.bos_token_id is None else int(self.bos_token_id)
        self.sequence_bos_id: int | None = bos if bos is not None or compat == "none" else self.eos_token_id
        self.bos_rule: BosRule = (
            "template" if compat == "none" else "bos-prepended (official)" if bos is not None else "eos-as-bos (official)"
        )

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

        group_splits: list[list[_Split]] = []
        start = 0
        for (index, group_id, _, responses), group_prompt in zip(items, prompt_ids, strict=True):
            group_full = full_ids[start : start + len(responses)]
            start += len(responses)
            splits = [self._split(group_prompt, ids, index, group_id) for ids in group_full]
            if self.compat == "official":
                self._official_truncation(splits)
            group_splits.append(splits)
        if truncation is not None and truncation.side == "right":
            self._set_headers(items, prompt_texts, joined, full_ids, group_splits, truncation.max_tokens)

        results = []
        for (index, group_id, _, _), splits in zip(items, group_splits, strict=True):
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
                    prompt_tokens=common_prefix_len(sequences),
                    truncated_tokens=cuts,
                    errors=errors,
                    answer_start=tuple(len(s.prompt) for s in splits),
                )
            )
        return results

    def _set_headers(
        self, items: Sequence[_Item], prompt_texts: Sequence[str], joined: Sequence[str],
        full_ids: Sequence[list[int]], group_splits: list[list[_Split]], limit: int,
    ) -> None:
        """Set :attr:`_Split.header` of every response over ``limit`` tokens (what a right cut
        shortens): the answer tokens before the response's own text, found on the
        prompt + answer texts (``joined``, as tokenized) against the same conversation with an
        empty assistant turn (:meth:`~rmserve.server.render.chat.Renderer._content_starts`).
        One template call and one tokenizer call for all of them; none when no response is over.
        """
        wanted: list[tuple[int, int, int]] = []  # (group position, response, index in joined)
        flat = 0
        for g, splits in enumerate(group_splits):
            wanted.extend((g, j, flat + j) for j, s in enumerate(splits) if len(s.prompt) + len(s.answer) > limit)
            flat += len(splits)
        if not wanted:
            return
        positions = list(dict.fromkeys(g for g, _, _ in wanted))
        empty: dict[int, str] = {}
        for g, text in zip(positions, self._empty_turn_texts([items[g] for g in positions]), strict=True):
            prompt_text = prompt_texts[g]
            if self.compat == "official":
                empty[g] = prompt_text + text.replace(prompt_text, "")
            else:  # not a prefix: the texts part inside the prompt and no token counts as header
                empty[g] = text if text.startswith(prompt_text) else ""
        starts = self._content_starts(
            [joined[k] for _, _, k in wanted], [empty[g] for g, _, _ in wanted], [full_ids[k] for _, _, k in wanted]
        )
        for (g, j, _), content in zip(wanted, starts, strict=True):
            split = group_splits[g][j]
            split.header = max(0, content - split.start)

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

        ``none``: the tokenizer's BOS is put in front unless the template wrote it in the
        prompt part; a tokenizer without BOS gets nothing. Every answer starts at index ≥ 1
        (its first token has a context).

        Raises:
            InvalidRequest: nothing at all before the answer (``none`` only: the conversation
                renders to no token, or its only token merges into the answer, and no BOS is
                put in front; field ``groups[i]``).
        """
        self._check_bos(full_ids, index, group_id)
        start = len(prompt_ids)
        if prompt_ids != full_ids[:start]:
            start -= 1
        start = max(0, min(start, len(full_ids)))
        bos = self.sequence_bos_id
        if bos is None or (self.compat == "none" and full_ids[:1] == [bos]):
            head: list[int] = []
        else:
            head = [bos]
        if not head and start == 0:
            merged = ", merged into the answer's first token" if prompt_ids else ""
            raise InvalidRequest(
                f"groups[{index}] (id {group_id!r}): no token comes before the answer: the chat template renders "
                f"the conversation alone to {len(prompt_ids)} token(s){merged} and nothing is put in front "
                f"(BOS rule {self.bos_rule}), so the answer's first token would have no context to be scored in; "
                "pass a --chat-template that renders the conversation before the answer",
                field=f"groups[{index}]", value=start, limit=1,
            )
        return _Split(prompt=head + full_ids[:start], answer=full_ids[start:] + [self.eos_token_id], start=start)

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
        """A request truncation on prompt + answer (module docstring); sets ``error`` when it cannot.

        A right cut needs :attr:`_Split.header` set (:meth:`_set_headers`).
        """
        limit = truncation.max_tokens
        prompt, answer = len(split.prompt), len(split.answer)
        excess = prompt + answer - limit
        if excess <= 0:
            return
        if truncation.side == "right":
            kept = limit - prompt
            if kept <= 0:
                split.error = (
                    f"the prompt alone is {prompt:,} tokens, so a right cut to "
                    f"truncation.max_tokens={limit:,} leaves no answer token"
                )
                return
            if kept <= split.header:
                if answer - 1 - split.header > 0:  # the response renders to tokens of its own
                    split.error = (
                        f"a right cut to truncation.max_tokens={limit:,} keeps none of the response: after the "
                        f"{prompt:,}-token prompt it keeps {kept:,} of the {answer:,} answer tokens, but the answer's "
                        f"first {split.header:,} are the chat template's, before the response"
                    )
                else:
                    split.error = (
                        f"the response is empty: its {answer:,} answer tokens are the chat template's and the EOS, so "
                        f"a right cut to truncation.max_tokens={limit:,} after the {prompt:,}-token prompt (keeping "
                        f"{kept:,} of them) would score none of the response"
                    )
                return
            split.answer = split.answer[:kept]
        else:
            if excess > prompt - 1:
                first = "BOS" if split.prompt[0] == self.sequence_bos_id else "first prompt token"
                split.error = (
                    f"the answer alone is {answer:,} tokens (+1 {first}), over "
                    f"truncation.max_tokens={limit:,}; a left cut never cuts answer tokens"
                )
                return
            split.prompt = split.prompt[:1] + split.prompt[1 + excess :]
        split.cut += excess
