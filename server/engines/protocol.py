"""The engine protocol the HTTP layer sees, and the records that cross it.

The server never touches ``AsyncLLM`` or transformers: it renders and tokenizes a group
with a :class:`~rmserve.server.render.chat.Renderer`, then hands token ids to a
:class:`RewardEngine`. Implementations: ``rmserve.server.engines.vllm_engine`` (vLLM),
``rmserve.server.engines.hf_engine`` (transformers), and fakes in the tests; engines are registered
by name in :mod:`rmserve.server.engines.registry`.

Every way of (re)loading a model — ``start``, ``restart``, ``reload_weights`` — returns one
:class:`LoadedModel`: the model's info, the renderer built for it (its tokenizer, chat
template and resolved ``max_model_len``; None when the engine leaves rendering to the app)
and the local checkpoint folder. That record is the only channel from engine to app.

A kind of reward model plugs in as one engine module plus its renderer: the engine returns,
per sequence, a :class:`SequenceScore` whose ``reward`` every kind has, and whose optional
``extras`` carry what only that kind produces (for example the summed log-probabilities of
a DPO policy and its reference, or a generative judge's text); the app passes extras
through to the reply's :class:`~rmserve.schema.GroupResult` without reading them.

Optional capabilities are separate protocols (:class:`SupportsPrefixCacheStats`,
:class:`SupportsWeightReload`, :class:`SupportsRestart`, :class:`SupportsCheckpointCheck`):
check them with ``isinstance``. A DPO engine (:mod:`rmserve.server.engines.dpo_pair`) is built from
:class:`LogprobEngine` s, which answer per-token log-probabilities instead of rewards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from rmserve.errors import InvalidRequest, RMServeError, SequenceTooLong
from rmserve.schema import Message, ModelInfo, ResponseError

if TYPE_CHECKING:  # render imports the tokenizer stack lazily; only its type is needed here
    from rmserve.server.kinds.judge_protocols import JudgeOutput
    from rmserve.server.render.chat import Renderer

ExtraValue = float | int | str | None
"""One per-response extra value: a number (e.g. a log-probability sum) or a text (a judge's
verdict); None where the engine has no value for that response."""


@dataclass(frozen=True, slots=True)
class SequenceScore:
    """The engine's answer for one token sequence.

    Attributes:
        reward: the reward, a Python float (a classifier's raw reward-head logit, no
            activation; other kinds define theirs in their engine module).
        num_cached_tokens: tokens of this sequence served from the prefix cache (0 when the
            engine has no prefix cache).
        extras: optional named values of this response that only some kinds of reward model
            produce (empty for classifiers). Every sequence of a group must carry the same
            names; the app sends them as ``GroupResult.extras`` (one list per name, response
            order) and omits the field when no sequence has any.
        error: set when the engine could compute no reward for this sequence (e.g. a DPO
            engine given no answer token: ``no_answer_tokens``); the reply then has a null
            reward and this error for the response, whatever ``reward`` holds.
    """

    reward: float
    num_cached_tokens: int
    extras: Mapping[str, ExtraValue] = field(default_factory=dict)
    error: ResponseError | None = None


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """What an engine serves after ``start``, ``restart`` or ``reload_weights``.

    Attributes:
        info: name, max length, dtype, fingerprint and engine kind of the loaded model.
        renderer: the renderer matching the model (tokenizer, chat template, ``max_model_len``),
            or None when the engine does not build one (the app then needs a renderer or a
            renderer factory of its own).
        checkpoint_dir: the loaded checkpoint's folder, resolved; None when the model is not a
            local folder (a hub id). The app compares checkpoints for a swap from it and
            restores it when a restart on another checkpoint fails.
        step_tokens: most tokens the engine's scheduler packs into one step (vLLM's
            ``max_num_batched_tokens``), when it has such a budget; None otherwise. The fair
            queue keeps a few steps' worth at the engine (``ServerConfig.engine_window_tokens``).
    """

    info: ModelInfo
    renderer: Renderer | None = None
    checkpoint_dir: Path | None = None
    step_tokens: int | None = None


def local_checkpoint(model: str | Path | None) -> Path | None:
    """``model`` resolved when it names an existing local folder, else None (hub ids, None)."""
    if model is None or not Path(model).is_dir():
        return None
    return Path(model).resolve()


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Cumulative prefix-cache counters of an engine, in tokens.

    Attributes:
        query_tokens: tokens of all sequences submitted so far.
        hit_tokens: of those, tokens served from the prefix cache.
    """

    query_tokens: int
    hit_tokens: int


