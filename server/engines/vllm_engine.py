"""The vLLM engines: a sequence classifier, a log-prob engine and a generative judge.

:class:`VLLMEngine` embeds ``AsyncLLM`` with the pooling runner and scores token-id
sequences with the ``classify`` task and no activation, so a reward is read from the raw
logits of the model's score head at the last token (:mod:`rmserve.server.kinds.heads`: the one
label; one label or a weighted sum of several; for an ``lm-logit`` head, a causal LM whose
LM-head row of the head's token id vLLM turns into a one-label score head at load,
:func:`~rmserve.server.engines.vllm_compat.lm_logit_overrides`; for a ``token-value`` head,
vLLM's own per-token reward architecture under the ``token_classify`` task, read at the last
row, the request told to read the prefix cache (the output then holds the computed positions
only, :func:`~rmserve.server.engines.vllm_compat.pooling_params`); a ``reward-token`` head the same, with the config's
``reward_token_id`` appended to every sequence — the renderer's limit is one token less, and the
counts it reports leave the reward token out). The sequences of one group are
submitted together, so they share prefix-cache blocks (the shared prompt is computed once; the
last token is always recomputed).

Every engine reports the attention backend its workers run (``ModelInfo.attention``, read
once the engine has started: :func:`~rmserve.server.engines.vllm_compat.attention_backend`).

:class:`VLLMLogprobEngine` embeds ``AsyncLLM`` with the generate runner over a causal LM and
answers the log-probabilities of given answer tokens (a DPO policy or reference,
:class:`~rmserve.server.engines.protocol.LogprobEngine`): one request per sequence with
``SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)``, whose
``prompt_logprobs[t]`` holds ``log p(token_t | tokens before t)`` of the prompt token itself.

:class:`VLLMJudgeEngine` embeds ``AsyncLLM`` with the generate runner over a chat model (a
generative judge, :class:`~rmserve.server.engines.protocol.JudgeEngine`): each call rendered with the
chat template, a group's calls submitted together, greedy decoding.

The engines are built from the same settings (:func:`~rmserve.server.engines.vllm_compat.engine_args`) and share their
lifecycle (start, shutdown, weight reload, restart, prefix-cache counters, abort on cancel).

Prompt log-probs and the prefix cache: vLLM skips *reading* the prefix cache for a request
that asks for prompt log-probs (``SamplingParams.skip_reading_prefix_cache`` defaults to True
then), because it does not compute the rows of cached positions: with ``c`` cached tokens
the log-probs of tokens ``1 … c`` are left uninitialised (vLLM issue #42019) and tokens
``c + 1 …`` are right. :class:`VLLMLogprobEngine` can read the cache anyway and keep only
rows it can prove were computed (see its docstring); ``read_prefix_cache`` chooses.

vLLM itself is reached through :mod:`rmserve.server.engines.vllm_compat` (the only module that
imports vllm; version notes there). The generate runner refuses a prompt of exactly
``max_model_len`` tokens (the one generated token must fit), so the log-prob and judge engines
serve one token less than their engine's length. Prompt log-probs come in two layouts: one row
per prompt token after the first, cached rows uninitialised (the v1 model runner: the CPU
build and 0.32), or only the computed rows (the v2 GPU model runner); :func:`computed_rows`
reads both.

Data parallel and priorities: every request of a group names the same ``data_parallel_rank``
(:class:`~rmserve.server.engines.parallel.RankBalancer`), else vLLM's balancer places each request on
its own and the ranks' separate prefix caches each compute the shared prompt. ``priority`` is
passed only under ``scheduling_policy="priority"`` (:func:`~rmserve.server.engines.parallel.request_options`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rmserve.server.config import EngineConfig, check_lm_head, check_reward_head
from rmserve.server.kinds.judge_protocols import JudgeOutput
from rmserve.server.render.judge import JudgeRenderer, enable_thinking, judge_chat_template, judge_lead_bos
from rmserve.server.engines.lifecycle import EngineLifecycle, Loaded, OwnRenderer
from rmserve.server.engines.parallel import RankBalancer, request_options
from rmserve.server.engines.protocol import (
    AnswerLogprobs,
    LoadedModel,
    PrefixCacheStats,
    SequenceScore,
    check_answer_starts,
    check_token_ids,
    gather_or_abort,
    local_checkpoint,
)
from rmserve.server.render.chat import Renderer, common_prefix_len
from rmserve.server.kinds.judge import JudgeSettings
from rmserve.server.kinds.judge_probe import check_chat_template
from rmserve.server.engines.vllm_compat import (
    CAN_READ_PREFIX_CACHE_WITH_PROMPT_LOGPROBS,
    PoolerConfig,
    SamplingParams,
    abort_requests,
    attention_backend,
    batch_invariance,
    encode,
    engine_args,
    final_output,
    lm_logit_overrides,
    pooling_params,
    reset_engine_prefix_cache,
    served_name,
    shutdown_when_built,
    start_async_llm,
    step_tokens,
    stop_engine,
    tokens_input,
    vllm_version,
)

from rmserve.server.kinds.heads import PER_TOKEN_HEADS, read_reward

from rmserve.errors import EngineError, EngineNotReady, ServerFault
from rmserve.schema import CLASSIFIER_REWARD_HEAD, LM_LOGIT_HEAD, REWARD_TOKEN_HEAD, JUDGE_KIND, JudgeEngineInfo, JudgeSampling, Message, ModelInfo, RewardHead


@dataclass(frozen=True, slots=True)
class _VLLMLoaded(Loaded):
    """A running ``AsyncLLM`` and its record."""

    engine: Any
    judge: JudgeRenderer | None = None
    """The judge engine's renderer (its record has no classifier renderer); None otherwise."""


