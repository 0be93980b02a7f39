"""The engine protocol the HTTP layer sees, and the records that cross it.

Handlers never touch ``AsyncLLM`` or transformers: they render and tokenize a group with a
:class:`~rmserve.server.render.Renderer`-like object, then hand token ids to a
:class:`RewardEngine`. Implementations: ``rmserve.server.engine`` (vLLM),
``rmserve.server.engine_hf`` (transformers), and a fake in the tests. Both real engines
expose, after ``start``, a ``renderer`` attribute (a
:class:`~rmserve.server.render.Renderer` with the model's tokenizer, the chat template in
use and the engine's ``max_model_len``); it is not part of the protocol so fakes stay small.
Optional capabilities are separate protocols (:class:`SupportsPrefixCacheStats`,
:class:`SupportsWeightReload`, :class:`SupportsRestart`): check them with ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rmserve.errors import InvalidRequest, SequenceTooLong
from rmserve.schema import ModelInfo


@dataclass(frozen=True, slots=True)
class SequenceScore:
    """The engine's answer for one token sequence.

    Attributes:
        reward: the raw reward-head logit (no activation), a Python float.
        num_cached_tokens: tokens of this sequence served from the prefix cache (0 when the
            engine has no prefix cache).
    """

    reward: float
    num_cached_tokens: int


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
    from many requests, then ``await shutdown()``. ``info()`` is valid after ``start``.
    """

    async def start(self) -> None:
        """Load the model; raise ``rmserve.errors.ServerFault`` when it cannot."""

    def info(self) -> ModelInfo:
        """Name, max length, dtype, fingerprint and engine kind of the loaded model."""

    async def score_group(self, token_ids: Sequence[Sequence[int]], request_id: str) -> list[SequenceScore]:
        """Score all sequences of one group together (so they share prefix-cache blocks).

        Args:
            token_ids: one list of token ids per response, each already within the model's
                max length, template and special tokens included.
            request_id: unique prefix for the engine's request ids (used to abort on
                client disconnect).

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

    async def reload_weights(self, path: str) -> ModelInfo:
        """Load the weights at ``path`` and return the new model info (new fingerprint)."""


@runtime_checkable
class SupportsRestart(Protocol):
    """Optional: an engine that restarts itself on another checkpoint (any architecture).

    The same engine object stays in the app; only what it runs changes. Both real engines
    implement it; the app uses it when a checkpoint cannot be reloaded in place (different
    architecture/shape or tokenizer). After a successful restart the engine's ``renderer``
    (when it has one) belongs to the new checkpoint.
    """

    async def restart(self, path: str) -> ModelInfo:
        """Shut the running model down, then start the checkpoint folder ``path`` with the
        same engine settings otherwise; return its model info (new fingerprint, new
        ``max_model_len``).

        Scoring calls made meanwhile get ``EngineNotReady``. On failure no model is loaded
        (``info()`` and ``score_group`` raise ``EngineNotReady``) until a later ``restart``
        succeeds — the caller may restart on the previous checkpoint.

        Raises:
            rmserve.errors.EngineNotReady: shutting down.
            rmserve.errors.InvalidRequest: ``path`` is not a folder (nothing was stopped).
            rmserve.errors.EngineError: the new model failed to start.
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
