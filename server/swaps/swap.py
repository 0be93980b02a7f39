"""Checkpoint swaps (``POST /v1/models/load``): the checks, the plan and the orchestration.

A swap is a ``reload`` (new weights into the running engine: same architecture/shape and
tokenizer) or a ``restart`` (the engine shuts its model down and starts the new checkpoint
with the same settings otherwise: any architecture or tokenizer). :func:`plan_swap` picks one
from the two checkpoints' ``config.json`` and tokenizer files and the engine's capabilities.

Checks come first and leave the engine and the scoring gate alone (who may load — the admin
role, or the admin token of a server without a users file — is checked before the route, by
:func:`rmserve.server.sharing.auth.route_user`): :func:`resolve_checkpoint`, :func:`check_files`
(the checkpoint's own files, in a worker thread: a folder that cannot be served is refused with 422 in milliseconds) and
:func:`plan_swap` (both checkpoints' config and tokenizer bytes compared on the event loop).
Then :func:`run_swap` closes the scoring gate (:func:`scoring_slot` is the other side of it),
drains in-flight scoring, hands the swap to the engine, loads the previous checkpoint again
when the swap fails (:func:`reload_or_restore`, :func:`restart_or_restore`), and publishes
the new model in the app's :class:`~rmserve.server.swaps.state.EngineState`. No torch, no vllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Literal

from aiohttp import web
from rmserve.fingerprint import TOKENIZER_FILES
from rmserve.server.swaps import gc_heap
from rmserve.server.swaps.checkpoints import check_checkpoint
from rmserve.server.sharing.leases import leases_of
from rmserve.server.engines.protocol import LoadedModel, SupportsCheckpointCheck, SupportsRestart, SupportsWeightReload
from rmserve.server.render.chat import Renderer
from rmserve.server.sharing.users import ANONYMOUS, User
from rmserve.server.swaps.state import (
    CONFIG_KEY,
    ENGINE_KEY,
    EXECUTOR_KEY,
    METRICS_KEY,
    RENDERER_FACTORY_KEY,
    RESULT_CACHE_KEY,
    STATE_KEY,
    EngineState,
)

from rmserve.errors import (
    Conflict,
    EngineError,
    EngineNotReady,
    Forbidden,
    RMServeError,
)
from rmserve.schema import LoadModelRequest, ModelInfo

logger = logging.getLogger("rmserve.server")

SHAPE_KEYS: tuple[str, ...] = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "num_labels",
    "torch_dtype",
    "tie_word_embeddings",
)
"""``config.json`` keys that must match for weights to load into the running engine."""

RESTART_HINT = "restart the server on it (this engine cannot restart itself on another checkpoint)"

SwapKind = Literal["reload", "restart"]
"""``reload``: weights loaded into the running engine; ``restart``: the engine restarted on the checkpoint."""


def resolve_checkpoint(path: str, roots: Sequence[str]) -> Path:
    """The checkpoint folder ``path`` resolved (symlinks followed), if it lies under a root.

    Args:
        path: the requested folder (absolute, or relative to the server's working directory).
        roots: the allowed checkpoint roots (``--checkpoint-root``), each resolved too.

    Raises:
        Forbidden (field ``path``): no roots configured; the path does not exist; it
            resolves outside every root (a symlink inside a root that points out of it
            included); or it is not a folder.
    """
    if not roots:
        raise Forbidden("no checkpoint roots are configured (--checkpoint-root); nothing may be loaded", field="path")
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        raise Forbidden(f"checkpoint path {path!r} does not exist under a checkpoint root", field="path") from None
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise Forbidden(f"checkpoint path {path!r} resolves outside the checkpoint roots", field="path")
    if not resolved.is_dir():
        raise Forbidden(f"checkpoint path {path!r} is not a folder", field="path")
    return resolved


async def check_files(folder: Path, engine: object = None, kind: object = None, served: object = None) -> None:
    """Refuse a checkpoint folder its own files rule out, before the engine is touched.

    Runs the engine's own rules when it has them
    (:class:`~rmserve.server.engines.protocol.SupportsCheckpointCheck`: a DPO engine wants a causal
    LM whose vocabulary matches its reference), else the served kind's
    (:meth:`~rmserve.server.kinds.base.RewardKind.check_checkpoint`, given the ``served``
    :class:`~rmserve.schema.ModelInfo`: a classifier's head may not change), else (no kind given)
    :func:`~rmserve.server.swaps.checkpoints.check_checkpoint` (config: a one-label
    ``*ForSequenceClassification``; tokenizer files present and their JSON parses; weight
    files present, every shard of an index), in a worker thread: a tokenizer JSON can be
    several MB. The scoring gate stays open; nothing is counted as a swap.

    Raises:
        InvalidCheckpoint (422, field ``path``): the first rule the folder breaks.
    """
    if isinstance(engine, SupportsCheckpointCheck):
        await asyncio.to_thread(engine.check_checkpoint, folder)
        return
    if kind is None:
        await asyncio.to_thread(check_checkpoint, folder)
    else:
        await asyncio.to_thread(kind.check_checkpoint, folder, served)


def _shape(folder: Path) -> dict[str, object]:
    file = folder / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise Conflict(f"checkpoint {folder.name!r} has no readable config.json: {type(exc).__name__}", field="path") from None
    return {key: config.get(key) for key in SHAPE_KEYS}


def reload_blocker(current: Path, new: Path) -> str | None:
    """Why ``new`` cannot be reloaded into the engine serving ``current``; None when it can.

    Compares the :data:`SHAPE_KEYS` of both ``config.json`` files and the bytes of every
    tokenizer file (:data:`~rmserve.fingerprint.TOKENIZER_FILES`) present in either.

    Returns:
        None (same architecture/shape and tokenizer), or a sentence naming the differing
        config keys (old → new) or the first differing tokenizer file.

    Raises:
        Conflict (409, field ``path``): a ``config.json`` is missing or not JSON.
    """
    old_shape, new_shape = _shape(current), _shape(new)
    differing = [key for key in SHAPE_KEYS if old_shape[key] != new_shape[key]]
    if differing:
        detail = ", ".join(f"{k}: {old_shape[k]!r} → {new_shape[k]!r}" for k in differing)
        return f"checkpoint {new.name!r} has a different architecture/shape ({detail})"
    for name in TOKENIZER_FILES:
        a, b = current / name, new / name
        old_bytes = a.read_bytes() if a.is_file() else None
        new_bytes = b.read_bytes() if b.is_file() else None
        if old_bytes != new_bytes:
            return f"checkpoint {new.name!r} has a different tokenizer ({name} differs)"
    return None


def plan_swap(engine: object, current: Path | None, new: Path) -> tuple[SwapKind, str | None]:
    """Which swap loads ``new`` into ``engine`` (serving the checkpoint folder ``current``).

    - ``reload`` when the engine supports in-place reload and ``new`` has the same
      architecture/shape and tokenizer (or ``current`` is unknown: a hub id, or an engine
      that does not say — then nothing can be compared and the reload is tried);
    - ``restart`` when the checkpoints differ, or the engine cannot reload in place, and it
      can restart itself and ``current`` is a known folder (so a failed restart can be
      undone by restarting on it).

    Returns:
        ``(kind, reason)``: ``reason`` says why a reload was not possible (None for a reload).

    Raises:
        Conflict (409, field ``path``): neither kind applies (the message names the
            difference and says to restart the server), or a ``config.json`` is unreadable.
    """
    can_reload = isinstance(engine, SupportsWeightReload)
    can_restart = isinstance(engine, SupportsRestart) and current is not None
    if current is None:
        blocker = None if can_reload else "the engine cannot reload weights in place"
    else:
        blocker = reload_blocker(current, new)
        if blocker is None and not can_reload:
            blocker = "the engine cannot reload weights in place"
    if blocker is None:
        return "reload", None
    if can_restart:
        return "restart", blocker
    if current is None and isinstance(engine, SupportsRestart):
        raise Conflict(
            f"{blocker}, and the loaded model is not a local checkpoint folder, so a failed restart could "
            f"not be undone; restart the server on it",
            field="path",
        )
    raise Conflict(f"{blocker}; {RESTART_HINT}", field="path")


# --- orchestration ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scoring_slot(state: EngineState, wait_s: float) -> AsyncIterator[None]:
    """Admit one scoring request past the swap gate and count it until it is answered.

    While a checkpoint swap runs (``state.serving`` cleared) the request waits up to
    ``wait_s`` seconds, then gets :class:`EngineNotReady` (503, Retry-After). Between the
    gate opening and the count there is no await, so a swap that has started draining
    never sees a request slip in.
    """
    if not state.serving.is_set():
        try:
            async with asyncio.timeout(wait_s):
                while not state.serving.is_set():
                    await state.serving.wait()
        except TimeoutError:
            raise EngineNotReady(
                f"a checkpoint swap is in progress (waited swap_wait_s={wait_s:g} s); retry later"
            ) from None
    state.enter_scoring()
    try:
        yield
    finally:
        state.leave_scoring()


async def start_swap(app: web.Application, load: LoadModelRequest, folder: Path,
                     user: User = ANONYMOUS) -> tuple[ModelInfo, SwapKind]:
    """Plan and run the swap of the app's engine to the resolved checkpoint ``folder`` for
    ``user`` (who then holds the model's lease, :mod:`rmserve.server.sharing.leases`).

    One swap at a time: a second one is refused, not queued. Once it holds the swap lock the
    swap runs to its end even if the caller is cancelled (a half-done restart would leave no
    model); the lock is released when it ends.

    Returns:
        (the served model's new info, the kind of swap).

    Raises:
        Conflict: another swap is in progress, or :func:`plan_swap` found no way to load it.
        Conflict / Forbidden / EngineNotReady / EngineError: from :func:`run_swap`.
    """
    state = app[STATE_KEY]
    kind, reason = plan_swap(app[ENGINE_KEY], state.checkpoint_dir, folder)
    if state.swap_lock.locked():
        raise Conflict("another checkpoint swap is in progress; retry after it finishes")
    await state.swap_lock.acquire()  # free (checked just above): returns without yielding
    operation = asyncio.ensure_future(run_swap(app, load, folder, kind, reason, user))
    operation.add_done_callback(lambda _: state.swap_lock.release())
    return await asyncio.shield(operation), kind


async def run_swap(app: web.Application, load: LoadModelRequest, folder: Path, kind: SwapKind,
                   reason: str | None, user: User = ANONYMOUS) -> ModelInfo:
    """Close the gate, check the lease, drain, swap, publish the new model info and hand the
    lease to ``user``; the scoring gate reopens whatever happens.

    The lease check (:meth:`~rmserve.server.sharing.leases.LeaseBook.check_swap`) runs right after
    the gate closes, with no await between: pinned work admitted before it is counted, and
    none is admitted after it until the swap ends. Requests already admitted are drained and
    answered on the old checkpoint (also when the swap is forced); requests pinned to the old
    fingerprint that come later get 409.

    After a successful swap the result cache is cleared: its entries are keyed by the old
    model's fingerprint and can no longer be hit (unless a later swap goes back to it).

    Raises:
        Conflict: another user holds the lease or has pinned work in flight (not forced).
        Forbidden: ``force`` asked by a user who is not an admin.
        EngineNotReady: in-flight scoring outlasted ``swap_drain_timeout_s`` (nothing loaded).
        EngineError: the engine failed; see :func:`reload_or_restore` and
            :func:`restart_or_restore` for what is served afterwards.
    """
    config = app[CONFIG_KEY]
    state = app[STATE_KEY]
    metrics = app[METRICS_KEY]
    if kind == "restart":
        logger.info("checkpoint swap to %s needs an engine restart: %s", folder.name, reason)
    started = time.perf_counter()
    book = leases_of(app)
    state.begin_swap()
    try:
        current, _ = state.require_ready()
        forced, overridden = book.check_swap(user, load.force, current)
        if overridden:
            logger.warning("checkpoint swap forced by %s over pinned work in flight on %s: %s", user.name,
                           current.fingerprint, ", ".join(f"{u}: {n} groups" for u, n in overridden))
        try:
            async with asyncio.timeout(config.swap_drain_timeout_s):
                await state.scoring_idle.wait()
        except TimeoutError:
            metrics.swaps.labels(kind=kind, outcome="drain_timeout").inc()
            raise EngineNotReady(
                f"{state.scoring_requests} scoring requests were still in flight after "
                f"swap_drain_timeout_s={config.swap_drain_timeout_s:g} s; checkpoint {folder.name!r} was not "
                "loaded and the current model is still served; retry later"
            ) from None
        try:
            with gc_heap.unfrozen_for(app, f"checkpoint swap to {folder.name}"):
                if kind == "reload":
                    loaded = await reload_or_restore(app, folder)
                else:
                    loaded = await restart_or_restore(app, folder)
        except BaseException:
            metrics.swaps.labels(kind=kind, outcome="error").inc()
            raise
        before = state.info
        info = state.swapped(loaded, load.name, folder)
        book.granted(user.name, info, current.fingerprint, overridden, forced)
        if before is None or info.fingerprint != before.fingerprint:
            # Entries are keyed by fingerprint, so none is ever served for another model; they
            # go to free memory. The same checkpoint loaded again (a sweep resuming) keeps them,
            # so groups a killed client had in flight are answered again without engine work.
            app[RESULT_CACHE_KEY].clear()
    finally:
        state.finish_swap()
    metrics.swaps.labels(kind=kind, outcome="ok").inc()
    metrics.swap_duration_s.labels(kind=kind).observe(time.perf_counter() - started)
    logger.info("checkpoint swap %d (%s): now serving %s (fingerprint %s, max_model_len %d)", info.swap_count,
                kind, load.name, info.fingerprint, info.max_model_len)
    return info


async def renderer_for(app: web.Application, loaded: LoadedModel) -> Renderer:
    """The renderer for a model the engine has just loaded.

    The app's renderer factory (called in a render thread) when it has one; else the fixed
    renderer the app was given (kept across restarts).
    """
    factory = app[RENDERER_FACTORY_KEY]
    state = app[STATE_KEY]
    if factory is None:
        assert state.renderer is not None
        return state.renderer
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(app[EXECUTOR_KEY], factory, loaded)


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, RMServeError) else f"{type(exc).__name__}: {exc}"


async def reload_or_restore(app: web.Application, folder: Path) -> LoadedModel:
    """Reload the engine's weights from ``folder``; on failure reload the previous checkpoint's.

    An engine may fail half-way through loading weights, so after any failure the weights in
    memory are treated as mixed: the state turns ``restoring`` (``/health`` 503
    ``restoring``, scoring and ``/v1/models`` 503 ``engine_not_ready`` with ``Retry-After``)
    while the previous checkpoint's weights are reloaded; the prefix cache is reset after
    each load. Returns the loaded model after a successful reload.

    Raises:
        EngineError: the reload failed; the message says whether the previous checkpoint
            serves again (status ``ready``, name, fingerprint and swap count as before) or
            not (status ``failed``: its reload failed too, or the served model is not a
            local folder and cannot be reloaded).
    """
    engine = app[ENGINE_KEY]
    state = app[STATE_KEY]
    try:
        loaded = await engine.reload_weights(str(folder))
        await engine.reset_prefix_cache()
        return loaded
    except Exception as exc:  # noqa: BLE001 - any failure may leave mixed weights
        failure = exc
    state.begin_restore(failure)
    head = f"reloading the weights of checkpoint {folder.name!r} failed ({_why(failure)})"
    previous = state.checkpoint_dir
    if previous is None:
        state.fail(failure)
        logger.error("%s; the served model is not a local folder and cannot be reloaded: no model is served", head)
        raise EngineError(
            f"{head}; the engine may hold partly replaced weights and the previous model is not a local "
            f"checkpoint folder, so it cannot be reloaded; no model is served: restart the server"
        ) from failure
    logger.error("%s; reloading the previous checkpoint %s", head, previous.name)
    try:
        restored = await engine.reload_weights(str(previous))
        await engine.reset_prefix_cache()
    except Exception as exc:  # noqa: BLE001
        state.fail(exc)
        logger.error("reloading the previous checkpoint %s failed too (%s): no model is served", previous.name,
                     _why(exc))
        raise EngineError(
            f"{head}; reloading the previous checkpoint {previous.name!r} failed too ({_why(exc)}); no model is "
            f"served: restart the server"
        ) from failure
    state.restored(restored)
    logger.info("the previous checkpoint %s is served again (fingerprint %s)", previous.name,
                restored.info.fingerprint)
    raise EngineError(
        f"{head}; the previous checkpoint {previous.name!r} was reloaded and is served again "
        f"(fingerprint {restored.info.fingerprint})"
    ) from failure


async def restart_or_restore(app: web.Application, folder: Path) -> LoadedModel:
    """Restart the engine on ``folder``; on failure restart it on the previous checkpoint.

    ``/health`` answers ``restarting`` meanwhile. Returns the loaded model (its renderer is
    in place).

    Raises:
        EngineError: the new checkpoint failed; the message says whether the previous one
            serves again (status stays ``ready``, name and swap count unchanged) or not
            (status ``failed``, no info, no renderer).
    """
    state = app[STATE_KEY]
    state.begin_restart()
    try:
        return await _restart_or_restore(app, folder)
    finally:
        state.finish_restart()


async def _restart_or_restore(app: web.Application, folder: Path) -> LoadedModel:
    engine = app[ENGINE_KEY]
    state = app[STATE_KEY]
    previous = state.checkpoint_dir
    assert previous is not None  # plan_swap restarts only from a known folder
    try:
        loaded = await engine.restart(str(folder))
        state.use_renderer(await renderer_for(app, loaded))
        return loaded
    except Exception as exc:  # noqa: BLE001 - any failure: restore the previous checkpoint
        failure = exc
    logger.error("engine restart on checkpoint %s failed (%s); restarting on the previous checkpoint %s",
                 folder.name, _why(failure), previous.name)
    try:
        restored = await engine.restart(str(previous))
        state.use_renderer(await renderer_for(app, restored))
    except Exception as exc:  # noqa: BLE001
        state.fail(exc)
        logger.error("restoring checkpoint %s failed too (%s): no model is served", previous.name, _why(exc))
        raise EngineError(
            f"restarting the engine on checkpoint {folder.name!r} failed ({_why(failure)}); restoring the previous "
            f"checkpoint {previous.name!r} failed too ({_why(exc)}); no model is served: restart the server"
        ) from failure
    state.restored(restored)
    raise EngineError(
        f"restarting the engine on checkpoint {folder.name!r} failed ({_why(failure)}); the previous checkpoint "
        f"{previous.name!r} was restored and is served again (fingerprint {restored.info.fingerprint})"
    ) from failure