@runtime_checkable
class RewardEngine(Protocol):
    """What the server needs from an engine.

    Lifecycle: ``await start()`` once (may take minutes), then ``score_group`` concurrently
    from many requests, then ``await shutdown()``. ``info()`` is valid after ``start`` (for
    in-process callers; the app keeps the :class:`LoadedModel` that ``start`` returned).
    """

    async def start(self) -> LoadedModel:
        """Load the model and describe it; raise ``rmserve.errors.ServerFault`` when it cannot."""

    def info(self) -> ModelInfo:
        """Name, max length, dtype, fingerprint and engine kind of the loaded model (the same
        as the last returned :class:`LoadedModel`'s ``info``)."""

    async def score_group(
        self,
        token_ids: Sequence[Sequence[int]],
        request_id: str,
        *,
        answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        """Score all sequences of one group together (so they share prefix-cache blocks).

        Args:
            token_ids: one list of token ids per response, each already within the model's
                max length, template and special tokens included.
            request_id: unique prefix for the engine's request ids (used to abort on
                client disconnect).
            answer_starts: per sequence, the index of its first answer token, when the
                renderer set :attr:`~rmserve.server.render.chat.RenderedGroup.answer_start`
                (DPO engines need it), else None. The scoring path always passes it: every
                reward engine takes it, and one that scores whole sequences ignores it.
            priority: engine request priority, lower first (0 interactive, 1 batch: the
                fair queue's ``ENGINE_PRIORITY``); an engine without priorities ignores it.

        Returns:
            One :class:`SequenceScore` per sequence, in order.

        Raises:
            rmserve.errors.EngineNotReady: not started, or shutting down.
            rmserve.errors.EngineError: the engine failed on this request.
        """

    async def shutdown(self) -> None:
        """Release the engine; idempotent."""


@runtime_checkable
class SupportsPrefixCacheStats(Protocol):
    """Optional: an engine with a prefix cache reports its counters (for ``/metrics``)."""

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Cumulative query/hit token counts since start."""


@runtime_checkable
class SupportsWeightReload(Protocol):
    """Optional: an engine that swaps checkpoints in place (same architecture)."""

    async def reset_prefix_cache(self) -> bool:
        """Drop all cached prefix blocks."""

    async def reload_weights(self, path: str) -> LoadedModel:
        """Load the weights at ``path`` into the running model; return what is now loaded
        (new fingerprint and checkpoint folder; same renderer)."""


@runtime_checkable
class SupportsRestart(Protocol):
    """Optional: an engine that restarts itself on another checkpoint (any architecture).

    The same engine object stays in the app; only what it runs changes. Both real engines
    implement it; the app uses it when a checkpoint cannot be reloaded in place (different
    architecture/shape or tokenizer).
    """

    async def restart(self, path: str) -> LoadedModel:
        """Shut the running model down, then start the checkpoint folder ``path`` with the
        same engine settings otherwise; return what is now loaded (new fingerprint,
        ``max_model_len`` and renderer).

        Scoring calls made meanwhile get ``EngineNotReady``. On failure no model is loaded
        (``info()`` and ``score_group`` raise ``EngineNotReady``) until a later ``restart``
        succeeds — the caller may restart on the previous checkpoint.

        Raises:
            rmserve.errors.EngineNotReady: shutting down.
            rmserve.errors.InvalidRequest: ``path`` is not a folder (nothing was stopped).
            rmserve.errors.EngineError: the new model failed to start.
        """


@runtime_checkable
class SupportsCheckpointCheck(Protocol):
    """Optional: an engine with its own file rules for a checkpoint swap.

    Called by the swap's file checks (:func:`rmserve.server.swaps.swap.check_files`, in a worker
    thread) instead of the classifier rules, before anything else is done: a folder it
    refuses leaves the engine and the served model untouched.
    """

    def check_checkpoint(self, folder: Path) -> None:
        """Refuse a checkpoint folder this engine cannot load, from its files alone.

        Raises:
            rmserve.errors.InvalidCheckpoint: naming the folder, the file and the rule.
        """


def check_token_ids(token_ids: Sequence[Sequence[int]], max_model_len: int) -> None:
    """The engines' own guard on a group's sequences (the renderer already enforces it).

    Raises:
        InvalidRequest: an empty sequence (field ``token_ids[j]``).
        SequenceTooLong: a sequence longer than ``max_model_len`` tokens.
    """
    for j, ids in enumerate(token_ids):
        if len(ids) == 0:
            raise InvalidRequest(f"token_ids[{j}] is empty", field=f"token_ids[{j}]", value=0, limit=1)
        if len(ids) > max_model_len:
            raise SequenceTooLong(
                f"token_ids[{j}] is {len(ids)} tokens, over max_model_len={max_model_len}",
                field=f"token_ids[{j}]", value=len(ids), limit=max_model_len,
            )


def check_answer_starts(token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int]) -> None:
    """The engines' guard on a group's answer starts: one per sequence, each ``1 ≤ start ≤ len``.

    Raises:
        InvalidRequest: a count other than one start per sequence (field ``answer_starts``), or
            a start that is not an integer in ``1 … len(token_ids[j])`` (field ``answer_starts[j]``).
    """
    if len(answer_starts) != len(token_ids):
        raise InvalidRequest(
            f"answer_starts has {len(answer_starts)} entries for {len(token_ids)} sequences",
            field="answer_starts", value=len(answer_starts), limit=len(token_ids),
        )
    for j, (ids, start) in enumerate(zip(token_ids, answer_starts, strict=True)):
        if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= len(ids):
            raise InvalidRequest(
                f"answer_starts[{j}] is {start!r}; it must be an integer in 1…{len(ids)} (the sequence's length)",
                field=f"answer_starts[{j}]", value=start, limit=len(ids),
            )


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to raise from a failed task group: its first rmserve error (nested groups
    walked in order), else its first error."""
    leaves: list[BaseException] = []

    def walk(eg: BaseExceptionGroup) -> None:
        for exc in eg.exceptions:
            if isinstance(exc, BaseExceptionGroup):
                walk(exc)
            else:
                leaves.append(exc)

    walk(group)
    return next((exc for exc in leaves if isinstance(exc, RMServeError)), leaves[0])


