"""The scoring app's state: typed app keys and :class:`EngineState` with its mutators.

Everything the app owns lives under one of the :class:`aiohttp.web.AppKey` keys below (no
module globals). :class:`EngineState` is the only mutable record; its fields change only
through its named methods, each called from one place:

- :meth:`EngineState.publish`, :meth:`EngineState.fail`, :meth:`EngineState.settle`,
  :meth:`EngineState.stop`: the app's engine start-up task and cleanup
  (:mod:`rmserve.server.http.app`);
- :meth:`EngineState.begin_swap` / :meth:`EngineState.finish_swap`,
  :meth:`EngineState.begin_restart` / :meth:`EngineState.finish_restart`,
  :meth:`EngineState.begin_restore`, :meth:`EngineState.use_renderer`,
  :meth:`EngineState.swapped`, :meth:`EngineState.restored`, and :meth:`EngineState.fail`
  when neither the new nor the previous checkpoint loads: the checkpoint-swap orchestration
  (:mod:`rmserve.server.swaps.swap`);
- :meth:`EngineState.enter_scoring` / :meth:`EngineState.leave_scoring`: the scoring gate
  (:func:`rmserve.server.swaps.swap.scoring_slot`), and :meth:`EngineState.admit_groups` /
  :meth:`EngineState.release_groups`: the scoring path (:mod:`rmserve.server.kinds.scoring`).

Routes only read it (:meth:`EngineState.require_ready`, ``status``, ``restarting``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web
from rmserve.server.config import ServerConfig
from rmserve.server.engines.protocol import LoadedModel, RewardEngine
from rmserve.server.render.chat import Renderer
from rmserve.server.kinds.result_cache import ResultCache

from rmserve.errors import EngineNotReady
from rmserve.schema import ModelInfo

if TYPE_CHECKING:  # prometheus_client is a server extra; importing this module must not need it
    from rmserve.server.http.observability import ServerMetrics

RendererFactory = Callable[[LoadedModel], Renderer]
"""Builds the renderer once the engine has loaded a model (it needs the model's max length);
called again after every engine restart."""


@dataclass(slots=True)
class EngineState:
    """Lifecycle of the app's engine and the counters of the scoring gate.

    Attributes:
        status: ``loading`` → ``ready`` (or ``failed``) → ``stopping``; also ``ready`` →
            ``restoring`` while the previous checkpoint's weights are reloaded after a
            failed in-place reload (the engine may hold partly replaced weights: nothing is
            scored), then ``ready`` again; and ``ready``/``restoring`` → ``failed`` when a
            checkpoint swap failed and the previous checkpoint could not be loaded again
            (no model is served).
        info: the served model's :class:`ModelInfo` (name overridden by
            ``served_model_name``, then by each swap's name); None unless ready (kept, but
            not served, while ``restoring``).
        renderer: the chat-template renderer in use (given to the app, or built once the
            engine is ready and again after each engine restart); None unless ready.
        error: why loading (or that swap and its restore) failed, when ``status`` is
            ``failed``; the failed reload, when ``restoring``.
        settled: set once loading finished, successfully or not.
        inflight_groups: groups admitted by ``/v1/score`` and not yet answered.
        scoring_requests: ``/v1/score`` requests past the swap gate and not yet answered.
        scoring_idle: set while ``scoring_requests == 0`` (a swap drains on it).
        serving: cleared while a checkpoint swap runs; scoring requests wait on it.
        swap_lock: held by the one checkpoint swap that may run at a time.
        restarting: True while a checkpoint swap restarts the engine (no model is loaded;
            ``/health`` answers 503 ``restarting`` while scoring requests wait on the gate).
        checkpoint_dir: folder of the loaded checkpoint (for the swap's compatibility check,
            and to restore it when a restart on another checkpoint fails); None when the
            model is not a local folder.
        needs_renderer: the kind's :attr:`~rmserve.server.kinds.base.RewardKind.needs_renderer`:
            False for a kind whose engine renders its own prompts (a generative judge); the
            state is then ready with no renderer (``renderer`` stays None).
    """

    status: str = "loading"
    info: ModelInfo | None = None
    renderer: Renderer | None = None
    error: BaseException | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    inflight_groups: int = 0
    scoring_requests: int = 0
    scoring_idle: asyncio.Event = field(default_factory=asyncio.Event)
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    swap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restarting: bool = False
    checkpoint_dir: Path | None = None
    needs_renderer: bool = True

    def __post_init__(self) -> None:
        self.scoring_idle.set()
        self.serving.set()

    def require_ready(self) -> tuple[ModelInfo, Renderer]:
        """Model info and renderer (None for a judge, see ``needs_renderer``); raises
        :class:`EngineNotReady` unless the engine is ready."""
        if self.status == "restoring":
            raise EngineNotReady(
                "the engine is not ready (status: restoring): a checkpoint reload failed and the previous "
                "checkpoint's weights are being loaded again; retry later"
            )
        if self.status != "ready" or self.info is None or (self.renderer is None and self.needs_renderer):
            raise EngineNotReady(f"the engine is not ready (status: {self.status}); retry later")
        return self.info, self.renderer

    # --- start-up and cleanup ------------------------------------------------------------

    def publish(self, info: ModelInfo, renderer: Renderer | None, checkpoint_dir: Path | None) -> None:
        """The engine has loaded its first model: serve it (status ``ready``); ``renderer``
        is None only for an engine that renders its own prompts (``needs_renderer`` False)."""
        self.info, self.renderer, self.checkpoint_dir = info, renderer, checkpoint_dir
        self.status = "ready"

    def fail(self, error: BaseException) -> None:
        """No model can be served (start failed, or a swap and its restore both failed)."""
        self.status, self.error, self.info, self.renderer = "failed", error, None, None

    def settle(self) -> None:
        """Loading has finished, successfully or not (wakes whoever waits on ``settled``)."""
        self.settled.set()

    def stop(self) -> None:
        """The app is shutting down (status ``stopping``)."""
        self.status = "stopping"

    # --- checkpoint swaps ----------------------------------------------------------------

    def begin_swap(self) -> None:
        """Close the scoring gate: new scoring requests wait until :meth:`finish_swap`."""
        self.serving.clear()

    def finish_swap(self) -> None:
        """Open the scoring gate again (whatever the swap's outcome)."""
        self.serving.set()

    def begin_restart(self) -> None:
        """The engine is restarting: no model is loaded (``/health`` says ``restarting``)."""
        self.restarting = True

    def finish_restart(self) -> None:
        """The engine restart is over (successful or not)."""
        self.restarting = False

    def begin_restore(self, failure: BaseException) -> None:
        """An in-place reload failed (``failure``) and may have left partly replaced weights:
        serve nothing (status ``restoring``; scoring and ``/v1/models`` answer 503) until
        :meth:`restored` or :meth:`fail`. The info and renderer are kept for the restore."""
        self.status, self.error = "restoring", failure

    def use_renderer(self, renderer: Renderer) -> None:
        """Render with ``renderer`` from now on (the restarted model's)."""
        self.renderer = renderer

    def swapped(self, loaded: LoadedModel, name: str, folder: Path) -> ModelInfo:
        """Serve the model swapped in from ``folder`` as ``name``: one more swap, finished now;
        returns the new info."""
        old, _ = self.require_ready()
        self.info = msgspec.structs.replace(
            loaded.info, name=name, swap_count=old.swap_count + 1, last_swap_time=time.time(),
            chat_template_override=old.chat_template_override,  # the server's setting, not the checkpoint's
        )
        self.checkpoint_dir = folder
        return self.info

    def restored(self, loaded: LoadedModel) -> None:
        """The previous checkpoint serves again after a failed restart or reload (status
        ``ready``): name, swap count and last swap time kept, the rest from ``loaded``."""
        old = self.info
        assert old is not None and self.status in ("ready", "restoring"), self.status
        self.info = msgspec.structs.replace(loaded.info, name=old.name, swap_count=old.swap_count,
                                            last_swap_time=old.last_swap_time,
                                            chat_template_override=old.chat_template_override)
        self.status, self.error = "ready", None

    # --- scoring -------------------------------------------------------------------------

    def enter_scoring(self) -> None:
        """Count one scoring request past the gate (a swap waits until none is left)."""
        self.scoring_requests += 1
        self.scoring_idle.clear()

    def leave_scoring(self) -> None:
        """The scoring request counted by :meth:`enter_scoring` has been answered."""
        self.scoring_requests -= 1
        if self.scoring_requests == 0:
            self.scoring_idle.set()

    def admit_groups(self, count: int) -> None:
        """``count`` more groups are being scored (``max_inflight_groups`` bounds the total)."""
        self.inflight_groups += count

    def release_groups(self, count: int) -> None:
        """``count`` admitted groups are answered (or failed)."""
        self.inflight_groups -= count


CONFIG_KEY = web.AppKey("config", ServerConfig)
KIND_KEY = web.AppKey("kind", object)
"""The served model's :class:`rmserve.server.kinds.base.RewardKind` (its kind's hooks and settings)."""
ENGINE_KEY = web.AppKey("engine", RewardEngine)
RENDERER_FACTORY_KEY = web.AppKey("renderer_factory", object)
METRICS_KEY: web.AppKey[ServerMetrics] = web.AppKey("metrics")
STATE_KEY = web.AppKey("engine_state", EngineState)
EXECUTOR_KEY = web.AppKey("render_executor", ThreadPoolExecutor)
RESULT_CACHE_KEY = web.AppKey("result_cache", ResultCache)
