"""Chat-template rendering, tokenization and the length policy.

A group (conversation + N responses) becomes N token-id sequences, each
``template(messages + [assistant: response])`` tokenized **without** adding special tokens,
so the BOS the template writes is the only one (tokenizing the rendered text *with*
special tokens would add a second BOS and change the reward). This is the same text →
ids path as ``tokenizer.apply_chat_template(..., tokenize=True)`` in transformers. A
tokenizer that puts its BOS in front of a plain ``encode`` while the template writes none
(Mistral's ``[INST]`` format) gets that one BOS in front (:attr:`Renderer.added_bos_id`): what
the model saw when it was trained on ``tokenizer(text)``; a tokenizer that adds none (Qwen's
ChatML) gets nothing in front — exactly one BOS where the family has one, none invented.

Efficiency: all texts of a request are rendered with one batched template call; the part
of a group's text shared by all responses is tokenized once when it ends right after an
added token (added tokens are cut out of the text before the BPE model runs, so ids
before and after such a boundary do not depend on each other); the remaining pieces of
every group go through one batched call of the fast tokenizer (Rust, parallel). The
renderer never mutates the tokenizer, so concurrent calls from worker threads are safe.

Length policy: a sequence longer than ``max_model_len`` raises
:class:`~rmserve.errors.SequenceTooLong` unless the request asked for a
:class:`~rmserve.schema.Truncation`; then every sequence longer than ``max_tokens`` is cut
from that side and the cut count is reported per response. A left cut keeps the leading
BOS (drops the tokens right after it), so truncated sequences still start with exactly one
BOS. A right cut must keep at least one token of the response itself: when the prompt and
the assistant turn's template tokens before the response already fill ``max_tokens`` (or the
response is empty, so everything it adds is template), the response is not scored
(``sequence_too_long``, its ids kept whole, 0 cut) — scoring it would score the shared prompt,
the same for every response. Where the response starts is found by rendering the
conversation once more with an empty assistant turn: the response's own tokens start where
the two texts part (:meth:`Renderer._content_starts`); this is done only for sequences a
right cut would shorten.

Request rules (exactly one of ``messages``/``prompt``, at least one turn and one response,
truncation bounds …) have one owner, :mod:`rmserve.server.http.wire`: :meth:`Renderer.render_request`
trusts a request that passed :func:`~rmserve.server.http.wire.validate_score_request`, and the
entry points for loose groups (:meth:`Renderer.render_groups`, :meth:`Renderer.render_group`)
run the wire's own checks, so every rule has one message.

Empty responses are scored: the template renders the assistant turn with empty content
(``<|assistant|>\\n</s>`` in the demo template), which is a legitimate, usually badly rated,
answer. Rejecting them would drop items from a benchmark silently on the client side.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.schema import Message, RequestGroup, ResponseError, ScoreRequest, Truncation
from rmserve.server.http.wire import check_request_group, check_truncation

TooLong = Literal["raise", "mark"]
"""What rendering does with a sequence over ``max_model_len`` when no truncation was asked (or
with one the requested truncation cannot cut to a scorable sequence)."""

_Item = tuple[int, str, tuple[Message, ...], tuple[str, ...]]
"""A group as the renderer works on it: (index in the request, id, messages, responses)."""


@dataclass(frozen=True, slots=True)
class RenderedGroup:
    """One group, ready for :meth:`RewardEngine.score_group`.

    Attributes:
        id: the group id from the request.
        token_ids: one token-id list per response, response order, template and BOS
            included, each at most ``max_model_len`` long (after truncation).
        prompt_tokens: leading tokens identical in every sequence (the shared prompt; what
            the prefix cache can share).
        truncated_tokens: tokens cut per response when truncation was requested (0 where
            nothing was cut), else None.
        errors: per response, why it must not go to the engine (a
            :class:`~rmserve.schema.ResponseError`; None where it may), when the group was
            rendered with ``too_long="mark"`` and a sequence is over ``max_model_len`` (or the
            requested truncation cannot cut it to a sequence worth scoring); else None. Such a
            sequence keeps its full token ids (its length is reported) and a cut of 0.
        answer_start: per response, the index in ``token_ids[j]`` of the first answer token
            (the tokens whose log-probabilities a DPO reward sums); None for kinds that score
            the whole sequence (classifiers).
    """

    id: str
    token_ids: tuple[list[int], ...]
    prompt_tokens: int
    truncated_tokens: tuple[int, ...] | None = None
    errors: tuple[ResponseError | None, ...] | None = None
    answer_start: tuple[int, ...] | None = None

    @property
    def scorable(self) -> tuple[int, ...]:
        """Indices of the responses to send to the engine (all, unless ``errors`` marks some)."""
        if self.errors is None:
            return tuple(range(len(self.token_ids)))
        return tuple(j for j, error in enumerate(self.errors) if error is None)

    @property
    def num_tokens(self) -> tuple[int, ...]:
        """Length of each scored sequence in tokens."""
        return tuple(len(ids) for ids in self.token_ids)


class Renderer:
    """Renders groups with the model's chat template and tokenizes them.

    Args:
        tokenizer: a transformers tokenizer with a chat template (fast tokenizers take the
            batched, prefix-sharing path; slow ones are tokenized text by text).
        max_model_len: longest sequence the engine accepts, in tokens.
        chat_template: Jinja text replacing the tokenizer's own template; None = the
            tokenizer's template.

    Raises:
        ServerFault: the tokenizer has no chat template and none was given.
    """

    def __init__(self, tokenizer: Any, *, max_model_len: int, chat_template: str | None = None) -> None:
        if chat_template is None:
            chat_template = getattr(tokenizer, "chat_template", None)
            if not isinstance(chat_template, str):
                # a dict of named templates, or none at all
                try:
                    chat_template = tokenizer.get_chat_template()
                except Exception as exc:  # noqa: BLE001 - transformers raises ValueError; be broad
                    raise ServerFault(f"the tokenizer has no chat template ({exc}); pass --chat-template") from None
        if max_model_len < 2:
            raise ValueError(f"max_model_len: {max_model_len} must be ≥ 2")
        self.tokenizer = tokenizer
        self.chat_template: str = chat_template
        """The Jinja template actually used (part of the model fingerprint)."""
        self.max_model_len = max_model_len
        self.bos_token_id: int | None = getattr(tokenizer, "bos_token_id", None)
        self.added_bos_id: int | None = tokenizer_added_bos(tokenizer)
        """The BOS id the tokenizer itself puts in front of a plain ``encode(text)`` (None when
        it adds none): put in front of a sequence whose template wrote none (:meth:`lead`)."""
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._boundary = _boundary_pattern(tokenizer) if self._backend is not None else None

    @classmethod
    def from_pretrained(
        cls, model: str | Path, *, max_model_len: int, chat_template_path: str | Path | None = None,
        trust_remote_code: bool = False,
    ) -> Renderer:
        """Load the tokenizer of ``model`` (folder or hub id) and wrap it.

        ``chat_template_path`` names a Jinja file that replaces the model's template;
        ``trust_remote_code`` lets a tokenizer the checkpoint ships as code load
        (``--trust-remote-code``).
        """
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
        template = None if chat_template_path is None else Path(chat_template_path).read_text(encoding="utf-8")
        return cls(tokenizer, max_model_len=max_model_len, chat_template=template)

    # --- public API ---------------------------------------------------------------------

    def render_request(self, request: ScoreRequest, *, too_long: TooLong = "raise") -> list[RenderedGroup]:
        """Render every group of a validated score request, with its truncation.

        ``request`` must have passed :func:`rmserve.server.http.wire.validate_score_request` (as
        every decoded request body has) with this renderer's ``max_model_len``; its rules are
        not checked again here. Returns and raises as :meth:`render_groups`, less the
        request-rule errors.

        Args:
            too_long: ``"raise"`` — a sequence over ``max_model_len`` (no truncation asked),
                or one a right cut would leave nothing of the response in, raises
                :class:`~rmserve.errors.SequenceTooLong`; ``"mark"`` — it is marked in its
                group's :attr:`RenderedGroup.errors` (type ``sequence_too_long``) and the
                other responses and groups are rendered as usual (the server's way: one
                over-length response never costs the rest of the request).
        """
        return self._render(_items(request.groups), request.truncation, too_long=too_long)

    def render_group(
        self,
        messages: Sequence[Message],
        responses: Sequence[str],
        *,
        group_id: str,
        group_index: int = 0,
        truncation: Truncation | None = None,
    ) -> RenderedGroup:
        """Render one conversation with each response as the final assistant turn.

        ``group_index`` is the group's position in its request; it appears in error fields
        (``groups[i].responses[j]``). The group and ``truncation`` are checked as a request
        would be (:func:`~rmserve.server.http.wire.check_request_group`,
        :func:`~rmserve.server.http.wire.check_truncation`). Errors as :meth:`render_groups`.
        """
        group = RequestGroup(id=group_id, responses=tuple(responses), messages=tuple(messages))
        check_request_group(group, group_index)
        check_truncation(truncation, max_model_len=self.max_model_len)
        return self._render(_items([group], start=group_index), truncation)[0]

    def render_groups(
        self, groups: Sequence[RequestGroup], truncation: Truncation | None = None
    ) -> list[RenderedGroup]:
        """Render and tokenize request groups (one batched tokenizer call for all).

        A group carries either ``messages`` or ``prompt`` (one user turn). Each group and
        ``truncation`` are checked by the wire's rules
        (:func:`~rmserve.server.http.wire.check_request_group`,
        :func:`~rmserve.server.http.wire.check_truncation`), with the same messages a request
        body gets; ids need not be unique here.

        Returns:
            One :class:`RenderedGroup` per group, request order.

        Raises:
            InvalidRequest: a group that breaks a request rule (neither or both of
                ``messages``/``prompt``, no turn, no response, a last turn not ``user`` …),
                a conversation the template rejects (field ``groups[i].messages``), or
                ``truncation.max_tokens`` outside ``[2, max_model_len]``.
            SequenceTooLong: a sequence longer than ``max_model_len`` and no truncation, or a
                right cut that would keep none of a response's own tokens; the message names
                the group id, ``groups[i].responses[j]``, the token count and the limit.
            ServerFault: the chat template writes BOS twice.
        """
        for i, group in enumerate(groups):
            check_request_group(group, i)
        check_truncation(truncation, max_model_len=self.max_model_len)
        return self._render(_items(groups), truncation)

    # --- internals ----------------------------------------------------------------------

    def _render(
        self, items: Sequence[_Item], truncation: Truncation | None, *, too_long: TooLong = "raise"
    ) -> list[RenderedGroup]:
        """Render checked groups (see :meth:`render_groups`; the request rules hold)."""
        conversations: list[list[dict[str, str]]] = []
        for _, _, messages, responses in items:
            turns = [{"role": m.role, "content": m.content} for m in messages]
            conversations.extend([*turns, {"role": "assistant", "content": r}] for r in responses)
        texts = self._apply_template(conversations, items)

        # Split each group's texts into a shared head (tokenized once) and per-response tails.
        pieces: list[str] = []
        plan: list[tuple[int, list[int]]] = []  # (head piece index or -1, tail piece indices)
        texts_by_group: list[list[str]] = []
        start = 0
        for _, _, _, responses in items:
            group_texts = texts[start : start + len(responses)]
            texts_by_group.append(group_texts)
            start += len(responses)
            cut = self._shared_cut(group_texts)
            head = -1
            if cut > 0:
                head = len(pieces)
                pieces.append(group_texts[0][:cut])
            tails = list(range(len(pieces), len(pieces) + len(group_texts)))
            pieces.extend(text[cut:] for text in group_texts)
            plan.append((head, tails))
        encoded = self._encode(pieces)
        for head, tails in plan:  # a sequence starts in its head, or in its own tail
            for first in [head] if head >= 0 else tails:
                encoded[first] = self.lead(encoded[first])
        group_ids = [[(encoded[head] if head >= 0 else []) + encoded[t] for t in tails] for head, tails in plan]
        starts: dict[int, dict[int, int]] = {}
        if truncation is not None and truncation.side == "right":
            starts = self._right_cut_starts(items, texts_by_group, group_ids, truncation.max_tokens)

        results = []
        for gi, ((index, group_id, _, _), (head, _), sequences) in enumerate(zip(items, plan, group_ids, strict=True)):
            head_ids = encoded[head] if head >= 0 else []
            self._check_bos(sequences[0], index, group_id)
            cuts: tuple[int, ...] | None = None
            errors: tuple[ResponseError | None, ...] | None = None
            shared = len(head_ids) if truncation is None or truncation.side == "right" else 0
            if truncation is None:
                over = [j for j, ids in enumerate(sequences) if len(ids) > self.max_model_len]
                if over and too_long == "raise":
                    j = over[0]
                    raise SequenceTooLong(
                        f"groups[{index}].responses[{j}] of group {group_id!r} is {len(sequences[j])} tokens "
                        f"(chat template included), over the model limit max_model_len={self.max_model_len}; "
                        "shorten it or request truncation",
                        field=f"groups[{index}].responses[{j}]", value=len(sequences[j]), limit=self.max_model_len,
                    )
                if over:
                    errors = tuple(
                        ResponseError(
                            "sequence_too_long",
                            f"{len(ids):,} tokens (chat template included), over max_model_len={self.max_model_len:,}",
                        )
                        if j in over else None
                        for j, ids in enumerate(sequences)
                    )
            else:
                sequences, cuts, errors = self.truncate(sequences, truncation, starts.get(gi, {}))
                failed = [(j, e) for j, e in enumerate(errors or ()) if e is not None]
                if failed and too_long == "raise":
                    j, error = failed[0]
                    raise SequenceTooLong(
                        f"groups[{index}].responses[{j}] of group {group_id!r}: {error.message}; "
                        "shorten the prompt or raise truncation.max_tokens",
                        field=f"groups[{index}].responses[{j}]", value=len(sequences[j]), limit=truncation.max_tokens,
                    )
            results.append(
                RenderedGroup(
                    id=group_id,
                    token_ids=tuple(sequences),
                    prompt_tokens=common_prefix_len(sequences, known=shared),
                    truncated_tokens=cuts,
                    errors=errors,
                )
            )
        return results

    def _empty_turn_texts(self, items: Sequence[_Item]) -> list[str]:
        """Each group's conversation with an empty assistant turn, templated (one batched call)."""
        conversations = [
            [*({"role": m.role, "content": m.content} for m in messages), {"role": "assistant", "content": ""}]
            for _, _, messages, _ in items
        ]
        return self._apply_template(conversations, items)

    def _content_starts(
        self, texts: Sequence[str], empty_texts: Sequence[str], sequences: Sequence[Sequence[int]]
    ) -> list[int]:
        """Per sequence, the index of its first token of the response's own text.

        ``texts[k]`` is the rendered text ``sequences[k]`` was tokenized from (no special
        tokens added) and ``empty_texts[k]`` the same conversation rendered with an empty
        assistant turn. The response's own text starts where the two texts part; that head of
        the text is tokenized (one batched call, each distinct head once) and the response
        starts at the first token where the head's ids and the sequence's ids differ — a token
        merged across the boundary belongs to the response, as in the DPO split. An empty
        response parts nowhere: its start is ``len(sequences[k])`` (nothing of its own).

        Returns:
            One index per sequence, in ``0 … len(sequences[k])``.
        """
        heads = [text[: len(os.path.commonprefix([text, empty]))] for text, empty in zip(texts, empty_texts, strict=True)]
        distinct = list(dict.fromkeys(heads))
        head_ids = dict(zip(distinct, map(self.lead, self._encode(distinct)), strict=True))
        return [common_prefix_len([list(ids), head_ids[head]]) for ids, head in zip(sequences, heads, strict=True)]

    def _right_cut_starts(
        self, items: Sequence[_Item], texts: Sequence[Sequence[str]], sequences: Sequence[Sequence[list[int]]], limit: int
    ) -> dict[int, dict[int, int]]:
        """Group position → response → :meth:`_content_starts` index, for the sequences over
        ``limit`` tokens only (what a right cut shortens); one template call and one tokenizer
        call for all of them, none when no sequence is over."""
        wanted = [(g, j) for g, group in enumerate(sequences) for j, ids in enumerate(group) if len(ids) > limit]
        if not wanted:
            return {}
        positions = list(dict.fromkeys(g for g, _ in wanted))
        empty = dict(zip(positions, self._empty_turn_texts([items[g] for g in positions]), strict=True))
        found = self._content_starts(
            [texts[g][j] for g, j in wanted], [empty[g] for g, _ in wanted], [sequences[g][j] for g, j in wanted]
        )
        starts: dict[int, dict[int, int]] = {}
        for (g, j), start in zip(wanted, found, strict=True):
            starts.setdefault(g, {})[j] = start
        return starts

    def _apply_template(self, conversations: list[list[dict[str, str]]], items: Sequence[_Item]) -> list[str]:
        from jinja2 import TemplateError

        try:
            texts = self.tokenizer.apply_chat_template(
                conversations, chat_template=self.chat_template, tokenize=False, add_generation_prompt=False
            )
        except TemplateError as exc:
            # Find the group the template rejected, to name it.
            for index, group_id, messages, responses in items:
                turns = [{"role": m.role, "content": m.content} for m in messages]
                try:
                    self.tokenizer.apply_chat_template(
                        [*turns, {"role": "assistant", "content": responses[0]}],
                        chat_template=self.chat_template, tokenize=False,
                    )
                except TemplateError as inner:
                    raise InvalidRequest(
                        f"groups[{index}] (id {group_id!r}): the chat template rejected the conversation: {inner}",
                        field=f"groups[{index}].messages",
                    ) from None
            raise InvalidRequest(f"the chat template rejected the request: {exc}", field="groups") from None
        if isinstance(texts, str):  # a single conversation on some versions
            texts = [texts]
        return list(texts)

    def _shared_cut(self, texts: Sequence[str]) -> int:
        """Character offset up to which all texts agree and ids are independent of what follows.

        0 when there is no such point (then every text is tokenized whole).
        """
        if self._boundary is None:
            return 0
        pattern, longest = self._boundary
        text = texts[0]
        common = len(os.path.commonprefix(list(texts))) if len(texts) > 1 else len(text)
        cut = 0
        # Scan a little past `common` so a longer token straddling it is not mistaken for a
        # shorter one ending before it (the tokenizer matches leftmost-longest).
        for match in pattern.finditer(text, 0, min(len(text), common + longest)):
            if match.end() > common:
                break
            cut = match.end()
        return cut

    def _encode(self, pieces: list[str]) -> list[list[int]]:
        if not pieces:
            return []
        if self._backend is not None:
            encode = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
            return [e.ids for e in encode(pieces, add_special_tokens=False)]
        return [list(self.tokenizer.encode(p, add_special_tokens=False)) for p in pieces]

    def lead(self, ids: list[int]) -> list[int]:
        """``ids`` (a rendered text's, no special tokens added) with :attr:`added_bos_id` in
        front when the tokenizer adds a BOS and ``ids`` does not start with it; else ``ids``."""
        return with_lead_bos(ids, self.added_bos_id)

    def encode_texts(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[int]]:
        """Each text tokenized as it is, no chat template: ``tokenizer.encode(text,
        add_special_tokens=…)`` (with special tokens, the tokenizer's own BOS — what vLLM's
        server does with a text prompt)."""
        return [list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)) for text in texts]

    @property
    def vocab_size(self) -> int | None:
        """Token ids the tokenizer knows (``len(tokenizer)``: added tokens included); None when
        it cannot say."""
        try:
            return len(self.tokenizer)
        except TypeError:
            return None

    @property
    def truncation_side(self) -> str:
        """The tokenizer's default cut side (``truncation_side``), ``right`` when it has none."""
        side = getattr(self.tokenizer, "truncation_side", None)
        return side if side in ("left", "right") else "right"

    def _check_bos(self, ids: list[int], index: int, group_id: str) -> None:
        bos = self.bos_token_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            raise ServerFault(
                f"the chat template writes BOS twice (group {group_id!r}, groups[{index}]); "
                "fix the template or pass --chat-template"
            )

    def truncate(
        self, sequences: list[list[int]], truncation: Truncation, content_starts: dict[int, int] | None = None
    ) -> tuple[list[list[int]], tuple[int, ...], tuple[ResponseError | None, ...] | None]:
        """Cut every sequence over ``truncation.max_tokens`` (module docstring): ``right`` drops
        the tail; ``left`` drops the tokens right after a leading BOS (kept), else the head.

        ``content_starts``: response → index of its first own token (:meth:`_content_starts`),
        for the sequences a right cut shortens; None (a raw input, all of it its own: the
        vLLM-compatible routes) counts every token as the sequence's own. Returns the
        sequences, the cuts (0 where none), and per response the error of a right cut that
        would leave nothing of the response (that sequence kept whole, 0 cut), or None when
        every sequence was cut or fits.
        """
        limit = truncation.max_tokens
        out, cuts = [], []
        errors: list[ResponseError | None] = [None] * len(sequences)
        for j, ids in enumerate(sequences):
            excess = len(ids) - limit
            if excess <= 0:
                out.append(ids)
                cuts.append(0)
                continue
            if truncation.side == "right":
                content = content_starts.get(j, 0) if content_starts is not None else 0
                if limit <= content:
                    errors[j] = ResponseError("sequence_too_long", _nothing_left_message(len(ids), content, limit))
                    out.append(ids)
                    cuts.append(0)
                    continue
                out.append(ids[:limit])
            elif self.bos_token_id is not None and ids[0] == self.bos_token_id:
                out.append([ids[0], *ids[excess + 1 :]])
            else:
                out.append(ids[excess:])
            cuts.append(excess)
        return out, tuple(cuts), (tuple(errors) if any(e is not None for e in errors) else None)