class _VLLMAdapter(EngineLifecycle[_VLLMLoaded]):
    """What the vLLM engines share: loading and releasing an ``AsyncLLM``, in-flight
    bookkeeping, prefix-cache counters, the weight reload and abort on cancel; start, shutdown
    and restart are :class:`~rmserve.server.engines.lifecycle.EngineLifecycle`'s.

    A subclass writes :meth:`_build` (check the checkpoint, build the ``AsyncLLM``, describe
    it) and, when a restart loads something other than ``config.model``, :meth:`_use_checkpoint`.
    """

    kind = "vllm"
    label = "vLLM engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self._swapping = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._query_tokens = 0
        self._hit_tokens = 0
        self.ranks = RankBalancer(config.data_parallel_size)
        """Data parallel rank of each group (:class:`RankBalancer`)."""
        self._attention: str | None = None
        """The attention backend of the engine last started (None before the first start)."""

    # --- lifecycle (the loading parts; the rest is EngineLifecycle's) --------------------

    async def _load(self) -> _VLLMLoaded:
        """Build the engine (25–60 s on 2 CPU cores for a tiny model; minutes for 8B on GPU),
        then ask its workers which attention backend they run (``info.attention``).

        :meth:`_build` runs in a worker thread so the event loop keeps serving ``/health``; if
        the caller is cancelled, the engine is shut down once the thread has built it (the
        thread itself cannot be interrupted).

        Raises:
            ServerFault: the checkpoint is not of the kind this engine serves, or vLLM failed
                to start (the message carries vLLM's reason).
        """
        building = asyncio.ensure_future(asyncio.to_thread(self._build))
        try:
            loaded = await asyncio.shield(building)
        except asyncio.CancelledError:
            building.add_done_callback(shutdown_when_built)
            raise
        try:
            self._attention = await attention_backend(loaded.engine)
        except asyncio.CancelledError:
            loaded.engine.shutdown()
            raise
        info = msgspec.structs.replace(loaded.info, attention=self._attention)
        return dataclasses.replace(loaded, record=dataclasses.replace(loaded.record, info=info))

    def _model_info(
        self, name: str, model: str, renderer: Renderer | str | None, max_model_len: int, dtype: str,
        *, head: RewardHead | None = None, attention: str | None = None,
    ) -> ModelInfo:
        """The lifecycle's model info with the attention backend of the engine last started
        (when known)."""
        return super()._model_info(name, model, renderer, max_model_len, dtype, head=head,
                                   attention=attention if attention is not None else self._attention)

    def _build(self) -> _VLLMLoaded:  # pragma: no cover - abstract
        """Check the checkpoint, build its ``AsyncLLM`` and describe it (blocking)."""
        raise NotImplementedError

    def _use_checkpoint(self, folder: Path) -> None:
        """A restart loads ``folder``: this engine's config with only the model replaced."""
        self.config = dataclasses.replace(self.config, model=str(folder))

    @staticmethod
    def _describe(engine: Any, build: Any) -> _VLLMLoaded:
        """``build(engine)`` → :class:`_VLLMLoaded`; the engine is shut down if that fails."""
        try:
            return build(engine)
        except BaseException:
            engine.shutdown()
            raise

    async def _release(self, loaded: _VLLMLoaded) -> str | None:
        """Stop the engine process (:func:`stop_engine`).

        vLLM's shutdown joins the engine-core process (up to a few seconds); it runs in a
        worker thread so the event loop keeps answering while the server drains. Returns the
        problem :meth:`shutdown` raises when the engine core had died before (it is shut down
        all the same).
        """
        if await stop_engine(loaded.engine):
            return "the vLLM engine core had died before the shutdown (its error is logged above)"
        return None

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """A reload or restart: new requests get :class:`EngineNotReady` while the in-flight
        ones drain; a second swap meanwhile is refused.

        Raises:
            EngineNotReady: another checkpoint reload or restart is in progress.
        """
        if self._swapping:
            raise EngineNotReady("another checkpoint reload or restart is in progress")
        self._swapping = True
        try:
            await self._idle.wait()
            yield
        finally:
            self._swapping = False

    async def _reload(self, loaded: _VLLMLoaded, folder: Path) -> _VLLMLoaded:
        """The workers load the weights of ``folder`` (``collective_rpc("reload_weights")``), the
        prefix cache is reset (cached prompt states of the old weights must not be reused) and
        the fingerprint is recomputed.

        Raises:
            EngineError: vLLM failed to load the weights.
        """
        try:
            await loaded.engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"reloading weights from {folder.name!r} failed: {type(exc).__name__}: {exc}") from exc
        await self.reset_prefix_cache()
        template = loaded.judge.chat_template if loaded.judge is not None else loaded.renderer
        info = self._model_info(loaded.info.name, str(folder), template, loaded.info.max_model_len, loaded.info.dtype)
        return _VLLMLoaded(
            record=LoadedModel(info, loaded.record.renderer, local_checkpoint(folder), loaded.record.step_tokens),
            engine=loaded.engine, judge=loaded.judge,
        )

    # --- requests -----------------------------------------------------------------------

    def _require_serving(self) -> _VLLMLoaded:
        """The loaded state, or :class:`EngineNotReady` (also while swapping weights)."""
        loaded = self._require()
        if self._swapping:
            raise EngineNotReady("the engine is swapping weights; retry shortly")
        return loaded

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a group as in flight (a weight reload or restart waits until none is)."""
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _gather_or_abort(self, engine: Any, coroutines: Sequence[Any], request_ids: list[str]) -> list[Any]:
        """:func:`~rmserve.server.engines.protocol.gather_or_abort` of one coroutine per engine
        request; on a failure or cancellation all of ``request_ids`` are aborted."""
        return await gather_or_abort(coroutines, lambda: abort_requests(engine, request_ids))

    def _count(self, submitted_tokens: int, cached_tokens: int) -> None:
        self._query_tokens += submitted_tokens
        self._hit_tokens += cached_tokens

    # --- extras: prefix-cache counters ----------------------------------------------------

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Tokens submitted (queries) and tokens served from the prefix cache (hits) so far.

        Counted by this adapter from each request's ``num_cached_tokens``; the same
        quantities as vLLM's ``vllm:prefix_cache_queries``/``vllm:prefix_cache_hits``.
        """
        return PrefixCacheStats(query_tokens=self._query_tokens, hit_tokens=self._hit_tokens)

    def num_unfinished_requests(self) -> int:
        """Engine requests (sequences) submitted and not yet finished or aborted."""
        return int(self._require().engine.get_num_unfinished_requests())

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block; True when vLLM reports success."""
        return await reset_engine_prefix_cache(self._require().engine)

class VLLMEngine(_VLLMAdapter, OwnRenderer):
    """:class:`~rmserve.server.engines.protocol.RewardEngine` backed by an embedded vLLM ``AsyncLLM``.

    Args:
        config: what to load and how; ``config.engine`` is ignored (this is the vLLM one).

    Attributes (after :meth:`start`):
        renderer: the :class:`Renderer` built from the model's tokenizer and template (the
            same as in the :class:`LoadedModel` that :meth:`start` returned).
        start_time_s: seconds :meth:`start` (or the last :meth:`restart`) took to build the engine.
        config: the settings; after :meth:`restart` its ``model`` is the checkpoint last started.
    """

    _head: RewardHead = CLASSIFIER_REWARD_HEAD
    """The head of the checkpoint last started (:func:`~rmserve.server.config.check_reward_head`)."""

    _num_values: int = 1
    """Values the score head gives per sequence: 1, or a multi-label head's ``num_labels``."""

    def _build(self) -> _VLLMLoaded:
        cfg = self.config
        head = check_reward_head(cfg.model, cfg.head_settings, self.kind)
        overrides: dict[str, Any] = {} if head.name in PER_TOKEN_HEADS else {"convert": "classify"}
        if head.name == LM_LOGIT_HEAD:
            overrides["hf_overrides"] = lm_logit_overrides(_token_text(cfg.model, head.token_id))
        warn_remote_code(cfg)
        args = engine_args(cfg, cfg.model, runner="pooling", pooler_config=PoolerConfig(use_activation=False), **overrides)
        engine = start_async_llm(cfg, cfg.model, args)

        def describe(engine: Any) -> _VLLMLoaded:
            self._head = head
            self._num_values = int(getattr(engine.model_config.hf_config, "num_labels", 1) or 1)
            max_model_len = int(engine.model_config.max_model_len)
            if head.name == REWARD_TOKEN_HEAD:
                self._num_values = 1  # its v_head gives one value, whatever num_labels its config implies
                max_model_len -= 1  # the appended reward token takes one position of the context
            renderer = Renderer.from_pretrained(
                cfg.model, max_model_len=max_model_len, chat_template_path=cfg.chat_template,
                trust_remote_code=cfg.trust_remote_code,
            )
            info = self._model_info(cfg.name, cfg.model, renderer, max_model_len, args.dtype)
            return _VLLMLoaded(engine=engine, record=LoadedModel(info, renderer, local_checkpoint(cfg.model), step_tokens(engine)))

        return self._describe(engine, describe)

    def _model_info(
        self, name: str, model: str, renderer: Renderer | str | None, max_model_len: int, dtype: str,
        *, head: RewardHead | None = None, attention: str | None = None,
    ) -> ModelInfo:
        """The model info with the served head (it enters the fingerprint) and the attention backend."""
        return super()._model_info(name, model, renderer, max_model_len, dtype,
                                   head=head if head is not None else self._head, attention=attention)

    async def score_group(
        self,
        token_ids: Sequence[Sequence[int]],
        request_id: str,
        *,
        answer_starts: Sequence[int] | None = None,
        priority: int = 0,
    ) -> list[SequenceScore]:
        """Score the sequences of one group concurrently (they share prefix-cache blocks).

        Engine request ids are ``f"{request_id}-{j}"``. If the caller is cancelled (client
        disconnect), all of the group's engine requests are aborted. With data parallel, all
        of them go to one rank (:class:`RankBalancer`).

        Args:
            token_ids: one token-id list per sequence.
            request_id: unique prefix for the engine's request ids.
            answer_starts: not used (a classifier scores the whole sequence); part of the one
                :meth:`~rmserve.server.engines.protocol.RewardEngine.score_group` signature.
            priority: vLLM request priority (lower first), sent under
                ``scheduling_policy="priority"`` only (:func:`request_options`).

        Returns:
            One :class:`SequenceScore` per sequence: the reward the head reads from the raw
            logits (:func:`~rmserve.server.kinds.heads.read_reward`), prefix-cache hit tokens.

        Raises:
            EngineNotReady: not started, shutting down or swapping weights.
            InvalidRequest: an empty sequence (field ``token_ids[j]``).
            SequenceTooLong: a sequence over ``max_model_len`` (the renderer prevents this).
            EngineError: vLLM failed on a request or its process died.
        """
        loaded = self._require_serving()
        check_token_ids(token_ids, loaded.info.max_model_len)
        request_ids = [f"{request_id}-{j}" for j in range(len(token_ids))]
        with self._in_flight(), self.ranks.group(sum(map(len, token_ids))) as rank:
            options = request_options(self.config, priority, rank)
            scores = await self._gather_or_abort(
                loaded.engine,
                [
                    self._score_one(loaded.engine, ids, rid, options)
                    for ids, rid in zip(token_ids, request_ids, strict=True)
                ],
                request_ids,
            )
        for ids, score in zip(token_ids, scores, strict=True):
            self._count(len(ids), score.num_cached_tokens)
        return scores

    async def _score_one(
        self, engine: Any, ids: Sequence[int], request_id: str, options: dict[str, Any]
    ) -> SequenceScore:
        per_token = self._head.name in PER_TOKEN_HEADS
        params = pooling_params(per_token)
        if self._head.name == REWARD_TOKEN_HEAD:  # read at the reward token, appended as the model's own code does
            ids = [*ids, int(self._head.token_id)]
        final = await final_output(encode(engine, tokens_input(list(ids)), params, request_id, options), request_id)
        error = getattr(final, "error", None)
        if error is not None:
            raise EngineError(f"vLLM failed on request {request_id}: {error}")
        data = final.outputs.data
        cached = int(final.num_cached_tokens or 0)
        if per_token:  # (computed positions, labels): the reward is the last token's value, the last row
            computed = len(ids) - cached
            if data.dim() != 2 or data.shape[0] != computed:
                raise EngineError(
                    f"expected one value row per computed token ({len(ids)} tokens, {cached} from the prefix cache), "
                    f"got shape {tuple(data.shape)} (request {request_id})"
                )
            data = data[-1]
        if data.numel() != self._num_values:
            raise EngineError(
                f"expected {self._num_values} score-head value(s) per sequence, got {data.numel()} (request {request_id})"
            )
        values = [float(v) for v in data.reshape(-1)]  # a tensor of the head's values, label order
        try:
            reward = read_reward(self._head, values)
        except ValueError as exc:
            raise EngineError(f"{exc} (request {request_id})") from None
        return SequenceScore(reward=reward, num_cached_tokens=cached)


