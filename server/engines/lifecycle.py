"""The loaded-model base and the lifecycle every engine shares: start, shutdown, restart, reload.

An engine holds its loaded state as a :class:`Loaded` (the
:class:`~rmserve.server.engines.protocol.LoadedModel` record plus the engine's own handles: a
vLLM ``AsyncLLM``, a transformers model, a pair of log-prob engines). :class:`EngineLifecycle`
runs every (re)load the same way, so an engine writes only how to load, reload and release:

- :meth:`EngineLifecycle._load` (required): build the configured checkpoint, blocking work in a
  worker thread; :meth:`EngineLifecycle._release`: free a loaded model (default: nothing);
- :meth:`EngineLifecycle._use_checkpoint`: make a folder the checkpoint the next ``_load`` builds
  (used by the default :meth:`EngineLifecycle._restart_on`);
- :meth:`EngineLifecycle._reload`: the weights of a folder into a loaded model (same shape);
- :meth:`EngineLifecycle._exclusive`: what a restart or reload holds (default: the engine's
  ``asyncio.Lock``, which its forward passes hold too);
- :meth:`EngineLifecycle._swap_folder`: the checks on a swap's checkpoint path.

From those, :meth:`EngineLifecycle.start`, :meth:`~EngineLifecycle.shutdown`,
:meth:`~EngineLifecycle.info`, :meth:`~EngineLifecycle.restart` and
:meth:`~EngineLifecycle.reload_weights` are written once here, with the messages and counters
of a (re)start (:meth:`EngineLifecycle._require` says why nothing is loaded: still loading,
shutting down, restarting, a failed or cancelled restart).

No torch, no vllm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

from rmserve.errors import EngineError, EngineNotReady, InvalidRequest, RMServeError
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import ModelInfo, RewardHead, ScoreKind
from rmserve.server.engines.protocol import LoadedModel

if TYPE_CHECKING:
    from rmserve.server.render.chat import Renderer


def model_info_text(info: ModelInfo) -> str:
    """``model demo-rm: classifier, head classifier, engine vllm, float32, max_model_len 4096,
    fingerprint 3f…``: a served model in words for the logs (the fields set, no struct repr);
    the kind's part is :meth:`ScoreKind.describe`, the head's :meth:`RewardHead.describe`."""
    parts = [f"model {info.name}: {ScoreKind.of(info).describe()}"]
    if info.head is not msgspec.UNSET:
        parts.append(f"head {info.head.describe()}")
    parts += [f"engine {info.engine}", info.dtype, f"max_model_len {info.max_model_len}"]
    if info.attention is not msgspec.UNSET:
        parts.append(f"attention {info.attention}")
    parts.append(f"fingerprint {info.fingerprint}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Loaded:
    """What an engine holds while a model is loaded; engines subclass it to add their handles.

    Attributes:
        record: the :class:`~rmserve.server.engines.protocol.LoadedModel` that ``start``,
            ``restart`` and ``reload_weights`` return (info, renderer, checkpoint folder).
    """

    record: LoadedModel

    @property
    def info(self) -> ModelInfo:
        """The served model's :class:`~rmserve.schema.ModelInfo` (``record.info``)."""
        return self.record.info

    @property
    def renderer(self) -> Renderer:
        """The record's renderer; only for an engine whose record has one."""
        assert self.record.renderer is not None
        return self.record.renderer


LoadedT = TypeVar("LoadedT", bound=Loaded)


class OwnRenderer:
    """Mixin of an engine (an :class:`EngineLifecycle`) whose loaded record carries the
    renderer it built: the ``renderer`` property."""

    def _require(self) -> Loaded:  # pragma: no cover - EngineLifecycle's comes first in the MRO
        raise NotImplementedError

    @property
    def renderer(self) -> Renderer:
        """The renderer matching the loaded model's tokenizer, template and max length.

        Raises:
            EngineNotReady: shutting down, or no model loaded.
        """
        return self._require().renderer


