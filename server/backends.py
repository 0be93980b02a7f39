"""Engine backends by name, imported only when chosen.

``rmserve serve --engine NAME`` resolves ``NAME`` here; the map holds ``"module:attr"``
strings so that importing this module (or the CLI) never imports torch or vllm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmserve.server.config import EngineConfig
    from rmserve.server.protocol import JudgeEngine, RewardEngine

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

DPO_ENGINE = "rmserve.server.dpo:DPOEngine"
"""``"module:attr"`` of the engine of ``kind="dpo"`` (it wraps the :data:`LOGPROB_ENGINES` of
``config.engine``)."""

JUDGE_ENGINES: dict[str, str] = {
    "vllm": "rmserve.server.engine:VLLMJudgeEngine",
    "hf": "rmserve.server.engine_hf:HFJudgeEngine",
}
"""Engine name → ``"module:attr"`` of a local :class:`~rmserve.server.protocol.JudgeEngine`
class taking an :class:`EngineConfig` (``kind="judge"`` without ``judge_url``)."""

OPENAI_JUDGE_ENGINE = "rmserve.server.judge_openai:OpenAIJudgeEngine"
"""``"module:attr"`` of the judge engine of ``kind="judge"`` with ``judge_url`` set (an
OpenAI-compatible chat-completions endpoint; ``config.engine`` is then not used)."""


def _import(target: str) -> type:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


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


def logprob_engine_class(name: str) -> type:
    """Import and return the log-probability engine class registered as ``name``.

    Raises:
        ValueError: ``name`` is not in :data:`LOGPROB_ENGINES`; the message lists the choices.
    """
    try:
        target = LOGPROB_ENGINES[name]
    except KeyError:
        raise ValueError(
            f"engine: no log-prob engine {name!r}; choose one of {', '.join(sorted(LOGPROB_ENGINES))}"
        ) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def judge_engine_class(config: EngineConfig) -> type:
    """Import and return the judge engine class of a ``kind="judge"`` config: the OpenAI-compatible
    one (:data:`OPENAI_JUDGE_ENGINE`) when ``config.judge_url`` is set, else the local judge engine
    of ``config.engine`` (:data:`JUDGE_ENGINES`).

    Raises:
        ValueError: ``config.engine`` has no judge engine; the message lists the choices.
    """
    if config.judge_url is not None:
        return _import(OPENAI_JUDGE_ENGINE)
    try:
        target = JUDGE_ENGINES[config.engine]
    except KeyError:
        raise ValueError(
            f"engine: no judge engine {config.engine!r}; choose one of {', '.join(sorted(JUDGE_ENGINES))}"
        ) from None
    return _import(target)


def build_engine(config: EngineConfig) -> RewardEngine | JudgeEngine:
    """The (not yet started) engine for ``config``: for ``kind="dpo"`` a
    :class:`~rmserve.server.dpo.DPOEngine` over the log-prob engines of ``config.engine``
    (:data:`LOGPROB_ENGINES`); for ``kind="judge"`` a
    :class:`~rmserve.server.protocol.JudgeEngine` (:func:`judge_engine_class`: the
    OpenAI-compatible engine when ``config.judge_url`` is set, else the local one of
    ``config.engine``); else the reward engine ``config.engine`` names."""
    if config.kind == "judge":
        return judge_engine_class(config)(config)
    if config.kind == "dpo":
        module_name, _, attr = DPO_ENGINE.partition(":")
        dpo_engine = getattr(importlib.import_module(module_name), attr)
        return dpo_engine(config, logprob_engine=logprob_engine_class(config.engine))
    return engine_class(config.engine)(config)