def warn_remote_code(cfg: EngineConfig) -> None:
    """Log a warning naming the Python files of a local checkpoint folder that the load may run
    (its configuration or tokenizer class, ``auto_map``) when the engine trusts remote code;
    nothing otherwise. ``run`` and ``eval`` print the server's warnings on stderr."""
    folder = Path(cfg.model)
    if not cfg.trust_remote_code or not folder.is_dir():
        return
    code = sorted(p.name for p in folder.glob("*.py") if p.is_file())
    if code:
        logging.getLogger(__name__).warning(
            "running the code of %r its config names (--trust-remote-code): %s", str(folder), ", ".join(code))


def _token_text(model: str, token_id: int | None) -> str:
    """The vocabulary entry of ``token_id`` in ``model``'s tokenizer, as vLLM's
    ``no_post_processing`` load looks it up (``convert_tokens_to_ids``).

    Raises:
        ServerFault: the tokenizer cannot be loaded, or the id has no entry that maps back to it
            (an id of the embedding's padding rows, or a vocabulary where two ids share a text):
            vLLM would read another row; the message says to use ``--engine hf``.
    """
    from transformers import AutoTokenizer

    assert token_id is not None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # noqa: BLE001
        raise ServerFault(f"model: cannot load the tokenizer of {model!r}: {type(exc).__name__}: {exc}") from exc
    text = tokenizer.convert_ids_to_tokens(int(token_id))
    back = tokenizer.convert_tokens_to_ids(text) if isinstance(text, str) else None
    if back != token_id:
        raise ServerFault(
            f"head_token_id: {model!r}'s tokenizer has no entry for id {token_id} that maps back to it "
            f"({text!r} → {back!r}); vLLM reads the LM-head row by the token's text: serve it with --engine hf"
        )
    return text