class EngineLifecycle(Generic[LoadedT]):
    """Base of an engine: the loaded state, its (re)loads and the rules for reading it.

    A subclass writes :meth:`_load` and, as it needs them, :meth:`_release`,
    :meth:`_use_checkpoint` (or :meth:`_restart_on`), :meth:`_reload`, :meth:`_exclusive` and
    :meth:`_swap_folder`; the public lifecycle (:meth:`start`, :meth:`shutdown`, :meth:`info`,
    :meth:`restart`, :meth:`reload_weights`) is this class's.

    Attributes:
        kind: the engine's registered name (``ModelInfo.engine``); set by subclasses.
        label: how log and error messages name the engine (e.g. ``"vLLM engine"``).
        start_time_s: seconds the last successful start or restart took to build the model.
    """

    kind = "engine"
    label = "engine"

    def __init__(self) -> None:
        self._loaded: LoadedT | None = None
        self._closing = False
        self._not_loaded = "the engine is still loading"
        self._lock = asyncio.Lock()
        self.start_time_s: float | None = None

    # --- what an engine writes ---------------------------------------------------------

    async def _load(self) -> LoadedT:  # pragma: no cover - abstract
        """Build the configured checkpoint (blocking work in a worker thread).

        Raises:
            ServerFault: the checkpoint is not of the kind this engine serves, or it did not load.
        """
        raise NotImplementedError

    async def _release(self, loaded: LoadedT) -> str | None:
        """Free ``loaded``, which is no longer served (shutdown, restart, a start cut short).

        Returns:
            A problem :meth:`shutdown` raises as :class:`~rmserve.errors.EngineError` (a restart
            ignores it), or None. The default frees nothing (the garbage collector does).
        """
        return None

    def _use_checkpoint(self, folder: Path) -> None:  # pragma: no cover - abstract
        """Make ``folder`` the checkpoint the next :meth:`_load` builds."""
        raise NotImplementedError

    async def _restart_on(self, folder: Path) -> LoadedT:
        """Build the checkpoint ``folder`` for :meth:`restart` (the old model is released):
        :meth:`_use_checkpoint`, then :meth:`_load`."""
        self._use_checkpoint(folder)
        return await self._load()

    async def _reload(self, loaded: LoadedT, folder: Path) -> LoadedT:  # pragma: no cover - abstract
        """The loaded state with the weights of ``folder`` (same architecture) in place of
        ``loaded``'s; on failure ``loaded`` stays served.

        Raises:
            EngineError: the weights did not load.
        """
        raise NotImplementedError

    async def _swap_folder(self, path: str | Path, *, restart: bool) -> Path:
        """The checkpoint folder of a :meth:`restart` (``restart``) or :meth:`reload_weights`,
        checked before anything is touched.

        The default checks that ``path`` is a folder, in a worker thread (it reads the disk).

        Raises:
            InvalidRequest (field ``path``): ``path`` is not an existing folder.
        """
        return await asyncio.to_thread(self._checkpoint_folder, path)

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """Held by a restart or reload: by default the engine's lock (its forward passes hold
        it too, so a swap waits for the one in progress)."""
        async with self._lock:
            yield

    # --- the lifecycle -----------------------------------------------------------------

    async def start(self) -> LoadedModel:
        """Load the model; return the loaded model (info, renderer, checkpoint folder). A
        second call returns the same record.

        Raises:
            EngineNotReady: shutting down (also when :meth:`shutdown` came while loading).
            ServerFault: the checkpoint is not of the kind this engine serves, or did not load.
        """
        if self._loaded is not None:
            return self._loaded.record
        if self._closing:
            raise EngineNotReady("the engine is shutting down")
        started = time.perf_counter()
        loaded = await self._load()
        if self._closing:  # shutdown() was called while loading
            await self._release(loaded)
            raise EngineNotReady("the engine was shut down while loading")
        return self._finish_start(loaded, started, "ready")

    async def shutdown(self) -> None:
        """Release the model; idempotent.

        Raises:
            EngineError: the release found a problem (for vLLM: the engine core had died).
        """
        self._closing = True
        loaded, self._loaded = self._loaded, None
        if loaded is not None and (problem := await self._release(loaded)) is not None:
            raise EngineError(problem)

    def info(self) -> ModelInfo:
        """What is served (:class:`~rmserve.schema.ModelInfo`).

        Raises:
            EngineNotReady: before :meth:`start`, shutting down, or no model after a failed restart.
        """
        return self._require().info

    async def restart(self, path: str | Path) -> LoadedModel:
        """Release the running model and load the checkpoint folder ``path`` (any architecture
        or tokenizer) with this engine's settings otherwise.

        The old model is released first (one model in memory at a time), so a restart costs a
        full start. Scoring calls meanwhile get :class:`EngineNotReady`; the swap waits for
        what :meth:`_exclusive` waits for (the calls in flight).

        Returns:
            The loaded model: new info, renderer and checkpoint folder.

        Raises:
            InvalidRequest / InvalidCheckpoint: :meth:`_swap_folder` refused ``path`` (nothing
                was stopped).
            EngineNotReady: shutting down, or (vLLM) another reload or restart is running.
            EngineError: the new model did not load; no model is loaded afterwards
                (:meth:`info` raises :class:`EngineNotReady`) until a restart succeeds.
        """
        if self._closing:
            raise EngineNotReady("the engine is shutting down")
        folder = await self._swap_folder(path, restart=True)
        async with self._exclusive():
            if self._closing:
                raise EngineNotReady("the engine is shutting down")
            old = self._begin_restart(folder)
            if old is not None:
                await self._release(old)  # a problem of the old model does not stop the restart
            old = None  # nothing holds the old model while the new one loads
            started = time.perf_counter()
            try:
                loaded = await self._restart_on(folder)
            except asyncio.CancelledError:
                self._restart_cancelled(folder)
                raise
            except Exception as exc:  # noqa: BLE001 - any start failure: no model now
                raise self._restart_failed(folder, exc) from exc
            if self._closing:  # shutdown() was called while building
                await self._release(loaded)
                raise EngineNotReady("the engine was shut down while restarting")
            return self._finish_start(loaded, started, f"restarted on {folder.name}")

    async def reload_weights(self, path: str | Path) -> LoadedModel:
        """Swap the weights in place for the checkpoint folder ``path`` (same architecture and
        tokenizer: the renderer is kept, the fingerprint recomputed). On failure the loaded
        model is unchanged.

        Returns:
            The loaded model: new fingerprint and checkpoint folder, the same renderer.

        Raises:
            EngineNotReady: not started or shut down (or, vLLM, another swap is running).
            InvalidRequest / InvalidCheckpoint: :meth:`_swap_folder` refused ``path``.
            EngineError: the weights did not load.
        """
        self._require()
        folder = await self._swap_folder(path, restart=False)
        async with self._exclusive():
            loaded = self._require()
            self._loaded = await self._reload(loaded, folder)
            return self._loaded.record

    # --- the loaded state and its messages ---------------------------------------------

    def _require(self) -> LoadedT:
        """The loaded state.

        Raises:
            EngineNotReady: shutting down, or no model loaded (the message says why).
        """
        if self._closing:
            raise EngineNotReady("the engine is shutting down")
        if self._loaded is None:
            raise EngineNotReady(self._not_loaded)
        return self._loaded

    @staticmethod
    def _checkpoint_folder(path: str | Path) -> Path:
        """``path`` as a folder.

        Raises:
            InvalidRequest (field ``path``): ``path`` is not an existing folder.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise InvalidRequest(f"checkpoint path {str(folder)!r} is not a folder", field="path")
        return folder

    def _begin_restart(self, folder: Path) -> LoadedT | None:
        """Drop the loaded state before a restart on ``folder`` (scoring meanwhile gets
        EngineNotReady); returns what was loaded."""
        old, self._loaded = self._loaded, None
        self._not_loaded = f"the engine is restarting on checkpoint {folder.name!r}"
        return old

    def _restart_cancelled(self, folder: Path) -> None:
        """Record that the restart on ``folder`` was cancelled: no model is loaded."""
        self._not_loaded = f"the restart on checkpoint {folder.name!r} was cancelled; no model is loaded"

    def _restart_failed(self, folder: Path, exc: BaseException) -> EngineError:
        """Record that the restart on ``folder`` failed and return the error to raise (with its reason)."""
        self._not_loaded = f"the restart on checkpoint {folder.name!r} failed; no model is loaded"
        reason = exc.message if isinstance(exc, RMServeError) else f"{type(exc).__name__}: {exc}"
        return EngineError(f"the {self.label} did not start on checkpoint {folder.name!r}: {reason}")

    def _finish_start(self, loaded: LoadedT, started: float, what: str) -> LoadedModel:
        """Publish ``loaded`` (built since ``perf_counter()`` was ``started``), log it on the
        engine module's logger, return its record."""
        self._loaded = loaded
        self.start_time_s = time.perf_counter() - started
        logging.getLogger(type(self).__module__).info(
            "%s %s in %.1f s: %s", self.label, what, self.start_time_s, model_info_text(loaded.record.info)
        )
        return loaded.record

    def _model_info(
        self, name: str, model: str, renderer: Renderer | str | None, max_model_len: int, dtype: str,
        *, head: RewardHead | None = None, attention: str | None = None,
    ) -> ModelInfo:
        """The :class:`ModelInfo` this engine serves for the weights at ``model``.

        Args:
            name: the served model name.
            model: the checkpoint (folder or hub id) the weights came from; it enters the fingerprint.
            renderer: the model's renderer, whose chat template enters the fingerprint; or, for
                an engine that does not render (a log-prob engine), the chat template text
                itself (None: none).
            max_model_len: the resolved context limit, in tokens.
            dtype: the resolved weight dtype (e.g. ``"bfloat16"``); it enters the fingerprint.
            head: a sequence classifier's reward head (:class:`~rmserve.schema.RewardHead`); it
                enters the fingerprint and ``ModelInfo.head`` (None: no head, left unset).
            attention: the attention implementation the engine runs (``ModelInfo.attention``;
                None: not reported).
        """
        template = renderer if renderer is None or isinstance(renderer, str) else renderer.chat_template
        return ModelInfo(
            name=name,
            max_model_len=max_model_len,
            dtype=dtype,
            fingerprint=model_fingerprint(model, template, dtype, head),
            engine=self.kind,
            head=msgspec.UNSET if head is None else head,
            attention=msgspec.UNSET if attention is None else attention,
        )
