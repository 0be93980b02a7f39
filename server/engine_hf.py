"""The transformers engines: a reference and fallback for the vLLM ones.

:class:`HFEngine` loads ``AutoModelForSequenceClassification`` and scores a group's
sequences in right-padded batches. The reward is the score head applied to the hidden
state at each sequence's last real token, found from the attention mask
(``position = mask.sum(-1) - 1``) — never by looking for the pad id, which breaks when
pad == EOS. No activation is applied (raw logits), no prefix cache
(``num_cached_tokens = 0``). Forward passes run in a worker thread, one at a time, so the
event loop stays free. A checkpoint swap is :meth:`HFEngine.reload_weights` (same
architecture: the tokenizer and renderer are kept) or :meth:`HFEngine.restart` (any
checkpoint: everything is rebuilt).

:class:`HFLogprobEngine` is the :class:`~rmserve.server.protocol.LogprobEngine` of a DPO
policy or reference (``AutoModelForCausalLM``), computed the reference harness's way
(allenai/reward-bench ``rewardbench/dpo.py``, ``concatenated_forward`` and
``get_batch_logps``): right-padded batches of ``hf_batch_size`` sequences, pad id = EOS (as
``scripts/run_dpo.py`` sets it), an attention mask, and for every answer token the
``log_softmax`` of the previous position's logits gathered at the token (in float32).

:class:`HFJudgeEngine` is the :class:`~rmserve.server.protocol.JudgeEngine` of a generative
judge: ``AutoModelForCausalLM.generate`` with greedy decoding, one prompt at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from rmserve.server.batching import length_sorted_batches
from rmserve.server.config import EngineConfig, check_lm_head, check_reward_head
from rmserve.server.judge_protocols import JudgeOutput
from rmserve.server.judge_render import (
    JudgeRenderer,
    finish_reason,
    judge_chat_template,
    judge_stop_ids,
    max_new_tokens,
)
from rmserve.server.lifecycle import EngineLifecycle
from rmserve.server.protocol import AnswerLogprobs, LoadedModel, SequenceScore, check_token_ids, local_checkpoint
from rmserve.server.render import Renderer

from rmserve.errors import EngineError, EngineNotReady, InvalidRequest, ServerFault
from rmserve.schema import Message, ModelInfo

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: Any
    base: Any
    head: Any
    device: torch.device
    pad_id: int
    record: LoadedModel

    @property
    def info(self) -> ModelInfo:
        return self.record.info

    @property
    def renderer(self) -> Renderer:
        assert self.record.renderer is not None
        return self.record.renderer


class HFEngine(EngineLifecycle[_Loaded]):
    """:class:`~rmserve.server.protocol.RewardEngine` backed by transformers.

    Args:
        config: model path, ``dtype`` (``auto`` = bfloat16 on CUDA, float32 on CPU),
            ``max_model_len`` (default: the model's ``max_position_embeddings``),
            ``chat_template`` and ``hf_batch_size`` (sequences per forward pass).

    Attributes (after :meth:`start`):
        renderer: the :class:`Renderer` for this model (the one in :meth:`start`'s record).
        config: the settings; after :meth:`restart` its ``model`` is the checkpoint last started.
    """

    kind = "hf"
    label = "transformers engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self._lock = asyncio.Lock()

    async def start(self) -> LoadedModel:
        """Load model and tokenizer in a worker thread; return the loaded model (info,
        renderer, checkpoint folder). A second call returns the same record.

        Raises:
            ServerFault: not a one-label ``*ForSequenceClassification`` with a ``score``
                head, or loading failed.
        """
        if self._loaded is not None:
            return self._loaded.record
        started = time.perf_counter()
        return self._finish_start(await asyncio.to_thread(self._build), started, log, "ready")

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
        info = self._model_info(cfg.name, cfg.model, renderer, max_model_len, dtype)
        return _Loaded(
            model=model, base=base, head=head, device=device,
            pad_id=int(pad_id) if pad_id is not None else 0,
            record=LoadedModel(info, renderer, local_checkpoint(cfg.model)),
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

    async def score_group(
        self, token_ids: Sequence[Sequence[int]], request_id: str, *, priority: int = 0
    ) -> list[SequenceScore]:
        """Score one group's sequences (raw logits; ``num_cached_tokens`` is always 0).

        ``priority`` is accepted and ignored (groups run in the order they arrive).

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
            loaded = self._require()  # a checkpoint swap may have replaced the model meanwhile
            try:
                rewards = await asyncio.to_thread(self._rewards, loaded, token_ids)
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"forward pass failed for {request_id}: {type(exc).__name__}: {exc}") from exc
        return [SequenceScore(reward=r, num_cached_tokens=0) for r in rewards]

    def _rewards(self, loaded: _Loaded, token_ids: Sequence[Sequence[int]]) -> list[float]:
        """Rewards in input order; batches of ``hf_batch_size``, longest first (less padding)."""
        return length_sorted_rewards(
            loaded.base, loaded.head, token_ids, pad_id=loaded.pad_id, device=loaded.device,
            max_batch_tokens=sys.maxsize, max_batch_size=self.config.hf_batch_size,
        )

    async def reset_prefix_cache(self) -> bool:
        """No prefix cache here: nothing to drop; True."""
        return True

    async def reload_weights(self, path: str) -> LoadedModel:
        """Replace the model in place with the checkpoint at ``path`` (same architecture).

        Waits for the forward pass in progress, loads the new model in a worker thread and
        swaps it in; the renderer (same tokenizer) is kept, the fingerprint recomputed. On
        any failure the loaded model is unchanged. Returns the loaded model.

        Raises:
            EngineNotReady: not started or shut down.
            EngineError: the checkpoint could not be loaded or is not a one-label classifier.
        """
        async with self._lock:
            loaded = self._require()
            try:
                self._loaded = await asyncio.to_thread(self._reload, loaded, path)
            except (OSError, RuntimeError, ValueError, ServerFault) as exc:
                raise EngineError(f"reloading weights failed: {type(exc).__name__}: {exc}") from exc
            return self._loaded.record

    def _reload(self, loaded: _Loaded, path: str) -> _Loaded:
        from transformers import AutoModelForSequenceClassification

        dtype = loaded.info.dtype
        model = AutoModelForSequenceClassification.from_pretrained(path, **_dtype_kwargs(dtype))
        model = model.to(loaded.device).eval()
        head = getattr(model, "score", None)
        base = getattr(model, model.base_model_prefix, None)
        if model.config.num_labels != 1 or head is None or base is None:
            raise ValueError(f"checkpoint is not a one-label classifier with a 'score' head ({type(model).__name__})")
        info = self._model_info(loaded.info.name, path, loaded.renderer, loaded.info.max_model_len, dtype)
        return _Loaded(model=model, base=base, head=head, device=loaded.device, pad_id=loaded.pad_id,
                       record=LoadedModel(info, loaded.renderer, local_checkpoint(path)))

    async def restart(self, path: str) -> LoadedModel:
        """Drop the model and load the checkpoint at ``path`` (any architecture or tokenizer).

        Like :meth:`start` with this engine's config, ``model`` replaced
        (``dataclasses.replace``): new renderer (tokenizer, chat template), ``max_model_len``
        (a configured one is kept, else the new model's ``max_position_embeddings``) and
        fingerprint. Waits for the forward pass in progress; the old model is released
        before the new one loads (one model in accelerator memory at a time). Returns the
        loaded model.

        Raises:
            EngineNotReady: shutting down.
            InvalidRequest: ``path`` is not a folder (the model is kept).
            EngineError: the checkpoint could not be loaded or is not a one-label
                classifier; no model is loaded afterwards until a restart succeeds.
        """
        folder = self._checkpoint_folder(path)
        async with self._lock:
            if self._closing:
                raise EngineNotReady("the engine is shutting down")
            self._begin_restart(folder)
            self.config = dataclasses.replace(self.config, model=str(folder))
            started = time.perf_counter()
            try:
                loaded = await asyncio.to_thread(self._release_then_build)
            except Exception as exc:  # noqa: BLE001 - any load failure: no model now
                raise self._restart_failed(folder, exc) from exc
            if self._closing:
                raise EngineNotReady("the engine was shut down while restarting")
            return self._finish_start(loaded, started, log, f"restarted on {folder.name}")

    def _release_then_build(self) -> _Loaded:
        """Free the dropped model's memory (garbage, CUDA cache), then :meth:`_build`."""
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self._build()


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


def length_sorted_rewards(
    base: Any,
    head: Any,
    sequences: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: torch.device,
    max_batch_tokens: int,
    max_batch_size: int,
) -> list[float]:
    """Rewards of many sequences (any groups) through :func:`length_sorted_batches`.

    Each batch goes through :func:`last_token_rewards`; the result is in input order.
    """
    rewards = [0.0] * len(sequences)
    batches = length_sorted_batches(
        [len(s) for s in sequences], max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size
    )
    with torch.inference_mode():
        for batch in batches:
            values = last_token_rewards(base, head, [sequences[j] for j in batch], pad_id=pad_id, device=device)
            for j, value in zip(batch, values, strict=True):
                rewards[j] = value
    return rewards


# --- log-probabilities of a causal LM (DPO policy / reference) ---------------------------


@dataclass(frozen=True, slots=True)
class _LMLoaded:
    model: Any
    device: torch.device
    pad_id: int
    record: LoadedModel

    @property
    def info(self) -> ModelInfo:
        return self.record.info


class HFLogprobEngine(EngineLifecycle[_LMLoaded]):
    """:class:`~rmserve.server.protocol.LogprobEngine` backed by transformers ``AutoModelForCausalLM``.

    Args:
        config: the engine settings (``dtype``, ``max_model_len``, ``chat_template``,
            ``hf_batch_size``); ``config.model`` is the policy.
        model: the folder or hub id to load (``config.model`` or ``config.ref_model``).

    No prefix cache (``num_cached_tokens`` is 0). Forward passes run one at a time in a
    worker thread. The record's ``renderer`` is None (the DPO engine renders); the
    fingerprint hashes the chat template a DPO renderer would use (``chat_template`` file,
    else the tokenizer's).
    """

    kind = "hf"
    label = "transformers log-prob engine"

    def __init__(self, config: EngineConfig, model: str) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self._field = "model" if model == config.model else "ref_model"
        self._lock = asyncio.Lock()

    async def start(self) -> LoadedModel:
        """Load the causal LM in a worker thread; a second call returns the same record.

        Raises:
            ServerFault: no LM head (field ``model`` / ``ref_model``), or loading failed.
        """
        if self._loaded is not None:
            return self._loaded.record
        started = time.perf_counter()
        return self._finish_start(await asyncio.to_thread(self._build, self.model), started, log, "ready")

    def _build(self, model_path: str) -> _LMLoaded:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config
        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_lm_head(model_path, self._field)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = AutoModelForCausalLM.from_pretrained(model_path, **_dtype_kwargs(dtype))
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(
                f"{self._field}: transformers could not load {model_path!r}: {type(exc).__name__}: {exc}"
            ) from exc
        model = model.to(device).eval()
        model_limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        max_model_len = cfg.max_model_len or model_limit
        if not max_model_len:
            raise ServerFault(f"{self._field}: {model_path!r} declares no max_position_embeddings; pass --max-model-len")
        if model_limit and max_model_len > model_limit:
            raise ServerFault(
                f"max_model_len={max_model_len} exceeds the max_position_embeddings={model_limit} of {model_path!r}"
            )
        if cfg.chat_template is not None:
            template: str | None = Path(cfg.chat_template).read_text(encoding="utf-8")
        else:
            template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        name = Path(model_path).name if Path(model_path).is_dir() else model_path
        info = self._model_info(name, model_path, template, max_model_len, dtype)
        return _LMLoaded(model=model, device=device, pad_id=int(pad_id),
                         record=LoadedModel(info, None, local_checkpoint(model_path)))

    async def shutdown(self) -> None:
        """Drop the model; idempotent."""
        self._closing = True
        self._loaded = None

    def info(self) -> ModelInfo:
        """Name, max length, dtype, fingerprint, ``engine="hf"``; EngineNotReady before start."""
        return self._require().info

    async def answer_logprobs(
        self, token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int], request_id: str, *, priority: int = 0
    ) -> list[AnswerLogprobs]:
        """Per-token log-probabilities of each sequence's answer tokens (see the class doc).

        ``priority`` is accepted and ignored (groups run in the order they arrive).

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: an empty or over-long sequence, or an answer
                start outside ``[1, len]`` (field ``answer_starts[j]``).
            EngineError: the forward pass failed.
        """
        loaded = self._require()
        check_token_ids(token_ids, loaded.info.max_model_len)
        for j, (ids, start) in enumerate(zip(token_ids, answer_starts, strict=True)):
            if not 1 <= start <= len(ids):
                raise InvalidRequest(
                    f"answer_starts[{j}] is {start}; it must be between 1 and the sequence length {len(ids)}",
                    field=f"answer_starts[{j}]", value=start, limit=len(ids),
                )
        async with self._lock:
            loaded = self._require()
            try:
                values = await asyncio.to_thread(
                    length_sorted_logprobs, loaded.model, token_ids, answer_starts, pad_id=loaded.pad_id,
                    device=loaded.device, max_batch_size=self.config.hf_batch_size,
                )
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"forward pass failed for {request_id}: {type(exc).__name__}: {exc}") from exc
        return [AnswerLogprobs(tuple(v), 0) for v in values]

    async def reset_prefix_cache(self) -> bool:
        """No prefix cache here: nothing to drop; True."""
        return True

    async def reload_weights(self, path: str) -> LoadedModel:
        """Replace the model with the causal LM at ``path`` (waits for the forward pass in
        progress; on failure the loaded model is unchanged). Returns the loaded model.

        Raises:
            EngineNotReady: not started or shut down.
            EngineError: the checkpoint could not be loaded or has no LM head.
        """
        async with self._lock:
            self._require()
            try:
                self._loaded = await asyncio.to_thread(self._build, path)
            except (OSError, RuntimeError, ValueError, ServerFault) as exc:
                reason = exc.message if isinstance(exc, ServerFault) else f"{type(exc).__name__}: {exc}"
                raise EngineError(f"reloading weights failed: {reason}") from exc
            self.model = path
            return self._loaded.record

    async def restart(self, path: str) -> LoadedModel:
        """Drop the model and load the causal LM in the folder ``path`` (released first: one
        model in memory at a time). Returns the loaded model.

        Raises:
            EngineNotReady: shutting down.
            InvalidRequest: ``path`` is not a folder (the model is kept).
            EngineError: the checkpoint did not load; no model until a restart succeeds.
        """
        folder = self._checkpoint_folder(path)
        async with self._lock:
            if self._closing:
                raise EngineNotReady("the engine is shutting down")
            self._begin_restart(folder)
            self.model = str(folder)
            started = time.perf_counter()
            try:
                gc.collect()
                loaded = await asyncio.to_thread(self._build, str(folder))
            except Exception as exc:  # noqa: BLE001 - any load failure: no model now
                raise self._restart_failed(folder, exc) from exc
            return self._finish_start(loaded, started, log, f"restarted on {folder.name}")