# --- log-probabilities of answer tokens (a DPO policy or reference) ------------------------


@dataclass(frozen=True, slots=True)
class LogprobCounters:
    """Cumulative counters of a :class:`VLLMLogprobEngine`, in sequences and tokens.

    Attributes:
        sequences: sequences answered (each once, however it was computed).
        submitted_tokens: tokens of every engine request, resubmissions included.
        cached_tokens: of those, tokens read from the prefix cache (not computed).
        resubmitted_sequences: sequences with answer rows that neither their first request
            (it read them from the cache, or it was preempted) nor a sibling computed; the
            prefix up to the last such row was sent again without reading the cache.
        resubmitted_tokens: tokens of those second requests (all computed).
        borrowed_rows: answer-token log-probs taken from another sequence of the same group
            that computed them over the identical preceding tokens.
    """

    sequences: int = 0
    submitted_tokens: int = 0
    cached_tokens: int = 0
    resubmitted_sequences: int = 0
    resubmitted_tokens: int = 0
    borrowed_rows: int = 0

    @property
    def computed_tokens(self) -> int:
        """Tokens the engine ran the model over: ``submitted_tokens - cached_tokens``."""
        return self.submitted_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class PromptRows:
    """The prompt log-probs of one engine request that were provably computed.

    Attributes:
        logprobs: token index ``t`` → ``log p(token_t | token_0 … token_{t-1})`` in nats, for
            the rows the request computed, from the first asked-for index on.
        num_cached_tokens: tokens the request read from the prefix cache.
        trusted: False when the rows cannot be attributed (the request was preempted and
            re-prefilled from a different cache state, or vLLM gave no preemption count);
            then ``logprobs`` is empty.
    """

    logprobs: dict[int, float]
    num_cached_tokens: int
    trusted: bool = True