def _nothing_left_message(length: int, content: int, limit: int) -> str:
    """Why a right cut of a classifier sequence cannot be scored (see :meth:`Renderer.truncate`)."""
    if content >= length:
        return (
            f"the response is empty: all {length:,} tokens are the prompt and the chat template, so a right cut to "
            f"truncation.max_tokens={limit:,} would score the shared prompt, not the response"
        )
    return (
        f"a right cut to truncation.max_tokens={limit:,} keeps none of the response: the first {content:,} of its "
        f"{length:,} tokens are the prompt and the chat template before it"
    )


def with_lead_bos(ids: list[int], bos: int | None) -> list[int]:
    """``ids`` with ``bos`` in front unless ``bos`` is None or ``ids`` already starts with it
    (the one rule of every renderer that puts the tokenizer's BOS in front: exactly one)."""
    return ids if bos is None or ids[:1] == [bos] else [bos, *ids]


def tokenizer_added_bos(tokenizer: Any) -> int | None:
    """The tokenizer's ``bos_token_id`` when ``tokenizer.encode`` puts it in front of a text with
    special tokens and not without (a Llama/Mistral tokenizer's ``add_bos_token``); None
    otherwise (no BOS, as Qwen's; a BOS it does not add), or when the tokenizer cannot say (an
    encode that fails)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    try:
        added = list(tokenizer.encode("a", add_special_tokens=True))
        bare = list(tokenizer.encode("a", add_special_tokens=False))
    except Exception:  # noqa: BLE001 - a tokenizer without these options adds nothing we can see
        return None
    return int(bos) if added[:1] == [bos] and bare[:1] != [bos] else None


def _boundary_pattern(tokenizer: Any) -> tuple[re.Pattern[str], int] | None:
    """Regex of added tokens after which tokenization restarts independently.

    Only tokens that do not swallow following whitespace (``rstrip``), do not depend on
    the next character (``single_word``) and are matched on raw text (not ``normalized``,
    or no normalizer) qualify. Longest first, as the tokenizer matches them.
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    backend = tokenizer.backend_tokenizer
    has_normalizer = backend.normalizer is not None
    contents = sorted(
        {
            tok.content
            for tok in decoder.values()
            if tok.content
            and not getattr(tok, "rstrip", False)
            and not getattr(tok, "single_word", False)
            and not (getattr(tok, "normalized", False) and has_normalizer)
        },
        key=len,
        reverse=True,
    )
    if not contents:
        return None
    return re.compile("|".join(re.escape(c) for c in contents)), len(contents[0])