def answer_logprobs_batch(
    model: Any, sequences: Sequence[Sequence[int]], answer_starts: Sequence[int], *, pad_id: int, device: torch.device
) -> list[list[float]]:
    """Log-probabilities of the answer tokens of one right-padded batch.

    Source: allenai/reward-bench ``rewardbench/dpo.py`` ``get_batch_logps``: labels shifted by
    one (``labels[:, 1:]``, ``logits[:, :-1]``), ``log_softmax(-1)`` gathered at the label —
    here only at answer positions, upcast to float32 before the softmax.

    Args:
        model: a causal LM returning ``logits`` of shape (batch, seq, vocab).
        sequences: token-id lists (any lengths ≥ 1).
        answer_starts: per sequence, the index of its first answer token (≥ 1).
        pad_id: filler id of the padding (masked; the official script pads with EOS).

    Returns:
        Per sequence, ``log p(ids[i] | ids[:i])`` for ``i = start … len - 1`` (nats).
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, ids in enumerate(sequences):
        input_ids[b, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[b, : len(ids)] = 1
    logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
    out = []
    for b, (ids, start) in enumerate(zip(sequences, answer_starts, strict=True)):
        if start >= len(ids):
            out.append([])
            continue
        scores = logits[b, start - 1 : len(ids) - 1].float().log_softmax(-1)
        targets = input_ids[b, start : len(ids)].to(scores.device)
        out.append(scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1).tolist())
    return out


def length_sorted_logprobs(
    model: Any, sequences: Sequence[Sequence[int]], answer_starts: Sequence[int], *, pad_id: int,
    device: torch.device, max_batch_size: int,
) -> list[list[float]]:
    """:func:`answer_logprobs_batch` over batches of at most ``max_batch_size`` sequences,
    longest first (:func:`length_sorted_batches`); the result is in input order."""
    values: list[list[float]] = [[] for _ in sequences]
    batches = length_sorted_batches([len(s) for s in sequences], max_batch_tokens=sys.maxsize, max_batch_size=max_batch_size)
    with torch.inference_mode():
        for batch in batches:
            answers = answer_logprobs_batch(
                model, [sequences[j] for j in batch], [answer_starts[j] for j in batch], pad_id=pad_id, device=device
            )
            for j, value in zip(batch, answers, strict=True):
                values[j] = value
    return values


# --- a generative judge (LLM-as-judge) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _JudgeLoaded:
    model: Any
    device: torch.device
    renderer: JudgeRenderer
    stop_ids: tuple[int, ...]
    pad_id: int
    context_tokens: int
    record: LoadedModel

    @property
    def info(self) -> ModelInfo:
        return self.record.info


class HFJudgeEngine(EngineLifecycle[_JudgeLoaded]):
    """:class:`~rmserve.server.protocol.JudgeEngine` backed by transformers ``generate``.

    The plain transformers way of generating, one prompt at a time: each call rendered as the
    vLLM judge renders it (:class:`~rmserve.server.judge_render.JudgeRenderer`), then
    ``model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=n)`` with an all-ones
    attention mask and a fresh ``GenerationConfig`` (so no sampling default of the checkpoint's
    ``generation_config.json`` applies; vLLM ignores them too for explicit sampling
    parameters). Stop tokens: the tokenizer's EOS and the ``eos_token_id`` (one or a list) of
    the checkpoint's generation config, as vLLM stops. ``n`` is ``max_tokens``, or fewer when
    the context ends first (:func:`~rmserve.server.judge_render.max_new_tokens`): the same cut
    vLLM makes, ``finish_reason="length"``. The text is the generated tokens decoded in one
    piece with ``skip_special_tokens=True``, as the vLLM judge decodes. No prefix cache (``cached_tokens`` 0). Used with
    ``--engine hf`` and as the independent reference of the vLLM judge's texts.

    Args:
        config: as :class:`~rmserve.server.engine.VLLMJudgeEngine` (``dtype``,
            ``max_model_len`` — default the model's ``max_position_embeddings`` — and
            ``chat_template``, ``judge_max_tokens``, ``protocol``, ``compat``).

    Attributes:
        max_tokens: generated tokens per call at most (``config.judge_max_tokens``).
    """

    kind = "hf"
    label = "transformers judge engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self.max_tokens = int(config.judge_max_tokens)
        self._lock = asyncio.Lock()

    async def start(self) -> LoadedModel:
        """Load tokenizer and causal LM in a worker thread; a second call returns the same record.

        Raises:
            ServerFault: no LM head (field ``model``), no chat template (field
                ``chat_template``, with the fix), or loading failed.
        """
        if self._loaded is not None:
            return self._loaded.record
        started = time.perf_counter()
        return self._finish_start(await asyncio.to_thread(self._build), started, log, "ready")

    def _build(self) -> _JudgeLoaded:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config
        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_lm_head(cfg.model, "model", kind="judge")
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"model: cannot load the tokenizer of {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        template = judge_chat_template(tokenizer, cfg.chat_template, cfg.model)
        try:
            model = AutoModelForCausalLM.from_pretrained(cfg.model, **_dtype_kwargs(dtype))
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"model: transformers could not load {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        model = model.to(device).eval()
        model_limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        context = cfg.max_model_len or model_limit
        if not context:
            raise ServerFault(f"{cfg.model!r} declares no max_position_embeddings; pass --max-model-len")
        if model_limit and context > model_limit:
            raise ServerFault(f"max_model_len={context} exceeds the model's max_position_embeddings={model_limit}")
        stop_ids = judge_stop_ids(tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None))
        if not stop_ids:
            raise ServerFault(f"{cfg.model!r} has no EOS token: a judge's generation could not stop before max_tokens")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        renderer = JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=context - 1)
        info = self._model_info(cfg.name, cfg.model, template, context - 1, dtype)
        info = msgspec.structs.replace(info, kind="judge", mode=cfg.protocol, compat=cfg.compat)
        return _JudgeLoaded(
            model=model, device=device, renderer=renderer, stop_ids=stop_ids, pad_id=int(pad),
            context_tokens=context, record=LoadedModel(info, None, local_checkpoint(cfg.model)),
        )

    async def shutdown(self) -> None:
        """Drop the model; idempotent."""
        self._closing = True
        self._loaded = None

    def info(self) -> ModelInfo:
        """Name, longest prompt (``max_model_len`` less one), dtype, checkpoint fingerprint,
        ``engine="hf"``, ``kind="judge"``, ``mode`` = the protocol choice, ``compat``;
        EngineNotReady before start."""
        return self._require().info

    async def judge_group(
        self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0
    ) -> list[JudgeOutput]:
        """Generate one output per call, one call after the other (see the class doc).

        ``priority`` is accepted and ignored (groups run in the order they arrive).

        ``request_id`` is only used in error messages: a generation in progress cannot be
        aborted; a cancelled caller simply does not wait for it.

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: as :meth:`VLLMJudgeEngine.judge_group
                <rmserve.server.engine.VLLMJudgeEngine.judge_group>`.
            EngineError: generation failed.
        """
        loaded = self._require()
        prompts = await asyncio.to_thread(loaded.renderer.render, calls)
        async with self._lock:
            loaded = self._require()
            try:
                return await asyncio.to_thread(self._generate_all, loaded, prompts)
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"generation failed for {request_id}: {type(exc).__name__}: {exc}") from exc

    def _generate_all(self, loaded: _JudgeLoaded, prompts: Sequence[Sequence[int]]) -> list[JudgeOutput]:
        return [
            greedy_generate(
                loaded.model, loaded.renderer, ids, max_tokens=self.max_tokens,
                context_tokens=loaded.context_tokens, stop_ids=loaded.stop_ids, pad_id=loaded.pad_id,
                device=loaded.device,
            )
            for ids in prompts
        ]


def greedy_generate(
    model: Any, renderer: JudgeRenderer, ids: Sequence[int], *, max_tokens: int, context_tokens: int,
    stop_ids: Sequence[int], pad_id: int, device: torch.device,
) -> JudgeOutput:
    """One greedy transformers generation of the prompt ``ids`` (no padding, batch of one).

    Returns:
        The :class:`~rmserve.server.judge_protocols.JudgeOutput`: text
        (:meth:`JudgeRenderer.decode <rmserve.server.judge_render.JudgeRenderer.decode>`), prompt and generated token counts (a final stop token
        included), ``finish_reason`` (:func:`~rmserve.server.judge_render.finish_reason`),
        ``cached_tokens`` 0.
    """
    from transformers import GenerationConfig

    limit = max_new_tokens(len(ids), max_tokens, context_tokens)
    config = GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=limit, eos_token_id=list(stop_ids), pad_token_id=pad_id
    )
    input_ids = torch.as_tensor([list(ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    generated = out[0, len(ids):].tolist()
    return JudgeOutput(
        text=renderer.decode(generated),
        prompt_tokens=len(ids),
        completion_tokens=len(generated),
        finish_reason=finish_reason(generated, set(stop_ids), limit),
        cached_tokens=0,
    )