def computed_rows(
    prompt_logprobs: Sequence[Any] | None, token_ids: Sequence[int], num_cached_tokens: int, first: int
) -> dict[int, float]:
    """The prompt log-probs of ``token_ids[t]`` for every computed ``t ≥ first``.

    A prompt log-prob of token ``t`` comes from the logits at position ``t - 1``; with ``c``
    cached tokens vLLM computes positions ``c …`` only, so the rows of tokens ``c + 1 …`` are
    right and those of tokens ``1 … c`` are not (vLLM issue #42019). Two layouts are read:
    ``len(prompt_logprobs) == len(token_ids)`` (entry ``t`` is token ``t``, entry 0 is None;
    vLLM's v1 model runner, uncomputed rows uninitialised) and, with ``c > 0``,
    ``len == len(token_ids) - c`` (only the computed rows: entry ``i`` is token ``c + i``;
    the v2 GPU model runner). Each kept entry must be ``{token_ids[t]: Logprob}``.

    Args:
        prompt_logprobs: ``RequestOutput.prompt_logprobs`` of a request with
            ``prompt_logprobs=0`` (one entry per position: None or a dict token → ``Logprob``).
        token_ids: the request's prompt, length ``P``.
        num_cached_tokens: ``c``, the request's cached tokens.
        first: the first token index wanted (≥ 1).

    Returns:
        ``{t: logprob}`` for ``max(first, c + 1) ≤ t < P``.

    Raises:
        EngineError: a row count that fits neither layout, or a row without its token.
    """
    n = len(token_ids)
    c = num_cached_tokens
    entries = 0 if prompt_logprobs is None else len(prompt_logprobs)
    if entries == n:
        offset = 0
    elif c > 0 and entries == n - c:
        offset = c
    else:
        raise EngineError(
            f"vLLM returned {entries} prompt log-prob rows for a {n}-token sequence with {c} cached tokens; "
            f"expected {n} (or {n - c})"
        )
    rows: dict[int, float] = {}
    for t in range(max(first, c + 1, 1), n):
        entry = prompt_logprobs[t - offset]  # type: ignore[index]
        token = token_ids[t]
        if entry is None or token not in entry:
            raise EngineError(f"vLLM's prompt log-prob row {t} does not hold the prompt token {token}")
        rows[t] = float(entry[token].logprob)
    return rows


def assemble_answers(
    token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int], rows: Sequence[PromptRows]
) -> tuple[list[list[float | None]], int]:
    """Every sequence's answer log-probs from its own computed rows, or borrowed ones.

    Sequence ``k`` needs the rows of tokens ``answer_starts[k] … len - 1``. A row it did not
    compute is taken from another sequence ``j`` of the group that computed row ``t`` and has
    the same tokens ``0 … t`` (a causal LM's log-prob of token ``t`` is a function of those
    tokens only, so the value is the same up to floating-point summation order).

    Returns:
        (per sequence its answer log-probs, None where a row has no source; the number of
        rows borrowed).
    """
    answers: list[list[float | None]] = []
    borrowed = 0
    prefix: dict[tuple[int, int], int] = {}
    for k, (ids, start) in enumerate(zip(token_ids, answer_starts, strict=True)):
        own = rows[k].logprobs
        values: list[float | None] = []
        for t in range(start, len(ids)):
            value = own.get(t)
            if value is None:
                value = _borrow(k, t, token_ids, rows, prefix)
                borrowed += value is not None
            values.append(value)
        answers.append(values)
    return answers, borrowed


def _borrow(
    k: int, t: int, token_ids: Sequence[Sequence[int]], rows: Sequence[PromptRows], prefix: dict[tuple[int, int], int]
) -> float | None:
    for j, other in enumerate(rows):
        if j == k or t not in other.logprobs:
            continue
        key = (min(j, k), max(j, k))
        if key not in prefix:
            prefix[key] = common_prefix_len((token_ids[j], token_ids[k]))
        if prefix[key] > t:
            return other.logprobs[t]
    return None


