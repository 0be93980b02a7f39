"""The transformers engine: a reference and fallback for :class:`VLLMEngine`.

:class:`HFEngine` loads ``AutoModelForSequenceClassification`` and scores a group's
sequences in right-padded batches. The reward is the score head applied to the hidden
state at each sequence's last real token, found from the attention mask
(``position = mask.sum(-1) - 1``) — never by looking for the pad id, which breaks when
pad == EOS. No activation is applied (raw logits), no prefix cache
(``num_cached_tokens = 0``). Forward passes run in a worker thread, one at a time, so the
event loop stays free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from rmserve.server.config import EngineConfig, check_reward_head
from rmserve.server.fingerprint import model_fingerprint
from rmserve.server.protocol import SequenceScore, check_token_ids
from rmserve.server.render import Renderer

from rmserve.errors import EngineError, EngineNotReady, ServerFault
from rmserve.schema import ModelInfo

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: Any
    base: Any
    head: Any
    device: torch.device
    pad_id: int
    renderer: Renderer
    info: ModelInfo


class HFEngine:
    """:class:`~rmserve.server.protocol.RewardEngine` backed by transformers.

    Args:
        config: model path, ``dtype`` (``auto`` = bfloat16 on CUDA, float32 on CPU),
            ``max_model_len`` (default: the model's ``max_position_embeddings``),
            ``chat_template`` and ``hf_batch_size`` (sequences per forward pass).

    Attributes (after :meth:`start`):
        renderer: the :class:`Renderer` for this model.
    """

    kind = "hf"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._loaded: _Loaded | None = None
        self._closing = False
        self._lock = asyncio.Lock()
        self.start_time_s: float | None = None

    async def start(self) -> None:
        """Load model and tokenizer in a worker thread.

        Raises:
            ServerFault: not a one-label ``*ForSequenceClassification`` with a ``score``
                head, or loading failed.
        """
        if self._loaded is not None:
            return
        started = time.perf_counter()
        self._loaded = await asyncio.to_thread(self._build)
        self.start_time_s = time.perf_counter() - started
        log.info("transformers engine ready in %.1f s: %s", self.start_time_s, self._loaded.info)

    def _build(self) -> _Loaded:
        from transformers import AutoModelForSequenceClassification

        cfg = self.config
        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_reward_head(cfg.model)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(cfg.model, **_dtype_kwargs(dtype))
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"transformers could not load {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        model = model.to(device).eval()
        num_labels = model.config.num_labels
        if num_labels != 1:
            raise ServerFault(f"{cfg.model!r} has num_labels={num_labels}; a reward model must have exactly 1")
        head = getattr(model, "score", None)
        base = getattr(model, model.base_model_prefix, None)
        if head is None or base is None:
            raise ServerFault(
                f"{cfg.model!r} ({type(model).__name__}) has no 'score' head over a base model; "
                "the transformers engine supports Llama/Qwen/Mistral/Gemma-style classifiers"
            )
        model_limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        max_model_len = cfg.max_model_len or model_limit
        if not max_model_len:
            raise ServerFault(f"{cfg.model!r} declares no max_position_embeddings; pass --max-model-len")
        if model_limit and max_model_len > model_limit:
            raise ServerFault(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={model_limit}")
        renderer = Renderer.from_pretrained(cfg.model, max_model_len=max_model_len, chat_template_path=cfg.chat_template)
        pad_id = model.config.pad_token_id
        info = ModelInfo(
            name=cfg.name,
            max_model_len=max_model_len,
            dtype=dtype,
            fingerprint=model_fingerprint(cfg.model, renderer.chat_template),
            engine=self.kind,
        )
        return _Loaded(
            model=model, base=base, head=head, device=device,
            pad_id=int(pad_id) if pad_id is not None else 0, renderer=renderer, info=info,
        )

    async def shutdown(self) -> None:
        """Drop the model; idempotent."""
        self._closing = True
        self._loaded = None

    def info(self) -> ModelInfo:
        """Name, max length, dtype, fingerprint, ``engine="hf"``; EngineNotReady before start."""
        return self._require().info

    @property
    def renderer(self) -> Renderer:
        """The renderer matching this model's tokenizer, template and max length."""
        return self._require().renderer

    async def score_group(self, token_ids: Sequence[Sequence[int]], request_id: str) -> list[SequenceScore]:
        """Score one group's sequences (raw logits; ``num_cached_tokens`` is always 0).

        ``request_id`` is only used in error messages: a forward pass in progress cannot
        be aborted, a cancelled caller simply does not wait for it.

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: an empty or over-long sequence.
            EngineError: the forward pass failed.
        """
        loaded = self._require()
        limit = loaded.info.max_model_len
        check_token_ids(token_ids, limit)
        async with self._lock:
            try:
                rewards = await asyncio.to_thread(self._rewards, loaded, token_ids)
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"forward pass failed for {request_id}: {type(exc).__name__}: {exc}") from exc
        return [SequenceScore(reward=r, num_cached_tokens=0) for r in rewards]

    def _rewards(self, loaded: _Loaded, token_ids: Sequence[Sequence[int]]) -> list[float]:
        """Rewards in input order; batches of ``hf_batch_size``, longest first (less padding)."""
        order = sorted(range(len(token_ids)), key=lambda j: -len(token_ids[j]))
        rewards = [0.0] * len(token_ids)
        step = self.config.hf_batch_size
        with torch.inference_mode():
            for start in range(0, len(order), step):
                chunk = order[start : start + step]
                values = last_token_rewards(
                    loaded.base, loaded.head, [token_ids[j] for j in chunk], pad_id=loaded.pad_id, device=loaded.device
                )
                for j, value in zip(chunk, values, strict=True):
                    rewards[j] = value
        return rewards

    def _require(self) -> _Loaded:
        if self._closing:
            raise EngineNotReady("the engine is shutting down")
        if self._loaded is None:
            raise EngineNotReady("the engine is still loading")
        return self._loaded


def _dtype_kwargs(dtype: str) -> dict[str, Any]:
    """``from_pretrained`` dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: _DTYPES[dtype]}


def last_token_rewards(
    base: Any, head: Any, sequences: Sequence[Sequence[int]], *, pad_id: int, device: torch.device
) -> list[float]:
    """Score a batch: right-pad, run ``base``, apply ``head`` at each last real token.

    Args:
        base: the decoder (``model.model`` for Llama), returning ``last_hidden_state``
            of shape (batch, seq, hidden).
        head: the score head, hidden → 1.
        sequences: token-id lists (any lengths ≥ 1).
        pad_id: filler id for padding (masked out; its value does not matter).

    Returns:
        One float per sequence: ``head(hidden[b, mask[b].sum() - 1])``.
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, ids in enumerate(sequences):
        input_ids[b, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[b, : len(ids)] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    last = attention_mask.sum(dim=-1) - 1
    pooled = hidden[torch.arange(hidden.shape[0], device=device), last]
    return head(pooled).float().reshape(-1).tolist()
