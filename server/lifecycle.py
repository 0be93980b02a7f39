"""Lifecycle bookkeeping shared by the engines: loaded or not, closing, restarting.

An engine module holds its own loaded state (a model handle plus a
:class:`~rmserve.server.protocol.LoadedModel`); :class:`EngineLifecycle` keeps the parts
every engine needs around it, so each engine writes only how to build, score and release:

- :meth:`EngineLifecycle._require`: the loaded state, or :class:`EngineNotReady` saying why
  there is none (still loading, shutting down, restarting, a failed restart);
- :meth:`EngineLifecycle._checkpoint_folder`: the restart/reload argument as a folder, or
  :class:`InvalidRequest` naming it;
- :meth:`EngineLifecycle._begin_restart` / :meth:`EngineLifecycle._restart_failed` /
  :meth:`EngineLifecycle._restart_cancelled` / :meth:`EngineLifecycle._finish_start`: the
  messages and counters of a (re)start;
- :meth:`EngineLifecycle._model_info`: the :class:`~rmserve.schema.ModelInfo` of a built model.

No torch, no vllm.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from rmserve.errors import EngineError, EngineNotReady, InvalidRequest, ServerFault
from rmserve.fingerprint import model_fingerprint
from rmserve.schema import ModelInfo
from rmserve.server.protocol import LoadedModel

if TYPE_CHECKING:
    from rmserve.server.render import Renderer


class _HasModel(Protocol):
    record: LoadedModel


LoadedT = TypeVar("LoadedT", bound=_HasModel)


class EngineLifecycle(Generic[LoadedT]):
    """Base of an engine: the loaded state and the rules for reading it.

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
        self.start_time_s: float | None = None

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

    def _begin_restart(self, folder: Path) -> None:
        """Drop the loaded state before a restart on ``folder`` (scoring meanwhile gets EngineNotReady)."""
        self._loaded = None
        self._not_loaded = f"the engine is restarting on checkpoint {folder.name!r}"

    def _restart_cancelled(self, folder: Path) -> None:
        """Record that the restart on ``folder`` was cancelled: no model is loaded."""
        self._not_loaded = f"the restart on checkpoint {folder.name!r} was cancelled; no model is loaded"

    def _restart_failed(self, folder: Path, exc: BaseException) -> EngineError:
        """Record that the restart on ``folder`` failed and return the error to raise (with its reason)."""
        self._not_loaded = f"the restart on checkpoint {folder.name!r} failed; no model is loaded"
        reason = exc.message if isinstance(exc, ServerFault) else f"{type(exc).__name__}: {exc}"
        return EngineError(f"the {self.label} did not start on checkpoint {folder.name!r}: {reason}")

    def _finish_start(self, loaded: LoadedT, started: float, log: logging.Logger, what: str) -> LoadedModel:
        """Publish ``loaded`` (built since ``perf_counter()`` was ``started``), log it, return its record."""
        self._loaded = loaded
        self.start_time_s = time.perf_counter() - started
        log.info("%s %s in %.1f s: %s", self.label, what, self.start_time_s, loaded.record.info)
        return loaded.record

    def _model_info(
        self, name: str, model: str, renderer: Renderer | str | None, max_model_len: int, dtype: str
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
        """
        template = renderer if renderer is None or isinstance(renderer, str) else renderer.chat_template
        return ModelInfo(
            name=name,
            max_model_len=max_model_len,
            dtype=dtype,
            fingerprint=model_fingerprint(model, template, dtype),
            engine=self.kind,
        )