class VLLMLogprobEngine(_VLLMAdapter):
    """:class:`~rmserve.server.engines.protocol.LogprobEngine` backed by an embedded vLLM ``AsyncLLM``
    (generate runner) over a causal LM.

    The sequences of a group are submitted together, one request each with
    ``SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0, detokenize=False)``;
    the answer log-probs are the prompt log-probs of the answer tokens (the one generated
    token is discarded).

    Two paths, chosen by ``read_prefix_cache``:

    * plain (False): vLLM's default for prompt log-probs, the prefix cache is not read
      (``skip_reading_prefix_cache=True``; it is still written), so every token is computed.
      The correctness baseline.
    * cache-reading (True, the default; needs ``config.enable_prefix_caching``): the group
      reads the prefix cache, so the shared prompt is computed once. vLLM then computes
      only the rows of tokens after the ``c = num_cached_tokens`` cached ones
      (:func:`computed_rows`); a sequence with ``c ≤ answer_start - 1`` has all its answer
      rows. For one with more cached tokens (its answer begins like an earlier sibling's),
      the missing rows are borrowed from a sibling that computed them over identical
      preceding tokens (:func:`assemble_answers`). Rows still missing (or all rows of a
      request that was preempted: re-prefilled from another cache state, its rows cannot be
      attributed) come from a plain request over the sequence's prefix up to the last
      missing token (row ``t`` depends on tokens ``0 … t`` only). Checked against the plain
      path and a transformers forward pass on RM-Bench groups
      (tests/server/test_engine_logprobs_vllm.py; token counts in
      benchmarks/results/2026-11-30-cpu2-dpo-prefix-cache.md).

    Args:
        config: engine settings (dtype, lengths, cache, parallelism); ``config.model`` is
            not what this engine loads unless ``model`` names it.
        model: folder or hub id of the causal LM (the policy's ``config.model`` or the
            reference's ``config.ref_model``).
        read_prefix_cache: the path; None = the class attribute :attr:`read_prefix_cache`.

    Attributes:
        read_prefix_cache: default path of new engines (True: cache-reading); tests flip it.
        model: the checkpoint loaded (after :meth:`restart`, the last one started).
        max_model_len (of :meth:`info`): the engine's length minus one, the longest sequence
            the generate runner accepts with its one generated token.
    """

    label = "vLLM log-prob engine"
    read_prefix_cache: bool = True

    def __init__(self, config: EngineConfig, model: str, *, read_prefix_cache: bool | None = None) -> None:
        super().__init__(config)
        if not isinstance(model, str) or not model:
            raise ValueError("model: must be a non-empty path or hub id")
        self.model = model
        self._field = "model" if model == config.model else "ref_model"
        if read_prefix_cache is not None:
            self.read_prefix_cache = read_prefix_cache
        self._counters = LogprobCounters()

    def _build(self) -> _VLLMLoaded:
        cfg, model = self.config, self.model
        check_lm_head(model, self._field)
        args = engine_args(cfg, model, runner="generate", logprobs_mode="raw_logprobs")
        engine = start_async_llm(cfg, model, args)

        def describe(engine: Any) -> _VLLMLoaded:
            max_model_len = int(engine.model_config.max_model_len) - 1
            renderer = Renderer.from_pretrained(model, max_model_len=max_model_len, chat_template_path=cfg.chat_template)
            info = self._model_info(served_name(cfg, model), model, renderer, max_model_len, args.dtype)
            return _VLLMLoaded(engine=engine, record=LoadedModel(info, renderer, local_checkpoint(model), step_tokens(engine)))

        return self._describe(engine, describe)

    def _use_checkpoint(self, folder: Path) -> None:
        self.model = str(folder)

    @property
    def reads_prefix_cache(self) -> bool:
        """Whether requests read the prefix cache: :attr:`read_prefix_cache`, prefix caching on,
        and a vLLM with the per-request switch."""
        return bool(
            self.read_prefix_cache and self.config.enable_prefix_caching and CAN_READ_PREFIX_CACHE_WITH_PROMPT_LOGPROBS
        )

    def counters(self) -> LogprobCounters:
        """Sequences, tokens, resubmissions and borrowed rows so far (:class:`LogprobCounters`)."""
        return self._counters

    async def answer_logprobs(
        self, token_ids: Sequence[Sequence[int]], answer_starts: Sequence[int], request_id: str, *, priority: int = 0
    ) -> list[AnswerLogprobs]:
        """Log-probabilities of the answer tokens of every sequence of one group.

        Engine request ids are ``f"{request_id}-{j}"`` (``-{j}-plain`` for a resubmitted prefix).
        If the caller is cancelled (client disconnect), the group's engine requests are aborted.
        With data parallel, all of them (resubmissions included) go to one rank.

        Args:
            token_ids: one token-id list per sequence (BOS and template included), each at
                most ``info().max_model_len`` tokens.
            answer_starts: per sequence, the index of its first answer token (1 … length).
            request_id: unique prefix for the engine's request ids.
            priority: vLLM request priority (lower first), sent under
                ``scheduling_policy="priority"`` only (:func:`request_options`).

        Returns:
            One :class:`AnswerLogprobs` per sequence: ``log p`` in nats of tokens
            ``answer_start … len - 1``, and the tokens its (first) request read from the
            prefix cache (a resubmitted prefix is counted in :meth:`counters`).

        Raises:
            EngineNotReady: not started, shutting down or swapping weights.
            InvalidRequest: an empty sequence (``token_ids[j]``) or a start out of range
                (``answer_starts[j]``).
            SequenceTooLong: a sequence over ``max_model_len``.
            EngineError: vLLM failed on a request, its process died, or it returned prompt
                log-probs this adapter cannot place.
        """
        loaded = self._require_serving()
        check_token_ids(token_ids, loaded.info.max_model_len)
        check_answer_starts(token_ids, answer_starts)
        read_cache = self.reads_prefix_cache
        with self._in_flight(), self.ranks.group(sum(map(len, token_ids))) as rank:
            options = request_options(self.config, priority, rank)
            request_ids = [f"{request_id}-{j}" for j in range(len(token_ids))]
            first = await self._prompt_rows(loaded.engine, token_ids, answer_starts, request_ids, read_cache, options)
            answers, borrowed = assemble_answers(token_ids, answer_starts, first)
            # per sequence with a row missing: the prefix up to its last missing token
            again = {
                j: answer_starts[j] + max(i for i, value in enumerate(values) if value is None) + 1
                for j, values in enumerate(answers)
                if None in values
            }
            if again:
                if not read_cache:
                    raise EngineError(
                        f"vLLM computed only part of the prompt of request {request_ids[next(iter(again))]} "
                        "without reading the prefix cache"
                    )
                prefixes = [list(token_ids[j][:end]) for j, end in again.items()]
                plain_ids = [f"{request_id}-{j}-plain" for j in again]
                redo = await self._prompt_rows(
                    loaded.engine, prefixes, [answer_starts[j] for j in again], plain_ids, False, options
                )
                for j, rows, rid in zip(again, redo, plain_ids, strict=True):
                    if rows.num_cached_tokens or not rows.trusted:
                        raise EngineError(f"vLLM read the prefix cache for request {rid}, which asked not to")
                    start = answer_starts[j]
                    answers[j] = [rows.logprobs[start + i] if v is None else v for i, v in enumerate(answers[j])]
        resubmitted_tokens = sum(again.values())
        submitted = sum(len(ids) for ids in token_ids) + resubmitted_tokens
        first_cached = sum(rows.num_cached_tokens for rows in first)
        self._count(submitted, first_cached)
        c = self._counters
        self._counters = LogprobCounters(
            sequences=c.sequences + len(token_ids),
            submitted_tokens=c.submitted_tokens + submitted,
            cached_tokens=c.cached_tokens + first_cached,
            resubmitted_sequences=c.resubmitted_sequences + len(again),
            resubmitted_tokens=c.resubmitted_tokens + resubmitted_tokens,
            borrowed_rows=c.borrowed_rows + borrowed,
        )
        return [
            AnswerLogprobs(logprobs=tuple(values), num_cached_tokens=rows.num_cached_tokens)  # type: ignore[arg-type]
            for values, rows in zip(answers, first, strict=True)
        ]

    async def _prompt_rows(
        self,
        engine: Any,
        token_ids: Sequence[Sequence[int]],
        answer_starts: Sequence[int],
        request_ids: list[str],
        read_cache: bool,
        options: dict[str, Any],
    ) -> list[PromptRows]:
        """Submit the sequences together; per sequence its computed rows from its answer start on."""
        fields: dict[str, Any] = {}
        if CAN_READ_PREFIX_CACHE_WITH_PROMPT_LOGPROBS:
            fields["skip_reading_prefix_cache"] = not read_cache
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False, **fields)
        outputs = await self._gather_or_abort(
            engine,
            [
                self._generate_one(engine, ids, rid, params, options)
                for ids, rid in zip(token_ids, request_ids, strict=True)
            ],
            request_ids,
        )
        rows = []
        for ids, start, (prompt_logprobs, cached, preemptions) in zip(token_ids, answer_starts, outputs, strict=True):
            if read_cache and preemptions != 0:
                # Re-prefilled after a preemption from another cache state: the rows written in
                # each attempt cannot be told apart (None: vLLM did not count preemptions).
                rows.append(PromptRows({}, cached, trusted=False))
            else:
                rows.append(PromptRows(computed_rows(prompt_logprobs, ids, cached, start), cached))
        return rows

    async def _generate_one(
        self, engine: Any, ids: Sequence[int], request_id: str, params: Any, options: dict[str, Any]
    ) -> tuple[Any, int, int | None]:
        """(prompt log-probs, cached tokens, preemptions or None when not counted) of one request."""
        prompt_logprobs = None

        def keep_prompt_logprobs(out: Any) -> None:
            nonlocal prompt_logprobs
            if out.prompt_logprobs:
                prompt_logprobs = out.prompt_logprobs

        final = await final_output(
            engine.generate(tokens_input(list(ids)), params, request_id=request_id, **options),
            request_id,
            keep_prompt_logprobs,
        )
        metrics = getattr(final, "metrics", None)
        preemptions = getattr(metrics, "num_preemptions", None)
        return prompt_logprobs, int(final.num_cached_tokens or 0), preemptions


