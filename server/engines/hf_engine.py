"""The transformers engines: a reference and fallback for the vLLM ones.

:class:`HFEngine` loads ``AutoModelForSequenceClassification`` (an ``lm-logit`` head:
``AutoModelForCausalLM``) and scores sequences in right-padded batches taken across the groups
in flight, each the oldest waiting sequence and those of the nearest lengths
(:class:`~rmserve.server.engines.batching.CrossGroupBatcher`). The reward is
read (:func:`~rmserve.server.kinds.heads.read_reward`) from the score head applied to the hidden
state at each sequence's last real token, found from the attention mask
(``position = mask.sum(-1) - 1``) — never by looking for the pad id, which breaks when
pad == EOS; for an ``lm-logit`` head the "score head" is the LM head, read at the head's token
id (the model's own logit there). ``info().attention`` is the model config's
``_attn_implementation`` (``sdpa``, ``eager`` …; ``eager`` for a model whose attention scores are
soft-capped, Gemma 2: :func:`attention_kwargs`). No activation is applied (raw logits), no prefix cache
(``num_cached_tokens = 0``). Forward passes run in a worker thread, one at a time, so the
event loop stays free. A checkpoint swap is :meth:`HFEngine.reload_weights` (same
architecture: the tokenizer and renderer are kept) or :meth:`HFEngine.restart` (any
checkpoint: everything is rebuilt).

:class:`HFLogprobEngine` is the :class:`~rmserve.server.engines.protocol.LogprobEngine` of a DPO
policy or reference (``AutoModelForCausalLM``), computed the reference harness's way
(allenai/reward-bench ``rewardbench/dpo.py``, ``concatenated_forward`` and
``get_batch_logps``): right-padded batches of ``hf_batch_size`` sequences, pad id = EOS (as
``scripts/run_dpo.py`` sets it), an attention mask, and for every answer token the
``log_softmax`` of the previous position's logits gathered at the token (in float32).

:class:`HFJudgeEngine` is the :class:`~rmserve.server.engines.protocol.JudgeEngine` of a generative
judge: ``AutoModelForCausalLM.generate`` with greedy decoding, one prompt at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import torch
from rmserve.server.engines.batching import CrossGroupBatcher, length_sorted_batches
from rmserve.server.engines.hf_heads import label_distribution_head, mlp_score_head, value_head_module
from rmserve.server.config import EngineConfig, check_lm_head, check_reward_head
from rmserve.server.kinds.judge_protocols import JudgeOutput
from rmserve.server.render.judge import (
    JudgeRenderer,
    enable_thinking,
    finish_reason,
    judge_chat_template,
    judge_lead_bos,
    judge_stop_ids,
    max_new_tokens,
)
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge_probe import check_chat_template
from rmserve.server.engines.lifecycle import EngineLifecycle, Loaded, LoadedT, OwnRenderer
from rmserve.server.engines.protocol import (
    AnswerLogprobs,
    LoadedModel,
    SequenceScore,
    check_answer_starts,
    check_token_ids,
    local_checkpoint,
)
from rmserve.server.render.chat import Renderer

from rmserve.server.kinds.heads import OBJECTIVES_EXTRA, read_reward

from rmserve.errors import EngineError, ServerFault, name_some
from rmserve.schema import (
    ATTENTION_UNKNOWN,
    CLASSIFIER_REWARD_HEAD,
    JUDGE_KIND,
    LM_LOGIT_HEAD,
    REMOTE_CODE_HEAD,
    MLP_VALUE_HEAD,
    VALUE_HEAD,
    LABEL_DISTRIBUTION_HEAD,
    JudgeEngineInfo,
    JudgeSampling,
    Message,
    RewardHead,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class _TorchLoaded(Loaded):
    """A transformers model on its device, the pad id of its batches, and its record."""

    model: Any
    device: torch.device
    pad_id: int


@dataclass(frozen=True, slots=True)
class _ClassifierLoaded(_TorchLoaded):
    """A reward model split into its base model and its score head (the ``score`` layer, or
    for an ``lm-logit`` head the LM head's column of the head's token), with the head read; a
    ``remote-code`` model is run whole (``base`` and ``head`` None: its own forward reads the
    reward)."""

    base: Any
    head: Any
    reward_head: RewardHead = CLASSIFIER_REWARD_HEAD


class TokenLogit:
    """The score head of an ``lm-logit`` reward: the model's LM head at one vocabulary id.

    ``TokenLogit(lm_head, t)(hidden)`` is ``lm_head(hidden)[:, t:t+1]``, shape (batch, 1): the
    model's own logit of token ``t`` (whatever the LM head computes, bias included).
    """

    def __init__(self, lm_head: Any, token_id: int) -> None:
        self.lm_head = lm_head
        self.token_id = int(token_id)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)[:, self.token_id : self.token_id + 1]


def attention_implementation(model: Any) -> str:
    """The attention implementation a transformers model runs: its config's
    ``_attn_implementation`` (``sdpa``, ``eager``, ``flash_attention_2`` …), else
    :data:`~rmserve.schema.ATTENTION_UNKNOWN`."""
    value = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return str(value) if isinstance(value, str) and value else ATTENTION_UNKNOWN


SOFT_CAPPED_ATTENTION = "eager"
"""The transformers attention implementation of a model whose attention scores are soft-capped
(``attn_logit_softcapping`` in its config: Gemma 2). transformers' ``sdpa`` path leaves the cap
out (allenai/reward-bench issue #169: Gemma-2 RMs scored lower under SDPA); its ``eager`` path
applies ``cap · tanh(scores / cap)``, as the model was trained and as vLLM computes it."""


def attention_kwargs(path: str, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """The ``from_pretrained`` attention keyword for checkpoint ``path``: ``attn_implementation=
    "eager"`` (:data:`SOFT_CAPPED_ATTENTION`) when its config soft-caps attention scores, else
    none (transformers' default). A config that cannot be read gives none (the load reports it)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - from_pretrained raises it again, with its context
        return {}
    configs = [config, getattr(config, "text_config", None)]
    if any(getattr(c, "attn_logit_softcapping", None) for c in configs if c is not None):
        return {"attn_implementation": SOFT_CAPPED_ATTENTION}
    return {}


def from_pretrained_checked(loader: Any, path: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(path, **kwargs)``, refused when the checkpoint holds no tensor
    for some of the model's weights: transformers would initialise those at random (a score
    head under another name, an LM head a config says is not tied) and every reward read
    through them would be silently wrong. Weights tied to one the checkpoint holds are not
    missing. A model whose attention scores are soft-capped (Gemma 2) is loaded with the
    attention implementation that applies the cap (:func:`attention_kwargs`).

    Raises:
        ServerFault: transformers could not load ``path``, or weights are missing (naming up to
            five of them and their count).
    """
    if "attn_implementation" not in kwargs:
        kwargs.update(attention_kwargs(path, trust_remote_code=bool(kwargs.get("trust_remote_code"))))
    try:
        model, info = loader.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ServerFault(f"transformers could not load {path!r}: {type(exc).__name__}: {exc}") from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ServerFault(
            f"{path!r} holds no tensor for {len(missing)} weight(s) of {type(model).__name__} ({name_some(missing)}), which "
            "transformers would initialise at random; a checkpoint whose head is named otherwise needs the head that "
            "reads it (--head)"
        )
    return model


def load_reward_model(path: str, head: RewardHead, dtype: str, device: torch.device) -> tuple[Any, Any, Any]:
    """Load the model of a reward head: ``(model, base, score head)``.

    ``classifier`` and ``multi-label``: ``AutoModelForSequenceClassification`` and its
    ``score`` layer; ``lm-logit``: ``AutoModelForCausalLM`` and :class:`TokenLogit` of its
    output embeddings (the LM head). ``base`` is the decoder (``model.<base_model_prefix>``).

    ``remote-code``: the checkpoint's own ``AutoModelForSequenceClassification`` class
    (``trust_remote_code=True``; the head was resolved only because the server trusts remote
    code), returned as ``(model, None, None)``: it is run whole (:func:`model_output_rewards`).

    ``mlp-value``: the decoder alone (``AutoModel``, the checkpoint's ``model.*`` tensors) and
    the MLP of its ``score.0`` / ``score.2`` tensors (:func:`~rmserve.server.engines.hf_heads.mlp_score_head`); ``model`` is the
    decoder. ``value-head``: the same, the head from its ``v_head.summary`` tensors
    (:func:`~rmserve.server.engines.hf_heads.value_head_module`). ``label-distribution``: the same,
    the head from the files beside the decoder
    (:func:`~rmserve.server.engines.hf_heads.label_distribution_head`).

    Raises:
        ServerFault: transformers could not load ``path``, the checkpoint lacks some of the
            model's weights (:func:`from_pretrained_checked`), or the model has no such head over
            a base model (the transformers engine supports Llama/Qwen/Mistral/Gemma-style models).
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    if head.name in (MLP_VALUE_HEAD, VALUE_HEAD):
        base = from_pretrained_checked(AutoModel, path, **_dtype_kwargs(dtype)).to(device).eval()
        build = mlp_score_head if head.name == MLP_VALUE_HEAD else value_head_module
        score = build(path, int(base.config.hidden_size), device, next(base.parameters()).dtype)
        return base, base, score
    if head.name == LABEL_DISTRIBUTION_HEAD:
        base = from_pretrained_checked(AutoModel, path, **_dtype_kwargs(dtype)).to(device).eval()
        from transformers import PretrainedConfig

        raw, _ = PretrainedConfig.get_config_dict(path)  # config.json as written: transformers moves temperature away
        score = label_distribution_head(path, int(base.config.hidden_size), raw, device)
        return base, base, score
    loader = AutoModelForCausalLM if head.name == LM_LOGIT_HEAD else AutoModelForSequenceClassification
    remote = head.name == REMOTE_CODE_HEAD
    model = from_pretrained_checked(loader, path, **_dtype_kwargs(dtype), **({"trust_remote_code": True} if remote else {}))
    model = model.to(device).eval()
    if remote:
        log.warning("running the modeling code of %r (--trust-remote-code): %s", path, type(model).__module__)
        return model, None, None
    base = getattr(model, model.base_model_prefix, None)
    if head.name == LM_LOGIT_HEAD:
        lm_head = model.get_output_embeddings()
        score = None if lm_head is None else TokenLogit(lm_head, int(head.token_id or 0))
        what = "an LM head"
    else:
        score = getattr(model, "score", None)
        what = "a 'score' head"
    if score is None or base is None:
        raise ServerFault(
            f"{path!r} ({type(model).__name__}) has no {what} over a base model; "
            "the transformers engine supports Llama/Qwen/Mistral/Gemma-style models"
        )
    return model, base, score


class _TorchLifecycle(EngineLifecycle[LoadedT]):
    """What the transformers engines share: the settings, one forward pass at a time (the
    lock a swap holds too), and loading in a worker thread after freeing the memory of a
    released model."""

    kind = "hf"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config

    async def _load(self) -> LoadedT:
        """:meth:`_build` in a worker thread, after :func:`_free_memory` (a restart's old model
        is released before the new one loads: one model in accelerator memory at a time)."""
        return await asyncio.to_thread(_free_memory_then, self._build)

    def _build(self) -> LoadedT:  # pragma: no cover - abstract
        """Load the configured checkpoint (blocking)."""
        raise NotImplementedError

    def _use_checkpoint(self, folder: Path) -> None:
        """A restart loads ``folder``: this engine's config with only ``model`` replaced."""
        self.config = dataclasses.replace(self.config, model=str(folder))

    async def reset_prefix_cache(self) -> bool:
        """No prefix cache here: nothing to drop; True."""
        return True


def _free_memory_then(build: Any) -> Any:
    """Free the memory of released models (garbage, CUDA cache), then ``build()``."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return build()


def _reload_failed(exc: BaseException) -> EngineError:
    """The :class:`EngineError` of a weight reload that raised ``exc`` (the loaded model stays)."""
    reason = exc.message if isinstance(exc, ServerFault) else f"{type(exc).__name__}: {exc}"
    return EngineError(f"reloading weights failed: {reason}")


_RELOAD_ERRORS = (OSError, RuntimeError, ValueError, ServerFault)
"""What a failed transformers load raises; a reload turns them into :class:`EngineError`."""


class HFEngine(_TorchLifecycle[_ClassifierLoaded], OwnRenderer):
    """:class:`~rmserve.server.engines.protocol.RewardEngine` backed by transformers.

    Start, shutdown and restart are :class:`~rmserve.server.engines.lifecycle.EngineLifecycle`'s:
    a restart drops the model and loads any checkpoint (new renderer, ``max_model_len`` — a
    configured one is kept, else the new model's ``max_position_embeddings`` — and
    fingerprint); :meth:`reload_weights` keeps the tokenizer and renderer.

    Args:
        config: model path, ``dtype`` (``auto`` = bfloat16 on CUDA, float32 on CPU),
            ``max_model_len`` (default: the model's ``max_position_embeddings``),
            ``chat_template`` and ``hf_batch_size`` (sequences per forward pass).

    Attributes (after :meth:`start`):
        renderer: the :class:`Renderer` for this model (the one in :meth:`start`'s record).
        config: the settings; after :meth:`restart` its ``model`` is the checkpoint last started.
    """

    label = "transformers engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._batcher: CrossGroupBatcher[SequenceScore] = CrossGroupBatcher(
            self._score_batch, max_batch_size=config.hf_batch_size,
            error=lambda request_id, exc: EngineError(
                f"forward pass failed for {request_id}: {type(exc).__name__}: {exc}"),
        )
        self._open = asyncio.Event()  # cleared while a checkpoint swap waits for the batches in flight
        self._open.set()

    def _build(self) -> _ClassifierLoaded:
        """Load model and tokenizer.

        Raises:
            ServerFault: no head rmserve serves under the head settings
                (:func:`~rmserve.server.config.check_reward_head`), no such head over a base
                model, or loading failed.
        """
        cfg = self.config
        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        reward_head = check_reward_head(cfg.model, cfg.head_settings, self.kind)
        model, base, head = load_reward_model(cfg.model, reward_head, dtype, device)
        max_model_len = _context_limit(model, cfg)
        renderer = Renderer.from_pretrained(cfg.model, max_model_len=max_model_len, chat_template_path=cfg.chat_template,
                                            trust_remote_code=cfg.trust_remote_code)
        pad_id = model.config.pad_token_id
        info = self._model_info(cfg.name, cfg.model, renderer, max_model_len, dtype, head=reward_head,
                                attention=attention_implementation(model))
        return _ClassifierLoaded(
            record=LoadedModel(info, renderer, local_checkpoint(cfg.model)),
            model=model, device=device, pad_id=int(pad_id) if pad_id is not None else 0, base=base, head=head,
            reward_head=reward_head,
        )

    async def score_group(
        self,
        token_ids: Sequence[Sequence[int]],
        request_id: str,
        *,
        answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        """Score one group's sequences (the head's reward read from the raw logits,
        :func:`~rmserve.server.kinds.heads.read_reward`; ``num_cached_tokens`` is always 0).

        The sequences join the queue of every group in flight
        (:class:`~rmserve.server.engines.batching.CrossGroupBatcher`): each forward pass takes the
        oldest waiting sequence and those of the nearest lengths, up to ``hf_batch_size``, whatever
        their group, so batches hold little padding. All of a group's sequences run on the model
        loaded when it arrived: a checkpoint swap waits until every queued sequence is scored, and
        a group arriving during the swap waits for it.

        ``priority`` is accepted and ignored (sequences run oldest first), and so is
        ``answer_starts`` (a classifier scores the whole sequence; part of the one
        :meth:`~rmserve.server.engines.protocol.RewardEngine.score_group` signature).

        ``request_id`` is only used in error messages: a forward pass in progress cannot
        be aborted; a cancelled caller's sequences not yet in a forward pass are dropped.

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: an empty or over-long sequence.
            EngineError: the forward pass failed for one of the group's sequences (run alone
                after a failed batch, so another group's sequence cannot fail this group).
        """
        loaded = self._require()
        limit = loaded.info.max_model_len
        check_token_ids(token_ids, limit)
        await self._open.wait()
        loaded = self._require()  # a checkpoint swap may have replaced the model meanwhile
        futures = self._batcher.submit(loaded, token_ids, request_id)
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for future in futures:  # one failed or the caller went away: drop what has not run
                future.cancel()

    @property
    def forward_passes(self) -> int:
        """Forward passes run so far (batches, a failed batch's one-sequence reruns included)."""
        return self._batcher.batches

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """A reload or restart: new groups wait while every queued sequence is scored on the
        model it was queued for, then the swap runs alone."""
        async with self._lock:
            self._open.clear()
            try:
                await self._batcher.idle()
                yield
            finally:
                self._open.set()

    def _score_batch(self, loaded: _ClassifierLoaded, token_ids: list[Sequence[int]]) -> list[SequenceScore]:
        """One forward pass over a batch of sequences (any groups), right-padded; blocking.

        A ``remote-code`` model runs whole (:func:`model_output_rewards`: its objectives become
        extras); any other head reads the decoder's last real position through the head
        (:func:`last_token_rewards`)."""
        with torch.inference_mode():
            if loaded.base is None:
                outputs = model_output_rewards(loaded.model, token_ids, pad_id=loaded.pad_id, device=loaded.device)
                return [SequenceScore(reward=reward, num_cached_tokens=0, extras=extras) for reward, extras in outputs]
            rewards = last_token_rewards(loaded.base, loaded.head, token_ids, pad_id=loaded.pad_id, device=loaded.device,
                                         read=lambda values: read_reward(loaded.reward_head, values))
        return [SequenceScore(reward=r, num_cached_tokens=0) for r in rewards]

    async def _reload(self, loaded: _ClassifierLoaded, folder: Path) -> _ClassifierLoaded:
        """Load the classifier in ``folder`` in a worker thread (after the forward pass in
        progress); the renderer (same tokenizer) is kept, the fingerprint recomputed.

        Raises:
            EngineError: the checkpoint could not be loaded, or its head (under this engine's
                head settings) is not the served one.
        """
        try:
            return await asyncio.to_thread(self._load_classifier, loaded, str(folder))
        except _RELOAD_ERRORS as exc:
            raise _reload_failed(exc) from exc

    def _load_classifier(self, loaded: _ClassifierLoaded, path: str) -> _ClassifierLoaded:
        dtype = loaded.info.dtype
        reward_head = check_reward_head(path, self.config.head_settings, self.kind)
        if reward_head != loaded.reward_head:
            raise ValueError(
                f"checkpoint has the {reward_head.describe()} head, the served model the "
                f"{loaded.reward_head.describe()} head"
            )
        model, base, head = load_reward_model(path, reward_head, dtype, loaded.device)
        info = self._model_info(loaded.info.name, path, loaded.renderer, loaded.info.max_model_len, dtype,
                                head=reward_head, attention=attention_implementation(model))
        return _ClassifierLoaded(
            record=LoadedModel(info, loaded.renderer, local_checkpoint(path)),
            model=model, device=loaded.device, pad_id=loaded.pad_id, base=base, head=head, reward_head=reward_head,
        )


def _context_limit(model: Any, cfg: EngineConfig) -> int:
    """The context length in tokens: ``cfg.max_model_len``, else the model's ``max_position_embeddings``.

    Raises:
        ServerFault: neither is set, or the configured length exceeds the model's.
    """
    model_limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    max_model_len = cfg.max_model_len or model_limit
    if not max_model_len:
        raise ServerFault(f"{cfg.model!r} declares no max_position_embeddings; pass --max-model-len")
    if model_limit and max_model_len > model_limit:
        raise ServerFault(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={model_limit}")
    return max_model_len


def _dtype_kwargs(dtype: str) -> dict[str, Any]:
    """``from_pretrained`` dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: _DTYPES[dtype]}


def right_padded(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of token-id lists (lengths ≥ 1) right-padded with ``pad_id``.

    Returns:
        ``(input_ids, attention_mask)``, both ``long`` of shape (batch, longest length), on the
        CPU; the mask is 1 at real tokens and 0 at padding.
    """
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, ids in enumerate(sequences):
        input_ids[b, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        attention_mask[b, : len(ids)] = 1
    return input_ids, attention_mask


def last_token_rewards(
    base: Any, head: Any, sequences: Sequence[Sequence[int]], *, pad_id: int, device: torch.device,
    read: Callable[[Sequence[float]], float] | None = None,
) -> list[float]:
    """Score a batch: right-pad, run ``base``, apply ``head`` at each last real token.

    Args:
        base: the decoder (``model.model`` for Llama), returning ``last_hidden_state``
            of shape (batch, seq, hidden).
        head: the score head, hidden → k values (k = 1 without ``read``).
        sequences: token-id lists (any lengths ≥ 1).
        pad_id: filler id for padding (masked out; its value does not matter).
        read: the reward of one sequence from its k head values (a reward head's
            :func:`~rmserve.server.kinds.heads.read_reward`); None: the one value itself.

    Returns:
        One float per sequence: ``read(head(hidden[b, mask[b].sum() - 1]))``.
    """
    input_ids, attention_mask = right_padded(sequences, pad_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    last = attention_mask.sum(dim=-1) - 1
    pooled = hidden[torch.arange(hidden.shape[0], device=device), last]
    values = head(pooled).float()
    if read is None:
        return values.reshape(-1).tolist()
    return [read(row) for row in values.reshape(values.shape[0], -1).tolist()]


def model_output_rewards(
    model: Any, sequences: Sequence[Sequence[int]], *, pad_id: int, device: torch.device,
) -> list[tuple[float, dict[str, float]]]:
    """Score a batch with a model's own forward (the ``remote-code`` head): right-pad with
    ``pad_id`` (the config's ``pad_token_id``, which a model's own code may look for to find
    each sequence's end) and pass the attention mask, then read its output.

    The reward is the output's ``score`` when it has one (a gated multi-objective model:
    ArmoRM-Llama3-8B-v0.1's card reads ``output.score``), else its ``logits`` (a value head's
    one logit), else its first element (a tuple output); either must hold one value per
    sequence. The output's ``rewards`` (one column per objective), when present, become the
    extras :data:`~rmserve.server.kinds.heads.OBJECTIVES_EXTRA` (``objective_0``, …).

    Args:
        model: the checkpoint's own classifier (``trust_remote_code``), called as
            ``model(input_ids=…, attention_mask=…)``.
        sequences: token-id lists (any lengths ≥ 1).
        pad_id: filler id of the padding.
        device: where the model runs.

    Returns:
        One ``(reward, extras)`` per sequence, input order.

    Raises:
        ValueError: the output has no score or logits, or not one value per sequence (naming
            the shape).
    """
    input_ids, attention_mask = right_padded(sequences, pad_id)
    out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
    if isinstance(out, (tuple, list)):
        values, objectives, what = out[0], None, "output[0]"
    else:
        score = getattr(out, "score", None)
        values, what = (score, "score") if score is not None else (getattr(out, "logits", None), "logits")
        objectives = getattr(out, "rewards", None)
    if not isinstance(values, torch.Tensor):
        raise ValueError(f"the model's output ({type(out).__name__}) has no score or logits tensor to read the reward from")
    batch = len(sequences)
    values = values.float()
    if values.numel() != batch:
        raise ValueError(
            f"the model's {what} has shape {tuple(values.shape)} for {batch} sequences; the remote-code head reads "
            "one value per sequence"
        )
    rewards = values.reshape(batch).tolist()
    columns: list[list[float]] = []
    if isinstance(objectives, torch.Tensor) and objectives.dim() == 2 and objectives.shape[0] == batch:
        columns = objectives.float().tolist()
    return [
        (reward, {OBJECTIVES_EXTRA.format(index=k): v for k, v in enumerate(columns[b])} if columns else {})
        for b, reward in enumerate(rewards)
    ]


def in_length_sorted_batches(
    sequences: Sequence[Sequence[int]],
    score_batch: Callable[[list[int]], Sequence[T]],
    *,
    max_batch_size: int,
    max_batch_tokens: int = sys.maxsize,
) -> list[T]:
    """One value per sequence, in input order, computed in :func:`length_sorted_batches`.

    ``score_batch(indices)`` gets the input positions of one batch (longest first) and returns
    one value per position, in that order; it runs under ``torch.inference_mode()``.

    Raises:
        ValueError: ``score_batch`` returned another number of values than the batch holds.
    """
    values: list[Any] = [None] * len(sequences)
    batches = length_sorted_batches(
        [len(s) for s in sequences], max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size
    )
    with torch.inference_mode():
        for batch in batches:
            for j, value in zip(batch, score_batch(batch), strict=True):
                values[j] = value
    return values


def length_sorted_rewards(
    base: Any,
    head: Any,
    sequences: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: torch.device,
    max_batch_tokens: int,
    max_batch_size: int,
    read: Callable[[Sequence[float]], float] | None = None,
) -> list[float]:
    """Rewards of many sequences (any groups) through :func:`length_sorted_batches`.

    Each batch goes through :func:`last_token_rewards` (with ``read``); the result is in input order.
    """
    return in_length_sorted_batches(
        sequences,
        lambda batch: last_token_rewards(base, head, [sequences[j] for j in batch], pad_id=pad_id, device=device,
                                         read=read),
        max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
    )


# --- log-probabilities of a causal LM (DPO policy / reference) ---------------------------


class HFLogprobEngine(_TorchLifecycle[_TorchLoaded]):
    """:class:`~rmserve.server.engines.protocol.LogprobEngine` backed by transformers ``AutoModelForCausalLM``.

    Args:
        config: the engine settings (``dtype``, ``max_model_len``, ``chat_template``,
            ``hf_batch_size``); ``config.model`` is the policy.
        model: the folder or hub id to load (``config.model`` or ``config.ref_model``).

    No prefix cache (``num_cached_tokens`` is 0). Forward passes run one at a time in a
    worker thread. The record's ``renderer`` is None (the DPO engine renders); the
    fingerprint hashes the chat template a DPO renderer would use (``chat_template`` file,
    else the tokenizer's). A reload or restart loads the causal LM of a folder (released
    first for a restart: one model in memory at a time).

    Attributes:
        model: the checkpoint loaded (after a reload or restart, the last one).
    """

    label = "transformers log-prob engine"

    def __init__(self, config: EngineConfig, model: str) -> None:
        super().__init__(config)
        self.model = model
        self._field = "model" if model == config.model else "ref_model"

    def _build(self) -> _TorchLoaded:
        return self._load_lm(self.model)

    def _load_lm(self, model_path: str) -> _TorchLoaded:
        """Load the causal LM at ``model_path``.

        Raises:
            ServerFault: no LM head (field ``model`` / ``ref_model``), or loading failed.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config
        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_lm_head(model_path, self._field)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = from_pretrained_checked(AutoModelForCausalLM, model_path, **_dtype_kwargs(dtype))
        except ServerFault as exc:
            raise ServerFault(f"{self._field}: {exc}") from exc
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
        info = self._model_info(name, model_path, template, max_model_len, dtype,
                                attention=attention_implementation(model))
        return _TorchLoaded(record=LoadedModel(info, None, local_checkpoint(model_path)),
                            model=model, device=device, pad_id=int(pad_id))

    def _use_checkpoint(self, folder: Path) -> None:
        self.model = str(folder)

    async def _reload(self, loaded: _TorchLoaded, folder: Path) -> _TorchLoaded:
        """Load the causal LM in ``folder`` beside the loaded one (after the forward pass in
        progress), then serve it.

        Raises:
            EngineError: the checkpoint could not be loaded or has no LM head.
        """
        try:
            reloaded = await asyncio.to_thread(self._load_lm, str(folder))
        except _RELOAD_ERRORS as exc:
            raise _reload_failed(exc) from exc
        self.model = str(folder)
        return reloaded

    async def answer_logprobs(
        self, token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int], request_id: str, *, priority: int = 0
    ) -> list[AnswerLogprobs]:
        """Per-token log-probabilities of each sequence's answer tokens (see the class doc).

        ``priority`` is accepted and ignored (groups run in the order they arrive), and so is
        ``answer_starts`` (a classifier scores the whole sequence; part of the one
        :meth:`~rmserve.server.engines.protocol.RewardEngine.score_group` signature).

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: an empty or over-long sequence, or an answer
                start outside ``[1, len]`` (field ``answer_starts[j]``).
            EngineError: the forward pass failed.
        """
        loaded = self._require()
        check_token_ids(token_ids, loaded.info.max_model_len)
        check_answer_starts(token_ids, answer_starts)
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
    input_ids, attention_mask = right_padded(sequences, pad_id)
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
    return in_length_sorted_batches(
        sequences,
        lambda batch: answer_logprobs_batch(model, [sequences[j] for j in batch], [answer_starts[j] for j in batch],
                                            pad_id=pad_id, device=device),
        max_batch_size=max_batch_size,
    )


# --- a generative judge (LLM-as-judge) ------------------------------------------------------


HF_BATCH_INVARIANT = (
    "each call is generated alone (a batch of one, no padding), so its text does not depend on the calls beside it"
)
"""``JudgeEngineInfo.batch_invariant_note`` of the transformers judge engine."""


@dataclass(frozen=True, slots=True)
class _JudgeLoaded(_TorchLoaded):
    """A causal LM with its judge renderer, stop tokens and context length (its record has no
    classifier renderer)."""

    judge: JudgeRenderer
    stop_ids: tuple[int, ...]
    context_tokens: int


class HFJudgeEngine(_TorchLifecycle[_JudgeLoaded]):
    """:class:`~rmserve.server.engines.protocol.JudgeEngine` backed by transformers ``generate``.

    The plain transformers way of generating, one prompt at a time: each call rendered as the
    vLLM judge renders it (:class:`~rmserve.server.render.judge.JudgeRenderer`), then
    ``model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=n)`` with an all-ones
    attention mask and a fresh ``GenerationConfig`` (so no sampling default of the checkpoint's
    ``generation_config.json`` applies; vLLM ignores them too for explicit sampling
    parameters). Stop tokens: the tokenizer's EOS and the ``eos_token_id`` (one or a list) of
    the checkpoint's generation config, as vLLM stops. ``n`` is ``max_tokens``, or fewer when
    the context ends first (:func:`~rmserve.server.render.judge.max_new_tokens`): the same cut
    vLLM makes, ``finish_reason="length"``. The text is the generated tokens decoded in one
    piece with ``skip_special_tokens=True``, as the vLLM judge decodes. No prefix cache (``cached_tokens`` 0). Used with
    ``--engine hf`` and as the independent reference of the vLLM judge's texts.

    Args:
        config: as :class:`~rmserve.server.engines.vllm_engine.VLLMJudgeEngine` (``dtype``,
            ``max_model_len`` — default the model's ``max_position_embeddings`` — and
            ``chat_template``, ``judge_max_tokens``, ``judge_thinking`` (passed to the template
            as ``enable_thinking`` when set), ``protocol``, ``compat``).

    A restart or reload loads the judge in a folder with this engine's settings otherwise
    (a generative judge is not swapped by the server; the HTTP layer refuses it). Every load
    first renders the conversations the protocol choice sends with the chat template
    (:func:`~rmserve.server.kinds.judge_probe.check_chat_template`), before the weights are read.

    :meth:`info` publishes :attr:`sampling` and ``judge_engine``: ``hf``, the transformers
    version, batch-invariant (each call is generated alone, a batch of one without padding, so
    its text does not depend on the calls beside it).

    Attributes:
        max_tokens: generated tokens per call at most (``config.judge_max_tokens``).
        sampling: how every call is decoded (greedy, at most ``max_tokens`` tokens).
    """

    label = "transformers judge engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.max_tokens = int(config.judge_max_tokens)
        self.sampling = JudgeSampling(max_tokens=self.max_tokens)

    def _build(self) -> _JudgeLoaded:
        return self._load_judge(self.config)

    async def _reload(self, loaded: _JudgeLoaded, folder: Path) -> _JudgeLoaded:
        """Load the judge in ``folder`` beside the loaded one, then serve it.

        Raises:
            EngineError: the checkpoint could not be loaded, or is not a judge.
        """
        config = dataclasses.replace(self.config, model=str(folder))
        try:
            reloaded = await asyncio.to_thread(self._load_judge, config)
        except _RELOAD_ERRORS as exc:
            raise _reload_failed(exc) from exc
        self.config = config
        return reloaded

    def _load_judge(self, cfg: EngineConfig) -> _JudgeLoaded:
        """Load tokenizer and causal LM of ``cfg.model``.

        Raises:
            ServerFault: no LM head (field ``model``), no chat template (field
                ``chat_template``, with the fix), a template that refuses the judge's calls
                (:func:`~rmserve.server.kinds.judge_probe.check_chat_template`), or loading failed.
        """
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = cfg.resolved_dtype()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_lm_head(cfg.model, "model", kind=JUDGE_KIND)
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"model: cannot load the tokenizer of {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        template = judge_chat_template(tokenizer, cfg.chat_template, cfg.model)
        # The probe renders text only; the prompt limit (the model's context) applies to token ids.
        probe = JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=1,
                              enable_thinking=enable_thinking(cfg.judge_thinking))
        check_chat_template(probe.render_text, JudgeSettings.from_engine_config(cfg), model=cfg.model)
        try:
            model = from_pretrained_checked(AutoModelForCausalLM, cfg.model, **_dtype_kwargs(dtype))
        except ServerFault as exc:
            raise ServerFault(f"model: {exc}") from exc
        model = model.to(device).eval()
        context = _context_limit(model, cfg)
        stop_ids = judge_stop_ids(tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None))
        if not stop_ids:
            raise ServerFault(f"{cfg.model!r} has no EOS token: a judge's generation could not stop before max_tokens")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        renderer = JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=context - 1,
                                 enable_thinking=enable_thinking(cfg.judge_thinking), lead_bos=judge_lead_bos(tokenizer, cfg))
        info = self._model_info(cfg.name, cfg.model, template, context - 1, dtype,
                                attention=attention_implementation(model))
        info = msgspec.structs.replace(
            info, kind=JUDGE_KIND, mode=cfg.protocol, compat=cfg.compat, judge_sampling=self.sampling,
            judge_engine=JudgeEngineInfo(self.kind, str(transformers.__version__), True, HF_BATCH_INVARIANT),
        )
        return _JudgeLoaded(
            record=LoadedModel(info, None, local_checkpoint(cfg.model)), model=model, device=device,
            pad_id=int(pad), judge=renderer, stop_ids=stop_ids, context_tokens=context,
        )

    async def judge_group(
        self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0
    ) -> list[JudgeOutput]:
        """Generate one output per call, one call after the other (see the class doc).

        ``priority`` is accepted and ignored (groups run in the order they arrive), and so is
        ``answer_starts`` (a classifier scores the whole sequence; part of the one
        :meth:`~rmserve.server.engines.protocol.RewardEngine.score_group` signature).

        ``request_id`` is only used in error messages: a generation in progress cannot be
        aborted; a cancelled caller simply does not wait for it.

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: as :meth:`VLLMJudgeEngine.judge_group
                <rmserve.server.engines.vllm_engine.VLLMJudgeEngine.judge_group>`.
            EngineError: generation failed.
        """
        loaded = self._require()
        prompts, opened = await asyncio.to_thread(loaded.judge.render_calls, calls)
        async with self._lock:
            loaded = self._require()
            try:
                outputs = await asyncio.to_thread(self._generate_all, loaded, prompts)
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"generation failed for {request_id}: {type(exc).__name__}: {exc}") from exc
        return [dataclasses.replace(o, reasoning_open=True) if open_ else o for o, open_ in zip(outputs, opened, strict=True)]

    def _generate_all(self, loaded: _JudgeLoaded, prompts: Sequence[Sequence[int]]) -> list[JudgeOutput]:
        return [
            greedy_generate(
                loaded.model, loaded.judge, ids, max_tokens=self.max_tokens,
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
        The :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput`: text
        (:meth:`JudgeRenderer.decode <rmserve.server.render.judge.JudgeRenderer.decode>`), prompt and generated token counts (a final stop token
        included), ``finish_reason`` (:func:`~rmserve.server.render.judge.finish_reason`),
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
