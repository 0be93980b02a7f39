"""Rendering of a local judge's calls: chat messages → prompt token ids, with the length rule.

Shared by the local judge engines (:class:`~rmserve.server.engines.vllm_engine.VLLMJudgeEngine` and
:class:`~rmserve.server.engines.hf_engine.HFJudgeEngine`), so both generate from the same token ids.
No torch, no vllm: the tokenizer is any object with ``apply_chat_template`` and ``__call__``
(a transformers tokenizer; the tests use a tiny fake one).

A call is rendered with the judge's chat template and its generation prompt
(``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``), then the text
is tokenized **without** adding special tokens: the BOS the template writes is the only one.
This is what the official RewardBench generative script does for local models before it hands
token ids to vLLM (it tokenizes the templated prompt with ``add_special_tokens=False`` because
vLLM would otherwise add a second BOS). A template that writes no BOS for a tokenizer that adds
one (Mistral's ``[INST]``) leaves the official prompt without any; under ``--compat none`` the
tokenizer's BOS is put in front (``lead_bos``), once.

Thinking switch: with ``enable_thinking`` set (``--judge-thinking on|off``) the template is
rendered with the keyword ``enable_thinking=True|False`` (transformers hands extra keywords of
``apply_chat_template`` to the template, as Qwen3's template reads them); unset, no keyword is
passed and the template's default applies. A templated prompt that ends with ``<think>`` (a
template that opens the reasoning for the model) is flagged, so the readers know the generated
text begins inside the reasoning (:func:`opens_reasoning`).

Length rule: a prompt of ``P`` tokens needs room for at least one generated token, so it is
refused (:class:`~rmserve.errors.SequenceTooLong`, field ``messages``) when ``P`` exceeds
``max_prompt_tokens`` (the engine's context less one token). A prompt that fits but leaves
fewer than ``max_tokens`` tokens of context is generated as far as the context goes and ends
with ``finish_reason="length"`` (what vLLM does; the transformers engine does the same), so one
long call never fails its group.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rmserve.errors import InvalidRequest, SequenceTooLong, ServerFault
from rmserve.judge_records import THINK_OPEN
from rmserve.schema import Message
from rmserve.server.render.chat import tokenizer_added_bos, with_lead_bos

CHAT_TEMPLATE_FIX = (
    "a judge needs a chat template: use a chat (instruction-tuned) model whose tokenizer has one, "
    "or pass --chat-template FILE (a Jinja chat template; EngineConfig.chat_template)"
)
"""The fix named when a judge model has no chat template."""


def judge_chat_template(tokenizer: Any, chat_template_path: str | Path | None, model: str) -> str:
    """The chat template a judge renders with: the file ``chat_template_path`` when given, else
    the tokenizer's own template.

    Raises:
        ServerFault: neither exists (or the tokenizer holds only named templates and no
            default); the message names ``chat_template`` and the fix.
    """
    if chat_template_path is not None:
        return Path(chat_template_path).read_text(encoding="utf-8")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        raise ServerFault(f"chat_template: the tokenizer of {model!r} has no chat template; {CHAT_TEMPLATE_FIX}")
    return template


def judge_lead_bos(tokenizer: Any, config: Any) -> int | None:
    """The ``lead_bos`` of a judge renderer (:class:`JudgeRenderer`) for an engine config: the
    tokenizer's own BOS (:func:`~rmserve.server.render.chat.tokenizer_added_bos`) under
    ``compat`` ``none``; None under ``official``."""
    return tokenizer_added_bos(tokenizer) if getattr(config, "compat", "none") == "none" else None


def enable_thinking(switch: str | None) -> bool | None:
    """The ``enable_thinking`` value of a thinking switch: ``on`` → True, ``off`` → False,
    None → None (not passed).

    Raises:
        ValueError: another value (naming ``judge_thinking``).
    """
    if switch is None:
        return None
    if switch not in ("on", "off"):
        raise ValueError(f"judge_thinking: {switch!r} is not one of on, off")
    return switch == "on"


def opens_reasoning(prompt_text: str) -> bool:
    """True when a templated prompt ends with ``<think>`` (trailing whitespace ignored): the
    template opened the reasoning, so the model's text begins inside it. A prompt ending with
    an empty, closed block (``<think>\n\n</think>``, Qwen3 with thinking off) does not."""
    return prompt_text.rstrip().endswith(THINK_OPEN)


class JudgeRenderer:
    """Renders judge calls to prompt token ids and applies the length rule.

    Args:
        tokenizer: a transformers tokenizer (or any object with ``apply_chat_template`` and
            ``__call__`` returning ``{"input_ids": [[...], ...]}`` for a list of texts).
        chat_template: the Jinja template to render with (see :func:`judge_chat_template`).
        max_prompt_tokens: the longest prompt accepted, in tokens (≥ 1): the engine's
            context less the one token that must be generated.
        enable_thinking: passed to the template as ``enable_thinking`` when not None
            (:func:`enable_thinking` of ``--judge-thinking``); None passes nothing.
        lead_bos: a BOS id put in front of a prompt whose ids do not start with it (the
            tokenizer's own, :func:`~rmserve.server.render.chat.tokenizer_added_bos`, for a
            template that writes none: Mistral's ``[INST]``; the engines pass it under
            ``--compat none``). None (``--compat official``, as the official script: the
            templated text tokenized without special tokens) puts nothing in front.

    The renderer never mutates the tokenizer; concurrent calls from worker threads are safe.
    """

    def __init__(
        self, tokenizer: Any, *, chat_template: str, max_prompt_tokens: int, enable_thinking: bool | None = None,
        lead_bos: int | None = None,
    ) -> None:
        if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens: {max_prompt_tokens!r} must be an integer ≥ 1")
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise ValueError(f"enable_thinking: {enable_thinking!r} must be true, false or None")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.max_prompt_tokens = max_prompt_tokens
        self.enable_thinking = enable_thinking
        self.lead_bos = lead_bos

    def render_text(self, messages: Sequence[Message]) -> str:
        """The templated prompt of one call, generation prompt included.

        Raises:
            InvalidRequest: no message, or the template rejects the conversation (field ``messages``).
        """
        if not messages:
            raise InvalidRequest("a judge call has no message", field="messages", value=0, limit=1)
        chat = [{"role": m.role, "content": m.content} for m in messages]
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return self.tokenizer.apply_chat_template(
                chat, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True, **extra
            )
        except Exception as exc:  # noqa: BLE001 - a Jinja error (e.g. raise_exception) names the cause
            raise InvalidRequest(
                f"the judge's chat template rejected the messages ({[m.role for m in messages]}): "
                f"{type(exc).__name__}: {exc}",
                field="messages",
            ) from None

    def render(self, calls: Sequence[Sequence[Message]]) -> list[list[int]]:
        """Prompt token ids of every call (one batched tokenizer call), checked for length.

        Returns:
            One token-id list per call, in order, each 1 … ``max_prompt_tokens`` long.

        Raises:
            InvalidRequest: no call, or a call the template rejects (field ``messages``).
            SequenceTooLong: a call's prompt is over ``max_prompt_tokens`` (field
                ``messages``, value its tokens, limit ``max_prompt_tokens``); nothing of
                the group should be generated.
        """
        return self.render_calls(calls)[0]

    def render_calls(self, calls: Sequence[Sequence[Message]]) -> tuple[list[list[int]], list[bool]]:
        """:meth:`render`, with per call whether its prompt opens the reasoning
        (:func:`opens_reasoning`: the generated text then begins inside it).

        Raises:
            InvalidRequest, SequenceTooLong: as :meth:`render`.
        """
        if not calls:
            raise InvalidRequest("a judge group has no call", field="messages", value=0, limit=1)
        texts = [self.render_text(messages) for messages in calls]
        ids = [list(seq) for seq in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        ids = [with_lead_bos(seq, self.lead_bos) for seq in ids]
        check_prompt_lengths(ids, self.max_prompt_tokens)
        return ids, [opens_reasoning(text) for text in texts]

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of generated tokens, decoded in one piece with ``skip_special_tokens=True``
        (a final EOS leaves no trace). Both local judge engines read their texts this way, so
        equal tokens give equal texts; a character cut in the middle by ``max_tokens`` shows as
        U+FFFD, where vLLM's streaming detokenizer would withhold its bytes."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def decode_all(self, outputs: Sequence[Sequence[int]]) -> list[str]:
        """:meth:`decode` of every output (for one worker-thread hop per group)."""
        return [self.decode(ids) for ids in outputs]


def check_prompt_lengths(prompts: Sequence[Sequence[int]], max_prompt_tokens: int) -> None:
    """The length rule of judge prompts.

    Raises:
        InvalidRequest: an empty prompt (field ``messages``).
        SequenceTooLong: the first prompt over ``max_prompt_tokens`` (field ``messages``,
            value its tokens, limit ``max_prompt_tokens``).
    """
    for k, ids in enumerate(prompts):
        if len(ids) == 0:
            raise InvalidRequest(f"judge call {k} rendered to an empty prompt", field="messages", value=0, limit=1)
        if len(ids) > max_prompt_tokens:
            raise SequenceTooLong(
                f"judge call {k} renders to {len(ids)} prompt tokens; the judge takes at most "
                f"{max_prompt_tokens} (its max_model_len less the one token it must generate)",
                field="messages",
                value=len(ids),
                limit=max_prompt_tokens,
            )


def max_new_tokens(prompt_tokens: int, max_tokens: int, context_tokens: int) -> int:
    """Tokens a call may generate: ``max_tokens``, or fewer when the context ends first.

    ``context_tokens`` is the engine's whole context (prompt + generated tokens at most; vLLM's
    ``max_model_len``). vLLM accepts a request whose ``prompt + max_tokens`` exceeds it and
    stops at the context with ``finish_reason="length"`` (``v1/core/sched/utils.py``
    ``check_stop``); the transformers engine generates this many tokens to match.

    Raises:
        ValueError: no room for one generated token (the length rule was not applied).
    """
    room = context_tokens - prompt_tokens
    if room < 1:
        raise ValueError(f"a {prompt_tokens}-token prompt leaves no room in a {context_tokens}-token context")
    return min(max_tokens, room)


def finish_reason(generated: Sequence[int], stop_ids: Sequence[int] | set[int], limit: int) -> str:
    """``stop`` when the last generated token is a stop token, else ``length`` (the generation
    ran out of ``limit`` tokens: ``max_tokens`` or the context).

    Raises:
        ValueError: nothing was generated, or more than ``limit`` tokens without a stop.
    """
    if not generated:
        raise ValueError("no token was generated")
    if generated[-1] in stop_ids:
        return "stop"
    if len(generated) != limit:
        raise ValueError(f"generation ended after {len(generated)} of {limit} tokens without a stop token")
    return "length"


def judge_stop_ids(tokenizer_eos: int | None, generation_eos: int | Sequence[int] | None) -> tuple[int, ...]:
    """The tokens a judge's generation stops at: the tokenizer's EOS, then the generation
    config's ``eos_token_id`` (an id or a list), without repeats (vLLM's stop rule)."""
    ids: list[int] = []
    extra = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    for token in [tokenizer_eos, *extra]:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return tuple(ids)
