"""The DPO engine: a DPO-trained policy served as a reward model by its implicit reward.

:class:`DPOEngine` is a :class:`~rmserve.server.engines.protocol.RewardEngine` built from one or two
:class:`~rmserve.server.engines.protocol.LogprobEngine` s (``backends.LOGPROB_ENGINES[config.engine]``, passed in by
:func:`~rmserve.server.engines.registry.build_engine`):
the policy (``config.model``) and, in the reference mode, the reference (``config.ref_model``).
For every sequence of a group it asks both for the log-probabilities of the answer tokens
(from :class:`~rmserve.server.render.dpo.DPORenderer`'s ``answer_start`` on) and computes
(:func:`implicit_reward`; allenai/reward-bench ``rewardbench/dpo.py``,
``DPOInference.inference_step`` and ``get_batch_logps``):

- reference mode: ``Σ log π(answer) − Σ log π_ref(answer)`` (no β: a constant factor does
  not change any comparison);
- reference-free ``avg``: ``Σ log π / n``; ``sum``: ``Σ log π``; ``norm``:
  ``−‖(log π_1 … log π_n)‖₂``,

where ``n`` is the number of answer tokens (the appended EOS included). Every response also
carries the extras ``policy_logp`` (Σ policy), ``ref_logp`` (Σ reference; None without one),
``policy_logp_norm`` (‖policy per-token log-probs‖₂) and ``answer_tokens`` (``n``), so any
reference-free variant can be recomputed from a stored reply, and ``bos``: what its sequence
starts with (the renderer's :attr:`~rmserve.server.render.dpo.DPORenderer.bos_rule`:
``template``, ``bos-prepended (official)`` or ``eos-as-bos (official)``). A sequence without answer
tokens (``answer_start == len(ids)``; the renderer never produces one, since it always
appends EOS) gets a null reward and the ``no_answer_tokens`` error.

Start-up refuses, before any weight is loaded, a policy or reference without an LM head
(:func:`~rmserve.server.config.check_lm_head`, naming ``model`` / ``ref_model``) and a
reference whose tokenizer differs from the policy's (vocabulary and special token ids); both
engines then start concurrently. The fingerprint is
:func:`~rmserve.fingerprint.dpo_fingerprint` of each model's own
:func:`~rmserve.fingerprint.model_fingerprint` (with the chat template the renderer uses and
the engine's dtype), the reward mode and ``compat``.

Checkpoint swaps replace the policy only (the reference stays loaded): :meth:`DPOEngine.reload_weights`
(same shape and tokenizer) or :meth:`DPOEngine.restart` (any causal LM; the renderer is
rebuilt); :meth:`DPOEngine.check_checkpoint` refuses a folder that is not a causal LM or
(with a reference) whose vocabulary differs from the reference's, before any engine work.
No torch or vllm import here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmserve.errors import EngineError, InvalidCheckpoint, ServerFault
from rmserve.fingerprint import dpo_fingerprint, model_fingerprint
from rmserve.schema import DPO_KIND, ModelInfo, ResponseError
from rmserve.server.swaps.checkpoints import check_checkpoint as check_checkpoint_files
from rmserve.server.config import EngineConfig, check_lm_head
from rmserve.server.render.dpo import DPORenderer
from rmserve.server.engines.lifecycle import EngineLifecycle, Loaded
from rmserve.server.engines.parallel import split_cpus
from rmserve.server.engines.protocol import (
    AnswerLogprobs,
    LoadedModel,
    LogprobEngine,
    PrefixCacheStats,
    SequenceScore,
    SupportsPrefixCacheStats,
    check_answer_starts,
    check_token_ids,
    first_error,
    local_checkpoint,
)

log = logging.getLogger(__name__)

LogprobEngineFactory = Callable[[EngineConfig, str], LogprobEngine]
"""Builds a (not started) log-probability engine from the engine settings and a model."""

TokenizerLoader = Callable[[str], Any]
"""Loads the tokenizer of a model (folder or hub id)."""

SPECIAL_TOKEN_IDS: tuple[str, ...] = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
"""Special token ids a reference must share with its policy (besides the vocabulary)."""


def implicit_reward(policy: Sequence[float], reference: Sequence[float] | None, mode: str) -> float:
    """The DPO implicit reward of one response from its answer tokens' log-probabilities.

    Source: allenai/reward-bench ``rewardbench/dpo.py``: ``DPOInference.inference_step``
    (policy minus reference, no β) and ``get_batch_logps`` (the masked sum, its mean, or
    ``-torch.norm(per_token_logps * loss_mask, p=2)``).

    Args:
        policy: per answer token, ``log π(token | prefix)`` under the policy, nats (length n ≥ 1).
        reference: the same under the reference (length n), or None for a reference-free mode.
        mode: ``reference`` (``Σ policy − Σ reference``), ``avg`` (``Σ policy / n``), ``sum``
            (``Σ policy``) or ``norm`` (``−sqrt(Σ policy²)``).

    Returns:
        The reward, nats (a Python float).

    Raises:
        ValueError: an unknown mode, no answer token, a missing or extra reference, or
            lengths that differ.
    """
    n = len(policy)
    if n == 0:
        raise ValueError("policy: no answer token; the implicit reward is undefined")
    if (mode == "reference") != (reference is not None):
        raise ValueError(f"reference: mode {mode!r} {'needs' if mode == 'reference' else 'takes no'} reference log-probs")
    if mode == "reference":
        assert reference is not None
        if len(reference) != n:
            raise ValueError(f"reference: {len(reference)} log-probs for {n} answer tokens")
        return math.fsum(policy) - math.fsum(reference)
    if mode == "avg":
        return math.fsum(policy) / n
    if mode == "sum":
        return math.fsum(policy)
    if mode == "norm":
        return -math.sqrt(math.fsum(p * p for p in policy))
    raise ValueError(f"mode: {mode!r} is not one of reference, avg, sum, norm")


def score_sequence(
    policy: AnswerLogprobs, reference: AnswerLogprobs | None, mode: str, bos_rule: str
) -> SequenceScore:
    """One sequence's :class:`SequenceScore`: reward, the policy's cached tokens and the extras.

    Extras: ``policy_logp`` (Σ policy), ``ref_logp`` (Σ reference, None without one),
    ``policy_logp_norm`` (‖policy‖₂), ``answer_tokens`` (n) and ``bos`` (``bos_rule``, the
    renderer's BOS rule). With no answer token the reward is NaN with the
    ``no_answer_tokens`` error (the reply's reward is null), the sums 0.
    """
    logprobs = policy.logprobs
    extras = {
        "policy_logp": math.fsum(logprobs),
        "ref_logp": None if reference is None else math.fsum(reference.logprobs),
        "policy_logp_norm": math.sqrt(math.fsum(p * p for p in logprobs)),
        "answer_tokens": len(logprobs),
        "bos": bos_rule,
    }
    if not logprobs:
        error = ResponseError("no_answer_tokens", "the sequence has no answer token, so its implicit reward is undefined")
        return SequenceScore(math.nan, policy.num_cached_tokens, extras, error)
    reward = implicit_reward(logprobs, None if reference is None else reference.logprobs, mode)
    return SequenceScore(reward, policy.num_cached_tokens, extras)


def load_auto_tokenizer(model: str) -> Any:
    """``transformers.AutoTokenizer.from_pretrained(model)`` (imported here)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def tokenizer_difference(policy: Any, reference: Any) -> str | None:
    """The first difference between two tokenizers, or None when they agree.

    Compared: the special token ids of :data:`SPECIAL_TOKEN_IDS`, then the vocabulary
    (``get_vocab()``: token → id), its size first, then the first token (in sorted order)
    that is missing or has another id.
    """
    for name in SPECIAL_TOKEN_IDS:
        a, b = getattr(policy, name, None), getattr(reference, name, None)
        if a != b:
            return f"{name} is {a!r} in the policy and {b!r} in the reference"
    vocab_a, vocab_b = policy.get_vocab(), reference.get_vocab()
    if len(vocab_a) != len(vocab_b):
        return f"the vocabulary has {len(vocab_a):,} tokens in the policy and {len(vocab_b):,} in the reference"
    for token in sorted(vocab_a):
        if vocab_a[token] != vocab_b.get(token):
            return f"token {token!r} has id {vocab_a[token]} in the policy and {vocab_b.get(token)!r} in the reference"
    return None


def _model_name(model: str) -> str:
    path = Path(model)
    return path.name if path.is_dir() else model


@dataclass(frozen=True, slots=True)
class _DPOLoaded(Loaded):
    """The DPO record (its renderer a :class:`~rmserve.server.render.dpo.DPORenderer`) and the
    policy's tokenizer."""

    tokenizer: Any


def engine_shares(config: EngineConfig, cpus: Sequence[int] | None = None) -> tuple[EngineConfig, EngineConfig]:
    """The engine settings of the policy and of the reference engine of a reference-mode DPO
    server, so that both fit on one machine side by side.

    - Accelerator memory: half the memory fraction and half an explicit KV-cache size each
      (``gpu_memory_utilization`` is the fraction of the device one vLLM instance may use; two
      instances at the default 0.9 would ask for 180 %).
    - CPU build: when neither ``--cpu-threads-bind`` nor ``VLLM_CPU_OMP_THREADS_BIND`` is
      given, the usable CPUs (``cpus``; default this process's affinity) are split in two
      halves, the policy's compute threads on the first, the reference's on the second.
      Binding both engines to every CPU would run two thread teams on the same cores, and
      their spinning barriers slow both down. With one CPU both share it.

    Reference-free configs are returned unchanged (twice).
    """
    import os

    if config.ref_model is None:
        return config, config
    kv = config.kv_cache_memory_bytes
    half = dataclasses.replace(
        config,
        gpu_memory_utilization=config.gpu_memory_utilization / 2,
        kv_cache_memory_bytes=None if kv is None else max(kv // 2, 1 << 20),
    )
    if config.cpu_threads_bind is not None or os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return half, half
    usable = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    ranks = config.data_parallel_size * config.tensor_parallel_size
    if len(usable) < 2 * ranks:
        return half, half
    middle = len(usable) // 2
    first, second = usable[:middle], usable[middle:]
    return (  # one CPU list per rank of each engine (data × tensor parallel)
        dataclasses.replace(half, cpu_threads_bind=split_cpus(first, ranks)),
        dataclasses.replace(half, cpu_threads_bind=split_cpus(second, ranks)),
    )


def _accelerator_present() -> bool:
    """True when torch sees a CUDA device (torch imported here; False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class DPOEngine(EngineLifecycle[_DPOLoaded]):
    """:class:`~rmserve.server.engines.protocol.RewardEngine` scoring a DPO policy by its implicit reward.

    Also :class:`~rmserve.server.engines.protocol.SupportsWeightReload`,
    :class:`~rmserve.server.engines.protocol.SupportsRestart`,
    :class:`~rmserve.server.engines.protocol.SupportsPrefixCacheStats` and
    :class:`~rmserve.server.engines.protocol.SupportsCheckpointCheck`, each through the policy (and
    reference) engine's own method: a reload or restart on a policy engine without it raises
    :class:`~rmserve.errors.EngineError`; an engine without a prefix cache counts zeros.

    Build it with :func:`rmserve.server.engines.registry.build_engine`, which passes the class
    ``LOGPROB_ENGINES[config.engine]`` as ``logprob_engine``.

    Args:
        config: a ``kind="dpo"`` config (``model``, ``ref_model`` or ``ref_free``, ``compat``,
            ``engine``, ``chat_template`` …).
        logprob_engine: builds the policy (``(config, config.model)``) and the reference
            (``(config, config.ref_model)``) engines.
        load_tokenizer: loads a model's tokenizer (for the renderer and the reference check);
            default transformers ``AutoTokenizer``.

    Attributes:
        policy: the policy's log-prob engine; ``reference``: the reference's, or None.

    Raises:
        ValueError: ``config.kind`` is not ``dpo``.
    """

    label = "DPO engine"

    def __init__(
        self, config: EngineConfig, *, logprob_engine: LogprobEngineFactory, load_tokenizer: TokenizerLoader | None = None,
    ) -> None:
        if config.kind != DPO_KIND:
            raise ValueError(f"kind: {config.kind!r}; DPOEngine serves kind dpo")
        super().__init__()
        factory = logprob_engine
        self.config = config
        self.mode: str = config.dpo_mode or ""
        policy_config, reference_config = engine_shares(config)
        self.policy: LogprobEngine = factory(policy_config, config.model)
        self.reference: LogprobEngine | None = (
            None if config.ref_model is None else factory(reference_config, config.ref_model)
        )
        self._load_tokenizer = load_tokenizer or load_auto_tokenizer
        self._reference_tokenizer: Any | None = None
        self._reference_fingerprint: str | None = None
        self._not_loaded = "the DPO engine is still loading"

    # --- lifecycle (start, shutdown, restart, reload: EngineLifecycle's) -----------------

    def _engines(self) -> list[LogprobEngine]:
        return [self.policy] if self.reference is None else [self.policy, self.reference]

    async def _load(self) -> _DPOLoaded:
        """Check both models, start both engines concurrently, build the renderer.

        :meth:`start` returns:
            The loaded model: ``kind="dpo"``, ``mode``, ``ref_model`` (the reference's
            folder name or hub id), ``compat``, the DPO fingerprint, the
            :class:`~rmserve.server.render.dpo.DPORenderer`, the policy's checkpoint folder.
            A second call returns the same record.

        Raises:
            ServerFault: before any weight is loaded — a policy (field ``model``) or
                reference (``ref_model``) without an LM head, a reference whose tokenizer
                differs from the policy's; after — an engine that failed to start (the other
                one is shut down).
        """
        tokenizer, ref_tokenizer = await asyncio.to_thread(self._check_models)
        try:
            if await asyncio.to_thread(_accelerator_present):
                # One after the other: each engine sizes its share of accelerator memory from
                # what is free when it starts, so concurrent starts would both count the
                # whole device.
                for engine in self._engines():
                    await engine.start()
            else:
                async with asyncio.TaskGroup() as tg:
                    for engine in self._engines():
                        tg.create_task(engine.start())
        except BaseException as exc:
            for engine in self._engines():
                await engine.shutdown()
            if isinstance(exc, BaseExceptionGroup):
                raise first_error(exc) from None
            raise
        self._reference_tokenizer = ref_tokenizer
        return await asyncio.to_thread(self._build, self.config.model, tokenizer, None)

    def _check_models(self) -> tuple[Any, Any | None]:
        """LM heads and tokenizers of both models (no weights): returns (policy, reference) tokenizers."""
        cfg = self.config
        check_lm_head(cfg.model, "model")
        if cfg.ref_model is not None:
            check_lm_head(cfg.ref_model, "ref_model")
        tokenizer = self._tokenizer(cfg.model, "model")
        if cfg.ref_model is None:
            return tokenizer, None
        ref_tokenizer = self._tokenizer(cfg.ref_model, "ref_model")
        difference = tokenizer_difference(tokenizer, ref_tokenizer)
        if difference is not None:
            raise ServerFault(
                f"ref_model: the reference {cfg.ref_model!r} does not share the tokenizer of the policy "
                f"{cfg.model!r} ({difference}); the implicit reward subtracts log-probs of the same token ids, "
                "so pass the reference the policy was trained from (same tokenizer), or --ref-free avg|sum|norm"
            )
        return tokenizer, ref_tokenizer

    def _tokenizer(self, model: str, field: str) -> Any:
        try:
            return self._load_tokenizer(model)
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"{field}: cannot load the tokenizer of {model!r}: {type(exc).__name__}: {exc}") from exc

    def _build(self, model: str, tokenizer: Any, renderer: DPORenderer | None) -> _DPOLoaded:
        """The loaded record for the policy ``model`` (renderer rebuilt unless given)."""
        cfg = self.config
        policy_info = self.policy.info()
        max_model_len = min(engine.info().max_model_len for engine in self._engines())
        if renderer is None:
            template = None if cfg.chat_template is None else Path(cfg.chat_template).read_text(encoding="utf-8")
            renderer = DPORenderer(tokenizer, max_model_len=max_model_len, chat_template=template, compat=cfg.compat)
        policy_fp = model_fingerprint(model, renderer.chat_template, policy_info.dtype)
        ref_fp = None
        if self.reference is not None:
            assert cfg.ref_model is not None
            if self._reference_fingerprint is None:  # the reference never changes: hashed once
                self._reference_fingerprint = model_fingerprint(
                    cfg.ref_model, renderer.chat_template, self.reference.info().dtype
                )
            ref_fp = self._reference_fingerprint
        info = ModelInfo(
            name=cfg.name,
            max_model_len=max_model_len,
            dtype=policy_info.dtype,
            fingerprint=dpo_fingerprint(policy_fp, ref_fp, self.mode, cfg.compat),
            engine=policy_info.engine,
            kind=DPO_KIND,
            mode=self.mode,
            ref_model=None if cfg.ref_model is None else _model_name(cfg.ref_model),
            compat=cfg.compat,
            attention=policy_info.attention,
        )
        return _DPOLoaded(LoadedModel(info, renderer, local_checkpoint(model)), tokenizer)

    @property
    def renderer(self) -> DPORenderer:
        """The DPO renderer of the policy's tokenizer and template."""
        renderer = self._require().record.renderer
        assert isinstance(renderer, DPORenderer)
        return renderer

    async def shutdown(self) -> None:
        """Shut both engines down; idempotent."""
        await super().shutdown()
        for engine in self._engines():
            await engine.shutdown()

    # --- scoring -------------------------------------------------------------------------

    async def score_group(
        self,
        token_ids: Sequence[Sequence[int]],
        request_id: str,
        *,
        answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        """Implicit rewards of one group's sequences (policy and reference asked concurrently).

        Args:
            token_ids: one token-id list per response (from the DPO renderer).
            request_id: prefix of the engines' request ids (``-policy`` / ``-reference`` added).
            answer_starts: per sequence, the index of its first answer token (required).
            priority: engine request priority (lower first), passed to both engines.

        Returns:
            One :class:`SequenceScore` per sequence (see :func:`score_sequence`):
            ``num_cached_tokens`` is the policy's.

        Raises:
            EngineNotReady: not started or shut down.
            InvalidRequest / SequenceTooLong: an empty or over-long sequence, or an answer
                start outside ``[1, len(ids)]`` (field ``answer_starts[j]``).
            EngineError: no ``answer_starts``, an engine failed, or answered a number of
                log-probs other than the answer length.
        """
        loaded = self._require()
        if answer_starts is None or len(answer_starts) != len(token_ids):
            raise EngineError(
                f"the DPO engine needs one answer start per sequence for {request_id} "
                f"(got {None if answer_starts is None else len(answer_starts)} for {len(token_ids)} sequences)"
            )
        check_token_ids(token_ids, loaded.info.max_model_len)
        check_answer_starts(token_ids, answer_starts)
        try:
            async with asyncio.TaskGroup() as tg:
                policy_task = tg.create_task(self.policy.answer_logprobs(
                    token_ids, answer_starts, f"{request_id}-policy", priority=priority
                ))
                ref_task = (
                    None if self.reference is None
                    else tg.create_task(self.reference.answer_logprobs(
                        token_ids, answer_starts, f"{request_id}-reference", priority=priority
                    ))
                )
        except BaseExceptionGroup as eg:
            raise first_error(eg) from None
        answers = [("policy", policy_task.result())]
        if ref_task is not None:
            answers.append(("reference", ref_task.result()))
        for which, answer in answers:
            if len(answer) != len(token_ids):
                raise EngineError(f"the {which} engine answered {len(answer)} sequences of {len(token_ids)} for {request_id}")
            for j, (ids, start, lp) in enumerate(zip(token_ids, answer_starts, answer, strict=True)):
                if len(lp.logprobs) != len(ids) - start:
                    raise EngineError(
                        f"the {which} engine answered {len(lp.logprobs)} log-probs for sequence {j} of {request_id}, "
                        f"which has {len(ids) - start} answer tokens"
                    )
        policy = answers[0][1]
        reference = answers[1][1] if len(answers) > 1 else [None] * len(policy)
        renderer = loaded.record.renderer
        assert isinstance(renderer, DPORenderer)
        return [score_sequence(p, r, self.mode, renderer.bos_rule) for p, r in zip(policy, reference, strict=True)]

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters summed over the policy and reference engines (each sequence
        is submitted to both); zeros for an engine without a prefix cache."""
        query = hit = 0
        for engine in self._engines():
            if isinstance(engine, SupportsPrefixCacheStats):
                stats = engine.prefix_cache_stats()
                query += stats.query_tokens
                hit += stats.hit_tokens
        return PrefixCacheStats(query_tokens=query, hit_tokens=hit)

    # --- checkpoint swaps (the policy only) ------------------------------------------------

    def check_checkpoint(self, folder: Path) -> None:
        """Refuse a policy checkpoint this engine cannot serve, from its files (blocking: a worker thread).

        Rules: :func:`~rmserve.server.swaps.checkpoints.check_checkpoint` with kind ``dpo`` (a
        causal LM, tokenizer and weight files present); with a reference, the folder's
        tokenizer must equal the reference's (:func:`tokenizer_difference`).

        Raises:
            InvalidCheckpoint (422, field ``path``): naming the folder and the rule.
        """
        check_checkpoint_files(folder, DPO_KIND)
        if self._reference_tokenizer is None:
            return
        try:
            tokenizer = self._load_tokenizer(str(folder))
        except Exception as exc:  # noqa: BLE001
            raise InvalidCheckpoint(
                f"checkpoint {folder.name!r}: its tokenizer does not load ({type(exc).__name__}: {exc})", field="path"
            ) from None
        difference = tokenizer_difference(tokenizer, self._reference_tokenizer)
        if difference is not None:
            raise InvalidCheckpoint(
                f"checkpoint {folder.name!r}: its tokenizer differs from the reference {self.config.ref_model!r} "
                f"({difference.replace('the policy', 'the checkpoint')}); a DPO policy must share its reference's "
                "tokenizer",
                field="path",
            )

    async def reset_prefix_cache(self) -> bool:
        """Reset the prefix cache of both engines; True when both did (or have none)."""
        ok = True
        for engine in self._engines():
            reset = getattr(engine, "reset_prefix_cache", None)
            if reset is not None:
                ok = bool(await reset()) and ok
        return ok

    async def _swap_folder(self, path: str | Path, *, restart: bool) -> Path:
        """The policy checkpoint of a swap, refused before any engine work (in a worker thread):
        for a restart a folder (:class:`InvalidRequest`) passing :meth:`check_checkpoint`, for a
        reload :meth:`check_checkpoint`; then the policy engine must be able to swap.

        Raises:
            InvalidRequest: (restart) ``path`` is not a folder.
            InvalidCheckpoint: refused by :meth:`check_checkpoint` (nothing was touched).
            EngineError: the policy engine cannot restart (reload) on another checkpoint.
        """
        folder = Path(path)
        if restart:
            await asyncio.to_thread(self._check_restart_folder, folder)
            if getattr(self.policy, "restart", None) is None:
                raise EngineError(f"the policy engine ({type(self.policy).__name__}) cannot restart on another checkpoint")
        else:
            await asyncio.to_thread(self.check_checkpoint, folder)
            if getattr(self.policy, "reload_weights", None) is None:
                raise EngineError(f"the policy engine ({type(self.policy).__name__}) cannot reload weights in place")
        return folder

    async def _reload(self, loaded: _DPOLoaded, folder: Path) -> _DPOLoaded:
        """Load the policy weights of ``folder`` into the running policy engine (same shape and
        tokenizer); the reference stays loaded. Caches are reset; the record is rebuilt (new
        fingerprint, same renderer).

        Raises:
            EngineError: the policy engine failed to reload.
        """
        await self.policy.reload_weights(str(folder))  # type: ignore[attr-defined]
        await self.reset_prefix_cache()
        self.config = dataclasses.replace(self.config, model=str(folder))
        renderer = loaded.record.renderer
        assert isinstance(renderer, DPORenderer)
        reloaded = await asyncio.to_thread(self._build, str(folder), loaded.tokenizer, renderer)
        log.info("DPO policy reloaded from %s: %s", folder.name, reloaded.info)
        return reloaded

    def _check_restart_folder(self, folder: Path) -> None:
        self.check_checkpoint(self._checkpoint_folder(folder))

    async def _restart_on(self, folder: Path) -> _DPOLoaded:
        """Restart the policy engine on ``folder`` (the reference stays loaded) and rebuild the
        record, the renderer from the new tokenizer.

        Raises:
            EngineError / ServerFault: the policy engine did not start on ``folder``, or its
                tokenizer does not load.
        """
        await self.policy.restart(str(folder))  # type: ignore[attr-defined]
        tokenizer = await asyncio.to_thread(self._tokenizer, str(folder), "path")
        self.config = dataclasses.replace(self.config, model=str(folder))
        self._reference_fingerprint = None  # hashed again with the new renderer's template
        return await asyncio.to_thread(self._build, str(folder), tokenizer, None)