# --- a generative judge (LLM-as-judge) ------------------------------------------------------


JUDGE_FINISH_REASONS = ("stop", "length")
"""The ``finish_reason`` values a judge output may have; vLLM's others (``abort``, ``error``,
``repetition``) are failures of the request."""


class VLLMJudgeEngine(_VLLMAdapter):
    """:class:`~rmserve.server.engines.protocol.JudgeEngine` backed by an embedded vLLM ``AsyncLLM``
    (generate runner, prefix caching as configured) over a chat model.

    Each call of a group is rendered with the model's chat template and its generation prompt
    (:class:`~rmserve.server.render.judge.JudgeRenderer`, in a worker thread), and all calls of
    the group are submitted together, so the instruction and question they share are computed
    once and read from the prefix cache by the others. ``judge_thinking`` is passed to the
    template as ``enable_thinking`` when set. Decoding is greedy:
    ``SamplingParams(temperature=0, top_p=1, max_tokens=config.judge_max_tokens)``, the
    official RewardBench 2 settings (:attr:`sampling`, published in :meth:`info` with the
    vLLM version and whether vLLM's batch-invariant mode is on,
    :func:`~rmserve.server.engines.vllm_compat.batch_invariance`).

    Before vLLM starts, the conversations the protocol choice sends are rendered with the chat
    template (:func:`~rmserve.server.kinds.judge_probe.check_chat_template`), so a template
    that refuses them (e.g. a system message) is a start-up error naming the fix.

    Context: the generate runner needs room for one generated token, so the longest prompt is
    the engine's ``max_model_len`` less one (``info().max_model_len``); a longer one raises
    :class:`~rmserve.errors.SequenceTooLong` for the group before anything is generated. A
    prompt that fits but leaves fewer than ``max_tokens`` tokens is accepted by vLLM, which
    stops at the context (``check_stop`` in ``vllm/v1/core/sched/utils.py``: ``num_tokens >=
    max_model_len`` ends the request as ``FINISHED_LENGTH_CAPPED``): the output has
    ``finish_reason="length"`` like one cut at ``max_tokens``, and the protocol readers count
    it as unparsed where they read the end of the text. Nothing is raised for the group.

    Args:
        config: ``kind="judge"`` settings: the model (a causal LM with a chat template, or
            ``chat_template`` naming a Jinja file), ``judge_max_tokens``, ``protocol`` and
            ``compat`` (reported in :meth:`info`), and the engine settings of every engine.

    Attributes:
        max_tokens: generated tokens per call at most (``config.judge_max_tokens``).
        sampling: how every call is decoded (greedy, at most ``max_tokens`` tokens).
        config: the settings; after :meth:`restart` its ``model`` is the checkpoint last started.
    """

    label = "vLLM judge engine"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.max_tokens = int(config.judge_max_tokens)
        self.sampling = JudgeSampling(max_tokens=self.max_tokens)

    def _build(self) -> _VLLMLoaded:
        from transformers import AutoTokenizer

        cfg = self.config
        check_lm_head(cfg.model, "model", kind=JUDGE_KIND)
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        except Exception as exc:  # noqa: BLE001
            raise ServerFault(f"model: cannot load the tokenizer of {cfg.model!r}: {type(exc).__name__}: {exc}") from exc
        template = judge_chat_template(tokenizer, cfg.chat_template, cfg.model)  # refused before vLLM starts
        # The probe renders text only; the prompt limit (known once vLLM runs) applies to token ids.
        probe = JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=1,
                              enable_thinking=enable_thinking(cfg.judge_thinking))
        check_chat_template(probe.render_text, JudgeSettings.from_engine_config(cfg), model=cfg.model)
        args = engine_args(cfg, cfg.model, runner="generate")
        engine = start_async_llm(cfg, cfg.model, args)

        def describe(engine: Any) -> _VLLMLoaded:
            max_prompt = int(engine.model_config.max_model_len) - 1
            judge = JudgeRenderer(tokenizer, chat_template=template, max_prompt_tokens=max_prompt,
                                  enable_thinking=enable_thinking(cfg.judge_thinking),
                                  lead_bos=judge_lead_bos(tokenizer, cfg))
            info = self._model_info(cfg.name, cfg.model, template, max_prompt, args.dtype)
            return _VLLMLoaded(engine=engine, record=LoadedModel(info, None, local_checkpoint(cfg.model), step_tokens(engine)),
                           judge=judge)

        return self._describe(engine, describe)

    def _model_info(
        self, name: str, model: str, renderer: Renderer | str | None, max_model_len: int, dtype: str
    ) -> ModelInfo:
        """The checkpoint's :class:`ModelInfo` with ``kind="judge"``, ``mode`` = the protocol
        choice, ``compat``, ``judge_sampling`` (:attr:`sampling`) and ``judge_engine`` (vLLM, its
        version, :func:`~rmserve.server.engines.vllm_compat.batch_invariance`); the fingerprint is
        the checkpoint's (weights, tokenizer, the chat template rendered with, dtype), as every
        engine computes it."""
        info = super()._model_info(name, model, renderer, max_model_len, dtype)
        invariant, note = batch_invariance()
        return msgspec.structs.replace(
            info, kind=JUDGE_KIND, mode=self.config.protocol, compat=self.config.compat, judge_sampling=self.sampling,
            judge_engine=JudgeEngineInfo(self.kind, vllm_version(), invariant, note),
        )

    @property
    def renderer(self) -> JudgeRenderer:
        """The judge renderer (tokenizer, chat template, longest prompt) of the loaded model."""
        judge = self._require().judge
        assert judge is not None
        return judge

    async def judge_group(
        self, calls: Sequence[Sequence[Message]], request_id: str, *, priority: int = 0
    ) -> list[JudgeOutput]:
        """Generate one output per call, all calls of the group submitted together.

        Engine request ids are ``f"{request_id}-{k}"``. If the caller is cancelled (client
        disconnect) or one call fails, the group's other engine requests are aborted. With
        data parallel, all of them go to one rank (:class:`RankBalancer`).

        Args:
            calls: per call, the chat messages before the chat template.
            request_id: unique prefix for the engine's request ids.
            priority: vLLM request priority (lower first), sent under
                ``scheduling_policy="priority"`` only (:func:`request_options`).

        Returns:
            One :class:`~rmserve.server.kinds.judge_protocols.JudgeOutput` per call: the text of
            the generated tokens (unstripped, :meth:`JudgeRenderer.decode
            <rmserve.server.render.judge.JudgeRenderer.decode>`, in a worker thread; vLLM's own
            detokenizer is off), prompt tokens, generated tokens
            (a final EOS included), ``finish_reason`` ``stop`` or ``length`` (cut at
            ``max_tokens`` or at the context), the prompt tokens read from the prefix cache,
            and ``reasoning_open`` when the templated prompt ends with ``<think>``.

        Raises:
            EngineNotReady: not started, shutting down or swapping weights.
            InvalidRequest: no call, or a call the chat template rejects (field ``messages``).
            SequenceTooLong: a call's prompt leaves no room for one generated token (field
                ``messages``, limit ``info().max_model_len``); nothing is generated.
            EngineError: vLLM failed on a request, or its process died.
        """
        loaded = self._require_serving()
        assert loaded.judge is not None
        prompts, opened = await asyncio.to_thread(loaded.judge.render_calls, calls)
        sampling = self.sampling
        params = SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, detokenize=False
        )
        request_ids = [f"{request_id}-{k}" for k in range(len(prompts))]
        with self._in_flight(), self.ranks.group(sum(map(len, prompts))) as rank:
            options = request_options(self.config, priority, rank)
            generated = await self._gather_or_abort(
                loaded.engine,
                [
                    self._judge_one(loaded.engine, ids, rid, params, options)
                    for ids, rid in zip(prompts, request_ids, strict=True)
                ],
                request_ids,
            )
        texts = await asyncio.to_thread(loaded.judge.decode_all, [tokens for tokens, _, _ in generated])
        outputs = [
            JudgeOutput(text=text, prompt_tokens=len(ids), completion_tokens=len(tokens), finish_reason=reason,
                        cached_tokens=cached, reasoning_open=open_)
            for text, ids, (tokens, reason, cached), open_ in zip(texts, prompts, generated, opened, strict=True)
        ]
        for output in outputs:
            self._count(output.prompt_tokens, output.cached_tokens)
        return outputs

    async def _judge_one(
        self, engine: Any, ids: Sequence[int], request_id: str, params: Any, options: dict[str, Any]
    ) -> tuple[list[int], str, int]:
        """(generated token ids, finish reason, prompt tokens read from the prefix cache) of one call."""
        final = await final_output(
            engine.generate(tokens_input(list(ids)), params, request_id=request_id, **options), request_id
        )
        error = getattr(final, "error", None)
        if error is not None:
            raise EngineError(f"vLLM failed on request {request_id}: {error}")
        if len(final.outputs) != 1:
            raise EngineError(f"expected one completion per judge call, got {len(final.outputs)} (request {request_id})")
        completion = final.outputs[0]
        reason = None if completion.finish_reason is None else str(completion.finish_reason)
        if reason not in JUDGE_FINISH_REASONS:
            raise EngineError(f"vLLM ended request {request_id} with finish_reason {reason!r}")
        return list(completion.token_ids), reason, int(final.num_cached_tokens or 0)