T = TypeVar("T")


async def gather_or_abort(
    coroutines: Sequence[Coroutine[Any, Any, T]], abort: Callable[[], Awaitable[None]] | None = None
) -> list[T]:
    """Run the coroutines of one group concurrently; their results in order.

    If any of them fails, or the caller is cancelled (client disconnect), the others are
    cancelled and awaited, then ``abort`` (if given: e.g. abort the group's engine requests)
    runs, and the first error (or the cancellation) propagates.
    """
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if abort is not None:
            await abort()
        raise


# --- log-probability engines (the parts a DPO reward is built from) ----------------------


@dataclass(frozen=True, slots=True)
class AnswerLogprobs:
    """The log-probabilities of one sequence's answer tokens under one causal LM.

    Attributes:
        logprobs: ``log p(token_i | token_0 … token_{i-1})`` in nats for every answer token
            ``i = answer_start … len(token_ids) - 1``, in order (length = answer tokens).
        num_cached_tokens: tokens of this sequence served from the prefix cache.
    """

    logprobs: tuple[float, ...]
    num_cached_tokens: int = 0


@runtime_checkable
class LogprobEngine(Protocol):
    """One causal LM that answers per-token log-probabilities of given sequences.

    A DPO reward engine (:mod:`rmserve.server.engines.dpo_pair`) holds one for the policy and, with a
    reference, one for the reference model, and computes the rewards from their answers.
    Implementations: ``VLLMLogprobEngine`` in :mod:`rmserve.server.engines.vllm_engine` (generate
    runner, prompt log-probs, prefix cache) and ``HFLogprobEngine`` in
    :mod:`rmserve.server.engines.hf_engine` (transformers, padded batches as the official script).
    Both are built as ``Cls(config, model)``: the engine settings, and the folder or hub id
    to load (``config.model`` for the policy, ``config.ref_model`` for the reference).
    Optional capabilities as for reward engines (:class:`SupportsPrefixCacheStats`,
    :class:`SupportsWeightReload`).
    """

    async def start(self) -> LoadedModel:
        """Load the model; ``renderer`` of the result may be None (the DPO engine builds its own).

        Raises:
            rmserve.errors.ServerFault: the model cannot be loaded (or has no LM head).
        """

    def info(self) -> ModelInfo:
        """What is loaded (valid after ``start``)."""

    async def answer_logprobs(
        self, token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int], request_id: str, *, priority: int = 0
    ) -> list[AnswerLogprobs]:
        """Log-probabilities of the answer tokens of every sequence of one group.

        Args:
            token_ids: one token-id list per sequence (BOS and template included).
            answer_starts: per sequence, the index of its first answer token (≥ 1 and
                ≤ ``len(token_ids[j])``; equal to the length means no answer token, and an
                empty ``logprobs``).
            request_id: unique prefix for the engine's request ids.
            priority: engine request priority, lower first (0 interactive, 1 batch: the
                fair queue's ``ENGINE_PRIORITY``); an engine without priorities ignores it.

        Returns:
            One :class:`AnswerLogprobs` per sequence, in order.

        Raises:
            rmserve.errors.EngineNotReady / rmserve.errors.EngineError: as ``score_group``.
        """

    async def shutdown(self) -> None:
        """Release the engine; idempotent."""


