"""Engine backends by name, imported only when chosen.

``rmserve serve --engine NAME`` resolves ``NAME`` here; the map holds ``"module:attr"``
strings so that importing this module (or the CLI) never imports torch or vllm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmserve.server.config import EngineConfig
    from rmserve.server.protocol import RewardEngine

ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engine:VLLMEngine",
    "hf": "rmserve.server.engine_hf:HFEngine",
}
"""Engine name → ``"module:attr"`` of a class taking an :class:`EngineConfig`."""

LOGPROB_ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engine:VLLMLogprobEngine",
    "hf": "rmserve.server.engine_hf:HFLogprobEngine",
}
"""Engine name → ``"module:attr"`` of a :class:`~rmserve.server.protocol.LogprobEngine` class
taking ``(config, model)``; a DPO engine (:mod:`rmserve.server.dpo`) builds its policy and
reference from it."""


def engine_class(name: str) -> type:
    """Import and return the engine class registered as ``name``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the choices.
    """
    try:
        target = ENGINES[name]
    except KeyError:
        raise ValueError(f"engine: unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}") from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def build_engine(config: EngineConfig) -> RewardEngine:
    """The (not yet started) engine that ``config.engine`` names, built from ``config``."""
    return engine_class(config.engine)(config)