def common_prefix_len(sequences: Sequence[Sequence[int]], *, known: int = 0) -> int:
    """Length of the longest common prefix of ``sequences`` (token-id lists; one or more),
    in tokens; the first ``known`` tokens are already known to be shared.

    One sequence: its length. Used by the renderers (a group's shared prompt), the vLLM
    log-prob engine (which sibling's rows can be borrowed) and the benchmarks.
    """
    if len(sequences) == 1:
        return len(sequences[0])
    first = sequences[0]
    n = min(len(s) for s in sequences)
    k = min(known, n)
    while k < n and all(s[k] == first[k] for s in sequences):
        k += 1
    return k


def _items(groups: Sequence[RequestGroup], *, start: int = 0) -> list[_Item]:
    """Request groups as renderer items, a ``prompt`` becoming one user turn.

    ``start`` is the request index of the first group. The groups must have passed
    :func:`~rmserve.server.http.wire.check_request_group` (exactly one of messages/prompt).
    """
    items: list[_Item] = []
    for i, group in enumerate(groups, start):
        if group.messages is not None:
            messages = group.messages
        else:
            assert group.prompt is not None  # exactly one of the two (check_request_group)
            messages = (Message("user", group.prompt),)
        items.append((i, group.id, tuple(messages), tuple(group.responses)))
    return items