@runtime_checkable
class JudgeEngine(Protocol):
    """A generative judge (LLM-as-judge): chat messages in, greedily generated text out.

    The judge scoring path (``rmserve.server.kinds.judge``) plans each group's calls with
    :func:`rmserve.server.kinds.judge_protocols.plan_group`, sends one group's calls in one
    :meth:`judge_group` call (so the shared instruction and question hit the prefix cache)
    and reads the outputs with :func:`rmserve.server.kinds.judge_protocols.score_group`.
    Implementations: ``VLLMJudgeEngine`` in :mod:`rmserve.server.engines.vllm_engine` (generate runner),
    ``HFJudgeEngine`` in :mod:`rmserve.server.engines.hf_engine` (transformers ``generate``, one
    prompt at a time) and ``OpenAIJudgeEngine`` in :mod:`rmserve.server.engines.openai_judge` (an
    OpenAI-compatible chat-completions endpoint). Decoding is greedy (temperature 0, top_p
    1) with at most ``max_tokens`` generated tokens per call; local engines render with the
    model's chat template and its generation prompt.
    """

    max_tokens: int
    """Generated tokens per call at most (official 2,048)."""

    async def start(self) -> LoadedModel:
        """Load the model (or check the endpoint) and describe it.

        Raises:
            rmserve.errors.ServerFault: the model cannot be loaded, or has no chat template.
        """

    def info(self) -> ModelInfo:
        """What is loaded (valid after ``start``)."""

    async def judge_group(
        self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0
    ) -> list[JudgeOutput]:
        """Generate one output per call, all calls submitted together.

        Args:
            calls: per call, the chat messages before the chat template.
            request_id: unique prefix for the engine's request ids.
            priority: engine request priority, lower first (0 interactive, 1 batch: the
                fair queue's ``ENGINE_PRIORITY``); an engine without priorities ignores it.

        Returns:
            One :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput` per call, in order.

        Raises:
            rmserve.errors.SequenceTooLong: a call's templated prompt leaves no room for one
                generated token within the model's max length (field ``messages``, limit
                the max length); nothing is generated for the group.
            rmserve.errors.EngineNotReady / rmserve.errors.EngineError: as ``score_group``.
        """

    async def shutdown(self) -> None:
        """Release the engine; idempotent."""
